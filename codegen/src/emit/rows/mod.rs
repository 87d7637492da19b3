//! Kernels that reduce along a tile dimension (`x.sum(tn)`, `.max(tn)`, `.min(tn)`):
//! softmax, norms, losses. A program owns a block of rows of the grid dimension
//! and walks the columns in `tile()` loops. Its threads form row groups of `C`
//! lanes; each thread holds, per row it owns, `VEC` adjacent columns out of every
//! `C·VEC` (so a warp's loads cover contiguous 16-byte chunks). Tile values live
//! in registers, per-row values (`[tm]`) are replicated across a row's lanes, and
//! a reduction combines a thread's own columns, then its lanes (warp shuffles,
//! shared memory when a row spans several warps). The block of the column tile
//! decides one pass (it covers the row) or a looped reduction.

mod load;
pub(super) mod lowering;
mod reduce;
mod space;
mod store;

use super::expr::CTy;
use super::{config_err, one_line, Emitter, Lowered};
use crate::error::CodegenError;
use crate::ir::*;
use load::{Kept, LoadKey};
use std::fmt::Write;

/// Most values of one tile a thread may hold per variable (registers).
const MAX_PER_THREAD: usize = 64;

/// Resident threads an SM that a row kernel of 8 warps or more keeps at
/// least, untuned: three blocks of 256 (85 registers a thread). layer_norm_bwd
/// and rms_norm_bwd keep three tensors' rows across their walks and ptxas
/// would take 128 registers, two blocks an SM; at 85 it holds them in 80
/// with no spill. H200, 16384×8192 bf16 (docs/perf-history.md, "Loads issued
/// together in row steps; defaults from the sweeps"): layer_norm_bwd 0.1994 ms
/// against 0.2297 (96% of the copy bandwidth against 83%).
const WIDE_ROW_THREADS: usize = 768;

/// Where a value lives: per thread, a scalar, a value per owned row, per owned
/// column, or per owned (row, column).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Place {
    Scalar,
    Row,
    Col,
    Tile,
}

struct Geometry {
    /// The grid (row) dimension.
    rd: DimId,
    /// Lanes per row, row groups, rows per thread, columns per chunk per lane.
    c: usize,
    r: usize,
    rpt: usize,
    vec: usize,
}

impl Geometry {
    fn row(&self) -> String {
        format!("(tb{} + tf_grp + i * {})", self.rd, self.r)
    }

    /// Element `j`'s column within the loop's step (`int`; `tf_lv` is `tf_lane · VEC`).
    fn col_in_step(&self) -> String {
        format!(
            "(tf_lv + (j / {v}) * {cv} + (j % {v}))",
            v = self.vec,
            cv = self.c * self.vec
        )
    }

    fn col(&self, cd: DimId) -> String {
        format!(
            "(tb{cd} + (j / {v}) * {cv} + tf_lane * {v} + (j % {v}))",
            v = self.vec,
            cv = self.c * self.vec
        )
    }
}

pub(super) fn emit(e: &mut Emitter) -> Result<Lowered, CodegenError> {
    let k = e.k;
    let cfg = e.cfg.clone();
    let first_at = first_reduce_at(&k.body).unwrap_or_default();
    let unsupported = |at: &str, m: &str| CodegenError::Unsupported {
        kernel: k.name.clone(),
        at: at.to_string(),
        message: m.to_string(),
    };
    let [rd] = k.grid[..] else {
        return Err(unsupported(
            &first_at,
            "a kernel that reduces tiles has one grid dimension (the rows) for now; loop over the others inside it",
        ));
    };
    if !k.grid_start.is_empty() {
        return Err(unsupported(
            &first_at,
            "`starting_at` is not supported in kernels that reduce tiles",
        ));
    }
    let nt = cfg.threads();
    let warps = cfg.num_warps;
    let rows = cfg.block_sizes[rd];
    let (r, c) = if rows >= warps {
        (warps, 32)
    } else {
        (rows, nt / rows.max(1))
    };
    if rows % r != 0 || c % 32 != 0 || !c.is_power_of_two() {
        return Err(config_err(
            k,
            &cfg,
            format!(
                "the block of rows (`{}`: {rows}) must be a power of two, a multiple of num_warps ({warps}) or dividing it",
                k.dims[rd].name
            ),
        ));
    }
    // 16 bytes per lane and chunk for the narrowest element the columns carry.
    let mut narrowest = 4;
    k.walk_stmts(&mut |s| {
        let mut note = |t: TensorId, index: &[DimId]| {
            if index.iter().any(|&d| d != rd) {
                narrowest = narrowest.min(e.spec.tensors[t].dtype.size());
            }
        };
        match s {
            Stmt::Store { tensor, index, .. } => {
                note(*tensor, &plain_index(index).unwrap_or_default())
            }
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => value.walk(&mut |x| {
                if let Expr::Load { tensor, index, .. } = x {
                    note(*tensor, &plain_index(index).unwrap_or_default())
                }
            }),
            _ => {}
        }
    });
    let g = Geometry {
        rd,
        c,
        r,
        rpt: rows / r,
        vec: 16 / narrowest.clamp(1, 4),
    };
    for d in loop_dims(&k.body) {
        let b = cfg.block_sizes[d];
        if b % (g.c * g.vec) != 0 {
            return Err(config_err(
                k,
                &cfg,
                format!(
                    "the block of `{}` ({b}) must be a multiple of {} ({} lanes per row x {} columns per lane)",
                    k.dims[d].name,
                    g.c * g.vec,
                    g.c,
                    g.vec
                ),
            ));
        }
        if g.rpt * b / g.c > MAX_PER_THREAD {
            return Err(config_err(
                k,
                &cfg,
                format!(
                    "each thread would hold {} values of a tile (at most {MAX_PER_THREAD}): use more warps or smaller blocks",
                    g.rpt * b / g.c
                ),
            ));
        }
    }

    // Memory-bound: by default as many resident threads as the registers the
    // loads hold allow (and a few dozen more for the rest), to keep loads in
    // flight; at most 1024 per SM, which leaves 64 registers each. The tuner
    // moves it (`Config::occupancy`) where ptxas would rather spill. Blocks of
    // 8 warps or more (a row of up to 8192 columns held in registers) keep at
    // least `WIDE_ROW_THREADS` resident: with two rows an SM, each row's
    // barrier between its walks leaves too few loads in flight.
    let min_blocks = match super::options::occupancy_blocks(k, &cfg, nt)? {
        Some(b) => b,
        None => {
            let budget = load::held_words(e, &g, &k.body) + 40;
            let fits = 65536 / (budget * nt);
            let floor = if nt >= 256 { WIDE_ROW_THREADS / nt } else { 1 };
            fits.max(floor).clamp(1, (1024 / nt).max(1))
        }
    };
    let params = e.begin(nt, min_blocks, load::HELPERS, &[]);
    let _ = writeln!(
        e.out,
        "  const int tid = threadIdx.x, tf_lane = tid % {c}, tf_grp = tid / {c}, tf_lv = tf_lane * {v};\n  \
         const long long tb{rd} = (long long)blockIdx.x * B{rd};\n  \
         (void)tf_lane; (void)tf_grp; (void)tf_lv;",
        v = g.vec
    );
    if g.c > 32 {
        let _ = writeln!(e.out, "  __shared__ float tf_red[{}];", nt / 32 * g.rpt);
    }
    let body = k.body.clone();
    let written = load::written(k);
    let kept = load::shared_loads(e, &body, &written);
    let mut w = RowWriter {
        g,
        cur: None,
        temps: 0,
        written,
        kept,
        step: Vec::new(),
        loop_body: Vec::new(),
    };
    w.stmts(e, &body, 1)?;
    e.out.push_str("}\n");
    Ok(e.finish(params, nt, 0, "rows"))
}

/// Whether the row lowering takes `k` (a kernel without `addmm`, in the
/// fast paths' plain form): one grid dimension (the rows), `tile()` loops
/// directly inside the grid loop, reductions only inside them and along
/// their tile, tensors indexed by the rows and the loop's tile, and a
/// reduction somewhere. The general lowering takes the rest.
fn takes(k: &Kernel) -> bool {
    let [rd] = k.grid[..] else { return false };
    if !k.grid_start.is_empty() {
        return false;
    }
    let mut reduces = false;
    // Every reduction is along `cur`, every index within {rows, cur}.
    let fits = |e: &Expr, cur: Option<DimId>, reduces: &mut bool| {
        let mut ok = true;
        e.walk(&mut |x| match x {
            Expr::Reduce { dim, .. } => {
                *reduces = true;
                ok &= Some(*dim) == cur;
            }
            Expr::Load { index, .. } => ok &= row_major(index, rd, cur),
            Expr::TileIndex(d) | Expr::TileBegin(d) | Expr::TileEnd(d) | Expr::TileSize(d) => {
                ok &= *d == rd || Some(*d) == cur
            }
            Expr::Addmm { .. } | Expr::Rand { .. } => ok = false,
            _ => {}
        });
        ok
    };
    let stmt_ok = |s: &Stmt, cur: Option<DimId>, reduces: &mut bool| match s {
        Stmt::Let { value, .. } | Stmt::Assign { value, .. } => fits(value, cur, reduces),
        Stmt::Store { index, value, .. } => fits(value, cur, reduces) && row_major(index, rd, cur),
        Stmt::Wait { .. } | Stmt::Signal { .. } => true,
        _ => false,
    };
    for s in &k.body {
        match s {
            Stmt::Loop {
                dim,
                body,
                until: None,
                range: None,
            } => {
                for t in body {
                    if !stmt_ok(t, Some(*dim), &mut reduces) {
                        return false;
                    }
                }
            }
            other => {
                if !stmt_ok(other, None, &mut reduces) {
                    return false;
                }
            }
        }
    }
    reduces
}

/// Whether `index` addresses a row's elements the way the row lowering
/// loads them: by the rows (`x[tm]`), the loop's columns (`w[tn]`), or both
/// with the columns last and contiguous (`x[(tm, tn)]`).
fn row_major(index: &[Expr], rd: DimId, cur: Option<DimId>) -> bool {
    match plain_index(index).as_deref() {
        Some([d]) => *d == rd || Some(*d) == cur,
        Some([r, c]) => *r == rd && Some(*c) == cur,
        _ => false,
    }
}

fn first_reduce_at(body: &[Stmt]) -> Option<String> {
    let mut at = None;
    for s in body {
        match s {
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Store { value, .. } => {
                value.walk(&mut |x| {
                    if let Expr::Reduce { at: a, .. } = x {
                        at.get_or_insert(a.clone());
                    }
                })
            }
            Stmt::Loop { body, .. } => {
                if let Some(a) = first_reduce_at(body) {
                    at.get_or_insert(a);
                }
            }
            _ => {}
        }
    }
    at
}

fn loop_dims(body: &[Stmt]) -> Vec<DimId> {
    body.iter()
        .filter_map(|s| match s {
            Stmt::Loop { dim, .. } => Some(*dim),
            _ => None,
        })
        .collect()
}

struct RowWriter {
    g: Geometry,
    /// The column dimension of the loop being emitted.
    cur: Option<DimId>,
    temps: usize,
    /// Tensors the kernel stores to (their loads are never reused).
    written: Vec<TensorId>,
    /// Loads several walks share ([`load::shared_loads`]).
    kept: Vec<Kept>,
    /// The loads of the current loop step, and their element access.
    step: Vec<(LoadKey, String)>,
    /// The statements of the loop being emitted.
    loop_body: Vec<Stmt>,
}

impl RowWriter {
    fn place(&self, dims: &[DimId]) -> Place {
        let row = dims.contains(&self.g.rd);
        let col = self.cur.is_some_and(|c| dims.contains(&c));
        match (row, col) {
            (false, false) => Place::Scalar,
            (true, false) => Place::Row,
            (false, true) => Place::Col,
            (true, true) => Place::Tile,
        }
    }

    /// Columns a thread holds per row in the current loop.
    fn cols(&self, e: &Emitter) -> usize {
        self.cur.map_or(1, |c| e.cfg.block_sizes[c] / self.g.c)
    }

    /// The C declaration suffix and element access of a value at `p`.
    fn shape(&self, e: &Emitter, p: Place) -> (String, &'static str) {
        let (rpt, cols) = (self.g.rpt, self.cols(e));
        match p {
            Place::Scalar => (String::new(), ""),
            Place::Row => (format!("[{rpt}]"), "[i]"),
            Place::Col => (format!("[{cols}]"), "[j]"),
            Place::Tile => (format!("[{rpt}][{cols}]"), "[i][j]"),
        }
    }

    /// Opens the element loops of `p` (and returns how many braces to close).
    fn open(&self, e: &mut Emitter, p: Place, ind: &str) -> usize {
        let mut n = 0;
        if matches!(p, Place::Row | Place::Tile) {
            let _ = writeln!(
                e.out,
                "{ind}#pragma unroll\n{ind}for (int i = 0; i < {}; ++i) {{",
                self.g.rpt
            );
            n += 1;
        }
        if matches!(p, Place::Col | Place::Tile) {
            let _ = writeln!(
                e.out,
                "{ind}#pragma unroll\n{ind}for (int j = 0; j < {}; ++j) {{",
                self.cols(e)
            );
            n += 1;
        }
        n
    }

    fn close(e: &mut Emitter, n: usize, ind: &str) {
        for _ in 0..n {
            let _ = writeln!(e.out, "{ind}}}");
        }
    }

    fn coords(&self) -> Vec<(DimId, String)> {
        let mut c = vec![(self.g.rd, self.g.row())];
        if let Some(cd) = self.cur {
            c.push((cd, self.g.col(cd)));
        }
        c
    }

    /// Whether a tile `let` can be recomputed at its uses instead of held: no
    /// reduction inside, reading only tensors nothing writes, and neither it nor
    /// a variable it reads is ever reassigned (a use would see the new value).
    fn inlinable(&self, var: VarId, value: &Expr) -> bool {
        let mut ok = true;
        let mut reads = vec![var];
        value.walk(&mut |x| match x {
            Expr::Reduce { .. } => ok = false,
            Expr::Load { tensor, .. } => ok &= !self.written.contains(tensor),
            Expr::Var(v) => reads.push(*v),
            _ => {}
        });
        // Tile values die with their loop, so only this loop's assignments matter.
        for s in &self.loop_body {
            if let Stmt::Assign { var: v, .. } = s {
                ok &= !reads.contains(v);
            }
        }
        ok
    }

    fn stmts(&mut self, e: &mut Emitter, body: &[Stmt], depth: usize) -> Result<(), CodegenError> {
        let ind = "  ".repeat(depth);
        for s in body {
            match s {
                Stmt::Let { var, value, at } => {
                    let value = &super::inline(value, &e.inline_vars);
                    let p = self.place(&e.checked.vars[*var].dims);
                    if matches!(p, Place::Tile | Place::Col) && self.inlinable(*var, value) {
                        // Recomputed where used (the loads it reads stay in
                        // registers for the step): a tile of f32 registers fewer.
                        e.bind_inline(*var, value);
                        continue;
                    }
                    let pre = self.hoist(e, value, at, &ind)?;
                    let dtype = e.checked.vars[*var].dtype;
                    let (v, ty) = self.elem(e, &pre, value, dtype, at, p, &ind)?;
                    let name = format!("v{var}");
                    let cty = ty.c();
                    let (decl, access) = self.shape(e, p);
                    // Declared before the loops that fill it.
                    let fill = e.out.split_off(v);
                    let _ = writeln!(
                        e.out,
                        "{ind}{cty} {name}{decl};  // {}",
                        e.k.vars[*var].name
                    );
                    e.out
                        .push_str(&fill.replace("TF_DST", &format!("{name}{access}")));
                    e.named_vars.insert(*var, format!("{name}{access}"));
                }
                Stmt::Assign { var, value, at } => {
                    let Some(name) = e.named_vars.get(var).cloned() else {
                        return Err(CodegenError::Unsupported {
                            kernel: e.k.name.clone(),
                            at: at.clone(),
                            message: format!(
                                "`{}` is reassigned but was not bound with `let` in this kernel",
                                e.k.vars[*var].name
                            ),
                        });
                    };
                    if e.checked.vars[*var].dims.is_empty() {
                        return Err(CodegenError::Unsupported {
                            kernel: e.k.name.clone(),
                            at: at.clone(),
                            message: "reassigning a scalar is not supported; bind a new name with `let`, or make it a tile (`full::<f32>([tm], v)`)".into(),
                        });
                    }
                    let value = &super::inline(value, &e.inline_vars);
                    let pre = self.hoist(e, value, at, &ind)?;
                    let p = self.place(&e.checked.vars[*var].dims);
                    let at_ = one_line(at);
                    let _ = writeln!(e.out, "{ind}// {at_}");
                    let start = e.out.len();
                    let dtype = e.checked.vars[*var].dtype;
                    self.elem(e, &pre, value, dtype, at, p, &ind)?;
                    let fill = e.out.split_off(start);
                    e.out.push_str(&fill.replace("TF_DST", &name));
                }
                Stmt::Store {
                    tensor,
                    index,
                    value,
                    at,
                } => {
                    let index = e.plain(index, at)?;
                    self.store(e, *tensor, &index, value, at, &ind)?
                }
                Stmt::Loop {
                    dim,
                    body: inner,
                    until: None,
                    range: None,
                } => {
                    if self.cur.is_some() {
                        return Err(CodegenError::Unsupported {
                            kernel: e.k.name.clone(),
                            at: first_reduce_at(inner).unwrap_or_default(),
                            message: "a kernel that reduces tiles takes one level of `tile()` loops inside the grid loop".into(),
                        });
                    }
                    let ext = e.end(*dim);
                    self.declare_kept(e, *dim, inner, &ind);
                    let _ = writeln!(
                        e.out,
                        "{ind}for (long long tb{dim} = 0; tb{dim} < {ext}; tb{dim} += B{dim}) {{  // tile `{}`\n\
                         {ind}  const int tf_rem{dim} = (int)max(0ll, min((long long)B{dim}, {ext} - tb{dim}));  // columns in this step",
                        e.k.dims[*dim].name
                    );
                    self.cur = Some(*dim);
                    self.step.clear();
                    self.loop_body = inner.clone();
                    let saved = (e.named_vars.clone(), e.inline_vars.clone());
                    self.issue_loads(e, inner, &format!("{ind}  "))?;
                    self.stmts(e, inner, depth + 1)?;
                    // Values bound in the loop die with it; carried ones were bound outside.
                    (e.named_vars, e.inline_vars) = saved;
                    self.cur = None;
                    self.step.clear();
                    let _ = writeln!(e.out, "{ind}}}");
                }
                other => {
                    if !e.block_stmt(other, &ind)? {
                        return Err(CodegenError::Unsupported {
                            kernel: e.k.name.clone(),
                            at: first_reduce_at(body).unwrap_or_default(),
                            message: "kernels that reduce tiles take `let`, assignments, stores and `tile()` loops".into(),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Emits the element loops computing `value` at `p` into `TF_DST` (replaced by
    /// the caller); returns where that code starts in the output, and the C type.
    #[allow(clippy::too_many_arguments)]
    /// Emits the element loops computing `value` into `TF_DST` (replaced by
    /// the caller), converted to the variable's `dtype` (a bf16 variable holds
    /// bf16 values); returns where that code starts in the output, and the C type.
    #[allow(clippy::too_many_arguments)]
    fn elem(
        &self,
        e: &mut Emitter,
        pre: &[(Expr, String)],
        value: &Expr,
        dtype: crate::dtype::DType,
        at: &str,
        p: Place,
        ind: &str,
    ) -> Result<(usize, CTy), CodegenError> {
        let start = e.out.len();
        let mut ctx = e.ctx(&self.coords());
        ctx.precomputed = pre.to_vec();
        let (shared, v, ty) = ctx.emit_shared(value, at)?;
        let v = crate::prims::cast::cuda(&v, ty, dtype);
        let n = self.open(e, p, ind);
        let _ = writeln!(e.out, "{ind}  {{ {shared}TF_DST = {v}; }}");
        Self::close(e, n, ind);
        Ok((start, dtype.cty()))
    }

    /// Issues every column load of a step's statements at its start, in the
    /// order they are written: a load that a statement after a reduction reads
    /// (layer_norm_bwd's `x` after `wdy.sum(tn)`) would otherwise wait for the
    /// reduction's shuffles, which wait for the loads before it, so a step's
    /// loads would come back one after the other instead of together. Loads of
    /// a tensor the kernel writes stay where they are read.
    fn issue_loads(
        &mut self,
        e: &mut Emitter,
        body: &[Stmt],
        ind: &str,
    ) -> Result<(), CodegenError> {
        let Some(cur) = self.cur else {
            return Ok(());
        };
        let mut loads: Vec<(TensorId, Vec<Expr>, String)> = Vec::new();
        for s in body {
            let (value, at) = match s {
                Stmt::Let { value, at, .. } | Stmt::Assign { value, at, .. } => (value, at),
                Stmt::Store { value, at, .. } => (value, at),
                _ => continue,
            };
            value.walk(&mut |x| {
                if let Expr::Load { tensor, index, .. } = x {
                    let column = plain_index(index).is_some_and(|i| i.contains(&cur));
                    if column
                        && !self.written.contains(tensor)
                        && !loads.iter().any(|(t, i, _)| t == tensor && i == index)
                    {
                        loads.push((*tensor, index.clone(), at.clone()));
                    }
                }
            });
        }
        for (tensor, index, at) in loads {
            let index = e.plain(&index, &at)?;
            self.load(e, tensor, &index, ind);
        }
        Ok(())
    }

    /// Computes the reductions and column loads inside `value` into registers
    /// first (innermost first), and returns them with the C names of an element.
    fn hoist(
        &mut self,
        e: &mut Emitter,
        value: &Expr,
        at: &str,
        ind: &str,
    ) -> Result<Vec<(Expr, String)>, CodegenError> {
        let mut pre: Vec<(Expr, String)> = Vec::new();
        let mut order = Vec::new();
        post_order(value, &mut order);
        for x in order {
            if pre.iter().any(|(y, _)| y == x) {
                continue;
            }
            match x {
                Expr::Load { tensor, index, .. }
                    if self
                        .cur
                        .is_some_and(|c| plain_index(index).is_some_and(|i| i.contains(&c))) =>
                {
                    let index = e.plain(index, at)?;
                    let access = self.load(e, *tensor, &index, ind);
                    pre.push((x.clone(), access));
                }
                Expr::Reduce { op, arg, dim, at } => {
                    if Some(*dim) != self.cur {
                        return Err(CodegenError::Unsupported {
                            kernel: e.k.name.clone(),
                            at: at.clone(),
                            message: format!(
                                "`.{}({})` must reduce along the tile of the enclosing `tile()` loop{}",
                                op.name(),
                                e.k.dims[*dim].name,
                                if *dim == self.g.rd {
                                    " (reductions across the grid's rows would need other programs' values)"
                                } else {
                                    ""
                                }
                            ),
                        });
                    }
                    let name = self.reduce(e, &pre, *op, arg, *dim, at, ind)?;
                    pre.push((x.clone(), name));
                }
                _ => {}
            }
        }
        let _ = at;
        Ok(pre)
    }
}

/// The tile dimensions of `x`'s value, by the checker's rules.
fn dims_of(e: &Emitter, x: &Expr) -> Vec<DimId> {
    crate::check::dims_of(e.k, e.spec, e.checked, x)
}

fn post_order<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
    match e {
        Expr::Binary { lhs, rhs, .. } | Expr::Compare { lhs, rhs, .. } => {
            post_order(lhs, out);
            post_order(rhs, out);
        }
        Expr::Select {
            mask,
            then,
            otherwise,
            ..
        } => {
            post_order(mask, out);
            post_order(then, out);
            post_order(otherwise, out);
        }
        Expr::Unary { arg, .. } | Expr::Cast { arg, .. } => post_order(arg, out),
        // A reduction's argument is computed inside it (its loads hoisted first).
        Expr::Reduce { arg, .. } => post_order(arg, out),
        _ => {}
    }
    out.push(e);
}
