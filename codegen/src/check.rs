//! Type and shape checks: every expression gets a set of tile dimensions and a
//! dtype, and every statement is checked against the tensors it touches. The
//! type rules of the primitives are the tables' ([`crate::prims`]).
//!
//! Arithmetic on floats is done in f32 (16-bit values are widened when loaded
//! and rounded when stored or cast), so float results are `f32`; integers
//! promote as C's do ([`DType::promote`]); comparisons give masks (`bool`).
//! An integer literal takes the type of the integer it meets (`x + 1` on an
//! i32 tile is i32), as Rust infers it; so does a value made of literals
//! only, through `select`, arithmetic and reductions: in
//! `count + select(v > 0.0, 1, 0).sum(tm)` with an i32 `count`, the
//! `select` and its sum are i32 too, computed so on the GPU and in interpret
//! mode ([`crate::literals`]).

use crate::dtype::DType;
use crate::error::CodegenError;
use crate::ir::*;
use crate::spec::Spec;

/// The type of a tile value: its dimensions (sorted, no repeats) and dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ty {
    pub dims: Vec<DimId>,
    pub dtype: DType,
    /// Made of literals only: an integer literal adapts to the integer type
    /// it is combined with.
    pub weak: bool,
}

impl Ty {
    pub fn new(dims: Vec<DimId>, dtype: DType) -> Ty {
        Ty {
            dims,
            dtype,
            weak: false,
        }
    }

    fn scalar(dtype: DType) -> Ty {
        Ty::new(Vec::new(), dtype)
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
    Ok(run(kernel, spec, false)?.0)
}

/// The type of every expression of `kernel`, by address, as the checker gave it.
#[derive(Clone, Debug, Default)]
pub struct Types {
    map: std::collections::HashMap<usize, Ty>,
}

impl Types {
    /// The type of `e`, an expression of the kernel these types are of.
    pub fn of(&self, e: &Expr) -> Option<&Ty> {
        self.map.get(&(e as *const Expr as usize))
    }
}

/// Checks `kernel`, already specialized ([`Kernel::specialize`]) for
/// `spec.constexprs`, and returns every expression's type too: what interpret
/// mode computes each value as, so it types values by the checker's own rules.
pub fn check_types(kernel: &Kernel, spec: &Spec) -> Result<(Checked, Types), CodegenError> {
    run(kernel, spec, true)
}

fn run(kernel: &Kernel, spec: &Spec, record: bool) -> Result<(Checked, Types), CodegenError> {
    let mut c = Checker::new(kernel, spec, record);
    c.check_args()?;
    c.stmts(&kernel.body)?;
    let types = c.types.take().unwrap_or_default();
    let vars = c
        .vars
        .into_iter()
        .map(|t| t.unwrap_or(Ty::scalar(DType::F32)))
        .collect();
    Ok((Checked { vars }, types))
}

/// The integer literals of `kernel` (specialized for `spec.constexprs`) in
/// values made of literals only that meet an integer of another type, by
/// address, with that type ([`crate::literals`]).
pub(crate) fn literal_types(
    kernel: &Kernel,
    spec: &Spec,
) -> Result<crate::literals::Found, CodegenError> {
    let mut c = Checker::new(kernel, spec, true);
    c.find = true;
    c.check_args()?;
    c.stmts(&kernel.body)?;
    Ok(c.found)
}

/// The type of `e`, an expression of `kernel` (specialized and checked for
/// `spec`, with `checked` its result), by the checker's own rules; `None` if
/// it does not check.
pub fn type_of(kernel: &Kernel, spec: &Spec, checked: &Checked, e: &Expr) -> Option<Ty> {
    let mut c = Checker {
        k: kernel,
        spec,
        vars: checked.vars.iter().cloned().map(Some).collect(),
        scope: (0..kernel.dims.len()).collect(),
        loops: Vec::new(),
        carrying: Vec::new(),
        partials: vec![None; kernel.vars.len()],
        types: None,
        find: false,
        found: Default::default(),
    };
    c.expr(e, "").ok()
}

/// The tile dimensions of `e` (see [`type_of`]); empty if it does not check.
pub(crate) fn dims_of(kernel: &Kernel, spec: &Spec, checked: &Checked, e: &Expr) -> Vec<DimId> {
    type_of(kernel, spec, checked, e)
        .map(|t| t.dims)
        .unwrap_or_default()
}

struct Checker<'a> {
    k: &'a Kernel,
    spec: &'a Spec,
    vars: Vec<Option<Ty>>,
    /// Tile dimensions of the enclosing loops (the grid's first).
    scope: Vec<DimId>,
    /// The enclosing inner loops' dimensions, outermost first.
    loops: Vec<DimId>,
    /// Those of them whose body assigns a variable (can carry a scan's
    /// running value from one block to the next).
    carrying: Vec<DimId>,
    /// Per variable bound in the innermost loop around it: the loop dimension
    /// its value reduces over (one block's partial result).
    partials: Vec<Option<DimId>>,
    /// Every expression's type, when asked for ([`check_types`]).
    types: Option<Types>,
    /// Whether to look for literal-made values meeting an integer of another
    /// type (types recorded), and their literals found so far.
    find: bool,
    found: crate::literals::Found,
}

impl<'a> Checker<'a> {
    fn new(k: &'a Kernel, spec: &'a Spec, record: bool) -> Checker<'a> {
        Checker {
            k,
            spec,
            vars: vec![None; k.vars.len()],
            scope: k.grid.clone(),
            loops: Vec::new(),
            carrying: Vec::new(),
            partials: vec![None; k.vars.len()],
            types: record.then(Types::default),
            find: false,
            found: Default::default(),
        }
    }
}

fn union(a: &[DimId], b: &[DimId]) -> Vec<DimId> {
    let mut v: Vec<DimId> = a.iter().chain(b).copied().collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// The type two operands meet at (arithmetic, comparisons, `select`): a
/// weak (literal) integer takes the other integer's type; otherwise
/// [`DType::promote`].
pub fn meet(a: &Ty, b: &Ty) -> DType {
    match (a.weak, b.weak) {
        (true, false) if !a.dtype.is_float() && !b.dtype.is_float() => DType::arith(b.dtype),
        (false, true) if !a.dtype.is_float() && !b.dtype.is_float() => DType::arith(a.dtype),
        _ => DType::promote(a.dtype, b.dtype),
    }
}

impl Checker<'_> {
    /// `a` and `b` meet (arithmetic, `select`): a literal-made integer value
    /// on one side takes the other side's integer type, computed in it.
    fn note_meet(&mut self, a: (&Expr, &Ty), b: (&Expr, &Ty)) {
        let (true, Some(types)) = (self.find, &self.types) else {
            return;
        };
        for ((x, tx), (_, ty)) in [(a, b), (b, a)] {
            if tx.weak && tx.dtype.is_int() && !ty.weak && ty.dtype.is_int() {
                let t = DType::arith(ty.dtype);
                if t != tx.dtype {
                    crate::literals::resolve(x, t, &|e| types.of(e), &mut self.found);
                }
            }
        }
    }

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

    /// A tile's dimensions as a value has them: none for an `each` index.
    fn tile_dims(&self, d: DimId) -> Vec<DimId> {
        if self.k.is_each(d) {
            Vec::new()
        } else {
            vec![d]
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
                        "expected a {}-D tensor (the kernel indexes it with {} component(s)), got a {}-D one",
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
            match dim.extent {
                Some(e) if !self.spec.scalars[e].is_int() => {
                    return Err(arg_err(
                        &k.scalars[e].name,
                        format!(
                            "is the extent of tile `{}` (dimension {d}) and must be an integer",
                            dim.name
                        ),
                    ))
                }
                None if k.grid.contains(&d) => {
                    return Err(self.err(
                        &dim.name,
                        format!(
                        "the grid tile `{}` needs an extent computed on the host, e.g. `tile(n)`",
                        dim.name
                    ),
                    ))
                }
                _ => {}
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
                self.partials[*var] = self.partial_of(value);
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
                if t.dtype.is_float() && !old.dtype.is_float() {
                    return Err(self.err(
                        at,
                        format!(
                            "`{}` holds {} values but the new value is a {}; convert it with `.cast::<{}>()`",
                            v.name, old.dtype, t.dtype, old.dtype
                        ),
                    ));
                }
                // A value carried across iterations is a sum of partials, not one.
                self.partials[*var] = None;
            }
            Stmt::Store {
                tensor,
                index,
                value,
                at,
            }
            | Stmt::Atomic {
                tensor,
                index,
                value,
                at,
                ..
            } => {
                let idx = self.index(*tensor, index, at)?;
                let t = self.expr_for_store(value, self.spec.tensors[*tensor].dtype, at)?;
                let name = &self.k.tensors[*tensor].name;
                if union(&t.dims, &idx) != idx {
                    return Err(self.err(
                        at,
                        format!(
                            "the stored value has tile dimensions {} but `{name}`'s index has {}; \
                             every dimension of the value must index the tensor",
                            self.dim_names(&t.dims),
                            self.dim_names(&idx)
                        ),
                    ));
                }
                let dst = self.spec.tensors[*tensor].dtype;
                if t.dtype.is_float() && !dst.is_float() {
                    return Err(self.err(
                        at,
                        format!(
                            "cannot store a {} value into `{name}`, a Tensor<{dst}>; convert it with `.cast::<{dst}>()`",
                            t.dtype
                        ),
                    ));
                }
                if let Stmt::Atomic { op, old, .. } = s {
                    op.check(dst).map_err(|m| self.err(at, m))?;
                    // The old values: one per place updated, of the tensor's type.
                    if let Some(v) = old {
                        self.vars[*v] = Some(Ty::new(idx.clone(), dst));
                        self.partials[*v] = None;
                    }
                } else {
                    self.lost_partials(value, &idx, at)?;
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
            Stmt::Loop {
                dim,
                body,
                until,
                range,
            } => {
                let name = &self.k.dims[*dim].name;
                let at = format!("for {name} in …");
                if let Some(u) = until {
                    self.integer_scalar(&format!("bound of `tile({name}).until(…)`"), u, &at)?;
                }
                match range {
                    Some(r) => {
                        self.integer_scalar("start of the loop's range", &r.begin, &at)?;
                        self.integer_scalar("end of the loop's range", &r.end, &at)?;
                    }
                    None if self.k.dims[*dim].extent.is_none() => {
                        return Err(self.err(&at, format!("the loop over `{name}` has no bounds")))
                    }
                    None => {}
                }
                self.scope.push(*dim);
                self.loops.push(*dim);
                let mut carries = false;
                walk_stmts(body, &mut |s| carries |= matches!(s, Stmt::Assign { .. }));
                if carries {
                    self.carrying.push(*dim);
                }
                self.stmts(body)?;
                if carries {
                    self.carrying.pop();
                }
                self.loops.pop();
                self.scope.pop();
            }
            Stmt::If {
                cond,
                then,
                otherwise,
                at,
            } => {
                for e in cond.exprs() {
                    let t = self.expr(e, at)?;
                    if !t.dims.is_empty() {
                        return Err(self.err(
                            at,
                            format!(
                                "an `if` branches the whole program, so its condition is a scalar; this one has tiles {} \
                                 (choose per element with `select(mask, a, b)`)",
                                self.dim_names(&t.dims)
                            ),
                        ));
                    }
                }
                self.stmts(then)?;
                self.stmts(otherwise)?;
            }
        }
        Ok(())
    }

    /// The loop dimension whose single block `value` reduces over, if it does
    /// (directly, or through a variable bound in that loop).
    fn partial_of(&self, value: &Expr) -> Option<DimId> {
        let mut found = None;
        value.walk(&mut |x| match x {
            Expr::Reduce { dim, .. } | Expr::ArgReduce { dim, .. }
                if self.loops.contains(dim) || self.k.grid.contains(dim) =>
            {
                found.get_or_insert(*dim);
            }
            Expr::Var(v) => {
                if let Some(d) = self.partials[*v] {
                    found.get_or_insert(d);
                }
            }
            _ => {}
        });
        found
    }

    /// A plain store of a reduction over one block of a loop (or of the
    /// grid) to a place that does not depend on that loop (grid) tile: each
    /// step (program) overwrites the last one's partial, so the result is one
    /// block's, not the whole extent's. Almost always a mistake.
    fn lost_partials(&self, value: &Expr, idx: &[DimId], at: &str) -> Result<(), CodegenError> {
        let Some(d) = self.partial_of(value) else {
            return Ok(());
        };
        let dim = &self.k.dims[d];
        if idx.contains(&d) || dim.whole {
            return Ok(());
        }
        let n = &dim.name;
        let message = if self.k.grid.contains(&d) {
            format!(
                "the stored value reduces over the grid tile `{n}`, so each program along `{n}` writes only its \
                 own block's partial result to the same place (the last one wins); add the partials with \
                 `atomic_add(…)`, or loop over `{n}` inside one program"
            )
        } else {
            format!(
                "the stored value reduces over one block of `{n}` and is stored at every step of the loop over \
                 `{n}`, so only the last block's partial result remains; accumulate across the loop \
                 (`let mut acc = zeros(…)` before it, `acc = acc + x.sum({n})` in it, store after it), or make one \
                 block cover the extent (`whole(…)`)"
            )
        };
        Err(self.err(at, message))
    }

    /// A scan `.{name}(d)` of a value of type `t`: `d` is one of its tiles,
    /// and the scan sees the whole extent along it, or a loop carries the
    /// running value from block to block. A scan over one block of a grid
    /// tile, or of a loop that carries nothing, restarts at every block: not
    /// what a prefix sum over the row means.
    fn scan_along(&self, op: ReduceOp, dim: DimId, t: &Ty, at: &str) -> Result<(), CodegenError> {
        let name = op.scan_name();
        let d = &self.k.dims[dim];
        let n = &d.name;
        if self.k.is_each(dim) {
            return Err(self.err(
                at,
                format!(
                    "`{n}` takes one index at a time, so there is nothing to scan along it; carry a running \
                     value across its loop instead"
                ),
            ));
        }
        if !t.dims.contains(&dim) {
            return Err(self.err(
                at,
                format!(
                    "`.{name}({n})` scans along tile `{n}`, but the value has tiles {}",
                    self.dim_names(&t.dims)
                ),
            ));
        }
        if d.whole {
            return Ok(());
        }
        if self.k.grid.contains(&dim) {
            return Err(self.err(
                at,
                format!(
                    "`.{name}({n})` scans one block of the grid tile `{n}`: each program would restart the scan \
                     at its own block; give the scan the whole extent (`whole(…)` in the `tile([…])`) or walk \
                     `{n}` in a loop that carries the running value"
                ),
            ));
        }
        if self.loops.contains(&dim) && !self.carrying.contains(&dim) {
            let bin = op.binary();
            let with = |a: &str, b: &str| match bin.function() {
                Some(f) => format!("{f}({a}, {b})"),
                None => format!("{a} {} {b}", bin.symbol()),
            };
            let (first, rest) = (
                with("carry", &format!("x.{name}({n})")),
                with("carry", &format!("x.{}({n})", op.name())),
            );
            return Err(self.err(
                at,
                format!(
                    "`.{name}({n})` scans one block of the loop over `{n}` at a time, and the loop carries \
                     nothing from block to block, so every block restarts the scan; carry the running value \
                     (`out[…] = {first}; carry = {rest};`), or make one block cover the extent (`whole(…)`)"
                ),
            ));
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
        if !t.dims.is_empty() || !t.dtype.is_int() {
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

    /// Checks an index of `tensor` and returns its tile dimensions.
    fn index(
        &mut self,
        tensor: TensorId,
        index: &[Expr],
        at: &str,
    ) -> Result<Vec<DimId>, CodegenError> {
        let p = &self.k.tensors[tensor];
        if index.len() != p.rank {
            return Err(self.err(
                at,
                format!(
                    "`{}` is {}-D but is indexed with {} component(s)",
                    p.name,
                    p.rank,
                    index.len()
                ),
            ));
        }
        let mut dims = Vec::new();
        for (axis, c) in index.iter().enumerate() {
            let t = self.expr(c, at)?;
            if !t.dtype.is_int() {
                return Err(self.err(
                    at,
                    format!(
                        "component {axis} of `{}`'s index is a {}; indices are integers (a tile like `tn`, \
                         `tn + offset`, a gathered `ids[tt]`, or `x.cast::<i64>()`)",
                        p.name, t.dtype
                    ),
                ));
            }
            dims = union(&dims, &t.dims);
        }
        Ok(dims)
    }

    /// A store accepts `.cast()` with no type (it takes the tensor's).
    fn expr_for_store(&mut self, e: &Expr, target: DType, at: &str) -> Result<Ty, CodegenError> {
        match e {
            Expr::Cast { arg, dtype: None } => {
                let t = self.expr(arg, at)?;
                let t = Ty::new(t.dims, target);
                if let Some(types) = &mut self.types {
                    types.map.insert(e as *const Expr as usize, t.clone());
                }
                Ok(t)
            }
            _ => self.expr(e, at),
        }
    }

    fn expr(&mut self, e: &Expr, at: &str) -> Result<Ty, CodegenError> {
        let t = self.expr_inner(e, at)?;
        if let Some(types) = &mut self.types {
            types.map.insert(e as *const Expr as usize, t.clone());
        }
        Ok(t)
    }

    fn expr_inner(&mut self, e: &Expr, at: &str) -> Result<Ty, CodegenError> {
        Ok(match e {
            Expr::Var(v) => self.vars[*v].clone().ok_or_else(|| {
                self.err(
                    at,
                    format!("`{}` is used before it has a value", self.k.vars[*v].name),
                )
            })?,
            Expr::Load { tensor, index, at } => {
                let dims = self.index(*tensor, index, at)?;
                Ty::new(dims, self.spec.tensors[*tensor].dtype)
            }
            Expr::Full { dims, dtype, .. } => {
                let mut ds = Vec::new();
                for d in dims {
                    self.in_scope(*d, at)?;
                    ds = union(&ds, &self.tile_dims(*d));
                }
                Ty::new(ds, *dtype)
            }
            Expr::Addmm { acc, a, b, at } => self.addmm(acc, a, b, at)?,
            Expr::Binary { op, lhs, rhs, at } => {
                let l = self.expr(lhs, at)?;
                let r = self.expr(rhs, at)?;
                let dims = union(&l.dims, &r.dims);
                let dtype = match op.entry().rule {
                    crate::prims::binary::Rule::Arith => {
                        self.note_meet((lhs, &l), (rhs, &r));
                        meet(&l, &r)
                    }
                    crate::prims::binary::Rule::Bits
                        if l.dtype != DType::Bool || r.dtype != DType::Bool =>
                    {
                        op.result(l.dtype, r.dtype).map_err(|m| self.err(at, m))?;
                        self.note_meet((lhs, &l), (rhs, &r));
                        meet(&l, &r)
                    }
                    _ => op.result(l.dtype, r.dtype).map_err(|m| self.err(at, m))?,
                };
                Ty {
                    dims,
                    dtype,
                    weak: l.weak && r.weak,
                }
            }
            Expr::Compare { lhs, rhs, at, .. } => {
                let l = self.expr(lhs, at)?;
                let r = self.expr(rhs, at)?;
                Ty::new(union(&l.dims, &r.dims), DType::Bool)
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
                let dtype = if a.dtype == DType::Bool && b.dtype == DType::Bool {
                    DType::Bool
                } else {
                    self.note_meet((then, &a), (otherwise, &b));
                    meet(&a, &b)
                };
                Ty {
                    dims: union(&union(&m.dims, &a.dims), &b.dims),
                    dtype,
                    weak: a.weak && b.weak,
                }
            }
            Expr::TileIndex(d) => {
                self.in_scope(*d, at)?;
                Ty::new(self.tile_dims(*d), DType::I64)
            }
            Expr::Unary { op, arg } => {
                let t = self.expr(arg, at)?;
                let dtype = op.result(t.dtype).map_err(|m| self.err(at, m))?;
                Ty {
                    dims: t.dims,
                    dtype,
                    weak: t.weak,
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
                Ty::new(t.dims, *dtype)
            }
            Expr::Reduce { op, arg, dim, at } => {
                let t = self.expr(arg, at)?;
                let name = &self.k.dims[*dim].name;
                if self.k.is_each(*dim) {
                    return Err(self.err(
                        at,
                        format!(
                            "`{name}` takes one index at a time, so there is nothing to reduce along it; \
                             accumulate across its loop instead"
                        ),
                    ));
                }
                if !t.dims.contains(dim) {
                    return Err(self.err(
                        at,
                        format!(
                            "`.{}({name})` reduces along tile `{name}`, but the value has tiles {}",
                            op.name(),
                            self.dim_names(&t.dims)
                        ),
                    ));
                }
                Ty {
                    dims: t.dims.into_iter().filter(|d| d != dim).collect(),
                    dtype: op.result(t.dtype),
                    // A sum of literal-made values is one too (`select(m, 1, 0).sum(t)`).
                    weak: t.weak,
                }
            }
            Expr::ArgReduce { op, arg, dim, at } => {
                let t = self.expr(arg, at)?;
                let name = &self.k.dims[*dim].name;
                let Some(method) = op.arg_name() else {
                    return Err(self.err(
                        at,
                        format!(
                            "`{}` picks no element, so it has no index to give",
                            op.name()
                        ),
                    ));
                };
                if self.k.is_each(*dim) {
                    return Err(self.err(
                        at,
                        format!(
                            "`{name}` takes one index at a time, so `.{method}({name})` has nothing to choose \
                             from; compare across its loop instead"
                        ),
                    ));
                }
                if !t.dims.contains(dim) {
                    return Err(self.err(
                        at,
                        format!(
                            "`.{method}({name})` picks along tile `{name}`, but the value has tiles {}",
                            self.dim_names(&t.dims)
                        ),
                    ));
                }
                Ty::new(
                    t.dims.into_iter().filter(|d| d != dim).collect(),
                    DType::I64,
                )
            }
            Expr::Scan { op, arg, dim, at } => {
                let t = self.expr(arg, at)?;
                self.scan_along(*op, *dim, &t, at)?;
                Ty {
                    dims: t.dims,
                    dtype: op.result(t.dtype),
                    weak: t.weak,
                }
            }
            Expr::Rand {
                kind,
                seed,
                offset,
                at,
            } => {
                let s = self.expr(seed, at)?;
                if !s.dims.is_empty() || !s.dtype.is_int() {
                    return Err(self.err(
                        at,
                        format!(
                            "the seed of `{}` is an integer scalar (a host `u64`/`i64` value); got a {} with tiles {}",
                            kind.name(),
                            s.dtype,
                            self.dim_names(&s.dims)
                        ),
                    ));
                }
                let o = self.expr(offset, at)?;
                if !o.dtype.is_int() {
                    return Err(self.err(
                        at,
                        format!(
                            "the offsets of `{}` are integers (e.g. `tm.index() * n + tn.index()`); got {}",
                            kind.name(),
                            o.dtype
                        ),
                    ));
                }
                let dtype = match kind {
                    RandKind::Bits => DType::U32,
                    _ => DType::F32,
                };
                Ty::new(o.dims, dtype)
            }
            Expr::Int(_) => Ty {
                dims: Vec::new(),
                dtype: DType::I64,
                weak: true,
            },
            Expr::Const(_) => Ty::scalar(DType::I64),
            Expr::TileBegin(d) | Expr::TileEnd(d) | Expr::TileSize(d) => {
                self.in_scope(*d, at)?;
                Ty::scalar(DType::I64)
            }
            Expr::Float(_) => Ty {
                dims: Vec::new(),
                dtype: DType::F32,
                weak: true,
            },
            Expr::IfConst {
                cond,
                then,
                otherwise,
                at,
            } => {
                // Not decided at specialization: a runtime choice, a `select`.
                for c in cond.exprs() {
                    let t = self.expr(c, at)?;
                    if !t.dims.is_empty() {
                        return Err(self.err(
                            at,
                            "the condition of an `if` value is a scalar; choose per element with `select(mask, a, b)`",
                        ));
                    }
                }
                let a = self.expr(then, at)?;
                let b = self.expr(otherwise, at)?;
                self.note_meet((then, &a), (otherwise, &b));
                Ty {
                    dims: union(&a.dims, &b.dims),
                    dtype: meet(&a, &b),
                    weak: a.weak && b.weak,
                }
            }
            Expr::Scalar(s) => Ty::scalar(self.spec.scalars[*s].dtype()),
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
        // Several shared tiles, one of them the innermost loop's: the others
        // are batch tiles, which the accumulator must hold too.
        let inner = self.loops.last().filter(|d| shared.contains(d));
        if let (Some(&k), true) = (inner, shared.len() > 1) {
            let batch: Vec<DimId> = shared.iter().copied().filter(|&d| d != k).collect();
            let mut dims = batch.clone();
            dims.extend(acc_t.dims.iter().copied());
            let names: Vec<&str> = dims.iter().map(|&d| self.k.dims[d].name.as_str()).collect();
            let each = batch
                .iter()
                .map(|&d| self.k.dims[d].name.as_str())
                .collect::<Vec<_>>()
                .join("`, `");
            return Err(self.err(
                at,
                format!(
                    "`addmm` contracts over `{}`, and `a` and `b` also share {}: a batched product, whose \
                     accumulator holds the batch tiles too (`zeros::<f32>([{}])`); or take one batch index \
                     per program (`each(…)` for `{each}` in the `tile([…])`)",
                    self.k.dims[k].name,
                    self.dim_names(&batch),
                    names.join(", ")
                ),
            ));
        }
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
