//! Emits one element of a tile expression as a C expression.
//!
//! Every lowering evaluates elementwise code the same way: it picks, for each tile
//! dimension, the C expression of the element's global index, and asks this module
//! for the value. So a fused epilogue and a pointwise kernel share one meaning.

use crate::check::Checked;
use crate::dtype::DType;
use crate::error::CodegenError;
use crate::ir::*;
use crate::spec::{ScalarKind, Spec};
use std::collections::HashMap;

/// The C type an element value is computed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CTy {
    F32,
    I64,
}

/// What the emitter needs to know about where it is.
pub struct ElemCtx<'a> {
    pub k: &'a Kernel,
    pub spec: &'a Spec,
    pub checked: &'a Checked,
    /// Global index of the element along each tile dimension in use (`None`: not bound here).
    pub coords: HashMap<DimId, String>,
    /// Variables that have a C name here (the accumulator's fragment, scalar locals).
    pub named_vars: HashMap<VarId, String>,
    /// Variables whose value is inlined where used: their `let` expression.
    pub inline_vars: HashMap<VarId, Expr>,
    /// Sub-expressions already computed into C values here (a row lowering's
    /// reductions and vector loads), with the C expression of this element.
    pub precomputed: Vec<(Expr, String)>,
}

/// The C expression of `tensor[i0, i1, …]`'s address offset and its bounds mask.
pub fn tensor_offset(t: TensorId, index: &[String]) -> String {
    let terms: Vec<String> = index
        .iter()
        .enumerate()
        .map(|(i, c)| format!("({c}) * t{t}_s{i}"))
        .collect();
    terms.join(" + ")
}

/// `coord < extent` for each index, joined with `&&`.
pub fn tensor_mask(t: TensorId, index: &[String]) -> String {
    let terms: Vec<String> = index
        .iter()
        .enumerate()
        .map(|(i, c)| format!("({c}) < t{t}_n{i}"))
        .collect();
    terms.join(" && ")
}

/// Converts a stored element (C storage type) to the type it is computed in.
pub fn widen(dtype: DType, raw: &str) -> (String, CTy) {
    match dtype {
        DType::BF16 => (format!("tf_bf16_to_f32({raw})"), CTy::F32),
        DType::F16 => (format!("tf_f16_to_f32({raw})"), CTy::F32),
        DType::F32 => (raw.to_string(), CTy::F32),
        DType::I32 | DType::U32 | DType::I64 => (format!("(long long)({raw})"), CTy::I64),
    }
}

/// Converts a computed value to the storage type of `dtype` (rounding to nearest even).
pub fn narrow(dtype: DType, value: &str, ty: CTy) -> String {
    let as_f = || match ty {
        CTy::F32 => value.to_string(),
        CTy::I64 => format!("(float)({value})"),
    };
    match dtype {
        DType::BF16 => format!("tf_f32_to_bf16({})", as_f()),
        DType::F16 => format!("tf_f32_to_f16({})", as_f()),
        DType::F32 => as_f(),
        DType::I32 => format!("(int)({value})"),
        DType::U32 => format!("(unsigned int)({value})"),
        DType::I64 => format!("(long long)({value})"),
    }
}

pub(crate) fn float_lit(v: f64) -> String {
    if v.is_nan() {
        "__int_as_float(0x7fc00000)".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "__int_as_float(0x7f800000)".into()
        } else {
            "__int_as_float(0xff800000)".into()
        }
    } else {
        format!("{v:?}f")
    }
}

fn to_f32(e: (String, CTy)) -> String {
    match e.1 {
        CTy::F32 => e.0,
        CTy::I64 => format!("(float)({})", e.0),
    }
}

impl ElemCtx<'_> {
    fn coord(&self, d: DimId, at: &str) -> Result<String, CodegenError> {
        self.coords
            .get(&d)
            .cloned()
            .ok_or_else(|| CodegenError::Unsupported {
                kernel: self.k.name.clone(),
                at: at.to_string(),
                message: format!(
                    "tile `{}` is not an elementwise dimension at this point of the kernel",
                    self.k.dims[d].name
                ),
            })
    }

    /// The C expression of one element of `e`, and its C type.
    pub fn emit(&self, e: &Expr, at: &str) -> Result<(String, CTy), CodegenError> {
        if let Some((_, name)) = self.precomputed.iter().find(|(x, _)| x == e) {
            let ty = match e {
                Expr::Load { tensor, .. } => widen(self.spec.tensors[*tensor].dtype, "").1,
                _ => CTy::F32,
            };
            return Ok((name.clone(), ty));
        }
        Ok(match e {
            Expr::Var(v) => {
                if let Some(name) = self.named_vars.get(v) {
                    let ty = if self.checked.vars[*v].dtype.is_float() {
                        CTy::F32
                    } else {
                        CTy::I64
                    };
                    (name.clone(), ty)
                } else if let Some(value) = self.inline_vars.get(v) {
                    let (c, ty) = self.emit(value, at)?;
                    (format!("({c})"), ty)
                } else {
                    return Err(CodegenError::Unsupported {
                        kernel: self.k.name.clone(),
                        at: at.to_string(),
                        message: format!(
                            "`{}` cannot be used here: its value lives in another part of the kernel",
                            self.k.vars[*v].name
                        ),
                    });
                }
            }
            Expr::Load { tensor, index, at } => {
                let coords = index
                    .iter()
                    .map(|d| self.coord(*d, at))
                    .collect::<Result<Vec<_>, _>>()?;
                let dtype = self.spec.tensors[*tensor].dtype;
                let raw = format!("t{tensor}[{}]", tensor_offset(*tensor, &coords));
                let (v, ty) = widen(dtype, &raw);
                let zero = if ty == CTy::F32 { "0.0f" } else { "0ll" };
                (
                    format!("(({}) ? {v} : {zero})", tensor_mask(*tensor, &coords)),
                    ty,
                )
            }
            Expr::Full { dtype, value, .. } => {
                if dtype.is_float() {
                    (float_lit(*value), CTy::F32)
                } else {
                    (format!("{}ll", *value as i64), CTy::I64)
                }
            }
            Expr::Addmm { at, .. } => {
                return Err(CodegenError::Unsupported {
                    kernel: self.k.name.clone(),
                    at: at.clone(),
                    message:
                        "`addmm` is supported as `acc = addmm(acc, a[(tm, tk)], b[(tk, tn)])`, \
                              the only statement of an inner `tile()` loop"
                            .into(),
                })
            }
            Expr::Binary { op, lhs, rhs, at } => {
                let l = self.emit(lhs, at)?;
                let r = self.emit(rhs, at)?;
                let float = l.1 == CTy::F32 || r.1 == CTy::F32;
                let (a, b) = if float {
                    (to_f32(l), to_f32(r))
                } else {
                    (l.0, r.0)
                };
                let code = match (op, float) {
                    (BinOp::Add, _) => format!("({a} + {b})"),
                    (BinOp::Sub, _) => format!("({a} - {b})"),
                    (BinOp::Mul, _) => format!("({a} * {b})"),
                    (BinOp::Div, true) => format!("tf_div({a}, {b})"),
                    (BinOp::Div, false) => format!("({a} / {b})"),
                    (BinOp::Rem, _) => format!("({a} % {b})"),
                    (BinOp::Min, true) => format!("fminf({a}, {b})"),
                    (BinOp::Max, true) => format!("fmaxf({a}, {b})"),
                    (BinOp::Min, false) => format!("tf_min_i({a}, {b})"),
                    (BinOp::Max, false) => format!("tf_max_i({a}, {b})"),
                };
                (code, if float { CTy::F32 } else { CTy::I64 })
            }
            Expr::TileIndex(d) => (format!("(long long)({})", self.coord(*d, at)?), CTy::I64),
            Expr::Compare { op, lhs, rhs, at } => {
                let l = self.emit(lhs, at)?;
                let r = self.emit(rhs, at)?;
                let (a, b) = if l.1 == CTy::F32 || r.1 == CTy::F32 {
                    (to_f32(l), to_f32(r))
                } else {
                    (l.0, r.0)
                };
                (format!("(({a} {} {b}) ? 1ll : 0ll)", op.symbol()), CTy::I64)
            }
            Expr::Select {
                mask,
                then,
                otherwise,
                at,
            } => {
                let (m, _) = self.emit(mask, at)?;
                let a = self.emit(then, at)?;
                let b = self.emit(otherwise, at)?;
                if a.1 == CTy::F32 || b.1 == CTy::F32 {
                    (format!("(({m}) != 0 ? {} : {})", to_f32(a), to_f32(b)), CTy::F32)
                } else {
                    (format!("(({m}) != 0 ? {} : {})", a.0, b.0), CTy::I64)
                }
            }
            Expr::Unary { op, arg } => {
                if let (UnOp::Exp, Expr::Binary {
                    op: BinOp::Sub,
                    lhs,
                    rhs,
                    ..
                }) = (op, &**arg)
                {
                    let (a, b) = (self.emit(lhs, at)?, self.emit(rhs, at)?);
                    if a.1 == CTy::F32 || b.1 == CTy::F32 {
                        let code = format!("tf_exp_diff({}, {})", to_f32(a), to_f32(b));
                        return Ok((code, CTy::F32));
                    }
                }
                let x = self.emit(arg, at)?;
                if x.1 == CTy::I64 {
                    match op {
                        UnOp::Neg => return Ok((format!("(-{})", x.0), CTy::I64)),
                        UnOp::Abs => return Ok((format!("tf_abs_i({})", x.0), CTy::I64)),
                        UnOp::Relu => return Ok((format!("tf_max_i({}, 0ll)", x.0), CTy::I64)),
                        _ => {}
                    }
                }
                let f = to_f32(x);
                let code = match op {
                    UnOp::Neg => format!("(-{f})"),
                    UnOp::Exp => format!("tf_exp({f})"),
                    UnOp::Log => format!("logf({f})"),
                    UnOp::Sqrt => format!("sqrtf({f})"),
                    UnOp::Rsqrt => format!("rsqrtf({f})"),
                    UnOp::Abs => format!("fabsf({f})"),
                    UnOp::Relu => format!("fmaxf({f}, 0.0f)"),
                    UnOp::Gelu => format!("tf_gelu({f})"),
                    UnOp::GeluTanh => format!("tf_gelu_tanh({f})"),
                    UnOp::Silu => format!("tf_silu({f})"),
                    UnOp::Sigmoid => format!("tf_sigmoid({f})"),
                    UnOp::Tanh => format!("tanhf({f})"),
                    UnOp::ReluGrad => format!("({f} > 0.0f ? 1.0f : 0.0f)"),
                    UnOp::GeluGrad => format!("tf_gelu_grad({f})"),
                };
                (code, CTy::F32)
            }
            Expr::Cast { arg, dtype } => {
                let x = self.emit(arg, at)?;
                match dtype {
                    // `.cast()` at a store: the store rounds to the tensor's type.
                    None => x,
                    Some(DType::BF16) => (format!("tf_round_bf16({})", to_f32(x)), CTy::F32),
                    Some(DType::F16) => (format!("tf_round_f16({})", to_f32(x)), CTy::F32),
                    Some(DType::F32) => (to_f32(x), CTy::F32),
                    Some(DType::I32) => (format!("(long long)(int)({})", x.0), CTy::I64),
                    Some(DType::U32) => (format!("(long long)(unsigned int)({})", x.0), CTy::I64),
                    Some(DType::I64) => (format!("(long long)({})", x.0), CTy::I64),
                }
            }
            Expr::IfConst { at, .. } => {
                return Err(CodegenError::Unsupported {
                    kernel: self.k.name.clone(),
                    at: at.clone(),
                    message: "a compile-time `if` reached the lowering undecided".into(),
                })
            }
            Expr::Reduce { op, at, .. } => {
                return Err(CodegenError::Unsupported {
                    kernel: self.k.name.clone(),
                    at: at.clone(),
                    message: format!(
                        "`.{}()` reduces inside a kernel without `addmm` (a row kernel); in a matmul's epilogue it is not supported yet",
                        op.name()
                    ),
                })
            }
            Expr::Int(v) => (format!("{v}ll"), CTy::I64),
            Expr::Float(v) => (float_lit(*v), CTy::F32),
            Expr::Scalar(s) => (
                format!("s{s}"),
                match self.spec.scalars[*s] {
                    ScalarKind::Int => CTy::I64,
                    ScalarKind::Float => CTy::F32,
                },
            ),
            Expr::Const(c) => (format!("{}ll", self.spec.constexprs[*c]), CTy::I64),
            Expr::TileBegin(d) => (format!("tb{d}"), CTy::I64),
            Expr::TileEnd(d) => (
                format!(
                    "tf_min_i(tb{d} + {}, s{})",
                    self.block(*d),
                    self.k.dims[*d].extent
                ),
                CTy::I64,
            ),
            Expr::TileSize(d) => (
                format!(
                    "(tf_min_i(tb{d} + {b}, s{e}) - tb{d})",
                    b = self.block(*d),
                    e = self.k.dims[*d].extent
                ),
                CTy::I64,
            ),
        })
    }

    fn block(&self, d: DimId) -> String {
        format!("B{d}")
    }
}
