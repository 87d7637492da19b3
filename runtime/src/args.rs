//! Kernel arguments as the generated host glue passes them: tensors by their
//! device view, scalars by value, constexprs as integers.

use crate::device::Device;
use crate::element::Element;
use crate::error::{argument, Result};
use crate::tensor::Tensor;
use std::sync::Arc;
use tilefuse_codegen::{DType, ScalarKind};
use tilefuse_interpret::HostMemory;

/// A tensor as a kernel sees it.
#[derive(Clone, Debug)]
pub struct TensorArg {
    pub ptr: u64,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub strides: Vec<isize>,
    pub device: Arc<Device>,
    /// In interpret mode: the host memory and the element offset of the first
    /// element in it.
    pub host: Option<(Arc<HostMemory>, usize)>,
}

/// Anything that can be passed where a kernel indexes a tensor.
pub trait AsTensorArg {
    fn tensor_arg(&self) -> TensorArg;
}

impl<T: Element> AsTensorArg for Tensor<T> {
    fn tensor_arg(&self) -> TensorArg {
        TensorArg {
            ptr: self.device_ptr(),
            dtype: T::DTYPE,
            shape: self.dims().to_vec(),
            strides: self.strides().to_vec(),
            device: self.device().clone(),
            host: self.host_memory().map(|(m, at)| (m.clone(), at)),
        }
    }
}

impl<A: AsTensorArg + ?Sized> AsTensorArg for &A {
    fn tensor_arg(&self) -> TensorArg {
        (**self).tensor_arg()
    }
}

impl<A: AsTensorArg + ?Sized> AsTensorArg for &mut A {
    fn tensor_arg(&self) -> TensorArg {
        (**self).tensor_arg()
    }
}

/// A host value passed to the kernel: integers as `i64` with the type device
/// code computes them in ([`ScalarKind`]: a `u32` stays 32-bit and unsigned),
/// floats as `f32`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScalarArg {
    Int(i64),
    Float(f32),
    I32(i32),
    U32(u32),
}

impl ScalarArg {
    pub fn kind(self) -> ScalarKind {
        match self {
            ScalarArg::Int(_) => ScalarKind::Int,
            ScalarArg::Float(_) => ScalarKind::Float,
            ScalarArg::I32(_) => ScalarKind::I32,
            ScalarArg::U32(_) => ScalarKind::U32,
        }
    }

    /// The value of an integer scalar (as the kernel's `long long` holds it).
    pub fn int(self) -> Option<i64> {
        match self {
            ScalarArg::Int(v) => Some(v),
            ScalarArg::I32(v) => Some(i64::from(v)),
            ScalarArg::U32(v) => Some(i64::from(v)),
            ScalarArg::Float(_) => None,
        }
    }
}

/// Host values that can be captured by device code.
pub trait IntoScalar {
    fn into_scalar(self) -> ScalarArg;
}

macro_rules! int_scalar {
    ($variant:ident: $($t:ty),*) => {$(
        impl IntoScalar for $t {
            fn into_scalar(self) -> ScalarArg {
                ScalarArg::$variant(self.into())
            }
        }
    )*};
}
int_scalar!(I32: i32, i16, u16, i8, u8);
int_scalar!(U32: u32);
int_scalar!(Int: i64);

impl IntoScalar for usize {
    fn into_scalar(self) -> ScalarArg {
        // Sizes beyond i64 cannot address GPU memory; saturate.
        ScalarArg::Int(i64::try_from(self).unwrap_or(i64::MAX))
    }
}

impl IntoScalar for isize {
    fn into_scalar(self) -> ScalarArg {
        ScalarArg::Int(self as i64)
    }
}

impl IntoScalar for u64 {
    fn into_scalar(self) -> ScalarArg {
        // Its 64 bits as they are (a random seed keeps all of them); values
        // past i64::MAX read as negative i64s in the kernel.
        ScalarArg::Int(self as i64)
    }
}

impl IntoScalar for f32 {
    fn into_scalar(self) -> ScalarArg {
        ScalarArg::Float(self)
    }
}

impl IntoScalar for f64 {
    fn into_scalar(self) -> ScalarArg {
        ScalarArg::Float(self as f32)
    }
}

impl<T: IntoScalar + Copy> IntoScalar for &T {
    fn into_scalar(self) -> ScalarArg {
        (*self).into_scalar()
    }
}

/// Values a `#[constexpr]` parameter can take.
pub trait IntoConst {
    fn into_const(self, name: &str) -> Result<i64>;
}

macro_rules! int_const {
    ($($t:ty),*) => {$(
        impl IntoConst for $t {
            fn into_const(self, name: &str) -> Result<i64> {
                i64::try_from(self).map_err(|_| argument("constexpr", name, format!("{self} does not fit in i64")))
            }
        }
    )*};
}
int_const!(usize, isize, i64, u64, i32, u32);

impl IntoConst for bool {
    fn into_const(self, _name: &str) -> Result<i64> {
        Ok(i64::from(self))
    }
}

/// Checks a tensor parameter's rank before the kernel's host code runs.
pub fn expect_rank<A: AsTensorArg + ?Sized>(
    t: &A,
    name: &str,
    rank: usize,
    kernel: &str,
) -> Result<()> {
    let a = t.tensor_arg();
    if a.shape.len() != rank {
        return Err(argument(
            format!("kernel `{kernel}`"),
            name,
            format!(
                "expected a {rank}-D tensor (the kernel indexes it with {rank} tile(s)), got shape {:?}",
                a.shape
            ),
        ));
    }
    Ok(())
}
