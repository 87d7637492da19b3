//! Type and shape checks: every expression gets a set of tile dimensions and a dtype,
//! and every statement is checked against the tensors it touches.
//!
//! Arithmetic on floats is done in f32 (16-bit values are widened when loaded and
//! rounded when stored or cast), so float results are `f32`; integer arithmetic is
//! 64-bit.

use crate::dtype::DType;
use crate::error::CodegenError;
use crate::ir::*;
use crate::spec::{ScalarKind, Spec};

/// The type of a tile value: its dimensions (sorted, no repeats) and dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ty {
    pub dims: Vec<DimId>,
    pub dtype: DType,
}

impl Ty {
    fn scalar(dtype: DType) -> Ty {
        Ty {
            dims: Vec::new(),
            dtype,
        }
    }
}

/// What checking learned, for the lowering.
#[derive(Clone, Debug)]
pub struct Checked {
    /// The type of each local variable.
    pub vars: Vec<Ty>,
}

/// Checks `kernel` for the argument facts in `spec`.
pub fn check(kernel: &Kernel, spec: &Spec) -> Result<Checked, CodegenError> {
    let kernel = &*kernel.specialize(&spec.constexprs)?;
    let mut c = Checker {
        k: kernel,
        spec,
        vars: vec![None; kernel.vars.len()],
        scope: kernel.grid.clone(),
    };
    c.check_args()?;
    c.stmts(&kernel.body)?;
    let vars = c
        .vars
        .into_iter()
        .map(|t| t.unwrap_or(Ty::scalar(DType::F32)))
        .collect();
    Ok(Checked { vars })
}

/// The tile dimensions of `e`, an expression of `kernel` (specialized and
/// checked for `spec`, with `checked` its result), by the checker's own rules;
/// empty if it does not check.
pub(crate) fn dims_of(kernel: &Kernel, spec: &Spec, checked: &Checked, e: &Expr) -> Vec<DimId> {
    let mut c = Checker {
        k: kernel,
        spec,
        vars: checked.vars.iter().cloned().map(Some).collect(),
        scope: (0..kernel.dims.len()).collect(),
    };
    c.expr(e, "").map(|t| t.dims).unwrap_or_default()
}

struct Checker<'a> {
    k: &'a Kernel,
    spec: &'a Spec,
    vars: Vec<Option<Ty>>,
    /// Tile dimensions of the enclosing loops.
    scope: Vec<DimId>,
}

fn union(a: &[DimId], b: &[DimId]) -> Vec<DimId> {
    let mut v: Vec<DimId> = a.iter().chain(b).copied().collect();
    v.sort_unstable();
    v.dedup();
    v
}

impl Checker<'_> {
    /// Tile `d` is bound by an enclosing loop here.
    fn in_scope(&self, d: DimId, at: &str) -> Result<(), CodegenError> {
        if self.scope.contains(&d) {
            Ok(())
        } else {
            Err(self.err(
                at,
                format!(
                    "tile `{}` is used outside the loop that defines it",
                    self.k.dims[d].name
                ),
            ))
        }
    }

    fn err(&self, at: &str, message: impl Into<String>) -> CodegenError {
        CodegenError::Type {
            kernel: self.k.name.clone(),
            at: at.to_string(),
            message: message.into(),
        }
    }

    fn dim_names(&self, dims: &[DimId]) -> String {
        let names: Vec<&str> = dims.iter().map(|&d| self.k.dims[d].name.as_str()).collect();
        format!("[{}]", names.join(", "))
    }

    fn check_args(&self) -> Result<(), CodegenError> {
        let k = self.k;
        let arg_err = |arg: &str, message: String| CodegenError::Argument {
            kernel: k.name.clone(),
            arg: arg.to_string(),
            message,
        };
        if self.spec.tensors.len() != k.tensors.len()
            || self.spec.scalars.len() != k.scalars.len()
            || self.spec.constexprs.len() != k.constexprs.len()
        {
            return Err(arg_err(
                "(all)",
                format!(
                    "the launch passed {} tensors, {} scalars and {} constexprs; the kernel has {}, {} and {}",
                    self.spec.tensors.len(),
                    self.spec.scalars.len(),
                    self.spec.constexprs.len(),
                    k.tensors.len(),
                    k.scalars.len(),
                    k.constexprs.len()
                ),
            ));
        }
        for (p, s) in k.tensors.iter().zip(&self.spec.tensors) {
            if s.rank != p.rank {
                return Err(arg_err(
                    &p.name,
                    format!(
                        "expected a {}-D tensor (the kernel indexes it with {} tile(s)), got a {}-D one",
                        p.rank, p.rank, s.rank
                    ),
                ));
            }
            if let Some(d) = p.declared {
                if d != s.dtype {
                    return Err(arg_err(
                        &p.name,
                        format!(
                            "declared as Tensor<{d}> but the launch passed Tensor<{}>",
                            s.dtype
                        ),
                    ));
                }
            }
        }
        for (d, dim) in k.dims.iter().enumerate() {
            if self.spec.scalars[dim.extent] != ScalarKind::Int {
                return Err(arg_err(
                    &k.scalars[dim.extent].name,
                    format!(
                        "is the extent of tile `{}` (dimension {d}) and must be an integer",
                        dim.name
                    ),
                ));
            }
        }
        Ok(())
    }

    fn stmts(&mut self, stmts: &[Stmt]) -> Result<(), CodegenError> {
        for s in stmts {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), CodegenError> {
        match s {
            Stmt::Let { var, value, at } => {
                let t = self.expr(value, at)?;
                self.vars[*var] = Some(t);
            }
            Stmt::Assign { var, value, at } => {
                let v = &self.k.vars[*var];
                if !v.mutable {
                    return Err(self.err(
                        at,
                        format!("`{}` is assigned but not declared `let mut`", v.name),
                    ));
                }
                let Some(old) = self.vars[*var].clone() else {
                    return Err(self.err(
                        at,
                        format!("`{}` is assigned before it has a value", v.name),
                    ));
                };
                let t = self.expr(value, at)?;
                if t.dims != old.dims {
                    return Err(self.err(
                        at,
                        format!(
                            "`{}` has tile dimensions {} but the new value has {}",
                            v.name,
                            self.dim_names(&old.dims),
                            self.dim_names(&t.dims)
                        ),
                    ));
                }
            }
            Stmt::Store {
                tensor,
                index,
                value,
                at,
            } => {
                self.index(*tensor, index, at)?;
                let t = self.expr_for_store(value, self.spec.tensors[*tensor].dtype, at)?;
                let idx = union(index, &[]);
                if union(&t.dims, &idx) != idx {
                    return Err(self.err(
                        at,
                        format!(
                            "the stored value has tile dimensions {} but `{}` is indexed by {}; \
                             every dimension of the value must index the tensor",
                            self.dim_names(&t.dims),
                            self.k.tensors[*tensor].name,
                            self.dim_names(&idx)
                        ),
                    ));
                }
                let dst = self.spec.tensors[*tensor].dtype;
                if dst.is_float() != t.dtype.is_float() {
                    return Err(self.err(
                        at,
                        format!(
                            "cannot store a {} value into `{}`, a Tensor<{dst}>; convert it with `.cast::<{dst}>()`",
                            t.dtype, self.k.tensors[*tensor].name
                        ),
                    ));
                }
            }
            Stmt::Wait {
                tensor,
                index,
                end,
                value,
                at,
            } => {
                let name = &self.k.tensors[*tensor].name;
                let ts = &self.spec.tensors[*tensor];
                if ts.rank != 1 || !matches!(ts.dtype, DType::U32 | DType::I32) {
                    return Err(self.err(
                        at,
                        format!(
                            "`wait` needs a 1-D Tensor<u32> (or i32) of flags; `{name}` is a {}-D Tensor<{}>",
                            ts.rank, ts.dtype
                        ),
                    ));
                }
                let ends = end.iter().map(|e| ("end of the flag range", e));
                let parts = [("index", index), ("value", value)].into_iter().chain(ends);
                self.integer_scalars("wait", parts, at)?;
            }
            Stmt::Signal {
                tensor,
                index,
                value,
                at,
            } => {
                let name = &self.k.tensors[*tensor].name;
                let ts = &self.spec.tensors[*tensor];
                if ts.rank != 1 || ts.dtype != DType::U32 {
                    return Err(self.err(
                        at,
                        format!(
                            "`signal` needs a 1-D Tensor<u32> of counters; `{name}` is a {}-D Tensor<{}>",
                            ts.rank, ts.dtype
                        ),
                    ));
                }
                self.integer_scalars("signal", [("index", index), ("value", value)], at)?;
            }
            Stmt::Loop { dim, body, until } => {
                if let Some(u) = until {
                    let what = format!("bound of `tile({}).until(…)`", self.k.dims[*dim].name);
                    let at = format!("for {} in tile(…).until(…)", self.k.dims[*dim].name);
                    self.integer_scalar(&what, u, &at)?;
                }
                self.scope.push(*dim);
                self.stmts(body)?;
                self.scope.pop();
            }
            // `check` runs on the specialized kernel, which has none.
            Stmt::If { at, .. } => return Err(self.err(at, "a compile-time `if` was not decided")),
        }
        Ok(())
    }

    /// The `parts` of statement `stmt` (`wait`, `signal`) must be integer scalars.
    fn integer_scalars<'e>(
        &mut self,
        stmt: &str,
        parts: impl IntoIterator<Item = (&'static str, &'e Expr)>,
        at: &str,
    ) -> Result<(), CodegenError> {
        for (what, e) in parts {
            self.integer_scalar(&format!("{what} of `{stmt}`"), e, at)?;
        }
        Ok(())
    }

    /// `e`, the `what` of a statement at `at`, must be an integer scalar.
    fn integer_scalar(&mut self, what: &str, e: &Expr, at: &str) -> Result<(), CodegenError> {
        let t = self.expr(e, at)?;
        if !t.dims.is_empty() || t.dtype.is_float() {
            return Err(self.err(
                at,
                format!(
                    "the {what} must be an integer scalar (e.g. `tm.begin() / rows_per_chunk` or `tm.end()`), got a {} tile with dimensions {}",
                    t.dtype,
                    self.dim_names(&t.dims)
                ),
            ));
        }
        Ok(())
    }

    fn index(&self, tensor: TensorId, index: &[DimId], at: &str) -> Result<(), CodegenError> {
        let p = &self.k.tensors[tensor];
        if index.len() != p.rank {
            return Err(self.err(
                at,
                format!(
                    "`{}` is {}-D but is indexed with {} tiles",
                    p.name,
                    p.rank,
                    index.len()
                ),
            ));
        }
        for (i, d) in index.iter().enumerate() {
            if index[..i].contains(d) {
                return Err(self.err(
                    at,
                    format!("tile `{}` indexes `{}` twice", self.k.dims[*d].name, p.name),
                ));
            }
            if !self.scope.contains(d) {
                return Err(self.err(
                    at,
                    format!(
                        "tile `{}` is used outside the loop that defines it",
                        self.k.dims[*d].name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A store accepts `.cast()` with no type (it takes the tensor's).
    fn expr_for_store(&mut self, e: &Expr, target: DType, at: &str) -> Result<Ty, CodegenError> {
        match e {
            Expr::Cast { arg, dtype: None } => {
                let t = self.expr(arg, at)?;
                Ok(Ty {
                    dims: t.dims,
                    dtype: target,
                })
            }
            _ => self.expr(e, at),
        }
    }

    fn expr(&mut self, e: &Expr, at: &str) -> Result<Ty, CodegenError> {
        Ok(match e {
            Expr::Var(v) => self.vars[*v].clone().ok_or_else(|| {
                self.err(
                    at,
                    format!("`{}` is used before it has a value", self.k.vars[*v].name),
                )
            })?,
            Expr::Load { tensor, index, at } => {
                self.index(*tensor, index, at)?;
                Ty {
                    dims: union(index, &[]),
                    dtype: self.spec.tensors[*tensor].dtype,
                }
            }
            Expr::Full { dims, dtype, .. } => {
                for d in dims {
                    self.in_scope(*d, at)?;
                }
                Ty {
                    dims: union(dims, &[]),
                    dtype: *dtype,
                }
            }
            Expr::Addmm { acc, a, b, at } => self.addmm(acc, a, b, at)?,
            Expr::Binary { op, lhs, rhs, at } => {
                let l = self.expr(lhs, at)?;
                let r = self.expr(rhs, at)?;
                let dtype = if l.dtype.is_float() || r.dtype.is_float() {
                    DType::F32
                } else {
                    DType::I64
                };
                if *op == BinOp::Rem && dtype.is_float() {
                    return Err(self.err(at, "`%` is defined on integers only"));
                }
                Ty {
                    dims: union(&l.dims, &r.dims),
                    dtype,
                }
            }
            Expr::Compare { lhs, rhs, at, .. } => {
                let l = self.expr(lhs, at)?;
                let r = self.expr(rhs, at)?;
                Ty {
                    dims: union(&l.dims, &r.dims),
                    dtype: DType::I64,
                }
            }
            Expr::Select {
                mask,
                then,
                otherwise,
                at,
            } => {
                let m = self.expr(mask, at)?;
                let a = self.expr(then, at)?;
                let b = self.expr(otherwise, at)?;
                if m.dtype.is_float() {
                    return Err(self.err(
                        at,
                        "the mask of `select(mask, a, b)` is a comparison or an integer tile, e.g. `tm.index() >= tn.index()`",
                    ));
                }
                Ty {
                    dims: union(&union(&m.dims, &a.dims), &b.dims),
                    dtype: if a.dtype.is_float() || b.dtype.is_float() {
                        DType::F32
                    } else {
                        DType::I64
                    },
                }
            }
            Expr::TileIndex(d) => {
                self.in_scope(*d, at)?;
                Ty {
                    dims: vec![*d],
                    dtype: DType::I64,
                }
            }
            Expr::Unary { op, arg } => {
                let t = self.expr(arg, at)?;
                let keeps_int = matches!(op, UnOp::Neg | UnOp::Abs | UnOp::Relu);
                Ty {
                    dims: t.dims,
                    dtype: if keeps_int && !t.dtype.is_float() {
                        DType::I64
                    } else {
                        DType::F32
                    },
                }
            }
            Expr::Cast { arg, dtype } => {
                let t = self.expr(arg, at)?;
                let Some(dtype) = dtype else {
                    return Err(self.err(
                        at,
                        "`.cast()` without a type is allowed only as the whole value of a store; \
                         elsewhere write the type, e.g. `.cast::<bf16>()`",
                    ));
                };
                Ty {
                    dims: t.dims,
                    dtype: *dtype,
                }
            }
            Expr::Reduce { op, arg, dim, at } => {
                let t = self.expr(arg, at)?;
                if !t.dims.contains(dim) {
                    return Err(self.err(
                        at,
                        format!(
                            "`.{}({})` reduces along tile `{}`, but the value has tiles [{}]",
                            op.name(),
                            self.k.dims[*dim].name,
                            self.k.dims[*dim].name,
                            self.dim_names(&t.dims)
                        ),
                    ));
                }
                if !t.dtype.is_float() {
                    return Err(self.err(
                        at,
                        format!(
                            "`.{}()` reduces floating-point tiles; cast first: `.cast::<f32>()`",
                            op.name()
                        ),
                    ));
                }
                Ty {
                    dims: t.dims.into_iter().filter(|d| d != dim).collect(),
                    dtype: DType::F32,
                }
            }
            Expr::Int(_)
            | Expr::Const(_)
            | Expr::TileBegin(_)
            | Expr::TileEnd(_)
            | Expr::TileSize(_) => {
                if let Expr::TileBegin(d) | Expr::TileEnd(d) | Expr::TileSize(d) = e {
                    self.in_scope(*d, at)?;
                }
                Ty::scalar(DType::I64)
            }
            Expr::Float(_) => Ty::scalar(DType::F32),
            Expr::IfConst { at, .. } => {
                return Err(self.err(at, "a compile-time `if` was not decided"))
            }
            Expr::Scalar(s) => Ty::scalar(match self.spec.scalars[*s] {
                ScalarKind::Int => DType::I64,
                ScalarKind::Float => DType::F32,
            }),
        })
    }

    /// `addmm(acc, a, b)` contracts by name: over the one tile that `a` and `b`
    /// both have and `acc` lacks. The other tiles of the operands (the rows of
    /// `a`, the columns of `b`, and batch tiles both share) are `acc`'s. So
    /// `addmm(s, q[(tm, td)], k[(tn, td)])` is `s + q·kᵀ`, with no transpose
    /// written.
    fn addmm(&mut self, acc: &Expr, a: &Expr, b: &Expr, at: &str) -> Result<Ty, CodegenError> {
        let acc_t = self.expr(acc, at)?;
        let a_t = self.expr(a, at)?;
        let b_t = self.expr(b, at)?;
        if !a_t.dtype.is_half() || a_t.dtype != b_t.dtype {
            return Err(self.err(
                at,
                format!(
                    "`addmm` multiplies bf16 or f16 tiles of the same dtype on tensor cores; got {} and {} \
                     (convert a computed tile with `.cast::<bf16>()`)",
                    a_t.dtype, b_t.dtype
                ),
            ));
        }
        let shared: Vec<DimId> = a_t
            .dims
            .iter()
            .copied()
            .filter(|d| b_t.dims.contains(d) && !acc_t.dims.contains(d))
            .collect();
        let [k] = shared.as_slice() else {
            return Err(self.err(
                at,
                format!(
                    "`addmm(acc, a, b)` contracts over the one tile that both `a` ({}) and `b` ({}) have and \
                     `acc` ({}) lacks; here {} such tiles, e.g. write `addmm(acc, a[(tm, tk)], b[(tk, tn)])`",
                    self.dim_names(&a_t.dims),
                    self.dim_names(&b_t.dims),
                    self.dim_names(&acc_t.dims),
                    if shared.is_empty() { "there are no".to_string() } else { format!("{} has", self.dim_names(&shared)) }
                ),
            ));
        };
        let out: Vec<DimId> = union(&a_t.dims, &b_t.dims)
            .into_iter()
            .filter(|d| d != k)
            .collect();
        if acc_t.dtype != DType::F32 || acc_t.dims != out {
            let names: Vec<&str> = out.iter().map(|&d| self.k.dims[d].name.as_str()).collect();
            return Err(self.err(
                at,
                format!(
                    "the accumulator of `addmm` must be an f32 tile over {} (e.g. `zeros::<f32>([{}])`), got a {} tile over {}",
                    self.dim_names(&out),
                    names.join(", "),
                    acc_t.dtype,
                    self.dim_names(&acc_t.dims)
                ),
            ));
        }
        Ok(acc_t)
    }
}
