//! Emits one element of a tile expression as a C expression.
//!
//! Every lowering evaluates elementwise code the same way: it picks, for each tile
//! dimension, the C expression of the element's global index, and asks this module
//! for the value. So a fused epilogue, a row kernel and the general lowering
//! share one meaning, the primitive tables' ([`crate::prims`]).

use crate::check::Checked;
use crate::dtype::DType;
use crate::error::CodegenError;
use crate::ir::*;
use crate::prims::{binary, cast, unary};
use crate::spec::{ScalarKind, Spec};
use std::collections::HashMap;

pub use crate::dtype::CTy;

/// What the emitter needs to know about where it is.
#[derive(Clone)]
pub struct ElemCtx<'a> {
    pub k: &'a Kernel,
    pub spec: &'a Spec,
    pub checked: &'a Checked,
    /// Global index of the element along each tile dimension in use (`None`: not bound here).
    pub coords: HashMap<DimId, String>,
    /// The in-block part of a bound coordinate whose whole is `tb{d} + within`
    /// (an int below 2^30): a comparison of two such tile indices takes 32 bits.
    pub within: HashMap<DimId, String>,
    /// Variables that have a C name here (the accumulator's fragment, scalar locals).
    pub named_vars: HashMap<VarId, String>,
    /// Variables whose value is inlined where used: their `let` expression.
    pub inline_vars: HashMap<VarId, Expr>,
    /// Sub-expressions already computed into C values here (a row lowering's
    /// reductions and vector loads), with the C expression of this element.
    pub precomputed: Vec<(Expr, String)>,
    /// Variables held unscaled (attention's scores, `x = q·kᵀ * scale`): this
    /// element's raw value and the uniform scale (C expressions). A use reads
    /// `(raw * scale)` (its `named_vars` entry); `exp(x - b)` folds the scale
    /// into the exponent's FMA.
    pub scaled_vars: HashMap<VarId, (String, String)>,
    /// Where a value is only rounded to a 16-bit float: a primitive's
    /// narrow form applies there.
    pub narrow: &'a crate::narrow::Narrow,
    /// What is known of float values' integrality and bounds: a cast of a
    /// bounded integer to an integer type needs no conversion unit.
    pub integral: &'a crate::integral::Integral,
}

/// The C expression of `tensor[i0, i1, …]`'s address offset.
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

/// `0 <= coord < extent` for each index (a computed index may be negative).
pub fn tensor_mask_signed(t: TensorId, index: &[String]) -> String {
    let terms: Vec<String> = index
        .iter()
        .enumerate()
        .map(|(i, c)| format!("(unsigned long long)({c}) < (unsigned long long)t{t}_n{i}"))
        .collect();
    terms.join(" && ")
}

/// Converts a stored element (C storage type) to the type it is computed in.
pub fn widen(dtype: DType, raw: &str) -> (String, CTy) {
    match dtype {
        DType::BF16 => (format!("tf_bf16_to_f32({raw})"), CTy::F32),
        DType::F16 => (format!("tf_f16_to_f32({raw})"), CTy::F32),
        DType::F32 => (raw.to_string(), CTy::F32),
        DType::Bool => (format!("({raw} != 0)"), CTy::Bool),
        DType::I8 | DType::U8 | DType::I16 | DType::I32 => (format!("(int)({raw})"), CTy::I32),
        DType::U32 => (format!("(unsigned int)({raw})"), CTy::U32),
        DType::I64 => (format!("(long long)({raw})"), CTy::I64),
    }
}

/// Converts a computed value to the storage type of `dtype` (rounding to
/// nearest even, saturating floats into integers: see [`cast`]).
pub fn narrow(dtype: DType, value: &str, ty: CTy) -> String {
    let v = cast::cuda(value, ty, dtype);
    match dtype {
        DType::BF16 => format!("tf_f32_to_bf16({})", cast::cuda(value, ty, DType::F32)),
        DType::F16 => format!("tf_f32_to_f16({})", cast::cuda(value, ty, DType::F32)),
        _ => format!("({})({v})", dtype.c_storage()),
    }
}

/// The C zero of a computed type (a masked load's value).
pub fn zero(ty: CTy) -> &'static str {
    match ty {
        CTy::F32 => "0.0f",
        CTy::Bool => "false",
        CTy::I32 => "0",
        CTy::U32 => "0u",
        CTy::I64 => "0ll",
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

/// An integer literal of a computed type.
pub(crate) fn int_lit(v: i64, ty: CTy) -> String {
    match ty {
        CTy::F32 => float_lit(v as f64),
        CTy::Bool => (v != 0).to_string(),
        CTy::I32 => format!("(int){v}"),
        CTy::U32 => format!("{}u", v as u32),
        CTy::I64 if v == i64::MIN => "(-9223372036854775807ll - 1)".into(),
        CTy::I64 => format!("{v}ll"),
    }
}

/// `e`, computed in `from`, as a value of `to`.
pub(crate) fn convert(e: &str, from: CTy, to: CTy) -> String {
    if from == to {
        return e.to_string();
    }
    match to {
        CTy::F32 => format!("(float)({e})"),
        CTy::Bool => format!("({e} != 0)"),
        CTy::I32 => format!("(int)({e})"),
        CTy::U32 => format!("(unsigned int)({e})"),
        CTy::I64 => format!("(long long)({e})"),
    }
}

/// Fills `{x}` (and `{a}`, `{b}`) in a table's C template.
pub(crate) fn fill(template: &str, args: &[(&str, &str)]) -> String {
    let mut s = template.to_string();
    for (k, v) in args {
        s = s.replace(&format!("{{{k}}}"), v);
    }
    s
}

impl ElemCtx<'_> {
    fn coord(&self, d: DimId, at: &str) -> Result<String, CodegenError> {
        // An `each` tile has one index, the program's (or its loop step's) `tb`.
        if let (None, true) = (self.coords.get(&d), self.k.dims[d].each) {
            return Ok(format!("tb{d}"));
        }
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

    /// A tile's own index whose coordinate here is `tb{d} + within`: its
    /// dimension and in-block offset.
    fn within_of(&self, e: &Expr) -> Option<(DimId, String)> {
        match e {
            Expr::TileIndex(d) if !self.k.is_each(*d) => {
                self.within.get(d).map(|w| (*d, w.clone()))
            }
            _ => None,
        }
    }

    fn unsupported(&self, at: &str, message: impl Into<String>) -> CodegenError {
        CodegenError::Unsupported {
            kernel: self.k.name.clone(),
            at: at.to_string(),
            message: message.into(),
        }
    }

    /// The dtype `e` has by the checker's rules.
    pub fn dtype_of(&self, e: &Expr) -> DType {
        crate::check::type_of(self.k, self.spec, self.checked, e).map_or(DType::F32, |t| t.dtype)
    }

    /// [`ElemCtx::emit`] with each computation `e` repeats (a `let` used
    /// twice is inlined twice, as jsd's `log(m)` is) declared once before:
    /// `(declarations, the C expression, its C type)`. The declarations are
    /// statements for the same scope as the expression (names `tf_c0`, …);
    /// the compiler does not merge library calls such as `logf` by itself.
    pub fn emit_shared(&self, e: &Expr, at: &str) -> Result<(String, String, CTy), CodegenError> {
        let mut ctx = self.clone();
        let mut decls = String::new();
        for (i, x) in repeated(e, &self.precomputed).into_iter().enumerate() {
            let (c, ty) = ctx.emit(&x, at)?;
            let name = format!("tf_c{i}");
            decls.push_str(&format!("const {} {name} = {c}; ", ty.c()));
            ctx.precomputed.push((x, name));
        }
        let (c, ty) = ctx.emit(e, at)?;
        Ok((decls, c, ty))
    }

    /// The C expression of one element of `e`, and its C type.
    pub fn emit(&self, e: &Expr, at: &str) -> Result<(String, CTy), CodegenError> {
        if let Some((_, name)) = self.precomputed.iter().find(|(x, _)| x == e) {
            return Ok((name.clone(), self.dtype_of(e).cty()));
        }
        Ok(match e {
            Expr::Var(v) => {
                if let Some(name) = self.named_vars.get(v) {
                    (name.clone(), self.checked.vars[*v].dtype.cty())
                } else if let Some(value) = self.inline_vars.get(v) {
                    let (c, ty) = self.emit(value, at)?;
                    (format!("({c})"), ty)
                } else {
                    return Err(self.unsupported(
                        at,
                        format!(
                            "`{}` cannot be used here: its value lives in another part of the kernel",
                            self.k.vars[*v].name
                        ),
                    ));
                }
            }
            Expr::Load { tensor, index, at } => {
                let dtype = self.spec.tensors[*tensor].dtype;
                let (coords, mask) = match plain_index(index) {
                    // A tile's own indices: in the tensor where in the extent.
                    Some(dims) => {
                        let coords = dims
                            .iter()
                            .map(|d| self.coord(*d, at))
                            .collect::<Result<Vec<_>, _>>()?;
                        // A tile whose bounds are data may start before the tensor.
                        let mask = if dims.iter().any(|d| self.k.dims[*d].extent.is_none()) {
                            tensor_mask_signed(*tensor, &coords)
                        } else {
                            tensor_mask(*tensor, &coords)
                        };
                        (coords, mask)
                    }
                    None => {
                        let coords = index
                            .iter()
                            .map(|c| self.emit(c, at).map(|(x, t)| convert(&x, t, CTy::I64)))
                            .collect::<Result<Vec<_>, _>>()?;
                        let mask = tensor_mask_signed(*tensor, &coords);
                        (coords, mask)
                    }
                };
                let raw = format!("t{tensor}[{}]", tensor_offset(*tensor, &coords));
                let (v, ty) = widen(dtype, &raw);
                (format!("(({mask}) ? {v} : {})", zero(ty)), ty)
            }
            Expr::Full { dtype, value, .. } => match cast::cpu(cast::Num::F(*value), *dtype) {
                // The value as its dtype holds it (`full::<bf16>(…, 0.1)` is bf16's 0.1).
                cast::Num::F(v) => (float_lit(v), CTy::F32),
                cast::Num::I(v) => (int_lit(v, dtype.cty()), dtype.cty()),
            },
            Expr::Addmm { at, .. } => {
                return Err(self.unsupported(
                    at,
                    "`addmm` is supported as `acc = addmm(acc, a[(tm, tk)], b[(tk, tn)])`, \
                     the only statement of an inner `tile()` loop",
                ))
            }
            Expr::Binary { op, lhs, rhs, at } => {
                let ty = self.dtype_of(e).cty();
                let entry = op.entry();
                let (a, b) = if entry.rule == binary::Rule::Shift {
                    // The amount keeps its own value (as a `long long`): by the
                    // width or more the helpers shift everything out.
                    let (a, ta) = self.emit(lhs, at)?;
                    let (b, tb) = self.emit(rhs, at)?;
                    (convert(&a, ta, ty), convert(&b, tb, CTy::I64))
                } else {
                    let operand_ty = if ty == CTy::Bool { CTy::Bool } else { ty };
                    let (a, ta) = self.emit(lhs, at)?;
                    let (b, tb) = self.emit(rhs, at)?;
                    (convert(&a, ta, operand_ty), convert(&b, tb, operand_ty))
                };
                let template = match ty {
                    CTy::F32 if !entry.narrow.is_empty() && self.narrow.contains(e) => entry.narrow,
                    CTy::F32 => entry.cuda,
                    CTy::Bool => entry.cuda_bool,
                    _ => entry.cuda_int,
                };
                (fill(template, &[("a", &a), ("b", &b)]), ty)
            }
            Expr::TileIndex(d) => {
                if self.k.is_each(*d) {
                    (format!("tb{d}"), CTy::I64)
                } else {
                    (format!("(long long)({})", self.coord(*d, at)?), CTy::I64)
                }
            }
            Expr::Compare { op, lhs, rhs, .. }
                if self.within_of(lhs).is_some() && self.within_of(rhs).is_some() =>
            {
                // `tm.index() >= tn.index()` (a causal mask): the in-block offsets'
                // difference against the tile starts', in 32 bits, where the whole
                // indices took two 64-bit adds and compares an element.
                let (dl, ol) = self.within_of(lhs).unwrap_or_default();
                let (dr, or) = self.within_of(rhs).unwrap_or_default();
                (
                    format!(
                        "((int)({ol}) - (int)({or}) {} tf_sat30(tb{dr} - tb{dl}))",
                        op.symbol()
                    ),
                    CTy::Bool,
                )
            }
            Expr::Compare { op, lhs, rhs, at } => {
                let l = self.emit(lhs, at)?;
                let r = self.emit(rhs, at)?;
                let lt = crate::check::type_of(self.k, self.spec, self.checked, lhs);
                let rt = crate::check::type_of(self.k, self.spec, self.checked, rhs);
                let ty = match (lt, rt) {
                    (Some(a), Some(b)) => crate::check::meet(&a, &b),
                    _ => DType::F32,
                }
                .cty();
                (
                    format!(
                        "({} {} {})",
                        convert(&l.0, l.1, ty),
                        op.symbol(),
                        convert(&r.0, r.1, ty)
                    ),
                    CTy::Bool,
                )
            }
            Expr::Select {
                mask,
                then,
                otherwise,
                at,
            } => {
                let ty = self.dtype_of(e).cty();
                let (m, mt) = self.emit(mask, at)?;
                let a = self.emit(then, at)?;
                let b = self.emit(otherwise, at)?;
                (
                    // The type named: each side converts to it even where its
                    // C expression's own type differs (an integer promotion).
                    format!(
                        "tf_select<{}>({}, {}, {})",
                        ty.c(),
                        convert(&m, mt, CTy::Bool),
                        convert(&a.0, a.1, ty),
                        convert(&b.0, b.1, ty)
                    ),
                    ty,
                )
            }
            Expr::Unary { op, arg } => {
                // exp(a - b) as one FFMA and an ex2 (a softmax's shape).
                if let (
                    UnOp::Exp,
                    Expr::Binary {
                        op: BinOp::Sub,
                        lhs,
                        rhs,
                        ..
                    },
                ) = (op, &**arg)
                {
                    if self.dtype_of(arg) == DType::F32 {
                        let (b, tb) = self.emit(rhs, at)?;
                        if let Some((raw, scale)) = match &**lhs {
                            Expr::Var(v) => self.scaled_vars.get(v),
                            _ => None,
                        } {
                            let code = format!(
                                "tf_exp_diff_scaled({raw}, {scale}, {})",
                                convert(&b, tb, CTy::F32)
                            );
                            return Ok((code, CTy::F32));
                        }
                        let (a, ta) = self.emit(lhs, at)?;
                        let code = format!(
                            "tf_exp_diff({}, {})",
                            convert(&a, ta, CTy::F32),
                            convert(&b, tb, CTy::F32)
                        );
                        return Ok((code, CTy::F32));
                    }
                }
                let ty = self.dtype_of(e).cty();
                let (x, tx) = self.emit(arg, at)?;
                let entry = op.entry();
                let (template, x) = match (entry.rule, ty) {
                    (_, CTy::F32) => (entry.cuda, convert(&x, tx, CTy::F32)),
                    (unary::Rule::Bits, CTy::Bool) => (entry.cuda_bool, x),
                    _ => (entry.cuda_int, convert(&x, tx, ty)),
                };
                (fill(template, &[("x", &x)]), ty)
            }
            Expr::Cast { arg, dtype } => {
                let x = self.emit(arg, at)?;
                match dtype {
                    // `.cast()` at a store: the store rounds to the tensor's type.
                    None => x,
                    Some(t) => {
                        // A float that can only be an integer the type holds.
                        let exact = match x.1 {
                            CTy::F32 if t.is_int() => {
                                let f = self.integral.fact(arg, &|e| self.dtype_of(e));
                                (f.integral && !f.nan)
                                    .then(|| cast::cuda_integral(&x.0, f.lo, f.hi, *t))
                                    .flatten()
                            }
                            _ => None,
                        };
                        (exact.unwrap_or_else(|| cast::cuda(&x.0, x.1, *t)), t.cty())
                    }
                }
            }
            Expr::Rand {
                kind,
                seed,
                offset,
                at,
            } => {
                let (s, st) = self.emit(seed, at)?;
                let (o, ot) = self.emit(offset, at)?;
                let code = kind.cuda(&convert(&s, st, CTy::I64), &convert(&o, ot, CTy::U32));
                let ty = if *kind == RandKind::Bits {
                    CTy::U32
                } else {
                    CTy::F32
                };
                (code, ty)
            }
            Expr::IfConst {
                cond,
                then,
                otherwise,
                at,
            } => {
                let ty = self.dtype_of(e).cty();
                let c = self.cond(cond, at)?;
                let a = self.emit(then, at)?;
                let b = self.emit(otherwise, at)?;
                (
                    format!(
                        "(({c}) ? {} : {})",
                        convert(&a.0, a.1, ty),
                        convert(&b.0, b.1, ty)
                    ),
                    ty,
                )
            }
            Expr::Reduce { op, at, .. } => {
                return Err(self.unsupported(
                    at,
                    format!(
                    "`.{}()` is computed by the lowering before the elementwise code that uses it",
                    op.name()
                ),
                ))
            }
            Expr::ArgReduce { op, at, .. } => {
                return Err(self.unsupported(
                    at,
                    format!(
                        "`.{}()` is computed by the general lowering before the elementwise code that uses it",
                        op.arg_name().unwrap_or("argmax")
                    ),
                ))
            }
            Expr::Scan { op, at, .. } => {
                return Err(self.unsupported(
                    at,
                    format!(
                        "`.{}()` is computed by the general lowering before the elementwise code that uses it",
                        op.scan_name()
                    ),
                ))
            }
            Expr::Int(v) => (int_lit(*v, CTy::I64), CTy::I64),
            Expr::Float(v) => (float_lit(*v), CTy::F32),
            Expr::Scalar(s) => match self.spec.scalars[*s] {
                ScalarKind::Float => (format!("s{s}"), CTy::F32),
                k => {
                    // Passed as a `long long`; computed in its own type.
                    let t = k.dtype().cty();
                    (convert(&format!("s{s}"), CTy::I64, t), t)
                }
            },
            Expr::Const(c) => (
                int_lit(self.spec.constexprs.get(*c).copied().unwrap_or(0), CTy::I64),
                CTy::I64,
            ),
            Expr::TileBegin(d) => (format!("tb{d}"), CTy::I64),
            Expr::TileEnd(d) => (
                format!("tf_min_i(tb{d} + {}, {})", self.block(*d), self.end(*d)),
                CTy::I64,
            ),
            Expr::TileSize(d) => (
                format!(
                    "(tf_min_i(tb{d} + {b}, {e}) - tb{d})",
                    b = self.block(*d),
                    e = self.end(*d)
                ),
                CTy::I64,
            ),
        })
    }

    /// A runtime condition (scalars) as a C `bool` expression.
    pub fn cond(&self, c: &Cond, at: &str) -> Result<String, CodegenError> {
        Ok(match c {
            Cond::Cmp { op, lhs, rhs } => {
                let cmp = Expr::Compare {
                    op: *op,
                    lhs: Box::new(lhs.clone()),
                    rhs: Box::new(rhs.clone()),
                    at: at.to_string(),
                };
                self.emit(&cmp, at)?.0
            }
            Cond::Not(c) => format!("!({})", self.cond(c, at)?),
            Cond::And(a, b) => format!("({} && {})", self.cond(a, at)?, self.cond(b, at)?),
            Cond::Or(a, b) => format!("({} || {})", self.cond(a, at)?, self.cond(b, at)?),
            Cond::NonZero(e) => {
                let (x, t) = self.emit(e, at)?;
                convert(&x, t, CTy::Bool)
            }
        })
    }

    fn block(&self, d: DimId) -> String {
        if self.k.is_each(d) {
            "1".into()
        } else {
            format!("B{d}")
        }
    }

    /// The C bound of dimension `d`'s loop: its extent, or its range's end.
    fn end(&self, d: DimId) -> String {
        end_of(self.k, d)
    }
}

/// The C bound of dimension `d`'s tiles: the host extent `s{n}`, or the
/// `tf_end{d}` its loop's range sets.
pub fn end_of(k: &Kernel, d: DimId) -> String {
    match k.dims[d].extent {
        Some(s) => format!("s{s}"),
        None => format!("tf_end{d}"),
    }
}

/// The computations (not loads, variables or constants) that occur more than
/// once in `e`, inner ones first, each once; not looking inside what is
/// `done` already (a reduction computed before, with its argument).
fn repeated(e: &Expr, done: &[(Expr, String)]) -> Vec<Expr> {
    fn visit<'a>(e: &'a Expr, done: &[(Expr, String)], seen: &mut Vec<(&'a Expr, usize)>) {
        if matches!(e, Expr::Reduce { .. }) || done.iter().any(|(x, _)| x == e) {
            return;
        }
        for c in e.children() {
            visit(c, done, seen);
        }
        let computes = matches!(
            e,
            Expr::Binary { .. } | Expr::Unary { .. } | Expr::Select { .. } | Expr::Rand { .. }
        );
        if computes {
            match seen.iter_mut().find(|(x, _)| *x == e) {
                Some((_, n)) => *n += 1,
                None => seen.push((e, 1)),
            }
        }
    }
    let mut seen = Vec::new();
    visit(e, done, &mut seen);
    seen.into_iter()
        .filter(|&(_, n)| n > 1)
        .map(|(x, _)| x.clone())
        .collect()
}
