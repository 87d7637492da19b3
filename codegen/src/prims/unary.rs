//! Elementwise functions of one argument: `exp(x)` or `x.exp()`.

use crate::dtype::DType;
use serde::{Deserialize, Serialize};

/// How a function types its argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Computed in f32 (integers and masks converted first).
    Float,
    /// Integers stay integers (promoted as arithmetic promotes them, so a
    /// mask gives an i32); floats give f32.
    KeepInt,
    /// Integers and masks only (bitwise): a mask stays a mask.
    Bits,
}

/// One elementwise function.
pub struct Unary {
    pub op: UnOp,
    /// The DSL name: `exp(x)` and `x.exp()`.
    pub name: &'static str,
    pub doc: &'static str,
    pub rule: Rule,
    /// C on an f32 value, `{x}` the argument (empty: floats refused).
    pub cuda: &'static str,
    /// C on an integer value (`int`, `unsigned int` or `long long`; the
    /// helpers are overloaded), for [`Rule::KeepInt`] and [`Rule::Bits`].
    pub cuda_int: &'static str,
    /// C on a `bool`, for [`Rule::Bits`].
    pub cuda_bool: &'static str,
    /// Device functions the C above calls, put in every kernel's prelude.
    pub helpers: &'static str,
    /// What interpret mode computes on a float (then rounded to f32).
    pub cpu: fn(f64) -> f64,
    /// What interpret mode computes on an integer or mask of this dtype
    /// (then wrapped to it: [`super::wrap_int`]).
    pub cpu_int: fn(i64, DType) -> i128,
}

macro_rules! unary_table {
    ($($op:ident: $name:literal, $rule:ident, $doc:literal,
        cuda $cuda:literal, int $int:literal, bool $bool:literal, helpers $helpers:literal,
        cpu $cpu:expr, cpu_int $cpui:expr;)*) => {
        /// Elementwise functions of one argument; see [`TABLE`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum UnOp { $(#[doc = concat!("`", $name, "(x)`: ", $doc)] $op),* }

        /// Every function, in [`UnOp`] order.
        pub static TABLE: &[Unary] = &[$(Unary {
            op: UnOp::$op,
            name: $name,
            doc: $doc,
            rule: Rule::$rule,
            cuda: $cuda,
            cuda_int: $int,
            cuda_bool: $bool,
            helpers: $helpers,
            cpu: $cpu,
            cpu_int: $cpui,
        }),*];

        impl UnOp {
            /// Every unary op the DSL knows, for parsing and for messages.
            pub const ALL: &'static [UnOp] = &[$(UnOp::$op),*];
        }
    };
}

fn refuse(_: i64, _: DType) -> i128 {
    0
}

fn phi(x: f64) -> f64 {
    0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2))
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

unary_table! {
    Neg: "neg", KeepInt, "`-x`",
        cuda "(-{x})", int "(-{x})", bool "", helpers "",
        cpu |x| -x, cpu_int |x, _| -(x as i128);
    Not: "not", Bits, "`!x`: bitwise not of an integer, logical not of a mask",
        cuda "", int "(~{x})", bool "(!{x})", helpers "",
        cpu |x| x, cpu_int |x, t| if t == DType::Bool { i128::from(x == 0) } else { !(x as i128) };
    Abs: "abs", KeepInt, "`|x|`",
        cuda "fabsf({x})", int "tf_abs({x})", bool "", helpers "",
        cpu f64::abs, cpu_int |x, _| (x as i128).abs();
    Sign: "signum", KeepInt, "-1, 0 or 1 (a float's sign: ±1, NaN stays NaN)",
        cuda "tf_sign({x})", int "tf_sign({x})", bool "", helpers "",
        cpu |x| if x.is_nan() { x } else if x == 0.0 { 0.0 } else { x.signum() },
        cpu_int |x, _| i128::from(x.signum());
    Relu: "relu", KeepInt, "`max(x, 0)`",
        cuda "fmaxf({x}, 0.0f)", int "tf_max({x}, 0)", bool "", helpers "",
        cpu |x| x.max(0.0), cpu_int |x, _| i128::from(x.max(0));
    Floor: "floor", KeepInt, "largest integer not above `x` (integers unchanged)",
        cuda "floorf({x})", int "({x})", bool "", helpers "",
        cpu f64::floor, cpu_int |x, _| i128::from(x);
    Ceil: "ceil", KeepInt, "smallest integer not below `x` (integers unchanged)",
        cuda "ceilf({x})", int "({x})", bool "", helpers "",
        cpu f64::ceil, cpu_int |x, _| i128::from(x);
    Round: "round", KeepInt, "nearest integer, halves away from zero, as Rust's `f32::round` (integers unchanged)",
        cuda "roundf({x})", int "({x})", bool "", helpers "",
        cpu f64::round, cpu_int |x, _| i128::from(x);
    Trunc: "trunc", KeepInt, "`x` with its fraction dropped (integers unchanged)",
        cuda "truncf({x})", int "({x})", bool "", helpers "",
        cpu f64::trunc, cpu_int |x, _| i128::from(x);
    Exp: "exp", Float, "`e^x` (`ex2.approx` of `x·log2 e`, 2 ulp)",
        cuda "tf_exp({x})", int "", bool "", helpers "",
        cpu f64::exp, cpu_int refuse;
    Exp2: "exp2", Float, "`2^x` (`ex2.approx`, 2 ulp)",
        cuda "tf_exp2({x})", int "", bool "",
        helpers "__device__ __forceinline__ float tf_exp2(float x) { float r; asm(\"ex2.approx.ftz.f32 %0, %1;\" : \"=f\"(r) : \"f\"(x)); return r; }\n",
        cpu f64::exp2, cpu_int refuse;
    Log: "ln", Float, "natural logarithm (also `log(x)`)",
        cuda "logf({x})", int "", bool "", helpers "",
        cpu f64::ln, cpu_int refuse;
    Log2: "log2", Float, "base-2 logarithm",
        cuda "log2f({x})", int "", bool "", helpers "",
        cpu f64::log2, cpu_int refuse;
    Log1p: "ln_1p", Float, "`ln(1 + x)`, exact near 0 (also `log1p(x)`)",
        cuda "log1pf({x})", int "", bool "", helpers "",
        cpu f64::ln_1p, cpu_int refuse;
    Expm1: "exp_m1", Float, "`e^x − 1`, exact near 0 (also `expm1(x)`)",
        cuda "expm1f({x})", int "", bool "", helpers "",
        cpu f64::exp_m1, cpu_int refuse;
    Sqrt: "sqrt", Float, "square root",
        cuda "sqrtf({x})", int "", bool "", helpers "",
        cpu f64::sqrt, cpu_int refuse;
    Rsqrt: "rsqrt", Float, "`1 / sqrt(x)` (`rsqrt.approx`)",
        cuda "rsqrtf({x})", int "", bool "", helpers "",
        cpu |x| 1.0 / x.sqrt(), cpu_int refuse;
    Recip: "recip", Float, "`1 / x`",
        cuda "tf_div(1.0f, {x})", int "", bool "", helpers "",
        cpu |x| 1.0 / x, cpu_int refuse;
    Sin: "sin", Float, "sine",
        cuda "sinf({x})", int "", bool "", helpers "",
        cpu f64::sin, cpu_int refuse;
    Cos: "cos", Float, "cosine",
        cuda "cosf({x})", int "", bool "", helpers "",
        cpu f64::cos, cpu_int refuse;
    Tan: "tan", Float, "tangent",
        cuda "tanf({x})", int "", bool "", helpers "",
        cpu f64::tan, cpu_int refuse;
    Asin: "asin", Float, "arcsine (NaN outside [-1, 1])",
        cuda "asinf({x})", int "", bool "", helpers "",
        cpu f64::asin, cpu_int refuse;
    Acos: "acos", Float, "arccosine (NaN outside [-1, 1])",
        cuda "acosf({x})", int "", bool "", helpers "",
        cpu f64::acos, cpu_int refuse;
    Atan: "atan", Float, "arctangent",
        cuda "atanf({x})", int "", bool "", helpers "",
        cpu f64::atan, cpu_int refuse;
    Sinh: "sinh", Float, "hyperbolic sine",
        cuda "sinhf({x})", int "", bool "", helpers "",
        cpu f64::sinh, cpu_int refuse;
    Cosh: "cosh", Float, "hyperbolic cosine",
        cuda "coshf({x})", int "", bool "", helpers "",
        cpu f64::cosh, cpu_int refuse;
    Tanh: "tanh", Float, "hyperbolic tangent",
        cuda "tanhf({x})", int "", bool "", helpers "",
        cpu f64::tanh, cpu_int refuse;
    Asinh: "asinh", Float, "inverse hyperbolic sine",
        cuda "asinhf({x})", int "", bool "", helpers "",
        cpu f64::asinh, cpu_int refuse;
    Acosh: "acosh", Float, "inverse hyperbolic cosine (NaN below 1)",
        cuda "acoshf({x})", int "", bool "", helpers "",
        cpu f64::acosh, cpu_int refuse;
    Atanh: "atanh", Float, "inverse hyperbolic tangent (NaN outside [-1, 1])",
        cuda "atanhf({x})", int "", bool "", helpers "",
        cpu f64::atanh, cpu_int refuse;
    Log10: "log10", Float, "base-10 logarithm",
        cuda "log10f({x})", int "", bool "", helpers "",
        cpu f64::log10, cpu_int refuse;
    Cbrt: "cbrt", Float, "cube root (negative for negative `x`)",
        cuda "cbrtf({x})", int "", bool "", helpers "",
        cpu f64::cbrt, cpu_int refuse;
    Erf: "erf", Float, "the error function",
        cuda "erff({x})", int "", bool "", helpers "",
        cpu libm::erf, cpu_int refuse;
    Sigmoid: "sigmoid", Float, "`1 / (1 + e^-x)`",
        cuda "tf_sigmoid({x})", int "", bool "",
        helpers "__device__ __forceinline__ float tf_sigmoid(float x) { return tf_div(1.0f, 1.0f + tf_exp(-x)); }\n",
        cpu sigmoid, cpu_int refuse;
    Silu: "silu", Float, "`x · sigmoid(x)`",
        cuda "tf_silu({x})", int "", bool "",
        helpers "__device__ __forceinline__ float tf_silu(float x) { return tf_div(x, 1.0f + tf_exp(-x)); }\n",
        cpu |x| x * sigmoid(x), cpu_int refuse;
    Gelu: "gelu", Float, "`x · Φ(x)` (erf form)",
        cuda "tf_gelu({x})", int "", bool "",
        helpers "// Φ(x) = (1 + erf(x/√2)) / 2, from erfc(t) / 2 = 2^(h(t) − 1 − t²·log2 e) at t = |x|/√2,
// with h a degree-11 fit on [0, 4] (held at h(4) beyond, where erfc < 2e-8 and gelu
// below 5e-8). The negative side is erfc itself, within 2.1e-6 relative down to -5
// (erff's 1 + erf cancels there); the positive side 1 - erfc/2, within 2 ulp. Twelve
// FMAs and one ex2, where erff evaluates two polynomials and selects (about 25
// instructions). docs/perf-history.md (GELU without erff) has the error by range.
// The coefficients sit in constant memory, read by the FMAs as operands: as
// immediates each took a register wherever the compiler hoisted them (a GEMM's
// epilogue, at its register limit, spilled).
__constant__ float tf_phi_fit[12] = {1.133601444e-07f, -2.984496632e-06f, 3.493410986e-05f, -2.373729803e-04f,
  1.004367834e-03f, -2.406020416e-03f, 7.958838250e-05f, 2.782250755e-02f, -1.483802646e-01f, 5.242727995e-01f,
  -1.627909303e+00f, -9.999999404e-01f};
__device__ __forceinline__ float tf_phi(float x) {
  const float t = fabsf(x) * 0.70710678118654752f, u = fminf(t, 4.0f);
  float h = tf_phi_fit[0];
  #pragma unroll
  for (int i = 1; i < 12; ++i) h = fmaf(h, u, tf_phi_fit[i]);
  const float e = tf_exp2(fmaf(t, t * -1.4426950408889634f, h));
  return x < 0.0f ? e : 1.0f - e;
}
__device__ __forceinline__ float tf_gelu(float x) { return x * tf_phi(x); }\n",
        cpu |x| x * phi(x), cpu_int refuse;
    GeluTanh: "gelu_tanh", Float, "GELU's tanh approximation",
        cuda "tf_gelu_tanh({x})", int "", bool "",
        helpers "__device__ __forceinline__ float tf_gelu_tanh(float x) { return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x))); }\n",
        cpu |x| 0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh()),
        cpu_int refuse;
    ReluGrad: "relu_grad", Float, "the derivative of `relu`: 1 where `x > 0`, else 0",
        cuda "({x} > 0.0f ? 1.0f : 0.0f)", int "", bool "", helpers "",
        cpu |x| f64::from(u8::from(x > 0.0)), cpu_int refuse;
    GeluGrad: "gelu_grad", Float, "the derivative of `gelu`: `Φ(x) + x·φ(x)`",
        cuda "tf_gelu_grad({x})", int "", bool "",
        helpers "__device__ __forceinline__ float tf_gelu_grad(float x) { return tf_phi(x) + x * 0.39894228040143268f * tf_exp(-0.5f * x * x); }\n",
        cpu |x| phi(x) + x * 0.398_942_280_401_432_7 * (-0.5 * x * x).exp(), cpu_int refuse;
    GeluTanhGrad: "gelu_tanh_grad", Float, "the derivative of `gelu_tanh`",
        cuda "tf_gelu_tanh_grad({x})", int "", bool "",
        helpers "__device__ __forceinline__ float tf_gelu_tanh_grad(float x) { const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x); const float t = tanhf(u); return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 0.134145f * x * x); }\n",
        cpu |x| {
            let u = 0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x);
            let t = u.tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.797_884_560_802_865_4 * (1.0 + 0.134145 * x * x)
        },
        cpu_int refuse;
    SiluGrad: "silu_grad", Float, "the derivative of `silu`: `σ(x)·(1 + x·(1 − σ(x)))`",
        cuda "tf_silu_grad({x})", int "", bool "",
        helpers "__device__ __forceinline__ float tf_silu_grad(float x) { const float s = tf_div(1.0f, 1.0f + tf_exp(-x)); return s * (1.0f + x * (1.0f - s)); }\n",
        cpu |x| { let s = sigmoid(x); s * (1.0 + x * (1.0 - s)) }, cpu_int refuse;
    SigmoidGrad: "sigmoid_grad", Float, "the derivative of `sigmoid`: `σ(x)·(1 − σ(x))`",
        cuda "tf_sigmoid_grad({x})", int "", bool "",
        helpers "__device__ __forceinline__ float tf_sigmoid_grad(float x) { const float s = tf_div(1.0f, 1.0f + tf_exp(-x)); return s * (1.0f - s); }\n",
        cpu |x| { let s = sigmoid(x); s * (1.0 - s) }, cpu_int refuse;
    Softplus: "softplus", Float, "`ln(1 + e^x)`, a smooth `relu` (its derivative is `sigmoid`)",
        cuda "tf_softplus({x})", int "", bool "",
        helpers "__device__ __forceinline__ float tf_softplus(float x) { return fmaxf(x, 0.0f) + log1pf(tf_exp(-fabsf(x))); }\n",
        cpu |x| x.max(0.0) + (-x.abs()).exp().ln_1p(), cpu_int refuse;
}

/// Names users also write for some functions (C's and PyTorch's spellings).
const ALIASES: &[(&str, UnOp)] = &[
    ("log", UnOp::Log),
    ("log1p", UnOp::Log1p),
    ("expm1", UnOp::Expm1),
    ("sign", UnOp::Sign),
    ("reciprocal", UnOp::Recip),
];

impl UnOp {
    /// The table entry.
    pub fn entry(self) -> &'static Unary {
        &TABLE[self as usize]
    }

    /// The DSL name (`relu`), as a user writes it.
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// The op a name (or an alias, `log` for `ln`) stands for.
    pub fn from_name(name: &str) -> Option<UnOp> {
        UnOp::ALL
            .iter()
            .copied()
            .find(|op| op.name() == name)
            .or_else(|| ALIASES.iter().find(|(n, _)| *n == name).map(|(_, op)| *op))
    }

    /// The type of the result on an argument of type `arg`, or why not.
    pub fn result(self, arg: DType) -> Result<DType, String> {
        let e = self.entry();
        match e.rule {
            Rule::Float => Ok(DType::F32),
            Rule::KeepInt => Ok(DType::arith(arg)),
            Rule::Bits if arg.is_float() => Err(format!(
                "`{}` works on integers and masks; this value is a {arg}",
                e.name
            )),
            Rule::Bits if arg == DType::Bool => Ok(DType::Bool),
            Rule::Bits => Ok(DType::arith(arg)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tf_phi` (the CUDA of `gelu` and `gelu_grad`) emulated in f32 from its
    /// own text: its fit's coefficients against f64 `erf`, by range.
    #[test]
    fn gelu_phi_fit_is_accurate() {
        let text = UnOp::Gelu.entry().helpers;
        let fit = &text[text.find("tf_phi_fit[12] = {").expect("the fit") + 18..];
        let coefs: Vec<f32> = fit[..fit.find('}').expect("its end")]
            .split(',')
            .map(|c| {
                c.trim()
                    .trim_end_matches('f')
                    .parse()
                    .expect("a coefficient")
            })
            .collect();
        let (first, rest) = coefs.split_first().expect("coefficients");
        assert_eq!(rest.len(), 11, "a degree-11 fit");
        let phi_f32 = |x: f32| -> f32 {
            let t = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
            let u = t.min(4.0);
            let h = rest.iter().fold(*first, |h, &c| h.mul_add(u, c));
            let e = (t.mul_add(t * -std::f32::consts::LOG2_E, h) as f64).exp2() as f32;
            if x < 0.0 {
                e
            } else {
                1.0 - e
            }
        };
        let mut worst = [0.0f64; 3];
        for i in 0..=20000 {
            let x = -5.0 + 13.0 * i as f32 / 20000.0;
            let (got, want) = (f64::from(x * phi_f32(x)), f64::from(x) * phi(f64::from(x)));
            if want == 0.0 {
                continue;
            }
            let band = if x >= 0.0 {
                0
            } else if x > -3.0 {
                1
            } else {
                2
            };
            worst[band] = worst[band].max((got - want).abs() / want.abs());
        }
        assert!(worst[0] < 4e-7, "positive side {worst:?}");
        assert!(worst[1] < 1.5e-6, "(-3, 0) {worst:?}");
        assert!(worst[2] < 3e-6, "[-5, -3] {worst:?}");
    }

    #[test]
    fn table_is_in_enum_order_with_unique_names() {
        for (i, e) in TABLE.iter().enumerate() {
            assert_eq!(e.op as usize, i, "{}", e.name);
            assert_eq!(UnOp::from_name(e.name), Some(e.op));
            let rule_has_c = match e.rule {
                Rule::Float => !e.cuda.is_empty(),
                Rule::KeepInt => !e.cuda.is_empty() && !e.cuda_int.is_empty(),
                Rule::Bits => !e.cuda_int.is_empty() && !e.cuda_bool.is_empty(),
            };
            assert!(rule_has_c, "{} lacks the C its rule needs", e.name);
        }
    }
}
