//! Attention-shaped kernels (see [`AttentionShape`]) as one flash-attention
//! program per block of query rows, in the manner of FlashAttention-2:
//!
//! - the block's `q` tile stays in shared memory; `k` and `v` tiles stream
//!   through two shared buffers each, 16-byte `cp.async` copies one tile ahead
//!   (swizzled so `ldmatrix` reads are free of bank conflicts);
//! - each warp owns `16 · MI` rows: it computes its scores `q·kᵀ` with
//!   `mma.sync.m16n8k16` into registers, runs the kernel's elementwise code and
//!   row reductions on them there (see [`frag`]), and multiplies the resulting
//!   `p` with `v` straight from registers (an accumulator fragment of the first
//!   product is an operand fragment of the second);
//! - a key tile that lies inside the tensor and where every comparison of tile
//!   indices in the loop holds for the whole tile (a causal mask below the
//!   diagonal) runs a copy of the body without the edge masks and comparisons.

mod frag;
mod hopper;
pub(super) mod lowering;
mod shape;
mod space;
mod split;

use super::expr::{CTy, ElemCtx};
use super::{config_err, rewrite, Emitter, Lowered};
use crate::dtype::DType;
use crate::error::CodegenError;
use crate::ir::*;
use frag::{Frags, Geo, Layout};
pub use lowering::default_wgmma_attention;
pub use shape::{AtomicProduct, AttentionShape, MoreScores, Packed};
use std::fmt::Write;

pub(super) fn emit(e: &mut Emitter, a: &AttentionShape) -> Result<Lowered, CodegenError> {
    if e.cfg.wgmma {
        return hopper::emit(e, a);
    }
    if let Some(x) = a.atomics.first() {
        return Err(config_err(
            e.k,
            e.cfg,
            format!(
                "the `mma.sync` attention program does not add products into `{}` atomically; set `wgmma` (the \
                 Hopper program) or `general`",
                e.k.tensors[x.tensor].name
            ),
        ));
    }
    let geo = geometry(e, a)?;
    let dtype = operands(e, a)?;
    let threads = geo.warps * 32;
    let (rows, keys) = (a.row_operands(), a.key_operands());
    // The row operands' tiles, then two buffers of each key operand's.
    let shared = (rows.len() * geo.bm + 2 * keys.len() * geo.bn) * geo.hd * 2;
    let helpers = helpers(&geo, threads, dtype, a.packed.is_some());
    let params = e.begin(threads, 1, &helpers, &[]);
    program_tiles(e, a);
    // Key operands indexed by an `each` loop around the key loop find their
    // rows inside it.
    let kv = if a.outer_each.is_empty() {
        kv_batch(e, a)?
    } else {
        Vec::new()
    };
    let _ = writeln!(
        e.out,
        "  const int lane = tid & 31, tf_warp = tid >> 5;\n\
         \x20 const int tf_g = lane >> 2, tf_t = lane & 3, tf_wr = tf_warp * {rows};\n\
         \x20 (void)tf_g; (void)tf_t;",
        rows = 16 * geo.mi,
    );
    let q_bytes = geo.bm * geo.hd * 2;
    let kv2 = 2 * geo.bn * geo.hd * 2;
    let mut bases = String::new();
    for r in 1..rows.len() {
        let _ = write!(bases, ", {} = tf_sq + {}u", RowOp(r).base(), r * q_bytes);
    }
    let _ = write!(bases, ", tf_sk = tf_sq + {}u", rows.len() * q_bytes);
    for i in 1..keys.len() {
        let _ = write!(bases, ", {} = tf_sk + {}u", KeyOp(i).ring(), i * kv2);
    }
    let mut lanes = String::new();
    for r in 1..rows.len() {
        let _ = write!(
            lanes,
            "\n  const tf_u32 {} = {} + tf_swz(tf_wr + (lane & 15), lane >> 4);",
            RowOp(r).lane(),
            RowOp(r).base()
        );
    }
    let _ = writeln!(
        e.out,
        "  const tf_u32 tf_sq = tf_smem_u32(tf_smem);\n\
         \x20 const tf_u32 {bases};\n\
         \x20 // Each lane's `ldmatrix` row in its first 16-row block, at the first 16\n\
         \x20 // columns: a later block adds whole rows, a later k step XORs the chunk\n\
         \x20 // (rows are a power of two bytes long and the swizzle is an XOR too).\n\
         \x20 const tf_u32 tf_qa = tf_sq + tf_swz(tf_wr + (lane & 15), lane >> 4);{lanes}\n\
         \x20 const tf_u32 tf_kl = tf_swz(((lane >> 4) << 3) + (lane & 7), (lane >> 3) & 1);\n\
         \x20 const tf_u32 tf_vl = tf_swz((((lane >> 3) & 1) << 3) + (lane & 7), lane >> 4);",
        bases = &bases[2..],
    );
    let q: Vec<String> = a.batch.iter().map(|b| format!("tb{b}")).collect();
    for (r, &t) in rows.iter().enumerate() {
        operand_base(e, &RowOp(r).name(), t, &q, a.row_axis);
    }
    if a.outer_each.is_empty() {
        key_bases(e, a, &kv);
    }
    let mut frags = Frags {
        geo: &geo,
        batch: &a.batch,
        layouts: vec![None; e.k.vars.len()],
        scaled: vec![None; e.k.vars.len()],
        temps: 0,
        masked: true,
        ind: "  ".into(),
        staged: Vec::new(),
        narrow_keys: false,
    };
    let body = a.stmts(e.k);
    for (i, s) in body.iter().enumerate() {
        if a.packed.as_ref().is_some_and(|p| p.rows_loop == i) {
            packed_rows(e, a)?;
        }
        if i == a.kv_loop {
            // The block's `q` (its rows known from here on), then the keys.
            for r in 0..rows.len() {
                let _ = writeln!(
                    e.out,
                    "  tf_att_load<{bm}>({base}, tf_{n}, tf_{n}_rs, tb{m}, tf_{n}_rows, tf_{n}_cols, tid);",
                    bm = geo.bm,
                    m = a.m,
                    base = RowOp(r).base(),
                    n = RowOp(r).name(),
                );
            }
            let mut s = s;
            for &g in &a.outer_each {
                let _ = writeln!(
                    e.out,
                    "  for (long long tb{g} = 0; tb{g} < {}; ++tb{g}) {{  // tile `{}`",
                    e.end(g),
                    e.k.dims[g].name
                );
                if let Stmt::Loop { body, .. } = s {
                    s = &body[0];
                }
            }
            if !a.outer_each.is_empty() {
                let kv = kv_batch(e, a)?;
                key_bases(e, a, &kv);
            }
            key_loop(e, a, &mut frags, s)?;
            e.out.push_str(&"  }\n".repeat(a.outer_each.len()));
        } else {
            outside(e, &mut frags, s)?;
        }
    }
    e.out.push_str("  tf_cp_async_wait<0>();\n}\n");
    Ok(e.finish(params, threads, shared, "attention (mma.sync, flash)"))
}

/// `tf_{k,v,…}`: the key operands' rows for this program (`kv`: their batch
/// indices, from [`kv_batch`]).
fn key_bases(e: &mut Emitter, a: &AttentionShape, kv: &[String]) {
    for (i, t) in a.key_operands().into_iter().enumerate() {
        operand_base(e, &KeyOp(i).name(), t, kv, a.row_axis);
    }
}

/// The names of row operand `r` ([`AttentionShape::row_operands`]): `q`'s
/// for the first.
#[derive(Clone, Copy)]
struct RowOp(usize);

impl RowOp {
    /// Its pointer's name (`tf_{name}`).
    fn name(self) -> String {
        match self.0 {
            0 => "q".into(),
            r => format!("r{r}"),
        }
    }
    /// Its tile's shared address.
    fn base(self) -> String {
        match self.0 {
            0 => "tf_sq".into(),
            r => format!("tf_sr{r}"),
        }
    }
    /// A lane's `ldmatrix` row address in it.
    fn lane(self) -> String {
        match self.0 {
            0 => "tf_qa".into(),
            r => format!("tf_ra{r}"),
        }
    }
}

/// The names of key operand `i` ([`AttentionShape::key_operands`]): `k`'s
/// and `v`'s for the first two.
#[derive(Clone, Copy)]
struct KeyOp(usize);

impl KeyOp {
    /// Its pointer's name (`tf_{name}`).
    fn name(self) -> String {
        match self.0 {
            0 => "k".into(),
            1 => "v".into(),
            i => format!("s{i}"),
        }
    }
    /// Its two buffers' shared address.
    fn ring(self) -> String {
        match self.0 {
            0 => "tf_sk".into(),
            1 => "tf_sv".into(),
            i => format!("tf_ss{i}"),
        }
    }
    /// This key tile's buffer.
    fn buf(self) -> String {
        match self.0 {
            0 => "tf_kb".into(),
            1 => "tf_vb".into(),
            i => format!("tf_sb{i}"),
        }
    }
    /// The Hopper program's barriers of its ring: a stage's tile landed, and
    /// the consumers are done with it.
    fn full(&self) -> String {
        match self.0 {
            0 => "tf_bk".into(),
            1 => "tf_bv".into(),
            i => format!("tf_bs{i}"),
        }
    }
    fn empty(&self) -> String {
        match self.0 {
            0 => "tf_ek".into(),
            1 => "tf_ev".into(),
            i => format!("tf_es{i}"),
        }
    }
}

/// The program's tiles: shared memory, `tid`, then the row tile and the other
/// grid tiles of `blockIdx.x` ([`AttentionShape::programs`]). Where the last
/// row tiles walk the most keys ([`work_order`]: causal attention and dQ),
/// the longest go first, a few slices at a time, so the launch ends on short
/// ones; where the first do (causal dK/dV), the first row tiles first, slice by
/// slice (grouping slices there cost ptxas a spill); else the last first.
fn program_tiles(e: &mut Emitter, a: &AttentionShape) {
    e.out.push_str(PREAMBLE);
    program_tile_of(e, a, "blockIdx.x");
}

/// The block's shared memory and thread index, before its tiles.
const PREAMBLE: &str =
    "  extern __shared__ __align__(1024) unsigned char tf_smem[];\n  const int tid = threadIdx.x;\n";

/// How many programs the launch's grid has (the row tiles of every slice),
/// for a persistent block's walk over them.
fn program_count(e: &Emitter, a: &AttentionShape) -> String {
    let r = a.row_tile();
    let mut count = format!("(({} + B{r} - 1) / B{r})", e.end(r));
    for b in a.programs(e.k) {
        let _ = write!(count, " * ({})", e.end(b));
    }
    count
}

/// Program `tile`'s (an unsigned expression below 2^31) tile indices: `tb{r}`
/// of its row tile and `tb{b}` of the grid's other dimensions.
fn program_tile_of(e: &mut Emitter, a: &AttentionShape, tile: &str) {
    let (r, d) = (a.row_tile(), a.d);
    let programs = a.programs(e.k);
    let order = work_order(e.k, a).filter(|_| a.packed.is_none());
    let longest_first = order == Some(true) && !programs.is_empty();
    match longest_first {
        false => {
            // The first row tiles first where they walk the most keys (causal
            // dK/dV), else the last.
            let rank = match order {
                Some(false) => "tf_pid % tf_mt",
                _ => "tf_mt - 1 - tf_pid % tf_mt",
            };
            let _ = write!(
                e.out,
                "  long long tf_pid = {tile};\n\
                 \x20 const long long tf_mt = ({mext} + B{r} - 1) / B{r};\n\
                 \x20 const long long tb{r} = ({rank}) * B{r};\n\
                 \x20 tf_pid /= tf_mt;\n",
                mext = e.end(r),
            );
        }
        true => {
            // Longest first: the slices (a batch's head) in groups whose keys
            // and values stay in L2 together, each group's row tiles from the
            // longest, so the launch ends on short programs.
            let slices = programs
                .iter()
                .map(|&b| format!("({})", e.end(b)))
                .collect::<Vec<_>>()
                .join(" * ");
            let rank = "tf_mt - 1 - tf_u % tf_mt";
            let _ = write!(
                e.out,
                "  // Programs take their row tiles longest first across groups of slices\n\
                 \x20 // whose keys and values fit {l2} MiB of L2 together: 2^tf_lg slices\n\
                 \x20 // (at most {most}; a power of two that divides their number, so a shift\n\
                 \x20 // and a mask find a program's). A launch's programs number below 2^31:\n\
                 \x20 // ints hold the arithmetic (in 64 bits it cost ptxas registers in the loop).\n\
                 \x20 const int tf_mt = (int)(({mext} + B{r} - 1) / B{r});\n\
                 \x20 const long long tf_fit = tf_max_i(1ll, ({l2}ll << 20) / tf_max_i(1ll, t{k}_n{axis} * (long long)B{d} * 4ll));\n\
                 \x20 const int tf_lg = min(min({most_lg}, __ffsll({slices}) - 1), 63 - __clzll(tf_fit));\n\
                 \x20 const int tf_u = (int)({tile} >> tf_lg);\n\
                 \x20 const long long tb{r} = (long long)({rank}) * B{r};\n\
                 \x20 int tf_pid = ((tf_u / tf_mt) << tf_lg) | (int)({tile} & ((1u << tf_lg) - 1u));\n",
                mext = e.end(r),
                slices = slices,
                k = a.k,
                axis = a.row_axis,
                l2 = LPT_L2_MIB,
                most = LPT_MOST_SLICES,
                most_lg = LPT_MOST_SLICES.ilog2(),
            );
        }
    }
    for &b in programs.iter().rev() {
        let ext = match longest_first {
            true => format!("(int)({})", e.end(b)),
            false => e.end(b),
        };
        let _ = writeln!(
            e.out,
            "  const long long tb{b} = tf_pid % {ext};  // tile `{}`\n  tf_pid /= {ext};",
            e.k.dims[b].name
        );
    }
    // The head dim is one whole tile; the body may not name its offset.
    let _ = writeln!(e.out, "  [[maybe_unused]] const long long tb{d} = 0;");
}

/// The keys and values of this many MiB of slices a group of programs shares
/// (a quarter of an H100's or H200's L2), and at most this many slices a group.
const LPT_L2_MIB: usize = 12;
const LPT_MOST_SLICES: usize = 8;

/// How a program's key loop grows with its row tile: `Some(true)` where the
/// loop ends at the row tile (causal attention and dQ: the last rows read the
/// most keys), `Some(false)` where it starts there (causal dK/dV: the first key
/// tiles meet the most queries), `None` where every program walks as far.
pub(super) fn work_order(k: &Kernel, a: &AttentionShape) -> Option<bool> {
    let rows = a.row_tile();
    let names_rows = |x: &Expr| {
        let mut found = false;
        x.walk(&mut |y| {
            found |= matches!(y, Expr::TileBegin(t) | Expr::TileEnd(t) | Expr::TileIndex(t) if *t == rows)
        });
        found
    };
    let mut order = None;
    k.walk_stmts(&mut |s| {
        if let Stmt::Loop {
            dim, until, range, ..
        } = s
        {
            if *dim != a.n {
                return;
            }
            let grows = until.as_ref().is_some_and(names_rows)
                || range.as_deref().is_some_and(|r| names_rows(&r.end));
            let shrinks = range.as_deref().is_some_and(|r| names_rows(&r.begin));
            order = match (grows, shrinks) {
                (true, false) => Some(true),
                (false, true) => Some(false),
                _ => None,
            };
        }
    });
    order
}

/// A packed kernel's rows ([`super::Packed`]): the block of its sequence this
/// program takes, from the row loop's bounds (at most one block: see
/// [`shared_blocks`]); a program past its sequence's end has none and stops.
/// Every thread returns together, before any of them waits on another.
fn packed_rows(e: &mut Emitter, a: &AttentionShape) -> Result<(), CodegenError> {
    let Some(r) = a.row_range(e.k) else {
        return Ok(());
    };
    let m = a.m;
    let name = e.k.dims[m].name.clone();
    let (begin, end) = (
        uniform_i64(e, &r.begin, &name)?,
        uniform_i64(e, &r.end, &name)?,
    );
    let _ = writeln!(
        e.out,
        "  const long long tb{m} = {begin};  // the rows `{name}`: this program's block of its sequence\n\
         \x20 const long long tf_end{m} = {end};\n\
         \x20 if (tb{m} >= tf_end{m}) return;  // none: past the sequence's end"
    );
    Ok(())
}

/// A block-uniform integer expression (scalars, tile bounds) as C `long long`.
fn uniform_i64(e: &Emitter, x: &Expr, what: &str) -> Result<String, CodegenError> {
    let (c, ty) = e.ctx(&[]).emit(x, what)?;
    Ok(super::expr::convert(&c, ty, CTy::I64))
}

/// `tf_nt`: how many key tiles the loop over `dim` walks, from `tf_beg{dim}`
/// (its range's start, or 0) up to its end and `until` bound; a range's end is
/// `tf_end{dim}`, the keys' extent in the masks.
fn key_tiles(
    e: &mut Emitter,
    dim: DimId,
    range: Option<&LoopRange>,
    until: Option<&Expr>,
) -> Result<(), CodegenError> {
    let name = e.k.dims[dim].name.clone();
    let (begin, next) = match range {
        Some(r) => {
            let (b, n) = (
                uniform_i64(e, &r.begin, &name)?,
                uniform_i64(e, &r.end, &name)?,
            );
            let _ = writeln!(e.out, "  const long long tf_end{dim} = {n};");
            (b, format!("tf_end{dim}"))
        }
        None => ("0ll".to_string(), e.end(dim)),
    };
    let end = match until {
        Some(u) => {
            let (c, _) = e.ctx(&[]).emit(u, "tile(…).until(…)")?;
            format!("tf_min_i({next}, {c})")
        }
        None => next,
    };
    let _ = writeln!(
        e.out,
        "  const long long tf_beg{dim} = {begin};\n\
         \x20 const long long tf_n_end = {end};\n\
         \x20 const int tf_nt = tf_n_end > tf_beg{dim} ? (int)tf_min_i((tf_n_end - tf_beg{dim} + B{dim} - 1) / B{dim}, 0x7fffffffll) : 0;"
    );
    Ok(())
}

/// The blocks both programs take: 1 for batch tiles (a program per index), a
/// power of two from 16 to 256 for the head dimension.
fn shared_blocks(e: &Emitter, a: &AttentionShape) -> Result<(), CodegenError> {
    for &t in &a.batch {
        if e.cfg.block_sizes[t] != 1 {
            return Err(config_err(
                e.k,
                e.cfg,
                format!(
                    "the batch tile `{}` of an attention kernel takes block size 1 (a program per index)",
                    e.k.dims[t].name
                ),
            ));
        }
    }
    if let Some(p) = &a.packed {
        let (grid, rows) = (e.cfg.block_sizes[p.rows], e.cfg.block_sizes[a.m]);
        if rows < grid {
            return Err(config_err(
                e.k,
                e.cfg,
                format!(
                    "the row loop `{}` of a packed attention kernel takes one tile of the block of `{}` a program \
                     takes: its block is {rows}, under `{}`'s {grid}; give them the same block",
                    e.k.dims[a.m].name, e.k.dims[p.rows].name, e.k.dims[p.rows].name
                ),
            ));
        }
    }
    let hd = e.cfg.block_sizes[a.d];
    if !hd.is_power_of_two() || !(16..=256).contains(&hd) {
        return Err(config_err(
            e.k,
            e.cfg,
            format!(
                "the head dimension's block is {hd}; an attention kernel takes a power of two from 16 to 256 \
                 (the launch fits a `whole` tile to the extent)"
            ),
        ));
    }
    Ok(())
}

/// `tf_pack(lo, hi)`: two f32 as the 16-bit pair of an operand register, `lo` in the low half.
fn pack_fn(dtype: DType) -> String {
    let cvt = if dtype == DType::BF16 {
        "bf16x2"
    } else {
        "f16x2"
    };
    format!(
        r#"__device__ __forceinline__ tf_u32 tf_pack(float lo, float hi) {{
  tf_u32 r; asm("cvt.rn.{cvt}.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
}}
"#
    )
}

/// The block sizes and warps of the config, checked against what the lowering does.
fn geometry(e: &Emitter, a: &AttentionShape) -> Result<Geo, CodegenError> {
    let c = e.cfg;
    let b = |d: DimId| c.block_sizes[d];
    shared_blocks(e, a)?;
    let (bm, bn, hd, warps) = (b(a.m), b(a.n), b(a.d), c.num_warps);
    if !matches!(warps, 4 | 8) {
        return Err(config_err(e.k, c, "an attention kernel runs 4 or 8 warps"));
    }
    if bm != 16 * warps && bm != 32 * warps {
        return Err(config_err(
            e.k,
            c,
            format!(
                "an attention kernel's row block is 16 or 32 rows a warp: {} or {} with {warps} warps, not {bm}",
                16 * warps,
                32 * warps
            ),
        ));
    }
    if !matches!(bn, 16 | 32 | 64 | 128) {
        return Err(config_err(
            e.k,
            c,
            format!("an attention kernel's key block is 16, 32, 64 or 128, not {bn}"),
        ));
    }
    let geo = Geo {
        m: a.m,
        n: a.n,
        d: a.d,
        bm,
        bn,
        hd,
        warps,
        mi: bm / (16 * warps),
        ni: bn / 8,
        di: hd / 8,
        wgmma: false,
        stages: 2,
        defer_pv: false,
        overlap: false,
        persistent: false,
        split: false,
    };
    // Scores (of each score-like product) and output accumulator, in f32
    // registers a thread; ~60 more go to operand fragments, row state and
    // addresses, within the 255 a thread has.
    let products = 1 + a.more_scores.len();
    let outputs = 1 + a.more_updates.len();
    let held = geo.mi * (products * geo.ni + outputs * geo.di) * 4;
    if held > 192 {
        return Err(config_err(
            e.k,
            c,
            format!(
                "a thread would hold {held} accumulator registers (scores {} + output {}); take a smaller \
                 row or key block, or 8 warps",
                products * geo.mi * geo.ni * 4,
                outputs * geo.mi * geo.di * 4
            ),
        ));
    }
    Ok(geo)
}

/// The products' operands (`q`, `k`, `v` and any others) share a 16-bit dtype
/// and have contiguous, 16-byte aligned rows.
fn operands(e: &Emitter, a: &AttentionShape) -> Result<DType, CodegenError> {
    let dtype = e.spec.tensors[a.q].dtype;
    for t in a.row_operands().into_iter().chain(a.key_operands()) {
        let ts = &e.spec.tensors[t];
        if !ts.dtype.is_half() || ts.dtype != dtype {
            return Err(CodegenError::Argument {
                kernel: e.k.name.clone(),
                arg: e.k.tensors[t].name.clone(),
                message: format!(
                    "attention operands are bf16 or f16, all the same; got {} and {}",
                    dtype, ts.dtype
                ),
            });
        }
        if !ts.last_contiguous || ts.align < 16 {
            return Err(CodegenError::Argument {
                kernel: e.k.name.clone(),
                arg: e.k.tensors[t].name.clone(),
                message: "attention operands need contiguous rows (head dimension stride 1) starting at \
                          16-byte aligned addresses (a row length that is a multiple of 8 elements); copy it \
                          into a fresh tensor first"
                    .into(),
            });
        }
    }
    Ok(dtype)
}

/// The batch indices of `k` and `v` for this program, as C: the query's
/// `tb{b}`, or for a head a group of query heads shares (`th / group`,
/// [`AttentionShape::kv_group`]) `tf_kv{i}`, declared here. A group under 1
/// gives an index past every extent: no rows (the TMA unit fills zeros).
/// `maybe_unused`: a persistent program declares them in each role, and the
/// consumers may not read them.
fn kv_batch(e: &mut Emitter, a: &AttentionShape) -> Result<Vec<String>, CodegenError> {
    let mut out = Vec::new();
    for (i, (&b, group)) in a.batch.iter().zip(&a.kv_group).enumerate() {
        if let Some(Some(x)) = a.kv_exprs.get(i) {
            let coords: Vec<(DimId, String)> =
                a.batch.iter().map(|&t| (t, format!("tb{t}"))).collect();
            let (c, ty) = e.ctx(&coords).emit(x, "the key operands' batch index")?;
            let _ = writeln!(
                e.out,
                "  [[maybe_unused]] const long long tf_kv{i} = {};",
                super::expr::convert(&c, ty, CTy::I64)
            );
            out.push(format!("tf_kv{i}"));
            continue;
        }
        let Some(g) = group else {
            out.push(format!("tb{b}"));
            continue;
        };
        let g = uniform_i64(e, g, "the key and value heads' group")?;
        let _ = writeln!(
            e.out,
            "  const long long tf_grp{i} = {g};\n\
             \x20 [[maybe_unused]] const long long tf_kv{i} = tf_grp{i} > 0 ? tb{b} / tf_grp{i} : 0x7fffffffll;"
        );
        out.push(format!("tf_kv{i}"));
    }
    Ok(out)
}

/// `tf_{name}`: the operand's rows for the batch indices `idx` (C, one per
/// batch tile, in index order around the rows' axis `row_axis`), with its row
/// stride, rows and columns (no rows when an index is past its extent).
fn operand_base(e: &mut Emitter, name: &str, t: TensorId, idx: &[String], row_axis: usize) {
    let rank = e.spec.tensors[t].rank;
    let mut off = String::new();
    let mut inside = String::from("true");
    let axes = (0..rank - 1).filter(|&x| x != row_axis);
    for (b, i) in idx.iter().zip(axes) {
        let _ = write!(off, " + {b} * t{t}_s{i}");
        let _ = write!(inside, " && {b} < t{t}_n{i}");
    }
    let _ = writeln!(
        e.out,
        "  const unsigned short* tf_{name} = t{t}{off};\n\
         \x20 const long long tf_{name}_rs = t{t}_s{r}, tf_{name}_cols = t{t}_n{c};\n\
         \x20 const long long tf_{name}_rows = ({inside}) ? t{t}_n{r} : 0;",
        r = row_axis,
        c = rank - 1,
    );
}

/// The swizzle, tile loader and operand packing the program uses. Packed
/// sequences' rows start where `cu_seqlens` says, which may be before the
/// tensor (`signed`): the loader tests each row against both ends.
fn helpers(g: &Geo, threads: usize, dtype: DType, signed: bool) -> String {
    let ch = g.hd / 8;
    // 16-byte chunk `ch` of row `r` goes to chunk `ch ^ f(r)`: eight rows that
    // `ldmatrix` reads together hit eight different bank groups.
    let swz = if ch >= 8 {
        "(r & 7)".to_string()
    } else {
        format!("((r / {}) & {})", 8 / ch, ch - 1)
    };
    let mma = if dtype == DType::BF16 {
        "tf_mma_bf16"
    } else {
        "tf_mma_f16"
    };
    format!(
        r#"
#define tf_att_mma {mma}
__device__ __forceinline__ tf_u32 tf_swz(int r, int ch) {{ return (tf_u32)(r * {row_bytes} + ((ch ^ {swz}) << 4)); }}
{pack}// Rows `row0 ..` of an operand (`rows` of them, `cols` elements each) into a
// swizzled tile of ROWS rows; zeros outside the operand. A thread copies one
// 16-byte column chunk of every STEP-th row: its source pointer moves by a
// constant stride and its edge test is one compare against an immediate, so
// few registers stay live across the key loop.
template <int ROWS>
__device__ __forceinline__ void tf_att_load(tf_u32 dst, const unsigned short* base, long long rs, long long row0,
                                            long long rows, long long cols, int tid) {{
  const int STEP = {threads} / {ch};
  const int ch = tid % {ch}, r0 = tid / {ch};
  const long long left = cols - ch * 8;
  const tf_u32 bytes = left >= 8 ? 16u : (left > 0 ? (tf_u32)(left * 2) : 0u);
  const long long lim = rows - row0 - r0;
  const unsigned short* src = base + (row0 + r0) * rs + ch * 8;
  const long long step = (long long)STEP * rs;
  #pragma unroll
  for (int i = 0; i < (ROWS + STEP - 1) / STEP; ++i) {{
    if (ROWS % STEP == 0 || r0 + i * STEP < ROWS) {{
      const bool ok = i * STEP < lim{lower};
      tf_cp_async16(dst + tf_swz(r0 + i * STEP, ch), ok ? (const void*)src : (const void*)base, ok ? bytes : 0u);
    }}
    src += step;
  }}
}}
"#,
        row_bytes = g.hd * 2,
        pack = pack_fn(dtype),
        lower = if signed {
            " && row0 + r0 + i * STEP >= 0"
        } else {
            ""
        },
    )
}

/// A statement outside the key loop: scalar code, per-row state, stores.
fn outside(e: &mut Emitter, f: &mut Frags, s: &Stmt) -> Result<(), CodegenError> {
    if e.block_stmt(s, "  ")? {
        return Ok(());
    }
    match s {
        Stmt::Let { var, value, at } => {
            let mut pre = Vec::new();
            f.assign(e, *var, value, true, &mut pre, at)
        }
        Stmt::Assign { var, value, at } => {
            if e.checked.vars[*var].dims.is_empty() {
                return Err(scalar_reassigned(e, at));
            }
            let mut pre = Vec::new();
            f.assign(e, *var, value, false, &mut pre, at)
        }
        Stmt::Store {
            tensor,
            index,
            value,
            at,
        } => {
            let index = e.plain(index, at)?;
            f.store(e, *tensor, &index, value, at)
        }
        Stmt::Loop { .. } => Err(CodegenError::Unsupported {
            kernel: e.k.name.clone(),
            at: String::new(),
            message: "an attention kernel has one inner loop, over the keys".into(),
        }),
        _ => Ok(()),
    }
}

fn scalar_reassigned(e: &Emitter, at: &str) -> CodegenError {
    CodegenError::Unsupported {
        kernel: e.k.name.clone(),
        at: at.to_string(),
        message: "reassigning a scalar is not supported; bind a new name with `let`".into(),
    }
}

/// The loop over key tiles: prefetch, then the body, twice (edge tiles and the rest).
fn key_loop(
    e: &mut Emitter,
    a: &AttentionShape,
    f: &mut Frags,
    s: &Stmt,
) -> Result<(), CodegenError> {
    let Stmt::Loop {
        dim,
        body,
        until,
        range,
    } = s
    else {
        return Ok(());
    };
    let g = *f.geo;
    let n = *dim;
    key_tiles(e, n, range.as_deref(), until.as_ref())?;
    let next = e.end(n);
    let conds = uniform_compares(e, body, n, &g);
    let mut fast = format!("tb{n} + B{n} <= {next}");
    for (c, _) in &conds {
        let _ = write!(fast, " && {c}");
    }
    let compares: Vec<Expr> = conds.into_iter().map(|(_, x)| x).collect();
    let fast_body: Vec<Stmt> = body.iter().map(|s| without(s, &compares)).collect();
    let tile_bytes = g.bn * g.hd * 2;
    let keys = a.key_operands().len();
    let ops: Vec<KeyOp> = (0..keys).map(KeyOp).collect();
    let names: Vec<String> = ops.iter().map(|o| format!("`{}`", o.name())).collect();
    let load = |o: &KeyOp, ind: &str, dst: &str, row: &str| -> String {
        format!(
            "{ind}tf_att_load<{bn}>({dst}, tf_{x}, tf_{x}_rs, {row}, tf_{x}_rows, tf_{x}_cols, tid);\n\
             {ind}tf_cp_async_commit();\n",
            bn = g.bn,
            x = o.name(),
        )
    };
    let first: String = ops
        .iter()
        .map(|o| load(o, "  ", &o.ring(), &format!("tf_beg{n}")))
        .collect();
    let bufs: Vec<String> = ops
        .iter()
        .map(|o| format!("{} = {} + (tf_it & 1) * {tile_bytes}u", o.buf(), o.ring()))
        .collect();
    let next: String = ops
        .iter()
        .map(|o| {
            load(
                o,
                "      ",
                &format!("{} + ((tf_it + 1) & 1) * {tile_bytes}u", o.ring()),
                &format!("tb{n} + B{n}"),
            )
        })
        .collect();
    let _ = write!(
        e.out,
        "  // Key tiles: {names} one tile ahead, in two buffers each.\n\
         {first}\
         \x20 for (int tf_it = 0; tf_it < tf_nt; ++tf_it) {{  // tile `{name}`\n\
         \x20   const long long tb{n} = tf_beg{n} + (long long)tf_it * B{n};\n\
         \x20   const tf_u32 {bufs};\n\
         \x20   if (tf_it + 1 < tf_nt) {{\n\
         {next}\
         \x20   }} else {{\n\
         {empty}\
         \x20   }}\n\
         \x20   tf_cp_async_wait<{wait}>();  // this tile's `k` (and `q`)\n\
         \x20   __syncthreads();\n\
         \x20   if ({fast}) {{\n",
        names = names.join(" and "),
        bufs = bufs.join(", "),
        empty = "      tf_cp_async_commit();\n".repeat(keys),
        wait = key_wait(keys, 0),
        name = e.k.dims[n].name,
    );
    loop_body(e, a, f, &fast_body, false)?;
    e.out.push_str("    } else {\n");
    loop_body(e, a, f, body, true)?;
    e.out
        .push_str("    }\n    __syncthreads();  // the buffers are refilled next iteration\n  }\n");
    Ok(())
}

/// The `cp.async` groups that may still be in flight once key operand `i`
/// of this tile has landed: each operand is a group, the next tile's behind
/// this one's.
fn key_wait(keys: usize, i: usize) -> usize {
    2 * keys - 1 - i
}

/// One copy of the key loop's body; `masked`: the tile may reach past the keys.
fn loop_body(
    e: &mut Emitter,
    a: &AttentionShape,
    f: &mut Frags,
    body: &[Stmt],
    masked: bool,
) -> Result<(), CodegenError> {
    let ind = "      ";
    f.masked = masked;
    f.ind = ind.into();
    let saved = f.layouts.clone();
    let named = e.named_vars.clone();
    let keys = a.key_operands();
    let key = |t: TensorId| KeyOp(keys.iter().position(|&x| x == t).unwrap_or(0));
    let rows = a.row_operands();
    let row = |t: TensorId| RowOp(rows.iter().position(|&x| x == t).unwrap_or(0));
    // A key operand's first reader waits for its tile (the first's, at the
    // top of the step: `key_loop`).
    let mut landed = vec![false; keys.len()];
    landed[0] = true;
    let mut wait_for = |t: TensorId| -> Option<usize> {
        let i = key(t).0;
        (!std::mem::replace(&mut landed[i], true)).then(|| key_wait(keys.len(), i))
    };
    // With `overlap`, the last tile's `p·v` runs from the scores until the
    // body next touches the output.
    let mut pv_running = false;
    // The Hopper program with more products than the forward's: each product
    // a `wgmma` group, the score-like ones whose accumulators start from a
    // constant issued first, in order (`dP = dO·Vᵀ` runs under `S`'s
    // softmax), the updates where they stand; a statement waits for the
    // groups whose results it reads.
    let grouped = f.geo.wgmma && !a.is_forward();
    let mut flight = InFlight::default();
    let mut products: Vec<(usize, String, TensorId, TensorId)> =
        vec![(a.scores, "tf_s".to_string(), a.q, a.k)];
    for (j, m) in a.more_scores.iter().enumerate() {
        products.push((m.at, format!("tf_s{}", j + 1), m.rows, m.keys));
    }
    let mut issued = Vec::new();
    if grouped {
        for (at, out, r, k) in &products {
            if starts_constant(&body[*at]) {
                scores(
                    e,
                    a,
                    f,
                    &body[*at],
                    out,
                    (row(*r), key(*k), None),
                    Part::Issue,
                )?;
                flight.issued(Product::Scores(*at));
                issued.push(*at);
            }
        }
    }
    for (i, s) in body.iter().enumerate() {
        let touches_acc =
            hopper::stmt_reads(s, a.acc) || matches!(s, Stmt::Assign { var, .. } if *var == a.acc);
        if pv_running && (i == a.update || touches_acc) {
            e.out.push_str(&hopper::last_pv_done(f.geo, ind));
            pv_running = false;
        }
        // Any statement waits for the updates of the accumulators it reads.
        if grouped {
            flight.wait(&mut e.out, ind, |p| match p {
                Product::Update(v) => hopper::stmt_reads(s, v),
                Product::Scores(_) | Product::Atomic(_) => false,
            });
        }
        if let Some((_, out, r, k)) = products.iter().find(|p| p.0 == i) {
            let ops = (row(*r), key(*k), wait_for(*k));
            if grouped {
                if !issued.contains(&i) {
                    scores(e, a, f, s, out, ops, Part::Issue)?;
                    flight.issued(Product::Scores(i));
                }
                flight.wait(&mut e.out, ind, |p| p == Product::Scores(i));
                scores(e, a, f, s, out, ops, Part::Result)?;
            } else {
                scores(e, a, f, s, out, ops, Part::Whole)?;
            }
            pv_running = i == a.scores && f.geo.overlap;
            continue;
        }
        if let Some(x) = a.atomics.iter().find(|x| x.at == i) {
            let packed = packed_operand(a, body, x);
            hopper::atomic_product(e, a, f, s, x, &mut flight, packed.as_deref())?;
            continue;
        }
        let update_of = if i == a.update {
            Some((a.acc, a.v))
        } else {
            a.more_updates
                .iter()
                .find(|u| u.at == i)
                .map(|u| (u.acc, u.keys))
        };
        if let Some((acc, keys)) = update_of {
            let defer = grouped && flight.deferred.is_none() && deferrable(a, body, i, acc);
            let issue = update(e, a, f, s, acc, key(keys), wait_for(keys), defer)?;
            match issue {
                Some(issue) => flight.deferred = Some((issue, Product::Update(acc))),
                None if grouped => flight.issued(Product::Update(acc)),
                None => {}
            }
            continue;
        }
        if e.block_stmt(s, ind)? {
            continue;
        }
        match s {
            Stmt::Let { var, value, at } => {
                let mut pre = Vec::new();
                f.assign(e, *var, value, true, &mut pre, at)?;
            }
            Stmt::Assign { var, value, at } => {
                if e.checked.vars[*var].dims.is_empty() {
                    return Err(scalar_reassigned(e, at));
                }
                let mut pre = Vec::new();
                f.assign(e, *var, value, false, &mut pre, at)?;
            }
            _ => {}
        }
    }
    if pv_running {
        e.out.push_str(&hopper::last_pv_done(f.geo, ind));
    }
    if let Some((issue, p)) = flight.deferred.take() {
        e.out.push_str(&issue);
        flight.issued(p);
    }
    // Every group is complete before the step releases its stage.
    flight.wait(&mut e.out, ind, |_| true);
    // `let`s of the body are local to it (its C scope ends here).
    for (v, l) in f.layouts.iter_mut().enumerate() {
        if saved[v].is_none() {
            *l = None;
        }
    }
    e.named_vars = named;
    f.masked = true;
    f.ind = "  ".into();
    Ok(())
}

/// The `wgmma` groups of a step in flight (the Hopper program with more
/// products than the forward's): each product is one group, committed in
/// order; waiting for one waits for those before it too.
#[derive(Default)]
pub(super) struct InFlight {
    committed: usize,
    /// The groups not yet waited for, with what each computes.
    pending: Vec<(usize, Product)>,
    /// An update whose issue waits for the atomic product behind it (its
    /// code and its group; see `deferrable`), issued there.
    pub(super) deferred: Option<(String, Product)>,
}

/// What a `wgmma` group computes: a score-like product's array (its
/// statement's position in the step) or an update of an accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Product {
    Scores(usize),
    Update(VarId),
    /// An atomic product (its statement's position), added once complete.
    Atomic(usize),
}

impl InFlight {
    fn issued(&mut self, p: Product) {
        self.pending.push((self.committed, p));
        self.committed += 1;
    }

    /// `wgmma.wait_group` (into `out`) until every pending group that
    /// `needed` names is complete; nothing if none is.
    fn wait(&mut self, out: &mut String, ind: &str, needed: impl Fn(Product) -> bool) {
        let Some(last) = (self.pending.iter())
            .filter(|(_, p)| needed(*p))
            .map(|(g, _)| *g)
            .max()
        else {
            return;
        };
        let _ = writeln!(
            out,
            "{ind}asm volatile(\"wgmma.wait_group.sync.aligned {};\" ::: \"memory\");",
            self.committed - last - 1
        );
        self.pending.retain(|(g, _)| *g > last);
    }

    /// `wgmma.wait_group {n}` (into `out`) where more than `n` groups are
    /// pending: their registers (packed operands) free before new ones live.
    fn wait_all_but(&mut self, out: &mut String, ind: &str, n: usize) {
        if self.pending.len() > n {
            let last = self.pending[self.pending.len() - 1 - n].0;
            let _ = writeln!(
                out,
                "{ind}asm volatile(\"wgmma.wait_group.sync.aligned {n};\" ::: \"memory\");"
            );
            self.pending.retain(|(g, _)| *g > last);
        }
    }
}

/// Whether the product in statement `s` starts from a constant (`zeros`):
/// it may be issued before the statements ahead of it run.
fn starts_constant(s: &Stmt) -> bool {
    let (Stmt::Let { value, .. } | Stmt::Assign { value, .. }) = s else {
        return false;
    };
    let mut constant = false;
    value.walk(&mut |x| {
        if let Expr::Addmm { acc, .. } = x {
            let mut ok = true;
            acc.walk(&mut |y| {
                ok &= !matches!(y, Expr::Var(_) | Expr::Load { .. } | Expr::Reduce { .. })
            });
            constant = ok;
        }
    });
    constant
}

/// Which part of a score-like statement [`scores`] emits: all of it, or (the
/// Hopper program with more products) the product's issue, and apart from
/// it the statement with the product's result once it is complete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Whole,
    Issue,
    Result,
}

/// The statement holding `q·kᵀ` (or a further product of its form, with its
/// row and key operands `ops` and the `cp.async` wait its key tile needs):
/// the product into `out`, then the statement with it as a computed value
/// (`part` of it: see [`Part`]).
fn scores(
    e: &mut Emitter,
    a: &AttentionShape,
    f: &mut Frags,
    s: &Stmt,
    out: &str,
    ops: (RowOp, KeyOp, Option<usize>),
    part: Part,
) -> Result<(), CodegenError> {
    let (row, key, wait) = ops;
    let ind = f.ind.clone();
    let ind = ind.as_str();
    let (Stmt::Let { var, value, at } | Stmt::Assign { var, value, at }) = s else {
        return Ok(());
    };
    let mut found = None;
    value.walk(&mut |x| {
        if matches!(x, Expr::Addmm { .. }) && found.is_none() {
            found = Some(x.clone());
        }
    });
    let Some(mm) = found else {
        return Ok(());
    };
    let Expr::Addmm { acc, .. } = &mm else {
        return Ok(());
    };
    let g = *f.geo;
    let declare = matches!(s, Stmt::Let { .. });
    let mut pre = Vec::new();
    if part == Part::Result {
        if declare && f.scale_later(e, (*var, value), (&mm, out), &pre, at)? {
            return Ok(());
        }
        pre.push((mm, format!("{out}[tf_mi][tf_j][tf_h * 2 + tf_e]")));
        return f.assign(e, *var, value, declare, &mut pre, at);
    }
    f.reductions(e, acc, &mut pre)?;
    let (init, _) = f.ctx(e, Layout::Scores, &pre).emit(acc, at)?;
    let (open, close) = g.loop_open(Layout::Scores, ind);
    // Issued apart from zeros, the first `wgmma` overwrites the scores.
    let zero = part == Part::Issue && matches!(**acc, Expr::Full { value, .. } if value == 0.0);
    let product = if part == Part::Issue {
        let ops = (row.0 * g.bm * g.hd * 2, key.buf());
        hopper::scores_issue(&g, ind, out, (ops.0, &ops.1), zero)
    } else if g.wgmma {
        hopper::scores_product(&g, ind, &format!("v{}", a.acc))
    } else {
        let wait = wait.map_or(String::new(), |w| {
            format!(
                "{ind}tf_cp_async_wait<{w}>();  // this tile's `{}`\n{ind}__syncthreads();\n",
                key.name()
            )
        });
        format!(
            "{wait}\
             {ind}#pragma unroll\n\
             {ind}for (int tf_ks = 0; tf_ks < {ks}; ++tf_ks) {{\n\
             {ind}  tf_u32 tf_af[{mi}][4];\n\
             {ind}  #pragma unroll\n\
             {ind}  for (int tf_mi = 0; tf_mi < {mi}; ++tf_mi)\n\
             {ind}    tf_ldmatrix_x4(tf_af[tf_mi], ({lane} + tf_mi * {rows16}u) ^ (tf_ks * 32));\n\
{mmas}\
             {ind}}}\n",
            mi = g.mi,
            ks = g.hd / 16,
            rows16 = 16 * g.hd * 2,
            lane = row.lane(),
            mmas = mma_pairs(
                &format!("{ind}  "),
                &g,
                g.ni / 2,
                &format!(
                    "tf_ldmatrix_x4(tf_bf, ({} + tf_kl + tf_jp * ROWS16) ^ (tf_ks * 32))",
                    key.buf()
                ),
                out,
                "tf_af",
            ),
        )
    };
    let init = if zero {
        String::new()
    } else {
        format!("{open}{ind}  {out}[tf_mi][tf_j][tf_h * 2 + tf_e] = {init};\n{close}")
    };
    let _ = write!(
        e.out,
        "{ind}float {out}[{mi}][{ni}][4];  // {at}\n{init}{product}",
        mi = g.mi,
        ni = g.ni,
        at = super::one_line(at),
    );
    if part == Part::Issue {
        return Ok(());
    }
    if declare && f.scale_later(e, (*var, value), (&mm, out), &pre, at)? {
        return Ok(());
    }
    pre.push((mm, format!("{out}[tf_mi][tf_j][tf_h * 2 + tf_e]")));
    f.assign(e, *var, value, declare, &mut pre, at)
}

/// `acc = addmm(x, p, v[…])`: `acc = x` elementwise, `p` into registers (zero
/// past the keys), then `acc += p·v` from them (`v` the key operand `key`,
/// after the `cp.async` wait its tile needs, if any).
#[allow(clippy::too_many_arguments)]
fn update(
    e: &mut Emitter,
    a: &AttentionShape,
    f: &mut Frags,
    s: &Stmt,
    acc_var: VarId,
    key: KeyOp,
    wait: Option<usize>,
    defer: bool,
) -> Result<Option<String>, CodegenError> {
    let Stmt::Assign {
        value: Expr::Addmm { acc, a: p, at, .. },
        ..
    } = s
    else {
        return Ok(None);
    };
    let g = *f.geo;
    let ind = f.ind.clone();
    let ind = ind.as_str();
    let mut pre = Vec::new();
    f.assign(e, acc_var, acc, false, &mut pre, at)?;
    let pt = frag::dims_of(e, p);
    if f.layout_of(e, &pt, at)? != Layout::Scores {
        return Err(CodegenError::Unsupported {
            kernel: e.k.name.clone(),
            at: at.clone(),
            message: format!(
                "the second operand of the output update is a tile over the rows and keys (`[{}, {}]`), e.g. `p.cast::<bf16>()`",
                e.k.dims[g.m].name, e.k.dims[g.n].name
            ),
        });
    }
    let pc = operand_element(e, f, p, e.spec.tensors[a.v].dtype, at)?;
    let (open, close) = g.loop_open(Layout::Scores, ind);
    let acc_v = format!("v{acc_var}");
    // Each update's `p` its own array (the first keeps the forward's name).
    let tf_p = if acc_var == a.acc {
        "tf_p".to_string()
    } else {
        format!("tf_p{acc_var}")
    };
    let mut later = None;
    let product = if g.wgmma && !a.is_forward() {
        let pa = pack_name(a, acc_var);
        let (pack, issue) = hopper::update_issue(&g, ind, &acc_v, (&pa, &tf_p), &key.buf());
        match defer {
            true => {
                later = Some(issue);
                pack
            }
            false => pack + &issue,
        }
    } else if g.wgmma {
        hopper::update_product(&g, ind, &acc_v)
    } else {
        let wait = wait.map_or(String::new(), |w| {
            format!(
                "{ind}tf_cp_async_wait<{w}>();  // this tile's `{}`\n{ind}__syncthreads();\n",
                key.name()
            )
        });
        format!(
            "{wait}\
             {ind}#pragma unroll\n\
             {ind}for (int tf_kk = 0; tf_kk < {nkk}; ++tf_kk) {{\n\
             {ind}  tf_u32 tf_pa[{mi}][4];\n\
             {ind}  #pragma unroll\n\
             {ind}  for (int tf_mi = 0; tf_mi < {mi}; ++tf_mi) {{\n\
{pack}\
             {ind}  }}\n\
{mmas}\
             {ind}}}\n",
            mi = g.mi,
            nkk = g.ni / 2,
            pack = pack_p(
                &format!("{ind}    "),
                "tf_pa[tf_mi]",
                &format!("{tf_p}[tf_mi]")
            ),
            mmas = mma_pairs(
                &format!("{ind}  "),
                &g,
                g.di / 2,
                &format!(
                    "tf_ldmatrix_x4_trans(tf_bf, ({} + tf_vl + tf_kk * ROWS16) ^ (tf_jp * 32))",
                    key.buf()
                ),
                &acc_v,
                "tf_pa",
            ),
        )
    };
    let _ = write!(
        e.out,
        "{ind}float {tf_p}[{mi}][{ni}][4];  // {at_line}\n{open}{ind}  {tf_p}[tf_mi][tf_j][tf_h * 2 + tf_e] = {pc};\n{close}{product}",
        mi = g.mi,
        ni = g.ni,
        at_line = super::one_line(at),
    );
    Ok(later)
}

/// Whether the update of `acc` at statement `at` of the step's `body` may be
/// issued after the atomic product that follows it (the one-pass backward's
/// dK after dQ): it is the last update before that product, and no statement
/// from it to the product reads `acc`. The step then waits for the atomic
/// product alone while the update runs under the atomic's adds (dQ's staging
/// and its barriers), where waiting for both serialized them (on an H200,
/// ~14% of the step's stall samples). An earlier update (dV) keeps its place:
/// it runs under the statements before the product.
fn deferrable(a: &AttentionShape, body: &[Stmt], at: usize, acc: VarId) -> bool {
    let Some(x) = a.atomics.iter().filter(|x| x.at > at).map(|x| x.at).min() else {
        return false;
    };
    let mut updates = std::iter::once(a.update).chain(a.more_updates.iter().map(|u| u.at));
    !updates.any(|u| u > at && u < x)
        && !body[at + 1..=x].iter().any(|s| hopper::stmt_reads(s, acc))
}

/// The packed A fragments of the update of `acc` in the Hopper program with
/// more products (`tf_pa`, the first update's, or `tf_pa{acc}`).
fn pack_name(a: &AttentionShape, acc: VarId) -> String {
    if acc == a.acc {
        "tf_pa".to_string()
    } else {
        format!("tf_pa{acc}")
    }
}

/// The packed A fragments of an update earlier in the step whose operand is
/// the atomic product `x`'s (the one-pass backward's `dS`, packed for dK and
/// stored for dQ), if one is: the atomic product stores them as they are.
fn packed_operand(a: &AttentionShape, body: &[Stmt], x: &AtomicProduct) -> Option<String> {
    let operand = |s: &Stmt| -> Option<Expr> {
        let mut found = None;
        for v in s.exprs() {
            v.walk(&mut |y| {
                if let (None, Expr::Addmm { a, .. }) = (&found, y) {
                    found = Some((**a).clone());
                }
            });
        }
        found
    };
    let want = operand(body.get(x.at)?)?;
    let updates =
        std::iter::once((a.update, a.acc)).chain(a.more_updates.iter().map(|u| (u.at, u.acc)));
    updates
        .filter(|(at, _)| *at < x.at)
        .find(|(at, _)| body.get(*at).and_then(operand).as_ref() == Some(&want))
        .map(|(_, acc)| pack_name(a, acc))
}

/// An element of `p` (over the rows and keys) as an f32 C expression, for an
/// operand of `dtype` packed from the scores' layout: its reductions first,
/// a cast to `dtype` left to the packing (which rounds to nearest, the same
/// rounding done once), zero past the keys in an edge tile.
fn operand_element(
    e: &mut Emitter,
    f: &mut Frags,
    p: &Expr,
    dtype: DType,
    at: &str,
) -> Result<String, CodegenError> {
    let mut pre = Vec::new();
    f.reductions(e, p, &mut pre)?;
    let ctx: ElemCtx = f.ctx(e, Layout::Scores, &pre);
    let p = match p {
        Expr::Cast {
            arg,
            dtype: Some(dt),
        } if *dt == dtype => arg,
        _ => p,
    };
    let (pc, ty) = ctx.emit(p, at)?;
    let pc = if ty == CTy::I64 {
        format!("(float)({pc})")
    } else {
        pc
    };
    Ok(if f.masked {
        format!("{} ? ({pc}) : 0.0f", f.key_in(e))
    } else {
        pc
    })
}

/// `dst[0..4]` = the A fragment of `p`'s 16 keys `tf_kk` from `src` (its
/// `[NI][4]` scores-layout floats): an accumulator fragment of the first product
/// is an operand fragment of the second.
fn pack_p(ind: &str, dst: &str, src: &str) -> String {
    (0..4)
        .map(|r| {
            let (j, e) = (
                if r < 2 { "2 * tf_kk" } else { "2 * tf_kk + 1" },
                2 * (r % 2),
            );
            format!(
                "{ind}{dst}[{r}] = tf_pack({src}[{j}][{e}], {src}[{j}][{e1}]);\n",
                e1 = e + 1
            )
        })
        .collect()
}

/// For each pair of 8-column blocks (`tf_jp < pairs`): their B fragments by
/// `load` (into `tf_bf`; `ROWS16` stands for 16 rows' bytes), then `acc[mi][2jp]`
/// and `acc[mi][2jp + 1]` += `a[mi]` times them, for every 16-row block.
fn mma_pairs(ind: &str, g: &Geo, pairs: usize, load: &str, acc: &str, a: &str) -> String {
    let load = load.replace("ROWS16", &format!("{}u", 16 * g.hd * 2));
    format!(
        "{ind}#pragma unroll
         {ind}for (int tf_jp = 0; tf_jp < {pairs}; ++tf_jp) {{
         {ind}  tf_u32 tf_bf[4];
         {ind}  {load};
         {ind}  #pragma unroll
         {ind}  for (int tf_mi = 0; tf_mi < {mi}; ++tf_mi) {{
         {ind}    tf_att_mma({acc}[tf_mi][2 * tf_jp], {a}[tf_mi], tf_bf);
         {ind}    tf_att_mma({acc}[tf_mi][2 * tf_jp + 1], {a}[tf_mi], tf_bf + 2);
         {ind}  }}
         {ind}}}
",
        mi = g.mi
    )
}

/// The comparisons of tile indices in `body` that involve the key tile `n` and
/// whose truth over a whole tile pair can be decided from the tiles' ranges:
/// each with the C condition under which it holds for every element.
fn uniform_compares(e: &Emitter, body: &[Stmt], n: DimId, g: &Geo) -> Vec<(String, Expr)> {
    let mut out: Vec<(String, Expr)> = Vec::new();
    let mut visit = |x: &Expr| {
        let Expr::Compare { op, lhs, rhs, .. } = x else {
            return;
        };
        let (Some(l), Some(r)) = (affine(e, lhs), affine(e, rhs)) else {
            return;
        };
        if l.0 != Some(n) && r.0 != Some(n) {
            return;
        }
        let range = |side: &(Option<DimId>, String)| match side.0 {
            None => (side.1.clone(), side.1.clone()),
            Some(d) => {
                let block = if d == g.m { g.bm } else { e.cfg.block_sizes[d] };
                (
                    format!("(tb{d} + {})", side.1),
                    format!("(tb{d} + {} + {})", block - 1, side.1),
                )
            }
        };
        let ((lmin, lmax), (rmin, rmax)) = (range(&l), range(&r));
        let cond = match op {
            CmpOp::Ge => format!("{lmin} >= {rmax}"),
            CmpOp::Gt => format!("{lmin} > {rmax}"),
            CmpOp::Le => format!("{lmax} <= {rmin}"),
            CmpOp::Lt => format!("{lmax} < {rmin}"),
            CmpOp::Eq | CmpOp::Ne => return,
        };
        if !out.iter().any(|(_, y)| y == x) {
            out.push((format!("({cond})"), x.clone()));
        }
    };
    for s in body {
        if let Stmt::Let { value, .. } | Stmt::Assign { value, .. } = s {
            value.walk(&mut |x| visit(x));
        }
    }
    out
}

/// `x` as `t.index() + c` (`Some(t)`) or a block-uniform `c` (`None`), with `c` in C.
fn affine(e: &Emitter, x: &Expr) -> Option<(Option<DimId>, String)> {
    let uniform = |x: &Expr| -> Option<String> {
        let mut ok = true;
        x.walk(&mut |y| {
            ok &= matches!(
                y,
                Expr::Int(_)
                    | Expr::Scalar(_)
                    | Expr::Const(_)
                    | Expr::TileBegin(_)
                    | Expr::TileEnd(_)
                    | Expr::TileSize(_)
                    | Expr::Binary {
                        op: BinOp::Add | BinOp::Sub | BinOp::Mul,
                        ..
                    }
            )
        });
        let (c, ty) = e.ctx(&[]).emit(x, "").ok()?;
        (ok && ty == CTy::I64).then_some(c)
    };
    match x {
        Expr::TileIndex(d) => Some((Some(*d), "0".into())),
        Expr::Binary {
            op: op @ (BinOp::Add | BinOp::Sub),
            lhs,
            rhs,
            ..
        } => {
            if let (Expr::TileIndex(d), Some(c)) = (lhs.as_ref(), uniform(rhs)) {
                let sign = if *op == BinOp::Add { "" } else { "-" };
                return Some((Some(*d), format!("{sign}({c})")));
            }
            if let (Some(c), Expr::TileIndex(d), BinOp::Add) = (uniform(lhs), rhs.as_ref(), op) {
                return Some((Some(*d), format!("({c})")));
            }
            uniform(x).map(|c| (None, c))
        }
        _ => uniform(x).map(|c| (None, c)),
    }
}

/// `s` with each of `compares` replaced by 1 (it holds on the whole tile).
fn without(s: &Stmt, compares: &[Expr]) -> Stmt {
    let mut f = |x: &Expr| compares.contains(x).then_some(Expr::Int(1));
    // Then a `select` on a compare that holds is its first value: `let x =
    // select(true, x, -inf)` is `x`, which keeps unscaled scores unscaled.
    let mut taken = |x: &Expr| match x {
        Expr::Select { mask, then, .. } if **mask == Expr::Int(1) => Some((**then).clone()),
        _ => None,
    };
    let mut both = |x: &Expr| rewrite(&rewrite(x, &mut f), &mut taken);
    match s {
        Stmt::Let { var, value, at } => Stmt::Let {
            var: *var,
            value: both(value),
            at: at.clone(),
        },
        Stmt::Assign { var, value, at } => Stmt::Assign {
            var: *var,
            value: both(value),
            at: at.clone(),
        },
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::{InFlight, Product};

    /// The waits a step of the backward's Hopper program emits: a group waited
    /// for waits for those before it (`wait_group` counts the later ones still
    /// allowed in flight), nothing is waited for twice, and `wait_all_but`
    /// leaves only the last groups running.
    #[test]
    fn in_flight_groups_wait_for_what_is_read() {
        let mut f = InFlight::default();
        let mut out = String::new();
        f.issued(Product::Scores(0));
        f.issued(Product::Scores(3));
        f.wait(&mut out, "", |p| p == Product::Scores(0));
        assert_eq!(
            out.trim(),
            "asm volatile(\"wgmma.wait_group.sync.aligned 1;\" ::: \"memory\");"
        );
        out.clear();
        f.wait(&mut out, "", |p| p == Product::Scores(0));
        assert!(out.is_empty(), "waited twice: {out}");
        f.issued(Product::Update(7));
        f.issued(Product::Update(8));
        f.wait(&mut out, "", |p| p == Product::Scores(3));
        assert!(out.contains("aligned 2;"), "{out}");
        out.clear();
        f.wait_all_but(&mut out, "", 1);
        assert!(out.contains("aligned 1;"), "{out}");
        assert_eq!(f.pending, vec![(3, Product::Update(8))]);
        out.clear();
        f.wait(&mut out, "", |_| true);
        assert!(out.contains("aligned 0;") && f.pending.is_empty(), "{out}");
    }
}
