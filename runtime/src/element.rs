//! Rust element types a [`crate::Tensor`] can hold.

use cudarc::driver::{DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use tilefuse_codegen::DType;

mod sealed {
    /// Only the types below are elements: host code copies them as bytes.
    pub trait Sealed {}
}

/// A type that can be a tensor element: bf16, f16, f32, i8, u8, i16, i32, u32,
/// i64 (sealed:
/// these are plain numbers, which tensors copy as bytes).
pub trait Element:
    sealed::Sealed
    + DeviceRepr
    + ValidAsZeroBits
    + Copy
    + Default
    + Send
    + Sync
    + 'static
    + std::fmt::Debug
{
    const DTYPE: DType;
    /// Converts to f64 (for references and checks).
    fn to_f64(self) -> f64;
    /// Converts from f64, rounding to nearest.
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr, |$x:ident| $to:expr, |$v:ident| $from:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $d;
            fn to_f64(self) -> f64 {
                let $x = self;
                $to
            }
            fn from_f64($v: f64) -> Self {
                $from
            }
        }
    };
}

element!(bf16, DType::BF16, |x| x.to_f64(), |v| bf16::from_f64(v));
element!(f16, DType::F16, |x| x.to_f64(), |v| f16::from_f64(v));
element!(f32, DType::F32, |x| f64::from(x), |v| v as f32);
element!(i8, DType::I8, |x| f64::from(x), |v| v as i8);
element!(u8, DType::U8, |x| f64::from(x), |v| v as u8);
element!(i16, DType::I16, |x| f64::from(x), |v| v as i16);
element!(i32, DType::I32, |x| f64::from(x), |v| v as i32);
element!(u32, DType::U32, |x| f64::from(x), |v| v as u32);
element!(i64, DType::I64, |x| x as f64, |v| v as i64);
