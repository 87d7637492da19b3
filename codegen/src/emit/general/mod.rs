//! The general lowering: every kernel the checker accepts.
//!
//! A program is one CUDA block. Every tile value is a register tensor: each
//! thread holds the elements a [`Layout`] gives it, in a C array indexed by
//! compile-time constants once the element loops are unrolled. Each scope
//! (the grid's body, each `tile()` loop's) has a layout over its active tile
//! dimensions, chosen for its memory accesses: 16-byte runs along the
//! contiguous dimension, lanes across it, warps across the others. A value
//! over fewer dimensions is the layout sliced to them, so broadcasting is
//! free. Values that enter a loop whose layout places them differently are
//! converted through shared memory once, before the loop (and back after it
//! if the loop assigns them).
//!
//! Statements lower one by one: an expression's loads, reductions and
//! matmuls are computed first into temporaries (hoisted), then one unrolled
//! loop over the result's elements evaluates the elementwise rest with the
//! primitive tables' C (the emitter's element context, `ElemCtx`). Loads and stores take any
//! index (tile indices, offsets, gathered integers, scalars) with masks from
//! the extents and the tensor's bounds, and move 16 bytes at a time where the
//! index runs contiguously. Reductions combine a thread's registers, then
//! lanes by shuffles, then warps through shared memory. `addmm` multiplies
//! through shared memory with FMAs (the fast matmul paths are elsewhere).

mod argreduce;
mod atomic;
mod config;
mod defer;
mod dot;
mod fetch;
mod gather;
mod layout;
pub(crate) mod lowering;
mod memory;
mod pipeline;
mod private;
mod products;
mod rand;
mod reduce;
mod scan;
pub(crate) mod split;
mod stream;

pub use config::{axes, default_config, seeds};
pub use gather::GatherStage;
pub use layout::Layout;
pub use private::{PrivateAxis, PrivateCopy, PrivateLaunch};

use super::expr::{convert, CTy, ElemCtx};
use super::{config_err, one_line, Emitter, Lowered, Param, SplitLoopLaunch};
use crate::error::CodegenError;
use crate::ir::*;
use std::collections::HashMap;
use std::fmt::Write;

/// A value held in registers: a C array over `dims` in layout `layout` (a
/// scalar when `dims` is empty).
#[derive(Clone, Debug)]
struct Val {
    name: String,
    dims: Vec<DimId>,
    cty: CTy,
    layout: usize,
    /// The array holds a load's raw bits in 32-bit words (16-bit values two
    /// to a register), widened where an element is used: a thread's loads
    /// are all in flight before the first value is needed.
    raw: Option<crate::dtype::DType>,
    /// The array holds other values than the elements: its C type, and the
    /// element's C with `{}` for the held value (a comparison of held
    /// random words, made where the element is used so that its mask stays
    /// a predicate instead of a register of its own).
    view: Option<(CTy, String)>,
}

/// The fewest elements a thread holds along a masked dimension for its
/// masks to be worth a second, unmasked copy of the code
/// ([`Gen::unmasked_where_whole`]). On an H200 the copy made welford (32
/// elements a thread) 14-17% faster, cross_entropy 26%, argmax 27%, while
/// jagged_softmax (4 rows a thread) ran 13% slower and rms_norm_dw (4)
/// 1.4%: below this count the masked code alone. position_ids (16) keeps
/// the copy, the one kernel at this count or more that did not gain (0.8%
/// slower) (docs/perf-history.md, "Reductions without masks, pow into 16
/// bits").
pub(super) const UNMASKED_MIN: usize = 8;

/// The lowering's state while it walks the kernel.
struct Gen<'e, 'a> {
    e: &'e mut Emitter<'a>,
    /// Every layout used; `tf_o{l}_{p}` and `tf_u{l}_{p}` are their per-thread
    /// offsets and copy flags.
    layouts: Vec<Layout>,
    /// The layout of each scope, by its statements' address.
    scope_layouts: HashMap<usize, usize>,
    /// The body being written (the header is written after it, once the
    /// layouts are known).
    body: String,
    vars: HashMap<VarId, Val>,
    /// Loads (and reductions paired with their argument's reduction,
    /// [`argreduce::paired`], keyed by [`argreduce::cache_key`]) already in
    /// registers in this scope, until what they read is written.
    loaded: Vec<(Expr, Val)>,
    /// [`argreduce::paired`] of the kernel.
    paired: Vec<(ReduceOp, Expr, DimId)>,
    temps: usize,
    /// Bytes of shared memory the conversions and reductions need at most.
    smem: usize,
    threads: usize,
    /// Register indices given by an expression instead of the loop variable
    /// `r{d}` (an element of a vector run).
    rsub: HashMap<DimId, String>,
    /// Tensors whose atomics go to a copy in shared memory, with its axes
    /// ([`private`]).
    private: Vec<(TensorId, Vec<private::Axis>)>,
    /// The dimension of the split loop about to be lowered ([`split`]).
    part_dim: Option<DimId>,
    /// Accumulations whose reduction waits for the end of their loop
    /// ([`defer`]), by their statement's address.
    deferred: HashMap<usize, defer::Deferred>,
    /// Gathers staged through shared memory when the launch gives room ([`gather`]).
    gathers: Vec<GatherStage>,
    /// Staged gathers written so far: all use the one staging region, so
    /// one inside another's index runs whole before the outer one stages.
    staged: usize,
    /// Tensors read once along the walk the programs share: their vector
    /// loads are streamed ([`stream`]).
    streamed: Vec<TensorId>,
}

/// Resident threads an SM that a kernel staging gathered rows in shared
/// memory asks its launch bounds for, when the config leaves `occupancy` to
/// the lowering: its rows wait in shared memory, not registers, so a thread
/// holds only its gathered values and indices. Given the whole register file
/// ptxas took 60 a thread for index_select (16384×8192 bf16 → 4096 columns,
/// H200): 4 blocks of 256 an SM, 64 KB of rows in flight, 80% of the copy
/// bandwidth. Bounded for 1536 threads it takes 40 without spilling and runs
/// at 94%; for 2048 (32 registers) it spills and runs at 63%
/// (docs/perf-history.md, "Loads read once, streamed; staged rows' occupancy").
const STAGED_THREADS: usize = 1536;

/// Checks the config for this lowering: blocks that are powers of two (the
/// layouts split them evenly) and 1 for `each` dimensions.
fn check_config(e: &Emitter) -> Result<(), CodegenError> {
    for (d, dim) in e.k.dims.iter().enumerate() {
        let b = e.cfg.block_sizes[d];
        if dim.each && b != 1 {
            return Err(config_err(
                e.k,
                e.cfg,
                format!(
                    "`{}` takes one index at a time (`each`): its block must be 1, not {b}",
                    dim.name
                ),
            ));
        }
        if !b.is_power_of_two() {
            return Err(config_err(
                e.k,
                e.cfg,
                format!(
                    "the general lowering splits blocks over threads evenly: the block of `{}` ({b}) must be a power of two",
                    dim.name
                ),
            ));
        }
    }
    Ok(())
}

pub(crate) fn emit(e: &mut Emitter, plan: &lowering::GeneralPlan) -> Result<Lowered, CodegenError> {
    check_config(e)?;
    let threads = e.cfg.threads();
    let k = e.k;
    let private = private::private_tensors(k, e.spec);
    // Shared only where the config allows it and the accumulators keep
    // their exact values in scratch.
    let checked = e.checked;
    let split = plan.split.as_ref().filter(|s| {
        e.cfg.split > 1
            && s.accs.iter().all(|(v, c)| {
                split::shareable(checked.vars[*v].dtype)
                    && match c {
                        // A position meets its best value element by element.
                        split::Combine::ArgOf { best, .. } => {
                            checked.vars[*best].dims == checked.vars[*v].dims
                        }
                        split::Combine::Op(_) => true,
                    }
            })
    });
    let mut g = Gen {
        e,
        layouts: Vec::new(),
        scope_layouts: HashMap::new(),
        body: String::new(),
        vars: HashMap::new(),
        loaded: Vec::new(),
        temps: 0,
        smem: 0,
        threads,
        rsub: HashMap::new(),
        private,
        part_dim: None,
        deferred: HashMap::new(),
        paired: argreduce::paired(k),
        gathers: Vec::new(),
        staged: 0,
        streamed: split
            .map(|s| stream::read_once(k, s.dim))
            .unwrap_or_default(),
    };
    let active: Vec<DimId> = k.grid.iter().copied().filter(|&d| !k.is_each(d)).collect();
    let root = g.scope_layout(&k.body, &active);
    let mut share = 0;
    match split {
        Some(s) => {
            g.stmts(&k.body[..s.at], &active, root, 1)?;
            g.part_dim = Some(s.dim);
            g.stmt(&k.body[s.at], &active, root, 1)?;
            let mut accs = Vec::new();
            for &(v, combine) in &s.accs {
                let Some(val) = g.vars.get(&v).cloned() else {
                    return Err(g.unsupported(
                        &k.vars[v].name,
                        format!("`{}` is assigned before it has a value", k.vars[v].name),
                    ));
                };
                accs.push((v, val, combine));
            }
            share = g.split_meet(&accs, 1)?;
            g.stmts(&k.body[s.at + 1..], &active, root, 1)?;
        }
        None => g.stmts(&k.body, &active, root, 1)?,
    }
    let body = std::mem::take(&mut g.body);
    let flush = g.private_flush();
    // The private copies after what the conversions and reductions share;
    // the launch sizes them (`Lowered::private`).
    let base = g.smem.next_multiple_of(16);
    let head = g.private_head(base);
    let smem = g.smem;
    // Programs walk the grid where their copies' kept tiles are its innermost.
    let walk = match split {
        None => private::kept_inner(k, &g.private).filter(|_| !g.private.is_empty()),
        Some(_) => None,
    };
    let private_launch = g.private_launch(walk);
    let layouts = g.layouts.clone();
    let gathers = std::mem::take(&mut g.gathers);
    let e = g.e;
    let mut extra: Vec<(Param, &str)> = match split {
        Some(_) => vec![
            (Param::SplitWays, "int tf_ways"),
            (Param::SplitPartials, "float* tf_partials"),
            (Param::SplitCounters, "unsigned* tf_counters"),
        ],
        None => Vec::new(),
    };
    if !gathers.is_empty() {
        extra.push((Param::StageCap, "long long tf_stage_cap"));
    }
    if private_launch.is_some() {
        extra.push((Param::PrivateOn, "int tf_priv"));
    }
    // One block an SM unless the config asks for more (`occupancy`): the
    // registers a thread may take then shrink, so more of a memory-bound
    // kernel's loads are in flight. Derived (0), a kernel that stages rows
    // asks for [`STAGED_THREADS`].
    let min_blocks = match crate::emit::options::occupancy_blocks(e.k, e.cfg, threads)? {
        Some(b) => b,
        None if !gathers.is_empty() => (STAGED_THREADS / threads).max(1),
        None => 1,
    };
    let params = e.begin(threads, min_blocks, "", &extra);
    let _ = writeln!(
        e.out,
        "  const int tid = threadIdx.x, tf_lane = tid & 31, tf_warp = tid >> 5;\n  \
         (void)tf_lane; (void)tf_warp;"
    );
    if smem > 0 || !gathers.is_empty() || private_launch.is_some() {
        e.out
            .push_str("  extern __shared__ __align__(16) unsigned char tf_smem[];\n");
    }
    if !gathers.is_empty() {
        // Staged rows go after everything else the block keeps there; the
        // launch sizes them (`Lowered::gathers`).
        let _ = writeln!(
            e.out,
            "  [[maybe_unused]] const unsigned int tf_stage_base = {};",
            smem.next_multiple_of(16)
        );
    }
    for (l, lay) in layouts.iter().enumerate() {
        let names = |d: DimId| k.dims[d].name.clone();
        let _ = writeln!(e.out, "  // layout {l}: {}", lay.describe(&names));
        for p in 0..lay.dims.len() {
            let base = lay.base_c(p);
            if lay.wraps(p) {
                let b = lay.block[p];
                let _ = writeln!(
                    e.out,
                    "  [[maybe_unused]] const int tf_o{l}_{p} = ({base}) & {}; [[maybe_unused]] const bool tf_u{l}_{p} = ({base}) < {b};",
                    b - 1
                );
            } else {
                let _ = writeln!(e.out, "  [[maybe_unused]] const int tf_o{l}_{p} = {base};");
            }
        }
    }
    e.out.push_str(&head);
    program_tiles(e, split.is_some(), walk.is_some())?;
    e.out.push_str(&body);
    if walk.is_some() {
        e.out.push_str("  }  // the walk\n");
    }
    e.out.push_str(&flush);
    e.out.push_str("}\n");
    let mut lowered = e.finish(params, threads, smem, "general");
    lowered.gathers = gathers;
    lowered.private = private_launch;
    lowered.split_loop = split.and_then(|s| {
        Some(SplitLoopLaunch {
            extent: k.dims[s.dim].extent?,
            block: e.cfg.block_sizes[s.dim],
            most: e.cfg.split,
            share_bytes: share,
        })
    });
    Ok(lowered)
}

/// Decodes the program id into the grid tiles' first indices `tb{d}` (the last
/// grid dimension moving fastest), honouring `starting_at`. With `walk`, the
/// program walks the grid's tiles a launch apart (`private`) and the decoding
/// opens that loop.
fn program_tiles(e: &mut Emitter, split: bool, walk: bool) -> Result<(), CodegenError> {
    // The launch's grid has fewer than 2^31 programs, so every tile count
    // and program number fits 32 bits (a 64-bit division costs ~100
    // instructions; the blocks are powers of two).
    if walk {
        let mut total = String::from("1u");
        for &d in &e.k.grid {
            let b = match e.k.is_each(d) {
                true => "1".to_string(),
                false => format!("B{d}"),
            };
            let _ = write!(total, " * (unsigned int)(({} + {b} - 1) / {b})", e.end(d));
        }
        for &d in &e.k.grid {
            let _ = writeln!(e.out, "  long long tb{d} = 0;");
        }
        let _ = writeln!(
            e.out,
            "  const unsigned int tf_total = {total};\n  \
             for (unsigned int tf_w = blockIdx.x; tf_w < tf_total; tf_w += gridDim.x) {{\n  \
             unsigned int tf_pid = tf_w;"
        );
    } else {
        let _ = writeln!(e.out, "  unsigned int tf_pid = blockIdx.x;");
    }
    if split {
        // The grid's tiles move fastest, the shares of each slowest: the
        // programs running at once read whole rows of a tensor walked down
        // its rows (a column sum's tiles side by side), not one column
        // tile's rows far apart.
        let _ = writeln!(e.out, "  unsigned int tf_progs = 1;");
    }
    if !walk {
        for &d in &e.k.grid {
            let _ = writeln!(e.out, "  long long tb{d};");
        }
    }
    for (pos, &d) in e.k.grid.iter().enumerate().rev() {
        let ext = e.end(d);
        let b = if e.k.is_each(d) {
            "1".to_string()
        } else {
            format!("B{d}")
        };
        let shift = match e.k.grid_start.get(pos) {
            Some(&s) => {
                if !e.spec.scalars.get(s).is_some_and(|k| k.is_int()) {
                    return Err(CodegenError::Argument {
                        kernel: e.k.name.clone(),
                        arg: e.k.scalars[s].name.clone(),
                        message: "a `starting_at` index must be an integer".into(),
                    });
                }
                format!(" + (s{s} / {b}) % tf_t + tf_t")
            }
            None => String::new(),
        };
        // The outermost dimension's index is what is left of the program id:
        // the launch has exactly the grid's programs (a walk stays below
        // their total), so no modulo. A 32-bit division is about 20
        // instructions a thread: dropping it took 1-3% off most short
        // programs (dropout 0.1543 -> 0.1508 ms on an H200), none slower.
        // A split's parts and `starting_at`'s rotation still need it.
        if pos == 0 && !split && shift.is_empty() {
            let _ = writeln!(e.out, "  tb{d} = (long long)tf_pid * {b};");
            continue;
        }
        // `starting_at` rotates the order, in 64 bits (the sum may pass 2^32).
        let tile = if shift.is_empty() {
            "tf_pid % tf_t".to_string()
        } else {
            format!("((long long)(tf_pid % tf_t){shift}) % tf_t")
        };
        let count = if split { " tf_progs *= tf_t;" } else { "" };
        let _ = writeln!(
            e.out,
            "  {{ const unsigned int tf_t = (unsigned int)(({ext} + {b} - 1) / {b});\n    tb{d} = (long long)({tile}) * {b};\n    tf_pid /= tf_t;{count} }}"
        );
    }
    if split {
        let _ = writeln!(
            e.out,
            "  const unsigned int tf_part = tf_pid;\n  const unsigned int tf_prog = blockIdx.x - tf_part * tf_progs;"
        );
    }
    Ok(())
}

/// Whether `e` reads a variable some statement of `body` assigns.
fn reads_assigned(e: &Expr, body: &[Stmt]) -> bool {
    let mut assigned = Vec::new();
    walk_stmts(body, &mut |s| {
        if let Stmt::Assign { var, .. } = s {
            assigned.push(*var);
        }
    });
    let mut found = false;
    e.walk(&mut |x| found |= matches!(x, Expr::Var(v) if assigned.contains(v)));
    found
}

fn indent(depth: usize) -> String {
    "  ".repeat(depth)
}

/// The statements a scope runs at its own level: its own, and those of its
/// runtime `if`s and `each` loops (which add no tile dimension).
fn level_stmts<'s>(k: &Kernel, stmts: &'s [Stmt], out: &mut Vec<&'s Stmt>) {
    for s in stmts {
        out.push(s);
        match s {
            Stmt::If {
                then, otherwise, ..
            } => {
                level_stmts(k, then, out);
                level_stmts(k, otherwise, out);
            }
            Stmt::Loop { dim, body, .. } if k.is_each(*dim) => level_stmts(k, body, out),
            _ => {}
        }
    }
}

impl Gen<'_, '_> {
    fn k(&self) -> &Kernel {
        self.e.k
    }

    fn block(&self, d: DimId) -> usize {
        if self.k().is_each(d) {
            1
        } else {
            self.e.cfg.block_sizes[d]
        }
    }

    fn w(&mut self, depth: usize, line: impl AsRef<str>) {
        let _ = writeln!(self.body, "{}{}", indent(depth), line.as_ref());
    }

    fn temp(&mut self, prefix: &str) -> String {
        self.temps += 1;
        format!("{prefix}{}", self.temps)
    }

    fn need_smem(&mut self, bytes: usize) {
        self.smem = self.smem.max(bytes);
    }

    fn unsupported(&self, at: &str, message: impl Into<String>) -> CodegenError {
        CodegenError::Unsupported {
            kernel: self.k().name.clone(),
            at: at.to_string(),
            message: message.into(),
        }
    }

    /// The type `e` has by the checker's rules.
    fn ty(&self, e: &Expr) -> crate::check::Ty {
        crate::check::type_of(self.e.k, self.e.spec, self.e.checked, e)
            .unwrap_or_else(|| crate::check::Ty::new(Vec::new(), crate::dtype::DType::F32))
    }

    /// The id of `layout` in [`Gen::layouts`], added if new.
    fn intern(&mut self, layout: Layout) -> usize {
        match self.layouts.iter().position(|l| *l == layout) {
            Some(i) => i,
            None => {
                self.layouts.push(layout);
                self.layouts.len() - 1
            }
        }
    }

    /// Elements of a value over `dims` a thread holds in layout `l`.
    fn size(&self, l: usize, dims: &[DimId]) -> usize {
        let lay = &self.layouts[l];
        dims.iter()
            .map(|&d| lay.pos(d).map_or(1, |p| lay.per_thread(p)))
            .product()
    }

    /// The register index along `d` of the current element: the loop
    /// variable `r{d}`, or what [`Gen::rsub`] says.
    fn rname(&self, d: DimId) -> String {
        self.rsub
            .get(&d)
            .cloned()
            .unwrap_or_else(|| format!("r{d}"))
    }

    /// The register index of the current element (loop variables `r{d}`) in
    /// a value over `dims` of layout `l`.
    fn flat(&self, l: usize, dims: &[DimId]) -> String {
        if dims.is_empty() {
            return String::new();
        }
        let lay = &self.layouts[l];
        let mut terms = Vec::new();
        let mut stride = 1;
        for &d in dims.iter().rev() {
            let n = lay.pos(d).map_or(1, |p| lay.per_thread(p));
            if n > 1 {
                let r = self.rname(d);
                terms.push(if stride == 1 {
                    r
                } else {
                    format!("{r} * {stride}")
                });
            }
            stride *= n;
        }
        if terms.is_empty() {
            "[0]".into()
        } else {
            terms.reverse();
            format!("[{}]", terms.join(" + "))
        }
    }

    /// The C access of `v`'s current element.
    fn access(&self, v: &Val) -> String {
        let flat = self.flat(v.layout, &v.dims);
        if let Some((_, view)) = &v.view {
            return view.replace("{}", &format!("{}{flat}", v.name));
        }
        match v.raw {
            None => format!("{}{flat}", v.name),
            Some(dt) => {
                let f = flat.trim_start_matches('[').trim_end_matches(']');
                let f = if f.is_empty() { "0" } else { f };
                memory::unpack_word(dt, &v.name, f)
            }
        }
    }

    /// The entries of a value's array (a load's raw words where it keeps them).
    fn len(&self, v: &Val) -> usize {
        match v.raw {
            Some(dt) => (self.size(v.layout, &v.dims) * dt.size()).div_ceil(4),
            None => self.size(v.layout, &v.dims),
        }
    }

    /// The C declaration of a value's array (or scalar).
    fn decl(&self, v: &Val) -> String {
        if v.raw.is_some() {
            return format!("unsigned int {}[{}]", v.name, self.len(v));
        }
        let cty = v.view.as_ref().map_or(v.cty, |(held, _)| *held);
        if v.dims.is_empty() {
            format!("{} {}", cty.c(), v.name)
        } else {
            format!("{} {}[{}]", cty.c(), v.name, self.len(v))
        }
    }

    /// The in-block offset of the current element along `d` (layout `l`).
    fn offset_c(&self, l: usize, d: DimId) -> String {
        let lay = &self.layouts[l];
        let Some(p) = lay.pos(d) else {
            return "0".into();
        };
        let (spt, e) = (lay.spt[p], lay.per_thread(p));
        let r = self.rname(d);
        let reg = if e == 1 {
            String::new()
        } else if spt == e {
            format!(" + {r}")
        } else if spt == 1 {
            format!(" + {r} * {}", lay.span(p))
        } else {
            format!(" + ({r} / {spt}) * {} + ({r} % {spt})", lay.span(p))
        };
        format!("tf_o{l}_{p}{reg}")
    }

    /// The global index of the current element along `d`.
    fn coord_c(&self, l: usize, d: DimId) -> String {
        if self.k().is_each(d) {
            return format!("tb{d}");
        }
        format!("(tb{d} + {})", self.offset_c(l, d))
    }

    /// Whether the current element along each of `dims` is inside its extent
    /// and not a copy.
    fn live_c(&self, l: usize, dims: &[DimId]) -> String {
        self.extent_terms(l, dims, |g, d| {
            format!("{} < {}", g.coord_c(l, d), g.e.end(d))
        })
    }

    /// `term(d)` for each of `dims` but `each` ones, with the copy flag of a
    /// wrapped one, joined by `&&` ("true" for none).
    fn extent_terms(
        &self,
        l: usize,
        dims: &[DimId],
        term: impl Fn(&Self, DimId) -> String,
    ) -> String {
        let mut terms = Vec::new();
        for &d in dims {
            if self.k().is_each(d) {
                continue;
            }
            terms.push(term(self, d));
            let lay = &self.layouts[l];
            if let Some(p) = lay.pos(d).filter(|&p| lay.wraps(p)) {
                terms.push(format!("tf_u{l}_{p}"));
            }
        }
        if terms.is_empty() {
            "true".into()
        } else {
            terms.join(" && ")
        }
    }

    /// Whether every element this thread holds along `dims` is inside its
    /// extent and not a copy: the tile is whole there (a branch uniform over
    /// the warp but for the copies), so a loop of [`Self::live_c`] masks can
    /// go without them: a mask an element costs 2–4 instructions (a 64-bit
    /// compare, predicates saved to registers), as much as what it guards.
    fn full_c(&self, l: usize, dims: &[DimId]) -> String {
        self.extent_terms(l, dims, |g, d| {
            format!("tb{d} + {} <= {}", g.block(d), g.e.end(d))
        })
    }

    /// Code that masks elements by `live` (`body` writes it, given the guard
    /// to put in front of a masked statement), written twice where it pays:
    /// once without the masks, where the tile is whole along `along`
    /// ([`Self::full_c`]), so that every tile but the last runs none. The
    /// branch goes around the whole of `body`, loops over the other
    /// dimensions included, and only where a thread holds at least
    /// [`UNMASKED_MIN`] elements along `along`.
    fn unmasked_where_whole<F>(
        &mut self,
        l: usize,
        along: &[DimId],
        live: &str,
        depth: usize,
        body: &mut F,
    ) -> Result<(), CodegenError>
    where
        F: FnMut(&mut Self, usize, Option<&str>) -> Result<(), CodegenError>,
    {
        let full = self.full_c(l, along);
        let lay = &self.layouts[l];
        let elements: usize = along
            .iter()
            .map(|&d| lay.pos(d).map_or(1, |p| lay.per_thread(p)))
            .product();
        if live == "true" {
            body(self, depth, None)
        } else if full == "true" || elements < UNMASKED_MIN {
            body(self, depth, Some(live))
        } else {
            self.w(depth, format!("if ({full}) {{"));
            body(self, depth + 1, None)?;
            self.w(depth, "} else {");
            body(self, depth + 1, Some(live))?;
            self.w(depth, "}");
            Ok(())
        }
    }

    /// `stmt` for every register of `dims` (layout `l`), masked by `live`
    /// where a tile along `along` is not whole ([`Self::unmasked_where_whole`]).
    fn masked_loops(
        &mut self,
        l: usize,
        dims: &[DimId],
        along: &[DimId],
        live: &str,
        stmt: &str,
        depth: usize,
    ) -> Result<(), CodegenError> {
        self.unmasked_where_whole(l, along, live, depth, &mut |g, depth, guard| {
            let n = g.open(l, dims, depth);
            let line = match guard {
                Some(live) => format!("if ({live}) {stmt}"),
                None => stmt.to_string(),
            };
            g.w(depth + n, line);
            g.close(n, depth);
            Ok(())
        })
    }

    /// Whether this thread is the one that writes a value over `dims` (layout
    /// `l`): not a copy along `dims`, and first along the layout's other
    /// dimensions (every thread there holds the same elements).
    fn owner_c(&self, l: usize, dims: &[DimId]) -> String {
        let lay = &self.layouts[l];
        let mut terms = Vec::new();
        for (p, &d) in lay.dims.iter().enumerate() {
            if dims.contains(&d) {
                if lay.wraps(p) {
                    terms.push(format!("tf_u{l}_{p}"));
                }
            } else if lay.tpw[p] * lay.wpc[p] > 1 {
                terms.push(format!("tf_o{l}_{p} == 0"));
                if lay.wraps(p) {
                    terms.push(format!("tf_u{l}_{p}"));
                }
            }
        }
        if terms.is_empty() {
            "true".into()
        } else {
            terms.join(" && ")
        }
    }

    /// Opens unrolled loops over the registers of `dims` in layout `l`;
    /// returns how many to close.
    fn open(&mut self, l: usize, dims: &[DimId], depth: usize) -> usize {
        let mut n = 0;
        for &d in dims {
            let lay = &self.layouts[l];
            let count = lay.pos(d).map_or(1, |p| lay.per_thread(p));
            self.w(
                depth + n,
                format!(
                    "#pragma unroll\n{}for (int r{d} = 0; r{d} < {count}; ++r{d}) {{",
                    indent(depth + n)
                ),
            );
            n += 1;
        }
        n
    }

    fn close(&mut self, n: usize, depth: usize) {
        for i in (0..n).rev() {
            self.w(depth + i, "}");
        }
    }

    /// An element context for the current element (layout `l`): coordinates
    /// of every dimension of the layout, variables and hoisted values by
    /// their register.
    fn ctx(&self, l: usize, pre: &[(Expr, Val)]) -> ElemCtx<'_> {
        let mut c = self.e.ctx(&[]);
        for &d in &self.layouts[l].dims {
            c.coords.insert(d, self.coord_c(l, d));
        }
        for d in 0..self.k().dims.len() {
            if self.k().is_each(d) {
                c.coords.insert(d, format!("tb{d}"));
            }
        }
        for (v, val) in &self.vars {
            c.named_vars.insert(*v, self.access(val));
        }
        c.precomputed = pre
            .iter()
            .map(|(x, val)| (x.clone(), self.access(val)))
            .collect();
        c
    }

    /// The layout of a scope running `stmts` with `active` tile dimensions:
    /// its heaviest inner loop's when its own work is small next to it (a row
    /// program's per-row values then sit where the loop over the row needs
    /// them), else one made for its own loads and stores.
    fn scope_layout(&mut self, stmts: &[Stmt], active: &[DimId]) -> usize {
        let key = stmts.as_ptr() as usize;
        if let Some(&l) = self.scope_layouts.get(&key) {
            return l;
        }
        let k = self.e.k;
        let mut level = Vec::new();
        level_stmts(k, stmts, &mut level);
        let own = self.own_volume(&level, active);
        let mut best: Option<(usize, &[Stmt], Vec<DimId>)> = None;
        for s in &level {
            if let Stmt::Loop { dim, body, .. } = s {
                if k.is_each(*dim) {
                    continue;
                }
                let mut inner = active.to_vec();
                inner.push(*dim);
                let vol: usize = inner.iter().map(|&d| self.block(d)).product();
                if best.as_ref().is_none_or(|b| vol > b.0) {
                    best = Some((vol, body.as_slice(), inner));
                }
            }
        }
        let l = match best {
            Some((vol, body, inner)) if own.saturating_mul(4) <= vol => {
                self.scope_layout(body, &inner)
            }
            _ => {
                let lay = self.make_layout(&level, active);
                self.intern(lay)
            }
        };
        self.scope_layouts.insert(key, l);
        l
    }

    /// The tiles a store or atomic writes over: its index's and its value's.
    fn access_dims(&self, index: &[Expr], value: &Expr) -> Vec<DimId> {
        let mut dims = self.ty(value).dims;
        for c in index {
            dims.extend(self.ty(c).dims);
        }
        dims.sort_unstable();
        dims.dedup();
        dims
    }

    /// The most elements a load, store or atomic of this level moves.
    fn own_volume(&self, level: &[&Stmt], active: &[DimId]) -> usize {
        let mut most = 0;
        let mut note = |dims: &[DimId]| {
            let v: usize = dims
                .iter()
                .filter(|d| active.contains(d))
                .map(|&d| self.block(d))
                .product();
            most = most.max(v);
        };
        for s in level {
            if let Stmt::Store { index, value, .. } | Stmt::Atomic { index, value, .. } = s {
                note(&self.access_dims(index, value));
            }
            for e in s.exprs() {
                e.walk(&mut |x| {
                    if matches!(x, Expr::Load { .. }) {
                        note(&self.ty(x).dims)
                    }
                });
            }
        }
        most
    }

    /// A layout over `active` for the accesses of `level`: the contiguous
    /// dimension is the one most bytes move along (the last index of
    /// contiguous tensors), with runs of 16 bytes of the narrowest such type.
    fn make_layout(&self, level: &[&Stmt], active: &[DimId]) -> Layout {
        let k = self.k();
        let mut dims: Vec<DimId> = active.to_vec();
        dims.sort_unstable();
        let block: Vec<usize> = dims.iter().map(|&d| self.block(d)).collect();
        // Votes: bytes moved along each dimension as the last, contiguous index.
        // Per dimension: bytes moved in all, and by element size.
        let mut votes: HashMap<DimId, (usize, [usize; 9])> = HashMap::new();
        let mut vote = |t: TensorId, index: &[Expr], dims_of: &[DimId]| {
            let ts = &self.e.spec.tensors[t];
            if !ts.last_contiguous {
                return;
            }
            if let Some(d) = index.last().and_then(|c| memory::affine_dim(k, c)) {
                if active.contains(&d) {
                    let vol: usize = dims_of.iter().map(|&x| self.block(x)).product();
                    let e = votes.entry(d).or_insert((0, [0; 9]));
                    e.0 += vol * ts.dtype.size();
                    e.1[ts.dtype.size()] += vol * ts.dtype.size();
                }
            }
        };
        for s in level {
            if let Stmt::Store {
                tensor,
                index,
                value,
                ..
            }
            | Stmt::Atomic {
                tensor,
                index,
                value,
                ..
            } = s
            {
                vote(*tensor, index, &self.access_dims(index, value));
            }
            for e in s.exprs() {
                e.walk(&mut |x| {
                    if let Expr::Load { tensor, index, .. } = x {
                        vote(*tensor, index, &self.ty(x).dims);
                    }
                });
            }
        }
        // Runs of 16 bytes of the element size that moves the most bytes (the
        // narrower on a tie): float -> int8/16/32/64 conversions keep the f32
        // and i64 accesses whole-sector per instruction, the bytes' runs short.
        let best = votes
            .iter()
            .max_by_key(|(d, (bytes, _))| (*bytes, usize::MAX - **d))
            .map(|(d, (_, by_size))| {
                let size = (1..by_size.len())
                    .max_by_key(|&s| (by_size[s], usize::MAX - s))
                    .unwrap_or(2);
                (*d, size)
            });
        let (contiguous, vec) = match best {
            Some((d, size)) => (dims.iter().position(|&x| x == d), 16 / size.max(1)),
            // No access to follow: the innermost dimension, one element a run.
            None => (dims.iter().position(|&x| Some(&x) == active.last()), 1),
        };
        // The others, innermost loop first; but where the level multiplies
        // tiles (`addmm`), the grid's first: its accumulators live across the
        // loop over the grid's dimensions, and spread over the threads there
        // (the loop's products are transients).
        let multiplies = level.iter().any(|s| {
            let mut found = false;
            for e in s.exprs() {
                e.walk(&mut |x| found |= matches!(x, Expr::Addmm { .. }));
            }
            found
        });
        let mut others: Vec<usize> = active
            .iter()
            .rev()
            .filter_map(|d| dims.iter().position(|x| x == d))
            .collect();
        if multiplies {
            others.reverse();
        }
        let mut reduced = Vec::new();
        for s in level {
            for e in s.exprs() {
                e.walk(&mut |x| {
                    // Scans too: across warps they also go through shared memory.
                    if let Expr::Reduce { dim, .. }
                    | Expr::Scan { dim, .. }
                    | Expr::ArgReduce { dim, .. } = x
                    {
                        if let Some(p) = dims.iter().position(|d| d == dim) {
                            reduced.push(p);
                        }
                    }
                });
            }
        }
        let warps = self.e.cfg.num_warps;
        if !multiplies {
            return Layout::blocked(&dims, &block, contiguous, vec, warps, &others, &reduced);
        }
        // Where the level multiplies tiles, its values differ in their tiles
        // (scores over queries and keys, accumulators over queries and the head
        // dimension, operands over keys and the head dimension): one spread of
        // the threads leaves some whole in every thread, and no fixed order
        // suits every kernel. Take the spread whose values need the fewest
        // registers, the grid-first one unless another needs a tenth fewer.
        let values = self.level_values(level);
        let candidates = Layout::spreads(&dims, &block, contiguous, vec, warps, &others, &reduced);
        let base = candidates[0].held(&values);
        let best = candidates
            .iter()
            .min_by_key(|l| l.held(&values))
            .filter(|l| l.held(&values) * 10 <= base * 9)
            .unwrap_or(&candidates[0]);
        best.clone()
    }

    /// The tiles and element sizes of the values a level holds in registers:
    /// its `let`s and assignments, and the loads, reductions and products
    /// inside them (an elementwise expression's inner nodes are computed
    /// element by element and are not held).
    fn level_values(&self, level: &[&Stmt]) -> Vec<(Vec<DimId>, usize)> {
        let mut out = Vec::new();
        for s in level {
            if let Stmt::Let { value, .. } | Stmt::Assign { value, .. } = s {
                let t = self.ty(value);
                out.push((t.dims, t.dtype.size()));
            }
            for e in s.exprs() {
                e.walk(&mut |x| {
                    if matches!(
                        x,
                        Expr::Load { .. }
                            | Expr::Reduce { .. }
                            | Expr::Scan { .. }
                            | Expr::ArgReduce { .. }
                            | Expr::Addmm { .. }
                    ) {
                        let t = self.ty(x);
                        out.push((t.dims, t.dtype.size()));
                    }
                });
            }
        }
        out
    }

    fn stmts(
        &mut self,
        stmts: &[Stmt],
        active: &[DimId],
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        self.prefetch(stmts, l, depth)?;
        for s in stmts {
            self.stmt(s, active, l, depth)?;
        }
        Ok(())
    }

    /// Issues the loads of a level's statements before the first of them, so
    /// their latency overlaps whatever the statements compute before the
    /// values are used (dropout draws its random numbers, about 13
    /// instructions an element, before the load it scales; in that order a
    /// warp waits for its load after the draws). Taken: loads of tensors the
    /// kernel never writes (and waits for nothing), indexed by tiles, scalars
    /// and constants only, outside branches, nested loops and matmuls; the
    /// statements then find them in [`Gen::loaded`].
    fn prefetch(&mut self, stmts: &[Stmt], l: usize, depth: usize) -> Result<(), CodegenError> {
        let loads: Vec<Expr> = self.level_loads(stmts).into_iter().cloned().collect();
        let mut pre = Vec::new();
        for x in &loads {
            if self.loaded.iter().any(|(y, _)| y == x) {
                continue;
            }
            let at = match x {
                Expr::Load { at, .. } => at.clone(),
                _ => String::new(),
            };
            self.hoist_into(x, &at, l, depth, &mut pre)?;
        }
        Ok(())
    }

    /// The loads [`Gen::prefetch`] takes from a level's statements.
    fn level_loads<'s>(&self, stmts: &'s [Stmt]) -> Vec<&'s Expr> {
        let k = self.e.k;
        let mut written = Vec::new();
        let mut waits = false;
        k.walk_stmts(&mut |s| match s {
            Stmt::Store { tensor, .. } | Stmt::Atomic { tensor, .. } => written.push(*tensor),
            Stmt::Wait { .. } | Stmt::Signal { .. } => waits = true,
            _ => {}
        });
        if waits {
            return Vec::new();
        }
        fn plain(index: &[Expr]) -> bool {
            let mut ok = true;
            for i in index {
                i.walk(&mut |y| {
                    ok &= !matches!(
                        y,
                        Expr::Var(_)
                            | Expr::Load { .. }
                            | Expr::Reduce { .. }
                            | Expr::Scan { .. }
                            | Expr::ArgReduce { .. }
                            | Expr::Addmm { .. }
                            | Expr::Rand { .. }
                    )
                });
            }
            ok
        }
        fn collect<'a>(x: &'a Expr, written: &[TensorId], out: &mut Vec<&'a Expr>) {
            match x {
                Expr::Load { tensor, index, .. } => {
                    if !written.contains(tensor) && plain(index) && !out.contains(&x) {
                        out.push(x);
                    }
                }
                Expr::Addmm { .. } => {}
                _ => {
                    for c in x.children() {
                        collect(c, written, out);
                    }
                }
            }
        }
        let mut loads = Vec::new();
        for s in stmts {
            if matches!(
                s,
                Stmt::Let { .. } | Stmt::Assign { .. } | Stmt::Store { .. } | Stmt::Atomic { .. }
            ) {
                for x in s.exprs() {
                    collect(x, &written, &mut loads);
                }
            }
        }
        loads
    }

    fn stmt(
        &mut self,
        s: &Stmt,
        active: &[DimId],
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        match s {
            Stmt::Let { var, value, at } => {
                // A mask `rand(..) > p` that is never reassigned stays the
                // draws' words, compared where it is used (a predicate
                // rather than a register of booleans).
                if !self.k().vars[*var].mutable {
                    let mut pre = Vec::new();
                    if let Some(v) = self.rand_compare(value, l, depth, &mut pre)? {
                        self.w(depth, format!("// {} (compared where used)", one_line(at)));
                        self.vars.insert(*var, v);
                        return Ok(());
                    }
                }
                let t = self.e.checked.vars[*var].clone();
                let val = Val {
                    name: format!("v{var}_{}", self.temps),
                    dims: t.dims.clone(),
                    cty: t.dtype.cty(),
                    layout: l,
                    raw: None,
                    view: None,
                };
                self.temps += 1;
                self.w(depth, format!("// {}", one_line(at)));
                let decl = self.decl(&val);
                self.w(depth, format!("{decl};"));
                self.assign(&val, t.dtype, value, at, l, depth)?;
                self.vars.insert(*var, val);
            }
            Stmt::Assign { at, .. } if self.deferred.contains_key(&(s as *const Stmt as usize)) => {
                let key = s as *const Stmt as usize;
                let d = self.deferred[&key].clone();
                self.w(
                    depth,
                    format!("// {} (reduced after the loop)", one_line(at)),
                );
                self.accumulate(&d, at, l, depth)?;
            }
            Stmt::Assign { var, value, at } => {
                let Some(val) = self.vars.get(var).cloned() else {
                    return Err(self.unsupported(
                        at,
                        format!(
                            "`{}` is assigned before it has a value",
                            self.k().vars[*var].name
                        ),
                    ));
                };
                self.w(depth, format!("// {}", one_line(at)));
                let dtype = self.e.checked.vars[*var].dtype;
                self.assign(&val, dtype, value, at, l, depth)?;
                self.forget_written(std::slice::from_ref(s));
            }
            Stmt::Store {
                tensor,
                index,
                value,
                at,
            } => {
                self.w(depth, format!("// {}", one_line(at)));
                self.store(*tensor, index, value, (None, None), at, l, depth)?;
                self.loaded.retain(|(x, _)| !reads_tensor(x, *tensor));
            }
            Stmt::Atomic {
                op,
                tensor,
                index,
                value,
                old,
                at,
            } => {
                self.w(depth, format!("// {}", one_line(at)));
                match old {
                    Some(var) => self.fetch(*tensor, index, value, (*op, *var), at, l, depth)?,
                    None => self.store(*tensor, index, value, (Some(*op), None), at, l, depth)?,
                }
                self.loaded.retain(|(x, _)| !reads_tensor(x, *tensor));
            }
            Stmt::Wait { .. } | Stmt::Signal { .. } => {
                self.forget_written(std::slice::from_ref(s));
                // Block-level statements: every thread takes part (their barrier).
                let out = std::mem::take(&mut self.e.out);
                let vars = self.scalar_names();
                let saved = std::mem::replace(&mut self.e.named_vars, vars);
                let r = self.e.block_stmt(s, &indent(depth));
                self.e.named_vars = saved;
                let code = std::mem::replace(&mut self.e.out, out);
                r?;
                self.body.push_str(&code);
            }
            Stmt::If {
                cond,
                then,
                otherwise,
                at,
            } => {
                let c = self.ctx(l, &[]).cond(cond, at)?;
                self.w(depth, format!("if ({c}) {{  // {}", one_line(at)));
                self.branch(then, active, l, depth + 1)?;
                if !otherwise.is_empty() {
                    self.w(depth, "} else {");
                    self.branch(otherwise, active, l, depth + 1)?;
                }
                self.w(depth, "}");
            }
            Stmt::Loop {
                dim,
                body,
                until,
                range,
            } => self.lower_loop(
                *dim,
                body,
                until.as_ref(),
                range.as_deref(),
                active,
                l,
                depth,
            )?,
        }
        Ok(())
    }

    /// Scalar variables by their C names, for the block-level statements.
    fn scalar_names(&self) -> HashMap<VarId, String> {
        self.vars
            .iter()
            .filter(|(_, v)| v.dims.is_empty())
            .map(|(k, v)| (*k, v.name.clone()))
            .collect()
    }

    /// A branch's statements: its variables and loads die with it.
    fn branch(
        &mut self,
        stmts: &[Stmt],
        active: &[DimId],
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        let saved = (self.vars.clone(), self.loaded.clone());
        self.stmts(stmts, active, l, depth)?;
        (self.vars, self.loaded) = saved;
        self.forget_written(stmts);
        Ok(())
    }

    /// Drops the registers of loads that `stmts` may have made stale: loads
    /// of a tensor they write, or that read a variable they assign; all of
    /// them after a `wait` (the data it waited for changed).
    fn forget_written(&mut self, stmts: &[Stmt]) {
        let (mut written, mut assigned, mut waits) = (Vec::new(), Vec::new(), false);
        walk_stmts(stmts, &mut |s| match s {
            Stmt::Store { tensor, .. } | Stmt::Atomic { tensor, .. } => written.push(*tensor),
            Stmt::Assign { var, .. } => assigned.push(*var),
            Stmt::Wait { .. } => waits = true,
            _ => {}
        });
        if waits {
            self.loaded.clear();
            return;
        }
        self.loaded.retain(|(x, _)| {
            let mut keep = true;
            x.walk(&mut |y| match y {
                Expr::Load { tensor, .. } => keep &= !written.contains(tensor),
                Expr::Var(v) => keep &= !assigned.contains(v),
                _ => {}
            });
            keep
        });
    }

    /// Computes `value` into `dst` (a variable of dtype `dtype`), element by element.
    fn assign(
        &mut self,
        dst: &Val,
        dtype: crate::dtype::DType,
        value: &Expr,
        at: &str,
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        self.assign_seeded(dst, dtype, value, at, l, depth, Vec::new())
    }

    /// [`Gen::assign`] with some of `value`'s parts already in registers.
    #[allow(clippy::too_many_arguments)]
    fn assign_seeded(
        &mut self,
        dst: &Val,
        dtype: crate::dtype::DType,
        value: &Expr,
        at: &str,
        l: usize,
        depth: usize,
        mut pre: Vec<(Expr, Val)>,
    ) -> Result<(), CodegenError> {
        self.hoist_into(value, at, l, depth, &mut pre)?;
        let n = self.open(l, &dst.dims, depth);
        let (c, ty) = self.ctx(l, &pre).emit(value, at)?;
        let c = crate::prims::cast::cuda(&c, ty, dtype);
        let c = convert(&c, dtype.cty(), dst.cty);
        let access = self.access(dst);
        self.w(depth + n, format!("{access} = {c};"));
        self.close(n, depth);
        Ok(())
    }

    /// Computes the loads, reductions and matmuls inside `value` into
    /// registers (innermost first); returns them for the elementwise code.
    fn hoist(
        &mut self,
        value: &Expr,
        at: &str,
        l: usize,
        depth: usize,
    ) -> Result<Vec<(Expr, Val)>, CodegenError> {
        let mut pre: Vec<(Expr, Val)> = Vec::new();
        self.hoist_into(value, at, l, depth, &mut pre)?;
        Ok(pre)
    }

    fn hoist_into(
        &mut self,
        x: &Expr,
        at: &str,
        l: usize,
        depth: usize,
        pre: &mut Vec<(Expr, Val)>,
    ) -> Result<(), CodegenError> {
        if pre.iter().any(|(y, _)| y == x) {
            return Ok(());
        }
        match x {
            Expr::Load { .. } => {
                if let Some((_, v)) = self.loaded.iter().find(|(y, _)| y == x) {
                    pre.push((x.clone(), v.clone()));
                    return Ok(());
                }
                let v = self.load(x, at, l, depth, pre)?;
                self.loaded.push((x.clone(), v.clone()));
                pre.push((x.clone(), v));
            }
            Expr::Reduce { op, arg, dim, at } | Expr::ArgReduce { op, arg, dim, at } => {
                let key = argreduce::cache_key(x);
                if let Some((_, v)) = self.loaded.iter().find(|(y, _)| *y == key) {
                    pre.push((x.clone(), v.clone()));
                    return Ok(());
                }
                self.hoist_into(arg, at, l, depth, pre)?;
                let wants_arg = matches!(x, Expr::ArgReduce { .. });
                let paired = self
                    .paired
                    .iter()
                    .any(|(o, a, d)| o == op && **arg == *a && d == dim);
                if !paired && !wants_arg {
                    let v = self.reduce(*op, arg, *dim, at, l, depth, pre)?;
                    pre.push((x.clone(), v));
                    return Ok(());
                }
                // The pairs, and where the kernel reduces the same tile
                // plainly too, their values, kept for it.
                let (idx, val) = self.arg_reduce(*op, arg, *dim, at, l, depth, pre, paired)?;
                let (arg_x, plain_x) = (
                    Expr::ArgReduce {
                        op: *op,
                        arg: arg.clone(),
                        dim: *dim,
                        at: String::new(),
                    },
                    Expr::Reduce {
                        op: *op,
                        arg: arg.clone(),
                        dim: *dim,
                        at: String::new(),
                    },
                );
                if let Some(val) = val {
                    self.loaded.push((plain_x, val.clone()));
                    self.loaded.push((arg_x, idx.clone()));
                    if !wants_arg {
                        pre.push((x.clone(), val));
                        return Ok(());
                    }
                }
                pre.push((x.clone(), idx));
            }
            Expr::Scan { op, arg, dim, at } => {
                self.hoist_into(arg, at, l, depth, pre)?;
                let v = self.scan(*op, arg, *dim, at, l, depth, pre)?;
                pre.push((x.clone(), v));
            }
            Expr::Addmm { acc, a, b, at } => {
                for y in [acc, a, b] {
                    self.hoist_into(y, at, l, depth, pre)?;
                }
                let v = self.addmm(acc, a, b, at, l, depth, pre)?;
                pre.push((x.clone(), v));
            }
            Expr::Rand {
                kind,
                seed,
                offset,
                at,
            } => {
                for c in [seed, offset] {
                    self.hoist_into(c, at, l, depth, pre)?;
                }
                if let Some(v) =
                    self.rand_groups(x, *kind, seed, offset, None, at, l, depth, pre)?
                {
                    pre.push((x.clone(), v));
                }
            }
            Expr::Compare { at, .. } => {
                if let Some(v) = self.rand_compare(x, l, depth, pre)? {
                    pre.push((x.clone(), v));
                } else {
                    for c in x.children() {
                        self.hoist_into(c, at, l, depth, pre)?;
                    }
                }
            }
            _ => {
                for c in x.children() {
                    self.hoist_into(c, at, l, depth, pre)?;
                }
            }
        }
        Ok(())
    }

    /// Computes an elementwise expression over its own dimensions into a new
    /// temporary (a gathered index, a reduction's argument).
    fn materialize(
        &mut self,
        x: &Expr,
        at: &str,
        l: usize,
        depth: usize,
        pre: &[(Expr, Val)],
    ) -> Result<Val, CodegenError> {
        if let Some((_, v)) = pre.iter().find(|(y, _)| y == x) {
            return Ok(v.clone());
        }
        let t = self.ty(x);
        let v = Val {
            name: self.temp("tf_x"),
            dims: t.dims.clone(),
            cty: t.dtype.cty(),
            layout: l,
            raw: None,
            view: None,
        };
        let decl = self.decl(&v);
        self.w(depth, format!("{decl};"));
        let n = self.open(l, &v.dims, depth);
        let (c, ty) = self.ctx(l, pre).emit(x, at)?;
        let access = self.access(&v);
        self.w(depth + n, format!("{access} = {};", convert(&c, ty, v.cty)));
        self.close(n, depth);
        Ok(v)
    }

    #[allow(clippy::too_many_arguments)]
    fn lower_loop(
        &mut self,
        dim: DimId,
        body: &[Stmt],
        until: Option<&Expr>,
        range: Option<&LoopRange>,
        active: &[DimId],
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        let k = self.e.k;
        let name = k.dims[dim].name.clone();
        let each = k.is_each(dim);
        let scalar = |g: &Self, x: &Expr| -> Result<String, CodegenError> {
            let (c, t) = g.ctx(l, &[]).emit(x, &name)?;
            Ok(convert(&c, t, CTy::I64))
        };
        // A split loop's share: whole tiles, the `tf_part`-th of `tf_ways`.
        let part = self.part_dim.take() == Some(dim) && range.is_none();
        let (begin, end) = match range {
            Some(r) => (scalar(self, &r.begin)?, scalar(self, &r.end)?),
            None if part => {
                let (ext, b) = (self.e.end(dim), format!("B{dim}"));
                let tiles = format!("(({ext}) + {b} - 1) / {b}");
                (
                    format!("({tiles}) * tf_part / tf_ways * {b}"),
                    format!("tf_min_i({ext}, ({tiles}) * (tf_part + 1) / tf_ways * {b})"),
                )
            }
            None => ("0ll".to_string(), self.e.end(dim)),
        };
        let ranged = range.is_some() || part;
        let stop = match until {
            Some(u) => format!("tf_min_i({end}, {})", scalar(self, u)?),
            None => end.clone(),
        };
        let mut inner = active.to_vec();
        if !each {
            inner.push(dim);
        }
        let li = if each {
            l
        } else {
            self.scope_layout(body, &inner)
        };
        self.w(depth, format!("{{  // for {name} in …"));
        let d1 = depth + 1;
        if ranged {
            // The first tile's start (vector runs test its alignment) and the end.
            self.w(
                d1,
                format!("[[maybe_unused]] const long long tf_beg{dim} = {begin};"),
            );
            self.w(d1, format!("const long long tf_end{dim} = {end};"));
        }
        // Values this loop uses, moved to its layout where it differs.
        let moved = self.enter(body, li, d1)?;
        let deferred = if each {
            Vec::new()
        } else {
            self.defer(body, dim, li, d1)?
        };
        if !deferred.is_empty() {
            // Where the deferred reductions run: their masks were applied
            // as the tiles arrived.
            self.w(d1, format!("[[maybe_unused]] const long long tb{dim} = 0;"));
        }
        let step = if each {
            "++tb{dim}".replace("{dim}", &dim.to_string())
        } else {
            format!("tb{dim} += B{dim}")
        };
        let bound = if ranged && until.is_none() {
            format!("tf_end{dim}")
        } else {
            stop
        };
        let begin = if ranged {
            format!("tf_beg{dim}")
        } else {
            begin
        };
        // A bound the body moves (`until(lim)` with `lim` assigned in the
        // loop) is known only after each step: no tile is loaded ahead.
        let moving = until.is_some_and(|u| reads_assigned(u, body));
        let ahead = if each || moving || !self.pipelined() {
            Vec::new()
        } else {
            self.load_first(body, dim, &begin, &bound, li, d1)?
        };
        self.w(
            d1,
            format!("for (long long tb{dim} = {begin}; tb{dim} < {bound}; {step}) {{"),
        );
        let saved = (self.vars.clone(), std::mem::take(&mut self.loaded));
        self.load_next(&ahead, dim, &bound, li, d1 + 1)?;
        self.stmts(body, &inner, li, d1 + 1)?;
        (self.vars, self.loaded) = saved;
        self.forget_written(body);
        self.w(d1, "}");
        self.finish_deferred(&deferred, li, d1)?;
        for s in body {
            self.deferred.remove(&(s as *const Stmt as usize));
        }
        self.leave(moved, d1)?;
        self.w(depth, "}");
        Ok(())
    }

    /// Before a loop of layout `li`: each tile variable it reads or assigns
    /// that sits elsewhere in `li` is copied into `li`'s registers. Returns the
    /// moved ones (old and new value) to move back after the loop.
    fn enter(
        &mut self,
        body: &[Stmt],
        li: usize,
        depth: usize,
    ) -> Result<Vec<(VarId, Val, Val, bool)>, CodegenError> {
        let mut used: Vec<VarId> = Vec::new();
        let mut assigned: Vec<VarId> = Vec::new();
        walk_stmts(body, &mut |s| {
            if let Stmt::Assign { var, .. } = s {
                assigned.push(*var);
            }
            for e in s.exprs() {
                e.walk(&mut |x| {
                    if let Expr::Var(v) = x {
                        used.push(*v);
                    }
                });
            }
        });
        used.extend(assigned.iter().copied());
        used.sort_unstable();
        used.dedup();
        let mut moved = Vec::new();
        for v in used {
            let Some(old) = self.vars.get(&v).cloned() else {
                continue;
            };
            if old.dims.is_empty() || old.layout == li {
                continue;
            }
            let (a, b) = (&self.layouts[old.layout], &self.layouts[li]);
            if a.same_slice(b, &old.dims, self.threads) {
                // The same registers: only the layout's name changes.
                let new = Val {
                    layout: li,
                    ..old.clone()
                };
                self.vars.insert(v, new.clone());
                moved.push((v, old, new, false));
                continue;
            }
            let new = Val {
                name: self.temp("tf_m"),
                layout: li,
                raw: None,
                view: None,
                ..old.clone()
            };
            let decl = self.decl(&new);
            self.w(
                depth,
                format!(
                    "{decl};  // `{}` in the loop's layout",
                    self.k().vars[v].name
                ),
            );
            self.convert(&old, &new, depth)?;
            self.vars.insert(v, new.clone());
            moved.push((v, old, new, assigned.contains(&v)));
        }
        Ok(moved)
    }

    /// After a loop: variables it assigned go back to their layout.
    fn leave(
        &mut self,
        moved: Vec<(VarId, Val, Val, bool)>,
        depth: usize,
    ) -> Result<(), CodegenError> {
        for (v, old, new, back) in moved {
            if back {
                self.convert(&new, &old, depth)?;
            }
            self.vars.insert(v, old);
        }
        Ok(())
    }

    /// Copies `src` into `dst` (the same dimensions, other layouts) through
    /// shared memory: each element written at its place in the block, read
    /// back where `dst` wants it. Rows of the innermost dimension are padded
    /// by one word: two layouts whose runs go along different dimensions
    /// otherwise hit one bank with every lane (rows of a power-of-two size).
    fn convert(&mut self, src: &Val, dst: &Val, depth: usize) -> Result<(), CodegenError> {
        let dims = src.dims.clone();
        let blocks: Vec<usize> = dims.iter().map(|&d| self.block(d)).collect();
        let size = src.cty.size();
        let pad = if dims.len() > 1 {
            4usize.div_ceil(size)
        } else {
            0
        };
        let mut strides = vec![1usize; dims.len()];
        let mut stride = 1;
        for (i, &b) in blocks.iter().enumerate().rev() {
            strides[i] = stride;
            stride *= b + if i + 1 == blocks.len() { pad } else { 0 };
        }
        self.need_smem(stride * size);
        let place = |g: &Self, l: usize| -> String {
            let mut s = String::from("0");
            for (&d, &st) in dims.iter().zip(&strides) {
                let _ = write!(s, " + ({}) * {st}", g.offset_c(l, d));
            }
            s
        };
        let ty = src.cty.c();
        self.w(depth, "__syncthreads();");
        let n = self.open(src.layout, &dims, depth);
        let (pw, live) = (place(self, src.layout), self.owner_c(src.layout, &dims));
        let access = self.access(src);
        self.w(
            depth + n,
            format!("if ({live}) (({ty}*)tf_smem)[{pw}] = {access};"),
        );
        self.close(n, depth);
        self.w(depth, "__syncthreads();");
        let n = self.open(dst.layout, &dims, depth);
        let pr = place(self, dst.layout);
        let access = self.access(dst);
        self.w(depth + n, format!("{access} = (({ty}*)tf_smem)[{pr}];"));
        self.close(n, depth);
        Ok(())
    }
}

/// Whether `x` loads from `tensor` anywhere.
fn reads_tensor(x: &Expr, tensor: TensorId) -> bool {
    let mut reads = false;
    x.walk(&mut |y| reads |= matches!(y, Expr::Load { tensor: t, .. } if *t == tensor));
    reads
}
