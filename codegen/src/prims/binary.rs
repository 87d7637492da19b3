//! Elementwise operations of two arguments: operators (`a + b`, `a & b`,
//! `a << b`) and functions (`max(a, b)`, `a.powf(b)`), broadcast by tile name.

use crate::dtype::DType;
use serde::{Deserialize, Serialize};

/// How an operation types its arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Both promoted ([`DType::promote`]): f32 if either is a float.
    Arith,
    /// Computed in f32.
    Float,
    /// Integers and masks: two masks give a mask, else promoted integers.
    Bits,
    /// Integers: the result has the left operand's (promoted) type.
    Shift,
}

/// One binary operation.
pub struct Binary {
    pub op: BinOp,
    /// The operator (`+`) or function name (`max`) a user writes.
    pub symbol: &'static str,
    /// The function spelling (`max(a, b)`, `a.max(b)`), if it has one.
    pub function: Option<&'static str>,
    pub doc: &'static str,
    pub rule: Rule,
    /// C on f32 values, `{a}` and `{b}` the arguments (empty: floats refused).
    pub cuda: &'static str,
    /// C on integers of one C type (the helpers are overloaded).
    pub cuda_int: &'static str,
    /// C on two masks ([`Rule::Bits`]).
    pub cuda_bool: &'static str,
    /// What interpret mode computes on floats (then rounded to f32).
    pub cpu: fn(f64, f64) -> f64,
    /// What interpret mode computes on integers of this dtype (then wrapped:
    /// [`super::wrap_int`]); `None` where the operation is undefined (an
    /// integer division by zero), which interpret mode reports.
    pub cpu_int: fn(i64, i64, DType) -> Option<i128>,
    /// C on f32 values where the result is only rounded to a 16-bit float
    /// ([`crate::narrow`]): cheaper, with an error far below that rounding.
    /// Empty: [`Binary::cuda`] everywhere.
    pub narrow: &'static str,
    /// Device functions the C above calls, put in every kernel's prelude.
    pub helpers: &'static str,
}

macro_rules! binary_table {
    (@or) => { "" };
    (@or $x:literal) => { $x };
    ($($op:ident: $sym:literal, $func:expr, $rule:ident, $doc:literal,
        cuda $cuda:literal, int $int:literal, bool $bool:literal,
        cpu $cpu:expr, cpu_int $cpui:expr
        $(, narrow $narrow:literal, helpers $helpers:literal)?;)*) => {
        /// Elementwise binary operations; see [`TABLE`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum BinOp { $(#[doc = concat!("`", $sym, "`: ", $doc)] $op),* }

        /// Every operation, in [`BinOp`] order.
        pub static TABLE: &[Binary] = &[$(Binary {
            op: BinOp::$op,
            symbol: $sym,
            function: $func,
            doc: $doc,
            rule: Rule::$rule,
            cuda: $cuda,
            cuda_int: $int,
            cuda_bool: $bool,
            cpu: $cpu,
            cpu_int: $cpui,
            narrow: binary_table!(@or $($narrow)?),
            helpers: binary_table!(@or $($helpers)?),
        }),*];

        impl BinOp {
            /// Every binary operation.
            pub const ALL: &'static [BinOp] = &[$(BinOp::$op),*];
        }
    };
}

/// A shift amount as PTX takes it: at least the width shifts everything out.
fn shift_amount(b: i64, t: DType) -> Option<u32> {
    (b >= 0 && b < i64::from(t.bits())).then_some(b as u32)
}

fn refuse_float(_: f64, _: f64) -> f64 {
    f64::NAN
}

binary_table! {
    Add: "+", None, Arith, "sum",
        cuda "({a} + {b})", int "({a} + {b})", bool "",
        cpu |a, b| a + b, cpu_int |a, b, _| Some(a as i128 + b as i128);
    Sub: "-", None, Arith, "difference",
        cuda "({a} - {b})", int "({a} - {b})", bool "",
        cpu |a, b| a - b, cpu_int |a, b, _| Some(a as i128 - b as i128);
    Mul: "*", None, Arith, "product",
        cuda "({a} * {b})", int "({a} * {b})", bool "",
        cpu |a, b| a * b, cpu_int |a, b, _| Some(a as i128 * b as i128);
    Div: "/", None, Arith, "quotient (integers: truncated toward zero)",
        cuda "tf_div({a}, {b})", int "({a} / {b})", bool "",
        cpu |a, b| a / b,
        cpu_int |a, b, _| (b != 0).then(|| (a as i128) / (b as i128));
    Rem: "%", None, Arith, "remainder with the dividend's sign (C's `%`, Rust's `%`; floats: `fmodf`)",
        cuda "fmodf({a}, {b})", int "({a} % {b})", bool "",
        cpu |a, b| a % b,
        cpu_int |a, b, _| (b != 0).then(|| (a as i128) % (b as i128));
    Min: "min", Some("min"), Arith, "the smaller (a NaN loses)",
        cuda "fminf({a}, {b})", int "tf_min({a}, {b})", bool "",
        cpu f64::min, cpu_int |a, b, _| Some(i128::from(a.min(b)));
    Max: "max", Some("max"), Arith, "the larger (a NaN loses)",
        cuda "fmaxf({a}, {b})", int "tf_max({a}, {b})", bool "",
        cpu f64::max, cpu_int |a, b, _| Some(i128::from(a.max(b)));
    Pow: "powf", Some("powf"), Float, "`a` to the power `b` (also `pow(a, b)`); into a 16-bit float, `2^(b·log2 a)` by `lg2.approx` and `ex2.approx` (relative error below 2⁻¹⁴ where `|b·log2 a| < 128`, the rounding's 2⁻⁹ or 2⁻¹²)",
        cuda "powf({a}, {b})", int "", bool "",
        cpu f64::powf, cpu_int |_, _, _| None,
        narrow "tf_pow_narrow({a}, {b})",
        helpers "// a^b through the special function units, for a result rounded to 16 bits:\n// ex2.approx's error grows with |b·log2 a| (2 + 1.16|x| ulp), 150 ulp of f32 at\n// most before the result overflows or underflows. The .ftz forms skip the\n// fix-ups for subnormal operands (7 instructions an element, 4% of clamp_pow),\n// so a below 2^-126 (zeros, subnormals), infinities, NaNs and results below\n// 2^-126 take powf, as do their signs, zeros and NaNs.\n__device__ __forceinline__ float tf_pow_narrow(float a, float b) {\n  float l, r;\n  asm(\"lg2.approx.ftz.f32 %0, %1;\" : \"=f\"(l) : \"f\"(a));\n  const float t = b * l;\n  asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(r) : \"f\"(t));\n  return (a >= 1.17549435082228751e-38f && a < __int_as_float(0x7f800000) && fabsf(b) < __int_as_float(0x7f800000) && t >= -126.0f) ? r : powf(a, b);\n}\n";
    Atan2: "atan2", Some("atan2"), Float, "the angle of the point `(b, a)`, as `a.atan2(b)`",
        cuda "atan2f({a}, {b})", int "", bool "",
        cpu f64::atan2, cpu_int |_, _, _| None;
    Hypot: "hypot", Some("hypot"), Float, "`sqrt(a² + b²)` without overflow or underflow in between",
        cuda "hypotf({a}, {b})", int "", bool "",
        cpu f64::hypot, cpu_int |_, _, _| None;
    Copysign: "copysign", Some("copysign"), Float, "`|a|` with the sign of `b`",
        cuda "copysignf({a}, {b})", int "", bool "",
        cpu f64::copysign, cpu_int |_, _, _| None;
    BitAnd: "&", None, Bits, "bitwise and (masks: both)",
        cuda "", int "({a} & {b})", bool "({a} && {b})",
        cpu refuse_float, cpu_int |a, b, _| Some(i128::from(a & b));
    BitOr: "|", None, Bits, "bitwise or (masks: either)",
        cuda "", int "({a} | {b})", bool "({a} || {b})",
        cpu refuse_float, cpu_int |a, b, _| Some(i128::from(a | b));
    BitXor: "^", None, Bits, "bitwise exclusive or (masks: one of the two)",
        cuda "", int "({a} ^ {b})", bool "({a} != {b})",
        cpu refuse_float, cpu_int |a, b, _| Some(i128::from(a ^ b));
    Shl: "<<", None, Shift, "left shift (by the width or more: 0)",
        cuda "", int "tf_shl({a}, {b})", bool "",
        cpu refuse_float,
        cpu_int |a, b, t| Some(shift_amount(b, t).map_or(0, |s| (a as i128) << s));
    Shr: ">>", None, Shift, "right shift, arithmetic for signed types (by the width or more: 0, or -1 for a negative value)",
        cuda "", int "tf_shr({a}, {b})", bool "",
        cpu refuse_float,
        cpu_int |a, b, t| Some(match shift_amount(b, t) {
            Some(s) => (a as i128) >> s,
            None if a < 0 => -1,
            None => 0,
        });
}

/// Function names users also write (C's spellings; Rust's `powi`, an
/// integer power, is `powf` with the exponent as a float).
const ALIASES: &[(&str, BinOp)] = &[("pow", BinOp::Pow), ("powi", BinOp::Pow)];

impl BinOp {
    /// The table entry.
    pub fn entry(self) -> &'static Binary {
        &TABLE[self as usize]
    }

    /// The operator or function as written (`+`, `max`).
    pub fn symbol(self) -> &'static str {
        self.entry().symbol
    }

    /// The function spelling (`max(a, b)`), if the operation has one.
    pub fn function(self) -> Option<&'static str> {
        self.entry().function
    }

    /// The operation a function name stands for (`max`, `powf`, `pow`).
    pub fn from_function(name: &str) -> Option<BinOp> {
        BinOp::ALL
            .iter()
            .copied()
            .find(|op| op.function() == Some(name))
            .or_else(|| ALIASES.iter().find(|(n, _)| *n == name).map(|(_, op)| *op))
    }

    /// The type of the result on arguments of types `a` and `b`, or why not.
    pub fn result(self, a: DType, b: DType) -> Result<DType, String> {
        let e = self.entry();
        match e.rule {
            Rule::Arith => Ok(DType::promote(a, b)),
            Rule::Float => Ok(DType::F32),
            Rule::Bits | Rule::Shift if a.is_float() || b.is_float() => Err(format!(
                "`{}` works on integers{}; here {a} and {b} (convert with `.cast::<i32>()`)",
                e.symbol,
                if e.rule == Rule::Bits {
                    " and masks"
                } else {
                    ""
                }
            )),
            Rule::Bits if a == DType::Bool && b == DType::Bool => Ok(DType::Bool),
            Rule::Bits => Ok(DType::promote(a, b)),
            Rule::Shift => Ok(DType::arith(a)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_in_enum_order() {
        for (i, e) in TABLE.iter().enumerate() {
            assert_eq!(e.op as usize, i, "{}", e.symbol);
            if let Some(f) = e.function {
                assert_eq!(BinOp::from_function(f), Some(e.op));
            }
        }
    }

    #[test]
    fn shifts_saturate_like_ptx() {
        let shl = BinOp::Shl.entry().cpu_int;
        let shr = BinOp::Shr.entry().cpu_int;
        assert_eq!(
            shl(1, 31, DType::I32).map(|v| super::super::wrap_int(DType::I32, v)),
            Some(i64::from(i32::MIN))
        );
        assert_eq!(shl(1, 32, DType::U32), Some(0));
        assert_eq!(shr(-8, 40, DType::I32), Some(-1));
        assert_eq!(shr(8, 40, DType::I32), Some(0));
    }
}
