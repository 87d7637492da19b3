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

/// A host value passed to the kernel: integers as `i64`, floats as `f32`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ScalarArg {
    Int(i64),
    Float(f32),
}

impl ScalarArg {
    pub fn kind(self) -> ScalarKind {
        match self {
            ScalarArg::Int(_) => ScalarKind::Int,
            ScalarArg::Float(_) => ScalarKind::Float,
        }
    }
}

/// Host values that can be captured by device code.
pub trait IntoScalar {
    fn into_scalar(self) -> ScalarArg;
}

macro_rules! int_scalar {
    ($($t:ty),*) => {$(
        impl IntoScalar for $t {
            fn into_scalar(self) -> ScalarArg {
                // Sizes and indices beyond i64 cannot address GPU memory; saturate.
                ScalarArg::Int(i64::try_from(self).unwrap_or(i64::MAX))
            }
        }
    )*};
}
int_scalar!(usize, isize, i64, u64, i32, u32, i16, u16, i8, u8);

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
