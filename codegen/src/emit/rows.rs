//! Kernels that reduce along a tile dimension (`x.sum(tn)`, `.max(tn)`, `.min(tn)`):
//! softmax, norms, losses. A program owns a block of rows of the grid dimension
//! and walks the columns in `tile()` loops. Its threads form row groups of `C`
//! lanes; each thread holds, per row it owns, `VEC` adjacent columns out of every
//! `C·VEC` (so a warp's loads cover contiguous 16-byte chunks). Tile values live
//! in registers, per-row values (`[tm]`) are replicated across a row's lanes, and
//! a reduction combines a thread's own columns, then its lanes (warp shuffles,
//! shared memory when a row spans several warps). The block of the column tile
//! decides one pass (it covers the row) or a looped reduction.

use super::expr::{narrow, tensor_mask, tensor_offset, CTy};
use super::{config_err, one_line, Emitter, Lowered};
use crate::dtype::DType;
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

/// Most values of one tile a thread may hold per variable (registers).
const MAX_PER_THREAD: usize = 64;

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
            Stmt::Store { tensor, index, .. } => note(*tensor, index),
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => value.walk(&mut |x| {
                if let Expr::Load { tensor, index, .. } = x {
                    note(*tensor, index)
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

    // Memory-bound: ask for enough resident threads (1024 per SM, so at most 64
    // registers each) to keep loads in flight.
    let params = e.begin(nt, (1024 / nt).max(1), "", &[]);
    let _ = writeln!(
        e.out,
        "  const int tid = threadIdx.x, tf_lane = tid % {c}, tf_grp = tid / {c};\n  \
         const long long tb{rd} = (long long)blockIdx.x * B{rd};\n  \
         (void)tf_lane; (void)tf_grp;",
    );
    if g.c > 32 {
        let _ = writeln!(e.out, "  __shared__ float tf_red[{}];", nt / 32 * g.rpt);
    }
    let body = k.body.clone();
    let mut w = RowWriter {
        g,
        cur: None,
        temps: 0,
    };
    w.stmts(e, &body, 1)?;
    e.out.push_str("}\n");
    Ok(e.finish(params, nt, 0, "rows"))
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

    fn stmts(&mut self, e: &mut Emitter, body: &[Stmt], depth: usize) -> Result<(), CodegenError> {
        let ind = "  ".repeat(depth);
        for s in body {
            match s {
                Stmt::Let { var, value, at } => {
                    let pre = self.hoist(e, value, at, &ind)?;
                    let p = self.place(&e.checked.vars[*var].dims);
                    let (v, ty) = self.elem(e, &pre, value, at, p, &ind)?;
                    let name = format!("v{var}");
                    let cty = if ty == CTy::F32 { "float" } else { "long long" };
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
                    let pre = self.hoist(e, value, at, &ind)?;
                    let p = self.place(&e.checked.vars[*var].dims);
                    let at_ = one_line(at);
                    let _ = writeln!(e.out, "{ind}// {at_}");
                    let start = e.out.len();
                    self.elem(e, &pre, value, at, p, &ind)?;
                    let fill = e.out.split_off(start);
                    e.out.push_str(&fill.replace("TF_DST", &name));
                }
                Stmt::Store {
                    tensor,
                    index,
                    value,
                    at,
                } => self.store(e, *tensor, index, value, at, &ind)?,
                Stmt::Loop { dim, body: inner } => {
                    if self.cur.is_some() {
                        return Err(CodegenError::Unsupported {
                            kernel: e.k.name.clone(),
                            at: first_reduce_at(inner).unwrap_or_default(),
                            message: "a kernel that reduces tiles takes one level of `tile()` loops inside the grid loop".into(),
                        });
                    }
                    let ext = e.k.dims[*dim].extent;
                    let _ = writeln!(
                        e.out,
                        "{ind}for (long long tb{dim} = 0; tb{dim} < s{ext}; tb{dim} += B{dim}) {{  // tile `{}`",
                        e.k.dims[*dim].name
                    );
                    self.cur = Some(*dim);
                    let saved = e.named_vars.clone();
                    self.stmts(e, inner, depth + 1)?;
                    // Values bound in the loop die with it; carried ones were bound outside.
                    e.named_vars = saved;
                    self.cur = None;
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
    fn elem(
        &self,
        e: &mut Emitter,
        pre: &[(Expr, String)],
        value: &Expr,
        at: &str,
        p: Place,
        ind: &str,
    ) -> Result<(usize, CTy), CodegenError> {
        let start = e.out.len();
        let mut ctx = e.ctx(&self.coords());
        ctx.precomputed = pre.to_vec();
        let (v, ty) = ctx.emit(value, at)?;
        let n = self.open(e, p, ind);
        let _ = writeln!(e.out, "{ind}  TF_DST = {v};");
        Self::close(e, n, ind);
        Ok((start, ty))
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
                    if self.cur.is_some_and(|c| index.contains(&c)) =>
                {
                    let name = self.load(e, *tensor, index, ind);
                    let p = self.place(index);
                    pre.push((x.clone(), format!("{name}{}", self.shape(e, p).1)));
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

    /// Loads `tensor[index]` (it has the loop's column) into registers: 16 bytes
    /// at a time where the rows allow, element by element at the ragged edge.
    fn load(&mut self, e: &mut Emitter, t: TensorId, index: &[DimId], ind: &str) -> String {
        let name = format!("tf_ld{}", self.temps);
        self.temps += 1;
        let p = self.place(index);
        let (decl, access) = self.shape(e, p);
        let ts = &e.spec.tensors[t];
        let dtype = ts.dtype;
        let cd = self.cur.unwrap_or(0);
        let cty = if dtype.is_float() {
            "float"
        } else {
            "long long"
        };
        let _ = writeln!(e.out, "{ind}{cty} {name}{decl};");
        let esize = dtype.size();
        let vec_ok = self.vec_ok(e, t, index);
        let idx: Vec<String> = index
            .iter()
            .map(|&d| {
                if d == cd {
                    "tf_c".to_string()
                } else {
                    self.g.row()
                }
            })
            .collect();
        let has_row = matches!(p, Place::Tile);
        let v = self.g.vec;
        let chunks = self.cols(e) / v;
        if has_row {
            let _ = writeln!(
                e.out,
                "{ind}#pragma unroll\n{ind}for (int i = 0; i < {}; ++i) {{",
                self.g.rpt
            );
        }
        let _ = writeln!(
            e.out,
            "{ind}#pragma unroll\n{ind}for (int tf_ch = 0; tf_ch < {chunks}; ++tf_ch) {{\n\
             {ind}  const long long tf_c0 = tb{cd} + tf_ch * {cv} + tf_lane * {v};",
            cv = self.g.c * v
        );
        let elem = |j: &str| access.replace("[j]", &format!("[{j}]"));
        let mask0 = tensor_mask(t, &idx).replace("tf_c", "(tf_c0 + {v} - 1)");
        let mask0 = mask0.replace("{v}", &v.to_string());
        if vec_ok {
            let per = 16 / esize;
            let _ = writeln!(
                e.out,
                "{ind}  if ({mask0}) {{\n{ind}    const long long tf_c = tf_c0;\n\
                 {ind}    const uint4* tf_q = (const uint4*)(t{t} + {off});",
                off = tensor_offset(t, &idx)
            );
            for q in 0..(v / per) {
                let _ = writeln!(e.out, "{ind}    {{ const uint4 tf_w = tf_q[{q}];");
                for x in 0..per {
                    let word = ["tf_w.x", "tf_w.y", "tf_w.z", "tf_w.w"][x * esize / 4];
                    let raw = match esize {
                        2 => format!(
                            "(tf_u16)({word} >> {})",
                            if x % 2 == 0 { "0" } else { "16" }
                        ),
                        _ => word.to_string(),
                    };
                    let val = match dtype {
                        DType::BF16 => format!("tf_bf16_to_f32({raw})"),
                        DType::F16 => format!("tf_f16_to_f32({raw})"),
                        _ => format!("__uint_as_float({raw})"),
                    };
                    let j = format!("tf_ch * {v} + {}", q * per + x);
                    let _ = writeln!(e.out, "{ind}      {name}{} = {val};", elem(&j));
                }
                let _ = writeln!(e.out, "{ind}    }}");
            }
            let _ = writeln!(e.out, "{ind}  }} else {{");
        } else {
            let _ = writeln!(e.out, "{ind}  {{");
        }
        let (wv, ty) = super::expr::widen(dtype, &format!("t{t}[{}]", tensor_offset(t, &idx)));
        let zero = if ty == CTy::F32 { "0.0f" } else { "0ll" };
        let _ = writeln!(
            e.out,
            "{ind}    #pragma unroll\n{ind}    for (int tf_v = 0; tf_v < {v}; ++tf_v) {{\n\
             {ind}      const long long tf_c = tf_c0 + tf_v;\n\
             {ind}      {name}{} = ({}) ? {wv} : {zero};\n{ind}    }}\n{ind}  }}\n{ind}}}",
            elem(&format!("tf_ch * {v} + tf_v")),
            tensor_mask(t, &idx)
        );
        if has_row {
            let _ = writeln!(e.out, "{ind}}}");
        }
        name
    }

    /// Reduces `arg` along the loop's column `dim` (its in-bounds columns): each
    /// thread over its own columns, then over the row's lanes.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &mut self,
        e: &mut Emitter,
        pre: &[(Expr, String)],
        op: ReduceOp,
        arg: &Expr,
        dim: DimId,
        at: &str,
        ind: &str,
    ) -> Result<String, CodegenError> {
        let name = format!("tf_red{}", self.temps);
        self.temps += 1;
        let has_row = dims_of(e, arg).contains(&self.g.rd);
        let (identity, comb) = match op {
            ReduceOp::Sum => ("0.0f", "({A} + {B})"),
            ReduceOp::Max => ("__int_as_float(0xff800000)", "fmaxf({A}, {B})"),
            ReduceOp::Min => ("__int_as_float(0x7f800000)", "fminf({A}, {B})"),
        };
        let f = |a: &str, b: &str| comb.replace("{A}", a).replace("{B}", b);
        let mut ctx = e.ctx(&self.coords());
        ctx.precomputed = pre.to_vec();
        let (v, ty) = ctx.emit(arg, at)?;
        let v = if ty == CTy::I64 {
            format!("(float)({v})")
        } else {
            v
        };
        let rpt = if has_row { self.g.rpt } else { 1 };
        let ext = e.k.dims[dim].extent;
        let _ = writeln!(
            e.out,
            "{ind}float {name}[{rpt}];  // {}\n{ind}#pragma unroll\n{ind}for (int i = 0; i < {rpt}; ++i) {{\n\
             {ind}  float tf_a = {identity};\n\
             {ind}  #pragma unroll\n{ind}  for (int j = 0; j < {cols}; ++j)\n\
             {ind}    if ({col} < s{ext}) tf_a = {upd};\n",
            one_line(at),
            cols = self.cols(e),
            col = self.g.col(dim),
            upd = f("tf_a", &format!("({v})"))
        );
        let lanes = self.g.c.min(32);
        let _ = writeln!(
            e.out,
            "{ind}  #pragma unroll\n{ind}  for (int tf_sh = {}; tf_sh > 0; tf_sh >>= 1) tf_a = {};\n\
             {ind}  {name}[i] = tf_a;\n{ind}}}",
            lanes / 2,
            f("tf_a", "__shfl_xor_sync(0xffffffffu, tf_a, tf_sh)")
        );
        if self.g.c > 32 {
            let per_row = self.g.c / 32;
            let _ = writeln!(
                e.out,
                "{ind}__syncthreads();\n\
                 {ind}if (tid % 32 == 0) for (int i = 0; i < {rpt}; ++i) tf_red[(tf_grp * {rpt} + i) * {per_row} + tf_lane / 32] = {name}[i];\n\
                 {ind}__syncthreads();\n\
                 {ind}#pragma unroll\n{ind}for (int i = 0; i < {rpt}; ++i) {{\n\
                 {ind}  float tf_a = {identity};\n\
                 {ind}  #pragma unroll\n{ind}  for (int w = 0; w < {per_row}; ++w) tf_a = {};\n\
                 {ind}  {name}[i] = tf_a;\n{ind}}}",
                f("tf_a", &format!("tf_red[(tf_grp * {rpt} + i) * {per_row} + w]"))
            );
        }
        Ok(if has_row {
            format!("{name}[i]")
        } else {
            format!("{name}[0]")
        })
    }

    fn store(
        &mut self,
        e: &mut Emitter,
        t: TensorId,
        index: &[DimId],
        value: &Expr,
        at: &str,
        ind: &str,
    ) -> Result<(), CodegenError> {
        let pre = self.hoist(e, value, at, ind)?;
        let p = self.place(index);
        let mut ctx = e.ctx(&self.coords());
        ctx.precomputed = pre;
        let (v, ty) = ctx.emit(value, at)?;
        let coords = self.coords();
        let idx: Vec<String> = index
            .iter()
            .map(|d| {
                coords
                    .iter()
                    .find(|(x, _)| x == d)
                    .map(|(_, c)| c.clone())
                    .unwrap_or_default()
            })
            .collect();
        // Each element is written by one thread: a row's value by its first lane,
        // a column's by the first row group.
        let owner = match p {
            Place::Row => "tf_lane == 0",
            Place::Col => "tf_grp == 0",
            Place::Tile => "true",
            Place::Scalar => "tid == 0",
        };
        let _ = writeln!(e.out, "{ind}// {}", one_line(at));
        let dtype = e.spec.tensors[t].dtype;
        if p == Place::Tile && self.vec_ok(e, t, index) {
            self.store_vec(e, t, &idx, &v, ty, ind);
            return Ok(());
        }
        let n = self.open(e, p, ind);
        let cty = if ty == CTy::F32 { "float" } else { "long long" };
        let _ = writeln!(
            e.out,
            "{ind}  if ({owner} && {}) {{ const {cty} v = {v}; t{t}[{}] = {}; }}",
            tensor_mask(t, &idx),
            tensor_offset(t, &idx),
            narrow(dtype, "v", ty)
        );
        Self::close(e, n, ind);
        Ok(())
    }
}

/// The tile dimensions of `x`'s value.
fn dims_of(e: &Emitter, x: &Expr) -> Vec<DimId> {
    match x {
        Expr::Var(v) => e.checked.vars[*v].dims.clone(),
        Expr::Load { index, .. } => index.clone(),
        Expr::Full { dims, .. } => dims.clone(),
        Expr::Binary { lhs, rhs, .. } => {
            let mut d = dims_of(e, lhs);
            for x in dims_of(e, rhs) {
                if !d.contains(&x) {
                    d.push(x);
                }
            }
            d
        }
        Expr::Unary { arg, .. } | Expr::Cast { arg, .. } => dims_of(e, arg),
        Expr::Reduce { arg, dim, .. } => dims_of(e, arg).into_iter().filter(|d| d != dim).collect(),
        _ => Vec::new(),
    }
}

impl RowWriter {
    /// Whether `tensor[index]` moves 16 bytes at a time: 16- or 32-bit floats,
    /// rows 16-byte aligned, the loop's column the contiguous last index.
    fn vec_ok(&self, e: &Emitter, t: TensorId, index: &[DimId]) -> bool {
        let ts = &e.spec.tensors[t];
        ts.dtype.is_float()
            && ts.last_contiguous
            && ts.align >= 16
            && index.last() == self.cur.as_ref()
            && (self.g.vec * ts.dtype.size()) % 16 == 0
    }

    /// Stores a tile `VEC` columns at a time: packed 16-byte stores where the
    /// chunk lies inside the tensor, element by element at its edge.
    fn store_vec(&self, e: &mut Emitter, t: TensorId, idx: &[String], v: &str, ty: CTy, ind: &str) {
        let dtype = e.spec.tensors[t].dtype;
        let esize = dtype.size();
        let vec = self.g.vec;
        let chunks = self.cols(e) / vec;
        let cv = self.g.c * vec;
        let cd = self.cur.unwrap_or(0);
        let col = self.g.col(cd);
        let at_c0: Vec<String> = idx.iter().map(|x| x.replace(&col, "tf_c0")).collect();
        let at_c: Vec<String> = idx.iter().map(|x| x.replace(&col, "tf_c")).collect();
        let full = tensor_mask(t, &at_c0).replace("(tf_c0)", &format!("(tf_c0 + {})", vec - 1));
        let cty = if ty == CTy::F32 { "float" } else { "long long" };
        let bits = |x: &str| match dtype {
            DType::BF16 => format!("(tf_u32)tf_f32_to_bf16({x})"),
            DType::F16 => format!("(tf_u32)tf_f32_to_f16({x})"),
            _ => format!("__float_as_uint({x})"),
        };
        let _ = writeln!(
            e.out,
            "{ind}#pragma unroll\n{ind}for (int i = 0; i < {rpt}; ++i) {{\n\
             {ind}#pragma unroll\n{ind}for (int tf_ch = 0; tf_ch < {chunks}; ++tf_ch) {{\n\
             {ind}  const long long tf_c0 = tb{cd} + tf_ch * {cv} + tf_lane * {vec};\n\
             {ind}  {cty} tf_o[{vec}];\n\
             {ind}  #pragma unroll\n{ind}  for (int tf_v = 0; tf_v < {vec}; ++tf_v) {{ const int j = tf_ch * {vec} + tf_v; tf_o[tf_v] = {v}; }}\n\
             {ind}  if ({full}) {{\n\
             {ind}    uint4* tf_q = (uint4*)(t{t} + {off});",
            rpt = self.g.rpt,
            off = tensor_offset(t, &at_c0)
        );
        let per = 16 / esize;
        for q in 0..(vec / per) {
            let words: Vec<String> = (0..4)
                .map(|w| {
                    if esize == 2 {
                        let (a, b) = (q * per + 2 * w, q * per + 2 * w + 1);
                        format!(
                            "{} | ({} << 16)",
                            bits(&format!("tf_o[{a}]")),
                            bits(&format!("tf_o[{b}]"))
                        )
                    } else {
                        bits(&format!("tf_o[{}]", q * per + w))
                    }
                })
                .collect();
            let _ = writeln!(
                e.out,
                "{ind}    tf_q[{q}] = make_uint4({});",
                words.join(", ")
            );
        }
        let _ = writeln!(
            e.out,
            "{ind}  }} else {{\n\
             {ind}    #pragma unroll\n{ind}    for (int tf_v = 0; tf_v < {vec}; ++tf_v) {{\n\
             {ind}      const long long tf_c = tf_c0 + tf_v;\n\
             {ind}      if ({}) t{t}[{}] = {};\n{ind}    }}\n{ind}  }}\n{ind}}}\n{ind}}}",
            tensor_mask(t, &at_c),
            tensor_offset(t, &at_c),
            narrow(dtype, "tf_o[tf_v]", ty)
        );
    }
}

fn post_order<'a>(e: &'a Expr, out: &mut Vec<&'a Expr>) {
    match e {
        Expr::Binary { lhs, rhs, .. } => {
            post_order(lhs, out);
            post_order(rhs, out);
        }
        Expr::Unary { arg, .. } | Expr::Cast { arg, .. } => post_order(arg, out),
        // A reduction's argument is computed inside it (its loads hoisted first).
        Expr::Reduce { arg, .. } => post_order(arg, out),
        _ => {}
    }
    out.push(e);
}
