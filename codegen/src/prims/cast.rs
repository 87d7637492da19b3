//! Conversions, `x.cast::<T>()` (and a store's implicit one): Rust's `as`.
//! Float to float rounds to nearest even; float to integer truncates toward
//! zero, saturates at the type's range and takes NaN to 0; integer to
//! integer keeps the low bits; to `bool` tests `!= 0`; `bool` is 0 or 1.

use crate::dtype::{CTy, DType};

/// A number as interpret mode holds it: floats rounded to f32 (kept in f64),
/// integers and masks exactly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Num {
    F(f64),
    I(i64),
}

impl Num {
    pub fn as_f64(self) -> f64 {
        match self {
            Num::F(v) => v,
            Num::I(v) => v as f64,
        }
    }
}

/// Device functions the conversions call.
pub const HELPERS: &str = r#"__device__ __forceinline__ unsigned int tf_f2u32(float x) { unsigned int r; asm("cvt.rzi.sat.u32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r; }
__device__ __forceinline__ int tf_f2i32(float x) { int r; asm("cvt.rzi.sat.s32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r; }
// To a narrower integer: the 32-bit conversion (NaN to 0, truncated, saturated),
// then clamped as integers: three instructions, where a NaN test, a float clamp
// and a truncation before the conversion took six (quantize_i8's store).
__device__ __forceinline__ int tf_f2i(float x, int lo, int hi) { return min(max(tf_f2i32(x), lo), hi); }
// cvt.rzi.sat.s64 gives i64::MIN for NaN (the 32-bit forms give 0): Rust's `as` gives 0.
__device__ __forceinline__ long long tf_f2i64(float x) { long long r; asm("cvt.rzi.sat.s64.f32 %0, %1;" : "=l"(r) : "f"(x)); return x != x ? 0ll : r; }
// An f32 known to hold an integer v, |v| < 2^22: v + 1.5*2^23 is exact with v in
// its low mantissa bits. An add and an integer subtract, where cvt.rzi runs on the
// conversion unit at an eighth of an add's rate (quantize_i8's store).
__device__ __forceinline__ int tf_f2i_exact(float x) { return __float_as_int(x + 12582912.0f) - 0x4B400000; }
"#;

/// The magnitude below which [`cuda_integral`]'s conversion is exact: an
/// integer `v` with `|v| < 2^22` is the low bits of `v + 1.5·2^23`.
const EXACT: f64 = 4194304.0;

/// C converting `x`, an f32 that holds an integer in `lo..=hi` and is never
/// NaN ([`crate::integral`]), to the integer dtype `to`: Rust's `as` gives
/// the same value, with nothing to truncate, saturate or map from NaN. `None`
/// where the bounds reach `to`'s range or 2^22, or `to` is not an integer.
pub fn cuda_integral(x: &str, lo: f64, hi: f64, to: DType) -> Option<String> {
    let (tlo, thi) = to.int_range().filter(|_| to.is_int())?;
    if lo < tlo.max(-EXACT + 1.0) || hi > thi.min(EXACT - 1.0) {
        return None;
    }
    Some(match to {
        DType::U32 => format!("(unsigned int)tf_f2i_exact({x})"),
        DType::I64 => format!("(long long)tf_f2i_exact({x})"),
        _ => format!("tf_f2i_exact({x})"),
    })
}

/// C converting `x`, computed in `from`, to a value of dtype `to` (computed
/// in `to.cty()`, rounded to `to`'s precision).
pub fn cuda(x: &str, from: CTy, to: DType) -> String {
    if from == CTy::F32 {
        return match to {
            DType::F32 => x.to_string(),
            DType::BF16 => format!("tf_round_bf16({x})"),
            DType::F16 => format!("tf_round_f16({x})"),
            DType::I8 => format!("tf_f2i({x}, -128, 127)"),
            DType::U8 => format!("tf_f2i({x}, 0, 255)"),
            DType::I16 => format!("tf_f2i({x}, -32768, 32767)"),
            DType::I32 => format!("tf_f2i32({x})"),
            DType::U32 => format!("tf_f2u32({x})"),
            DType::I64 => format!("tf_f2i64({x})"),
            DType::Bool => format!("({x} != 0.0f)"),
        };
    }
    match to {
        DType::F32 => format!("(float)({x})"),
        DType::BF16 => format!("tf_round_bf16((float)({x}))"),
        DType::F16 => format!("tf_round_f16((float)({x}))"),
        DType::I8 => format!("(int)(signed char)({x})"),
        DType::U8 => format!("(int)(unsigned char)({x})"),
        DType::I16 => format!("(int)(short)({x})"),
        DType::I32 => format!("(int)({x})"),
        DType::U32 => format!("(unsigned int)({x})"),
        DType::I64 => format!("(long long)({x})"),
        DType::Bool if from == CTy::Bool => x.to_string(),
        DType::Bool => format!("({x} != 0)"),
    }
}

/// What interpret mode converts: `v`, a value of dtype `from`, to `to`.
pub fn cpu(v: Num, to: DType) -> Num {
    match v {
        Num::F(x) => match to {
            DType::F32 => Num::F(super::f32r(x)),
            DType::BF16 => Num::F(half::bf16::from_f64(x).to_f64()),
            DType::F16 => Num::F(half::f16::from_f64(x).to_f64()),
            DType::I8 => Num::I(i64::from(x as f32 as i8)),
            DType::U8 => Num::I(i64::from(x as f32 as u8)),
            DType::I16 => Num::I(i64::from(x as f32 as i16)),
            DType::I32 => Num::I(i64::from(x as f32 as i32)),
            DType::U32 => Num::I(i64::from(x as f32 as u32)),
            DType::I64 => Num::I(x as f32 as i64),
            DType::Bool => Num::I(i64::from(x != 0.0)),
        },
        Num::I(i) => {
            if to.is_float() {
                // Integer to f32 rounds once; to bf16/f16 rounds that again,
                // as the GPU's `(float)` then its rounding do.
                let f = i as f32;
                cpu(Num::F(f64::from(f)), to)
            } else {
                Num::I(super::wrap_int(to, i128::from(i)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_to_int_saturates_and_nan_is_zero() {
        assert_eq!(cpu(Num::F(300.7), DType::U8), Num::I(255));
        assert_eq!(cpu(Num::F(-3.9), DType::I32), Num::I(-3));
        assert_eq!(cpu(Num::F(f64::NAN), DType::I64), Num::I(0));
        assert_eq!(cpu(Num::I(-1), DType::U32), Num::I(4294967295));
        assert_eq!(cpu(Num::I(300), DType::I8), Num::I(44));
        assert_eq!(cpu(Num::I(7), DType::Bool), Num::I(1));
    }

    #[test]
    fn an_integral_conversion_needs_bounds_inside_the_type_and_2_22() {
        assert_eq!(
            cuda_integral("v", -127.0, 127.0, DType::I8).as_deref(),
            Some("tf_f2i_exact(v)")
        );
        assert!(cuda_integral("v", -129.0, 0.0, DType::I8).is_none());
        assert!(cuda_integral("v", -1.0, 1.0, DType::U8).is_none());
        assert!(cuda_integral("v", 0.0, 4194304.0, DType::I32).is_none());
        assert!(cuda_integral("v", 0.0, 1.0, DType::F32).is_none());
        assert!(cuda_integral("v", 0.0, 1.0, DType::Bool).is_none());
    }

    /// The helper's arithmetic, as f32 does it, at the ends of its range and
    /// at zero.
    #[test]
    fn the_magic_add_recovers_every_integer_below_2_22() {
        for v in [
            -4194303i32,
            -4194302,
            -128,
            -1,
            0,
            1,
            127,
            255,
            65535,
            4194303,
        ] {
            let bits = (v as f32 + 12582912.0f32).to_bits() as i32;
            assert_eq!(bits - 0x4B40_0000, v);
        }
        assert_eq!((-0.0f32 + 12582912.0f32).to_bits() as i32 - 0x4B40_0000, 0);
    }
}
