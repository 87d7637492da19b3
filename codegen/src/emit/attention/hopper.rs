//! The Hopper (sm_90a) attention program, in the manner of FlashAttention-3
//! (`Config::wgmma`): a producer warpgroup and one to three consumer warpgroups
//! of 64 query rows each (three, 192-row tiles, where the head dimension is
//! small: FlashAttention-3's shape at 64).
//!
//! - One producer thread loads the block's `q` tile once, then every key tile's
//!   `k` and `v` by TMA into a ring of `num_stages` shared buffers (128-byte
//!   swizzled panels of 64 head-dimension columns; rows past the tensors come
//!   in as zeros), each completing on its own `mbarrier`.
//! - A consumer warpgroup computes its 64 rows of scores `q·kᵀ` with
//!   `wgmma.m64n{BN}k16` from shared memory (both operands K-major) into
//!   registers, in the layout the `mma.sync` program's fragments have (a warp's
//!   16 rows, [`super::frag`]), so the kernel's elementwise code and row
//!   reductions are the same; `p` goes to `wgmma.m64n{D}k16` as register
//!   operands, `v` as a transposed (MN-major) shared operand. Each consumer warp
//!   releases a stage's `k` when its `q·kᵀ` is done and its `v` when its `p·v` is.
//! - The backward's kernels (more products a step) take the same program: every
//!   row operand loaded once, each streamed operand in its own ring, each
//!   product one `wgmma` group waited for where its result is first read (see
//!   `InFlight` in the parent module), per-step column vectors (`lse`, `delta`)
//!   staged in shared memory ([`column_vectors`]), and an atomic product (the
//!   one pass's dQ, [`atomic_product`]) through a swizzled `dS` tile, its
//!   adds by the threads (vector reductions) or, with `Config::tma_store`,
//!   staged in shared memory and added by the TMA unit ([`tma_add_axis`]).
//! - With `Config::persistent` (a forward kernel): one wave of blocks, each
//!   walking the grid's programs; the ring's steps run on across tiles, and
//!   the producer loads the next tile's `q` (and keys) once the consumers
//!   are done with this tile's `q·kᵀ`, under its last `p·v` and stores.
//!   Where tiles walk different numbers of keys (causal), the blocks take
//!   their tiles from a counter ([`Param::TileCounter`]), longest first.

use super::super::hopper::{tma_add_fn, tma_load_fn, wgmma_fn, wgmma_fn_acc, WgmmaA, HELPERS};
use super::super::{config_err, Emitter, Lowered, Param};
use super::frag::{Frags, Geo, Layout};
use super::AttentionShape;
use super::{key_tiles, loop_body, operands, outside, uniform_compares, without, KeyOp, RowOp};
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

/// Bytes of one swizzle atom (8 rows of 128 bytes); tiles start on one.
const ATOM: usize = 1024;

/// Registers the producer thread's warpgroup keeps (`setmaxnreg`).
const PRODUCER_REGS: usize = 24;

/// Registers a consumer thread gets (`setmaxnreg`): the register file (64K)
/// less the producer's, shared by `consumers` warpgroups, in steps of 8.
fn consumer_regs(consumers: usize) -> usize {
    ((65536 / 128 - PRODUCER_REGS) / consumers.max(1)).min(240) / 8 * 8
}

/// Accumulator registers (scores and output) a consumer thread may hold: its
/// share less what the packed `p`, the row statistics and addresses take (160
/// of 240 with one or two consumer warpgroups; 96 of 160 with three, where the
/// key block's `p` is at most 128 keys: FlashAttention-3's head dimension 64).
fn held_limit(consumers: usize) -> usize {
    consumer_regs(consumers) - if consumers >= 3 { 64 } else { 80 }
}

/// With more products a step (the backward's: two score-like products, one
/// or two updates), what the accumulators may take: the packed operands of
/// the updates are a quarter of the scores' registers, and no row statistics
/// stay live (FlashAttention-3's dK/dV at head dimension 128: 64 keys, 64
/// queries a step, 192 accumulators of 240).
fn held_limit_backward(consumers: usize) -> usize {
    consumer_regs(consumers) - 48
}

pub(super) fn emit(e: &mut Emitter, a: &AttentionShape) -> Result<Lowered, CodegenError> {
    let (rows, rings) = (a.row_operands(), rings(a));
    if rings.len() > 2 {
        return Err(config_err(
            e.k,
            e.cfg,
            format!(
                "the wgmma attention path streams two operands a key step (`k` and `v`, or the backward's two); \
                 this kernel's products read {}; leave `wgmma` unset",
                rings.len()
            ),
        ));
    }
    let mut g = geometry(e, a)?;
    let dtype = operands(e, a)?;
    let rank = e.spec.tensors[a.q].rank;
    for &t in rows.iter().chain(&rings) {
        if e.spec.tensors[t].rank != rank {
            return Err(config_err(
                e.k,
                e.cfg,
                "the wgmma attention path loads q, k and v with TMA and needs them of one rank; \
                 leave `wgmma` unset",
            ));
        }
    }
    if rank > 5 {
        return Err(config_err(
            e.k,
            e.cfg,
            format!("TMA loads tensors of up to 5 dimensions; q has {rank}: leave `wgmma` unset"),
        ));
    }
    let body = a.stmts(e.k);
    if let Some(at) = body[a.kv_loop + 1..].iter().find_map(|s| match s {
        Stmt::Wait { at, .. } => Some(at.clone()),
        _ => None,
    }) {
        return Err(CodegenError::Unsupported {
            kernel: e.k.name.clone(),
            at,
            message:
                "the wgmma attention path waits before the key loop only; move the `wait` before it"
                    .into(),
        });
    }
    let consumers = g.warps / 4;
    let stages = g.stages;
    let forward = a.is_forward();
    // A persistent grid (`Config::persistent`): one wave of blocks, each
    // walking the grid's programs, its producer loading the next tile's `q`
    // and keys while the consumers finish this one's.
    let persistent = e.cfg.persistent;
    // Where programs walk different numbers of keys (causal), a persistent
    // block takes its next tile from a counter, longest first, as
    // FlashAttention-3's scheduler: a fixed stride across the grid left the
    // blocks that drew the long tiles working alone at the end (causal 16k
    // keys, 1.5× the one-tile grid's time).
    let dynamic = persistent && super::work_order(e.k, a).is_some();
    let waits = body[..a.kv_loop]
        .iter()
        .any(|s| matches!(s, Stmt::Wait { .. }));
    if persistent && (!forward || a.packed.is_some() || !a.outer_each.is_empty() || waits) {
        return Err(config_err(
            e.k,
            e.cfg,
            "`persistent` walks a forward attention kernel's tiles on the Hopper program (no packed \
             sequences, no `each` loop around the keys, no `wait`); drop `persistent` for this kernel",
        ));
    }
    // The key loop, inside the loops over `each` tiles around it (the
    // backward's dK/dV: a group's query heads), all walked as one sequence of
    // steps through the ring.
    let mut key_loop = &body[a.kv_loop];
    for _ in &a.outer_each {
        if let Stmt::Loop { body: inner, .. } = key_loop {
            key_loop = &inner[0];
        }
    }
    // A tile's `p·v` may wait to be issued with the next tile's `q·kᵀ` (and is
    // complete when that returns) if nothing in the key loop between the two
    // reads the output accumulator.
    if let (true, Stmt::Loop { body, .. }) = (forward, key_loop) {
        g.defer_pv = body
            .iter()
            .enumerate()
            .filter(|(i, _)| *i < a.scores || *i > a.update)
            .all(|(_, s)| !stmt_reads(s, a.acc));
    }
    g.overlap = g.defer_pv && e.cfg.overlap && forward;
    g.persistent = persistent;
    // The split tail (`stream_k`): the last tiles' key steps shared by one wave.
    let carried = if e.cfg.stream_k {
        Some(super::split::split_tail(
            e,
            a,
            &body,
            key_loop,
            persistent && !dynamic && g.defer_pv,
        )?)
    } else {
        None
    };
    g.split = carried.is_some();
    // Warpgroups taking turns at the tensor cores (see [`scores_product`]).
    let pingpong = g.defer_pv && consumers >= 2;
    let threads = 128 * (consumers + 1);
    let q_bytes = g.bm * g.hd * 2;
    let kv_bytes = g.bn * g.hd * 2;
    let panels = g.hd / 64;
    // An atomic product's `dS` (two buffers of the block's rows by the step's keys).
    let ds_bytes = if a.atomics.is_empty() {
        0
    } else {
        2 * g.bm * g.bn * 2
    };
    // The backward's column vectors (`lse`, `delta`), staged a step at a time
    // (see [`column_vectors`]): two buffers a warpgroup of each.
    let columns = match key_loop {
        Stmt::Loop { body, .. } if !forward => column_loads(e, &a.batch, g.n, body),
        _ => Vec::new(),
    };
    let cv_bytes = consumers * 2 * columns.len() * g.bn * 4;
    // With `tma_store`, the atomic product's rows axis in its tensor, and its
    // staging: each warpgroup's share of the step's 64 rows, f32, in boxes of
    // 32 columns (128 bytes, swizzled as the TMA unit reads them).
    let tma_add = match (key_loop, a.atomics.as_slice()) {
        (Stmt::Loop { body, .. }, [x]) if e.cfg.tma_store => {
            Some((x.tensor, tma_add_axis(e, &g, &body[x.at])?))
        }
        _ if e.cfg.tma_store => {
            return Err(config_err(
                e.k,
                e.cfg,
                "`tma_store` on an attention kernel adds its one atomic product by TMA; this kernel has \
                 none (or several): drop `tma_store`",
            ))
        }
        _ => None,
    };
    let sdq_bytes = if tma_add.is_some() {
        consumers * atomic_split(&g).n * 64 * 4
    } else {
        0
    };
    let tiles =
        rows.len() * q_bytes + rings.len() * stages * kv_bytes + ds_bytes + sdq_bytes + cv_bytes;
    // Persistent: `q`'s release; dynamic: two words of the tiles taken.
    let bars = 8 * (1 + 2 * rings.len() * stages + usize::from(persistent) + usize::from(dynamic));
    let shared = tiles + bars + ATOM;

    let mut helpers = String::from(HELPERS);
    if rank != 2 {
        helpers += &tma_load_fn(rank);
    }
    helpers += &if forward {
        wgmma_fn("tf_wgmma_qk", g.bn, dtype, WgmmaA::Shared, false)
    } else {
        wgmma_fn_acc("tf_wgmma_sd", g.bn, dtype, WgmmaA::Shared, false)
    };
    helpers += &wgmma_fn("tf_wgmma_pv", g.hd, dtype, WgmmaA::Registers, true);
    if !a.atomics.is_empty() {
        let n = atomic_split(&g).n;
        helpers += &wgmma_fn_acc("tf_wgmma_dq", n, dtype, WgmmaA::SharedTransposed, true);
    }
    if tma_add.is_some() {
        helpers += &tma_add_fn(rank);
    }
    helpers += &super::pack_fn(dtype);
    let named: Vec<(String, TensorId, usize)> = (rows.iter().enumerate())
        .map(|(r, &t)| (RowOp(r).name(), t, g.bm))
        .chain((rings.iter().enumerate()).map(|(i, &t)| (KeyOp(i).name(), t, g.bn)))
        .collect();
    let mut maps: Vec<(Param, String)> = named
        .iter()
        .map(|(name, t, rows)| {
            (
                Param::TensorMap {
                    tensor: *t,
                    box_inner: 64,
                    box_outer: *rows,
                    rows_axis: Some(a.row_axis),
                },
                format!("const __grid_constant__ tf_tmap tf_map_{name}"),
            )
        })
        .collect();
    if let Some((tensor, axis)) = tma_add {
        // f32 boxes of the step's 64 rows by 32 columns (128 bytes).
        maps.push((
            Param::TensorMap {
                tensor,
                box_inner: 32,
                box_outer: g.bn,
                rows_axis: Some(axis),
            },
            "const __grid_constant__ tf_tmap tf_map_add".to_string(),
        ));
    }
    if dynamic {
        maps.push((Param::TileCounter, "unsigned* tf_counter".to_string()));
    }
    if g.split {
        maps.push((Param::SplitPartials, "float* tf_partials".to_string()));
        maps.push((Param::SplitCounters, "unsigned* tf_counters".to_string()));
    }
    let extra: Vec<(Param, &str)> = maps.iter().map(|(p, d)| (*p, d.as_str())).collect();
    let params = e.begin(threads, 1, &helpers, &extra);
    let (m, n) = (a.m, a.n);
    // A persistent block's per-tile code (the program's tile indices, the
    // key operands' batch indices, the block statements and the key loop's
    // bounds), emitted once and placed in each role's walk over the tiles.
    let mut tile_code = String::new();
    if persistent {
        e.out.push_str(super::PREAMBLE);
        let count = super::program_count(e, a);
        let _ = writeln!(
            e.out,
            "  const long long tf_tiles = {count};  // the grid's programs"
        );
        let at = e.out.len();
        super::program_tile_of(e, a, "(unsigned)tf_tile");
        tile_code = e.out.split_off(at);
    } else {
        super::program_tiles(e, a);
    }
    // Key operands indexed by an `each` loop around the key loop find their
    // rows at each step (the producer's, below).
    let kv = if a.outer_each.is_empty() {
        let at = e.out.len();
        let kv = super::kv_batch(e, a)?;
        if persistent {
            tile_code += &e.out.split_off(at);
        }
        kv
    } else {
        Vec::new()
    };
    let ops: Vec<KeyOp> = (0..rings.len()).map(KeyOp).collect();
    // The rings' bases after the row operands' tiles, then the barriers: the
    // row operands', each ring's arrivals, then each ring's releases.
    let mut bases = String::new();
    let mut prev = ("tf_sq".to_string(), rows.len() * q_bytes);
    for o in &ops {
        let _ = write!(bases, "{} = {} + {}u, ", o.ring(), prev.0, prev.1);
        prev = (o.ring(), stages * kv_bytes);
    }
    if ds_bytes > 0 {
        let _ = write!(bases, "tf_sds = {} + {}u, ", prev.0, prev.1);
        prev = ("tf_sds".to_string(), ds_bytes);
    }
    if sdq_bytes > 0 {
        let _ = write!(bases, "tf_sdq = {} + {}u, ", prev.0, prev.1);
        prev = ("tf_sdq".to_string(), sdq_bytes);
    }
    if cv_bytes > 0 {
        let _ = write!(bases, "tf_scv = {} + {}u, ", prev.0, prev.1);
        prev = ("tf_scv".to_string(), cv_bytes);
    }
    let _ = write!(bases, "tf_bq = {} + {}u", prev.0, prev.1);
    let mut bar_names = String::new();
    let mut prev = ("tf_bq".to_string(), 8);
    for name in ops
        .iter()
        .map(KeyOp::full)
        .chain(ops.iter().map(KeyOp::empty))
    {
        let _ = write!(
            bar_names,
            "{}{name} = {} + {}u",
            if bar_names.is_empty() { "" } else { ", " },
            prev.0,
            prev.1
        );
        prev = (name, stages * 8);
    }
    if persistent {
        // The consumers' release of a tile's `q` (every consumer warp's).
        let _ = write!(bar_names, ", tf_eq = {} + {}u", prev.0, prev.1);
    }
    if dynamic {
        // The producer's tiles for the consumers, a word each, by parity.
        bar_names.push_str(", tf_tq = tf_eq + 8u");
    }
    let inits: String = ops
        .iter()
        .map(|o| format!("      tf_mbar_init({} + s * 8, 1);\n", o.full()))
        .chain(
            ops.iter()
                .map(|o| format!("      tf_mbar_init({} + s * 8, {{cw}});\n", o.empty())),
        )
        .collect::<String>()
        .replace("{cw}", &(4 * consumers).to_string());
    let row_bases: String = (1..rows.len())
        .map(|r| {
            format!(
                "  const tf_u32 {} = tf_sq + {}u;\n",
                RowOp(r).base(),
                r * q_bytes
            )
        })
        .collect();
    let layout = if forward {
        format!(
            "  // Tiles from a 1024-byte boundary: q ({panels} panels of 64 columns), then the\n\
             \x20 // rings of k and v ({stages} stages), then the barriers: q's, each stage's k and\n\
             \x20 // v arrivals, and its k and v releases by the consumer warps (apart: a\n\
             \x20 // tile's k is done with before its v).\n"
        )
    } else {
        format!(
            "  // Tiles from a 1024-byte boundary: the {r} row operands ({panels} panels of 64\n\
             \x20 // columns each), then the rings of the {k} key operands ({stages} stages), then\n\
             \x20 // the barriers: the row operands', each stage's arrivals of each key operand,\n\
             \x20 // and their releases by the consumer warps once the step's products are done.\n",
            r = rows.len(),
            k = rings.len(),
        )
    };
    let _ = write!(
        e.out,
        "  const int warp = tid >> 5;\n\
         {layout}\
         \x20 const tf_u32 tf_sq = (tf_smem_u32(tf_smem) + {atom_m1}u) & ~{atom_m1}u;\n\
         \x20 const tf_u32 {bases};\n\
         \x20 const tf_u32 {bar_names};\n\
         {row_bases}\
         \x20 if (tid == 0) {{\n\
         \x20   tf_mbar_init(tf_bq, 1);\n\
         \x20   tf_mbar_init(tf_done(), {cw});\n\
         {eq_init}\
         \x20   for (int s = 0; s < {stages}; ++s) {{\n\
         {inits}\
         \x20   }}\n\
         \x20   asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");\n\
         \x20 }}\n\
         \x20 __syncthreads();\n",
        atom_m1 = ATOM - 1,
        cw = 4 * consumers,
        eq_init = if persistent {
            format!("    tf_mbar_init(tf_eq, {});\n", 4 * consumers)
        } else {
            String::new()
        },
    );
    // Block-level statements before the key loop run on every thread: the
    // producer needs their scalars (the loop's bound, a packed sequence's
    // rows) and their `wait`s.
    let block_at = e.out.len();
    let mut waited = false;
    for (i, s) in body[..a.kv_loop].iter().enumerate() {
        if a.packed.as_ref().is_some_and(|p| p.rows_loop == i) {
            super::packed_rows(e, a)?;
        }
        waited |= matches!(s, Stmt::Wait { .. });
        e.block_stmt(s, "  ")?;
    }
    if waited {
        // Flags acquired by generic loads; the TMA unit reads through the async proxy.
        e.out
            .push_str("  asm volatile(\"fence.proxy.async.global;\" ::: \"memory\");\n");
    }
    let Stmt::Loop {
        dim,
        body: kv_body,
        until,
        range,
    } = key_loop
    else {
        if persistent {
            // Its walk holds the key loop; the tile code above has no place.
            return Err(config_err(
                e.k,
                e.cfg,
                "`persistent` walks the key loop's tiles; this kernel has none: drop `persistent`",
            ));
        }
        return Ok(e.finish(params, threads, shared, "attention (wgmma)"));
    };
    let tiles_at = e.out.len();
    key_tiles(e, *dim, range.as_deref(), until.as_ref())?;
    // With the split tail every tile walks the same keys: their count comes
    // before the walk, which shares them out.
    let key_count = if g.split {
        e.out.split_off(tiles_at)
    } else {
        String::new()
    };
    if persistent {
        tile_code += &e.out.split_off(block_at);
    }
    // Steps: the key tiles, once for each index of the `each` loops around
    // them (`tf_it / tf_nt` counts those, the innermost fastest).
    let steps = if a.outer_each.is_empty() {
        "tf_nt".to_string()
    } else {
        let count: Vec<String> = a
            .outer_each
            .iter()
            .map(|&x| format!(" * (long long)({})", e.end(x)))
            .collect();
        let _ = writeln!(
            e.out,
            "  const int tf_steps = (int)tf_min_i((long long)tf_nt{}, 0x7fffffffll);",
            count.concat()
        );
        "tf_steps".to_string()
    };
    // The steps a block walks of its tile: all of them, or with the split
    // tail its part, `tf_j0..tf_j1` (`rel`: a step's place in that part).
    let (last_step, rel, count) = if g.split {
        (
            "tf_j1".to_string(),
            "(tf_it - tf_j0)",
            "(tf_j1 - tf_j0)".to_string(),
        )
    } else {
        (steps.clone(), "tf_it", steps.clone())
    };
    let each_tiles = |e: &Emitter, ind: &str| -> String {
        if a.outer_each.is_empty() {
            return String::new();
        }
        // In 32 bits (every index is below `tf_steps`, an int), one division
        // for the key tile and its quotient; the outermost loop's index is
        // what is left (below its extent), with no division. 64-bit divisions
        // here, twice a step, were ~12% of the one-pass backward's stall
        // samples on an H200.
        let mut out = format!(
            "{ind}const int tf_rest0 = tf_it / tf_nt;\n{ind}const int tf_ti = tf_it - tf_rest0 * tf_nt;\n"
        );
        let mut rest = "tf_rest0".to_string();
        for (i, &x) in a.outer_each.iter().rev().enumerate() {
            // A role may not read a group's head index (dK/dV's consumers
            // read only the step): `maybe_unused` keeps NVRTC from warning.
            let name = &e.k.dims[x].name;
            if i + 1 == a.outer_each.len() {
                let _ = writeln!(
                    out,
                    "{ind}[[maybe_unused]] const long long tb{x} = {rest};  // tile `{name}`"
                );
            } else {
                let _ = write!(
                    out,
                    "{ind}const int tf_rest{n} = {rest} / (int)({ext});\n\
                     {ind}[[maybe_unused]] const long long tb{x} = {rest} - tf_rest{n} * (int)({ext});  // tile `{name}`\n",
                    n = i + 1,
                    ext = e.end(x),
                );
                rest = format!("tf_rest{}", i + 1);
            }
        }
        out
    };
    let tile_of_step = if a.outer_each.is_empty() {
        "tf_it"
    } else {
        "tf_ti"
    };
    // TMA coordinates, innermost first: column, then the other axes from the
    // last in: the row's and the batch tiles' (keys' and values' own: a
    // grouped head's).
    let coords = |idx: &[String], row: &str| -> String {
        let mut batch = idx.iter();
        let mut axes: Vec<String> = (0..rank - 1)
            .map(|x| {
                if x == a.row_axis {
                    format!("(int)({row})")
                } else {
                    format!("(int){}", batch.next().map_or("0", |b| b.as_str()))
                }
            })
            .collect();
        axes.reverse();
        axes.iter().map(|c| format!(", {c}")).collect()
    };
    let q_idx: Vec<String> = a.batch.iter().map(|b| format!("tb{b}")).collect();
    let load =
        |map: &str, idx: &[String], dst: &str, row: &str, bar: &str, rows: usize| -> String {
            let at = coords(idx, row);
            (0..panels)
                .map(|p| {
                    format!(
                    "        tf_tma_{rank}d({dst} + {off}u, &tf_map_{map}, {col}{at}, {bar});\n",
                    off = p * rows * 128,
                    col = p * 64
                )
                })
                .collect()
        };
    let row_loads: String = (0..rows.len())
        .map(|r| {
            let dst = if r == 0 {
                "tf_sq".to_string()
            } else {
                RowOp(r).base()
            };
            load(
                &RowOp(r).name(),
                &q_idx,
                &dst,
                &format!("tb{m}"),
                "tf_bq",
                g.bm,
            )
            .replace("        ", "      ")
        })
        .collect();
    // The key operands' batch indices where `each` loops index them: at each step.
    let (kv, kv_lines) = if a.outer_each.is_empty() {
        (kv, String::new())
    } else {
        let at = e.out.len();
        let kv = super::kv_batch(e, a)?;
        let lines: String = (e.out.split_off(at).lines())
            .map(|l| format!("        {}\n", l.trim_start()))
            .collect();
        (kv, lines)
    };
    let ring_loads: String = ops
        .iter()
        .map(|o| {
            format!(
                "        if (tf_ri >= {stages}) tf_mbar_wait({empty} + s * 8, tf_free);\n\
                 \x20       tf_mbar_expect_tx({full} + s * 8, {kv_bytes}u);\n\
                 {loads}",
                empty = o.empty(),
                full = o.full(),
                loads = load(
                    &o.name(),
                    &kv,
                    &format!("{} + s * {kv_bytes}u", o.ring()),
                    "tf_row",
                    &format!("{} + s * 8", o.full()),
                    g.bn
                ),
            )
        })
        .collect();
    // Each role's walk over the tiles (persistent), the ring's steps counted
    // across them (`tf_r0`: the steps before this tile's); else one tile.
    let walk = |ind: &str, producer: bool| -> String {
        if !persistent {
            return format!("{ind}const int tf_r0 = 0;  // the ring's steps before this tile's\n");
        }
        let code: String = tile_code
            .lines()
            .map(|l| format!("{ind}  {}\n", l.trim_start()))
            .collect();
        let q_wait = format!(
            "{ind}  if (tf_tc > 0) tf_mbar_wait(tf_eq, (tf_tc - 1) & 1);  // the consumers are done with the last tile's q\n"
        );
        let head = format!(
            "{ind}int tf_r0 = 0, tf_tc = 0;  // the ring's steps before this tile's; tiles walked\n"
        );
        if g.split {
            // Whole tiles strided across the blocks up to `tf_dp` (all of
            // them when the waves come out even), then the rest's key steps
            // shared evenly, in order: a block's share is at least a tile's
            // steps (one wave of blocks for at least as many tiles), so a
            // tile is split at most once. `tf_j0..tf_j1`: the tile's steps
            // the block walks.
            let key_count: String = key_count
                .lines()
                .map(|l| format!("{ind}{}\n", l.trim_start()))
                .collect();
            return format!(
                "{key_count}\
                 {ind}const long long tf_rem = tf_tiles % gridDim.x;\n\
                 {ind}const long long tf_dp = tf_rem == 0 || tf_nt == 0 ? tf_tiles : tf_tiles - gridDim.x - tf_rem;\n\
                 {ind}const long long tf_sw = (tf_tiles - tf_dp) * tf_nt;  // the split tiles' steps\n\
                 {ind}long long tf_si = (tf_sw / gridDim.x) * blockIdx.x + (tf_sw % gridDim.x) * blockIdx.x / gridDim.x;\n\
                 {ind}const long long tf_si1 = (tf_sw / gridDim.x) * (blockIdx.x + 1) + (tf_sw % gridDim.x) * (blockIdx.x + 1) / gridDim.x;\n\
                 {head}\
                 {ind}for (long long tf_next = blockIdx.x;; ++tf_tc) {{\n\
                 {ind}  long long tf_tile = tf_next;\n\
                 {ind}  int tf_j0 = 0, tf_j1 = tf_nt;\n\
                 {ind}  if (tf_next < tf_dp) {{\n\
                 {ind}    tf_next += gridDim.x;\n\
                 {ind}  }} else {{\n\
                 {ind}    if (tf_si >= tf_si1) break;\n\
                 {ind}    tf_tile = tf_dp + tf_si / tf_nt;\n\
                 {ind}    tf_j0 = (int)(tf_si % tf_nt);\n\
                 {ind}    tf_j1 = (int)tf_min_i(tf_nt, tf_j0 + (tf_si1 - tf_si));\n\
                 {ind}    tf_si += tf_j1 - tf_j0;\n\
                 {ind}  }}\n\
                 {code}{}",
                if producer { q_wait.as_str() } else { "" }
            );
        }
        match (dynamic, producer) {
            (false, _) => format!(
                "{head}{ind}for (long long tf_tile = blockIdx.x; tf_tile < tf_tiles; tf_tile += gridDim.x, ++tf_tc) {{\n\
                 {code}{}",
                if producer { q_wait.as_str() } else { "" }
            ),
            // The block's first tile is its index, the next ones from the
            // counter. Each block takes one past the last, so a launch takes
            // exactly `tf_tiles` (a grid of at most that many blocks): the
            // last `atomicInc` wraps the counter to zero for the next launch.
            // The producer publishes each tile (or the end) beside `q`'s
            // arrival, whose release the consumers' wait acquires.
            (true, true) => format!(
                "{head}{ind}for (long long tf_tile = blockIdx.x;; ++tf_tc) {{\n\
                 {ind}  if (tf_tc > 0) tf_tile = (long long)gridDim.x + atomicInc(tf_counter, (unsigned)(tf_tiles - 1));\n\
                 {ind}  if (tf_tile >= tf_tiles) {{  // none left: the consumers stop at the end mark\n\
                 {q_wait}{ind}    asm volatile(\"st.shared.u32 [%0], %1;\" :: \"r\"(tf_tq + (tf_tc & 1) * 4u), \"r\"(0xffffffffu) : \"memory\");\n\
                 {ind}    tf_mbar_arrive(tf_bq);\n\
                 {ind}    break;\n\
                 {ind}  }}\n\
                 {code}{q_wait}{ind}  asm volatile(\"st.shared.u32 [%0], %1;\" :: \"r\"(tf_tq + (tf_tc & 1) * 4u), \"r\"((tf_u32)tf_tile) : \"memory\");\n"
            ),
            (true, false) => format!(
                "{head}{ind}for (;; ++tf_tc) {{\n\
                 {ind}  tf_mbar_spin(tf_bq, tf_tc & 1);  // the tile's q, and the tile\n\
                 {ind}  tf_u32 tf_tn;\n\
                 {ind}  asm volatile(\"ld.shared.u32 %0, [%1];\" : \"=r\"(tf_tn) : \"r\"(tf_tq + (tf_tc & 1) * 4u) : \"memory\");\n\
                 {ind}  if (tf_tn == 0xffffffffu) break;\n\
                 {ind}  const long long tf_tile = tf_tn;\n\
                 {code}"
            ),
        }
    };
    let _ = write!(
        e.out,
        "  if (warp < 4) {{\n\
         \x20   // Producer: one thread issues every load.\n\
         \x20   asm volatile(\"setmaxnreg.dec.sync.aligned.u32 {PRODUCER_REGS};\");\n\
         \x20   if (tid == 0) {{\n\
         {producer_walk}\
         \x20     tf_mbar_expect_tx(tf_bq, {row_bytes}u);\n\
         {row_loads}\
         \x20     for (int tf_it = {first}; tf_it < {last_step}; ++tf_it) {{\n\
         \x20       const int tf_ri = tf_r0 + {rel};  // the step's place in the ring\n\
         \x20       const int s = tf_ri % {stages};\n\
         \x20       const tf_u32 tf_free = ((tf_ri / {stages}) & 1) ^ 1;  // the stage's last tile released it\n\
         {each}\
         {kv_lines}\
         \x20       const int tf_row = (int)(tf_beg{n} + (long long){tile_of_step} * B{n});\n\
         {ring_loads}\
         \x20     }}\n\
         {walk_end}\
         \x20     tf_mbar_wait(tf_done(), 0);  // the consumers finished: bounded, see tf_mbar_spin\n\
         \x20   }}\n\
         \x20 }} else {{\n\
         \x20   asm volatile(\"setmaxnreg.inc.sync.aligned.u32 {creg};\");\n\
         \x20   // Consumer warp w (0..{last}) owns rows 16w..16w+15; its warpgroup's 64 rows\n\
         \x20   // start at 64 · (w / 4) in each panel of q.\n\
         \x20   const int lane = tid & 31, tf_cw = warp - 4;\n\
         \x20   const int tf_g = lane >> 2, tf_t = lane & 3, tf_wr = tf_cw * 16;\n\
         \x20   const tf_u32 tf_qw = tf_sq + (tf_cw >> 2) * {wg_rows}u;\n\
         {first_turn}\
         {consumer_walk}\
         {deferred}",
        row_bytes = rows.len() * q_bytes,
        each = each_tiles(e, "        "),
        producer_walk = walk("      ", true),
        walk_end = if persistent {
            format!("      tf_r0 += {count};\n      }}\n")
        } else {
            String::new()
        },
        first = g.first_step(),
        consumer_walk = walk("    ", false),
        // Persistent: the turns run on across tiles, the first given once.
        first_turn = if pingpong && persistent {
            format!(
                "    // The warpgroups take turns at the tensor cores, the first one first, across tiles.\n\
                 \x20   if (tf_cw >= {}) asm volatile(\"bar.arrive 2, 256;\" ::: \"memory\");\n",
                4 * (consumers - 1)
            )
        } else {
            String::new()
        },
        last = 4 * consumers - 1,
        creg = consumer_regs(consumers),
        wg_rows = 64 * 128,
        deferred = if g.defer_pv {
            format!(
                "    tf_u32 tf_pa[{kk}][4]{zero};  // the last tile's `p`, multiplied with its `v` next iteration\n{first}",
                kk = g.bn / 16,
                // Zero for a persistent tile without keys (see its last `p·v`).
                zero = if persistent { " = {}" } else { "" },
                first = if pingpong && !persistent {
                    // The last warpgroup gives the first its first turn.
                    format!(
                        "    // The warpgroups take turns at the tensor cores, the first one first.\n\
                         \x20   if (tf_cw >= {} && tf_nt > 0) asm volatile(\"bar.arrive 2, 256;\" ::: \"memory\");\n",
                        4 * (consumers - 1)
                    )
                } else {
                    String::new()
                }
            )
        } else {
            String::new()
        },
    );
    // The consumer warps store the outputs (and signal after them).
    e.storers = (
        "(tid - 128)".into(),
        format!(
            "asm volatile(\"bar.sync 1, {};\" ::: \"memory\");",
            128 * consumers
        ),
    );
    let mut frags = Frags {
        geo: &g,
        batch: &a.batch,
        layouts: vec![None; e.k.vars.len()],
        scaled: vec![None; e.k.vars.len()],
        temps: 0,
        masked: true,
        ind: "    ".into(),
        staged: Vec::new(),
        narrow_keys: true,
    };
    for s in &body[..a.kv_loop] {
        if !is_block_level(e, s) {
            outside(e, &mut frags, s)?;
        }
    }
    let conds = uniform_compares(e, kv_body, n, &g);
    let mut fast = format!("tb{n} + B{n} <= {}", e.end(n));
    for (c, _) in &conds {
        let _ = write!(fast, " && {c}");
    }
    let compares: Vec<Expr> = conds.into_iter().map(|(_, x)| x).collect();
    let fast_body: Vec<Stmt> = kv_body.iter().map(|s| without(s, &compares)).collect();
    // Each step's stage: the forward's `k` (its `v` where `p·v` is not
    // deferred), else every key operand's, each waited for here.
    let (bufs, spins) = if forward {
        let vb = if g.defer_pv {
            String::new()
        } else {
            format!(", tf_vb = tf_sv + tf_st * {kv_bytes}u")
        };
        (
            format!("tf_kb = tf_sk + tf_st * {kv_bytes}u{vb}"),
            "      tf_mbar_spin(tf_bk + tf_st * 8, tf_ph);\n".to_string(),
        )
    } else {
        let bufs: Vec<String> = ops
            .iter()
            .map(|o| format!("{} = {} + tf_st * {kv_bytes}u", o.buf(), o.ring()))
            .collect();
        let spins: String = ops
            .iter()
            .map(|o| format!("      tf_mbar_spin({} + tf_st * 8, tf_ph);\n", o.full()))
            .collect();
        (bufs.join(", "), spins)
    };
    let (declare, stage) = if forward {
        (String::new(), String::new())
    } else {
        // A step's coordinates from `tf_it`, for the next step's loads.
        let step_tiles = format!(
            "{}          const long long tb{n} = tf_beg{n} + (long long){tile_of_step} * B{n};\n",
            each_tiles(e, "          ")
        );
        column_vectors(e, &mut frags, &columns, &step_tiles, &steps)?
    };
    let _ = write!(
        e.out,
        "{declare}\
         \x20   tf_mbar_spin(tf_bq, {q_phase});\n\
         \x20   for (int tf_it = {first}; tf_it < {last_step}; ++tf_it) {{  // tile `{name}`\n\
         {each}\
         \x20     const long long tb{n} = tf_beg{n} + (long long){tile_of_step} * B{n};\n\
         \x20     const int tf_ri = tf_r0 + {rel};  // the step's place in the ring\n\
         \x20     const int tf_st = tf_ri % {stages};\n\
         \x20     const tf_u32 tf_ph = (tf_ri / {stages}) & 1;\n\
         \x20     const tf_u32 {bufs};\n\
         {spins}\
         {opaque}\
         {stage}\
         \x20     if ({fast}) {{\n",
        // The row tiles' addresses, opaque to the compiler in each step: else
        // it holds every loop-invariant `wgmma` descriptor of them across the
        // loop (two row operands: 32 registers; dK/dV spilled 72 bytes at 64
        // queries a step and head dimension 128, none with these).
        opaque = match (forward, a.atomics.is_empty()) {
            (true, _) => "",
            (false, true) => {
                "      tf_u32 tf_qwo;\n\
                 \x20     asm volatile(\"mov.b32 %0, %1;\" : \"=r\"(tf_qwo) : \"r\"(tf_qw));\n"
            }
            (false, false) => {
                "      tf_u32 tf_qwo, tf_sqo;\n\
                 \x20     asm volatile(\"mov.b32 %0, %1;\" : \"=r\"(tf_qwo) : \"r\"(tf_qw));\n\
                 \x20     asm volatile(\"mov.b32 %0, %1;\" : \"=r\"(tf_sqo) : \"r\"(tf_sq));\n"
            }
        },
        name = e.k.dims[n].name,
        each = each_tiles(e, "      "),
        q_phase = if persistent { "tf_tc & 1" } else { "0" },
        first = g.first_step(),
    );
    loop_body(e, a, &mut frags, &fast_body, false)?;
    e.out.push_str("      } else {\n");
    loop_body(e, a, &mut frags, kv_body, true)?;
    // Every `q·kᵀ` of the tile is complete: the producer may load the next
    // tile's `q` while this one's last `p·v` and stores run.
    let q_free = if persistent {
        "    if (lane == 0) tf_mbar_arrive(tf_eq);  // this tile's q is done with\n"
    } else {
        ""
    };
    if g.defer_pv {
        // The last tile's `p·v`.
        let _ = write!(
            e.out,
            "      }}\n    }}\n{q_free}{last}\
             \x20     asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n\
             {pv}\
             \x20     asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n\
             \x20     asm volatile(\"wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");\n\
             {v_free}\
             \x20   }}\n",
            pv = pv_issue(&g, "      ", &format!("v{}", a.acc), "tf_pa", "tf_vb"),
            // Persistent: issued even for a tile without keys (its `p` then
            // zero, its stage any): under the tile loop a guarded issue had
            // ptxas serialize every `wgmma` of the kernel (C7520), 1.5× the
            // time. The next tile's steps reuse the stage.
            last = if persistent {
                format!(
                    "    {{  // the last tile's p·v\n\
                     \x20     const int tf_st = {count} > 0 ? (tf_r0 + {count} - 1) % {stages} : 0;\n\
                     \x20     const tf_u32 tf_vb = tf_sv + tf_st * {kv_bytes}u;\n\
                     \x20     if ({count} > 0) tf_mbar_spin(tf_bv + tf_st * 8, ((tf_r0 + {count} - 1) / {stages}) & 1);\n"
                )
            } else {
                format!(
                    "    if (tf_nt > 0) {{\n\
                     \x20     const int tf_st = (tf_r0 + tf_nt - 1) % {stages};\n\
                     \x20     const tf_u32 tf_vb = tf_sv + tf_st * {kv_bytes}u;\n\
                     \x20     tf_mbar_spin(tf_bv + tf_st * 8, ((tf_r0 + tf_nt - 1) / {stages}) & 1);\n"
                )
            },
            v_free = if persistent {
                format!("      if (lane == 0 && {count} > 0) tf_mbar_arrive(tf_ev + tf_st * 8);  // its v is done with\n")
            } else {
                String::new()
            },
        );
    } else {
        let what = if forward {
            "both products read the stage"
        } else {
            "the step's products are done with the stage"
        };
        let releases: String = ops
            .iter()
            .map(|o| format!("        tf_mbar_arrive({} + tf_st * 8);\n", o.empty()))
            .collect();
        let _ = write!(
            e.out,
            "      }}\n      if (lane == 0) {{  // {what}\n{releases}      }}\n    }}\n{q_free}"
        );
    }
    frags.ind = "    ".into();
    if tma_add.is_some() {
        // The TMA unit's adds of the last steps done before the block leaves.
        e.out.push_str(
            "    if ((tf_cw & 3) == 0 && lane == 0) asm volatile(\"cp.async.bulk.wait_group 0;\" ::: \"memory\");\n",
        );
    }
    if let Some(c) = carried {
        e.out.push_str(&super::split::split_meet(&g, c, consumers));
    }
    for s in &body[a.kv_loop + 1..] {
        outside(e, &mut frags, s)?;
    }
    if carried.is_some() {
        e.out.push_str("    }\n");
    }
    if persistent {
        let _ = write!(e.out, "    tf_r0 += {count};\n    }}\n");
        if pingpong {
            // The last warpgroup gave a turn after its last step.
            e.out.push_str(
                "    if (tf_cw < 4) asm volatile(\"bar.sync 2, 256;\" ::: \"memory\");  // the turn given after the last step\n",
            );
        }
    }
    e.out
        .push_str("    if (lane == 0) tf_mbar_arrive(tf_done());\n  }\n}\n");
    let mut l = e.finish(params, threads, shared, "attention (wgmma)");
    l.persistent = persistent;
    l.split_tiles = g
        .split
        .then(|| super::split::floats_per_tile(&g, consumers));
    Ok(l)
}

/// The key loop's f32 loads over its keys alone (the backward's `lse` and
/// `delta` of the loop's queries, a column of the scores each), staged for
/// each step in shared memory by [`column_vectors`].
fn column_loads(e: &Emitter, batch: &[DimId], n: DimId, body: &[Stmt]) -> Vec<Expr> {
    let mut loads: Vec<Expr> = Vec::new();
    for s in body {
        for x in s.exprs() {
            x.walk(&mut |y| {
                if let Expr::Load { tensor, .. } = y {
                    let dims: Vec<DimId> = super::frag::dims_of(e, y)
                        .into_iter()
                        .filter(|d| !batch.contains(d) && !e.k.dims[*d].each)
                        .collect();
                    if dims == [n]
                        && e.spec.tensors[*tensor].dtype == crate::dtype::DType::F32
                        && !loads.contains(y)
                    {
                        loads.push(y.clone());
                    }
                }
            });
        }
    }
    loads
}

/// [`column_loads`]' values staged for each step in shared memory (at
/// `tf_scv`, in the program's dynamic shared memory, so its size counts
/// them): a warpgroup's threads load the step's `bn` values of each once,
/// then every element reads its column there. Loaded in each element
/// instead, their 64-bit addresses and early-issued loads cost the dK/dV
/// program hundreds of bytes of spills. Each thread loads its values a step
/// ahead into registers (`tf_cvn`), so their latency passes under a step's
/// products instead of stalling the step's start (the top stall of the
/// backward's programs on an H200). Two buffers a warpgroup (by step
/// parity): a thread writes one only after every thread of its warpgroup
/// passed the last step's barrier, done with its reads of the step before.
/// `step_tiles` declares a step's tile indices from `tf_it`. Returns the
/// buffers' declaration with the first step's loads and the step's staging
/// code (both empty without such loads), and records the loads in `frags`.
fn column_vectors(
    e: &Emitter,
    frags: &mut Frags,
    loads: &[Expr],
    step_tiles: &str,
    steps: &str,
) -> Result<(String, String), CodegenError> {
    let g = *frags.geo;
    if loads.is_empty() {
        return Ok((String::new(), String::new()));
    }
    let mut coords: Vec<(DimId, String)> =
        frags.batch.iter().map(|&b| (b, format!("tb{b}"))).collect();
    coords.push((g.n, format!("(tb{} + tf_c)", g.n)));
    let ctx = e.ctx(&coords);
    // A thread's columns: every 128th from its place in the warpgroup.
    let per = g.bn.div_ceil(128);
    let mut fetch = String::new();
    let mut stage = String::new();
    for (i, x) in loads.iter().enumerate() {
        let (c, _) = ctx.emit(x, "a column of the step")?;
        let _ = writeln!(fetch, "            tf_cvn[tf_r][{i}] = {c};");
        let _ = writeln!(stage, "            tf_cvw[{i}][tf_c] = tf_cvn[tf_r][{i}];");
        frags.staged.push((
            x.clone(),
            format!("tf_cv[tf_cw >> 2][tf_it & 1][{i}][tf_j * 8 + 2 * tf_t + tf_e]"),
        ));
    }
    let each_column = |body: &str| {
        format!(
            "        #pragma unroll\n\
             \x20       for (int tf_r = 0; tf_r < {per}; ++tf_r) {{\n\
             \x20         const int tf_c = (tf_cw & 3) * 32 + lane + tf_r * 128;\n\
             \x20         if (tf_c < {bn}) {{\n\
             {body}\
             \x20         }}\n\
             \x20       }}\n",
            bn = g.bn,
        )
    };
    // Step `at`'s values into `tf_cvn` where it is one (a step's tile
    // indices divide by the loop's tile count), in a scope of their own.
    let fetch_step = |at: &str| {
        format!(
            "        if ({at} < {steps}) {{\n\
             \x20         const int tf_it = {at};\n\
             {step_tiles}\
             {loads}\
             \x20       }}\n",
            loads = each_column(&fetch)
        )
    };
    let declare = format!(
        "    // The steps' column vectors: [warpgroup][step parity][vector][key].\n\
         \x20   float (*const tf_cv)[2][{n}][{bn}] = reinterpret_cast<float (*)[2][{n}][{bn}]>(tf_smem + (tf_scv - tf_smem_u32(tf_smem)));\n\
         \x20   float tf_cvn[{per}][{n}];  // this thread's columns of the next step\n\
         {first}",
        n = loads.len(),
        bn = g.bn,
        first = fetch_step("0"),
    );
    let step = format!(
        "      {{  // the step's column vectors, once a warpgroup, read from shared memory\n\
         \x20       float (*tf_cvw)[{bn}] = tf_cv[tf_cw >> 2][tf_it & 1];\n\
         {store}\
         \x20       asm volatile(\"bar.sync %0, 128;\" :: \"r\"(2 + (tf_cw >> 2)) : \"memory\");\n\
         \x20       // The next step's, their latency under this step's products.\n\
         \x20       const int tf_itn = tf_it + 1;\n\
         {next}\
         \x20     }}\n",
        bn = g.bn,
        store = each_column(&stage),
        next = fetch_step("tf_itn"),
    );
    Ok((declare, step))
}

/// How the consumer warpgroups share an atomic product (`dSᵀ·K`, see
/// [`super::AtomicProduct`]): `n` columns of the head dimension each, over
/// every key of the block (`split_n`: the warpgroups wait for each other's
/// `dS`), or (where the columns do not split into 64s) every column over
/// the warpgroup's own 64 keys, each adding its part.
#[derive(Clone, Copy, Debug)]
pub(super) struct AtomicSplit {
    pub n: usize,
    pub split_n: bool,
}

fn atomic_split(g: &Geo) -> AtomicSplit {
    atomic_split_of(g.warps / 4, g.hd)
}

fn atomic_split_of(consumers: usize, hd: usize) -> AtomicSplit {
    let per = hd / consumers.max(1);
    if per % 64 == 0 {
        AtomicSplit {
            n: per,
            split_n: true,
        }
    } else {
        AtomicSplit {
            n: hd,
            split_n: false,
        }
    }
}

/// With [`Config::tma_store`](crate::Config::tma_store), where the TMA unit
/// adds an atomic product's step (`s`, the `atomic_add`) into its tensor: the
/// axis of the step's rows, its index the loop's tile (the last index must be
/// the head dimension's tile, the others neither); an error naming the
/// statement otherwise.
fn tma_add_axis(e: &Emitter, g: &Geo, s: &Stmt) -> Result<usize, CodegenError> {
    let Stmt::Atomic { index, at, .. } = s else {
        return Err(config_err(e.k, e.cfg, "`tma_store`: no atomic product"));
    };
    let tile = |x: &Expr, d: DimId| matches!(x, Expr::TileIndex(t) if *t == d);
    let rows: Vec<usize> = (0..index.len()).filter(|&i| tile(&index[i], g.n)).collect();
    let others_free = index.iter().enumerate().all(|(i, x)| {
        i + 1 == index.len()
            || rows.contains(&i)
            || !super::frag::dims_of(e, x)
                .iter()
                .any(|&d| d == g.n || d == g.d)
    });
    match (rows.as_slice(), index.last()) {
        ([r], Some(last)) if *r + 1 < index.len() && tile(last, g.d) && others_free => Ok(*r),
        _ => Err(CodegenError::Unsupported {
            kernel: e.k.name.clone(),
            at: at.clone(),
            message: "`tma_store` adds the product by TMA boxes: index the tensor with the loop's tile \
                      (its rows) and, last, the head dimension's tile, the other indices by neither; \
                      or drop `tma_store`"
                .into(),
        }),
    }
}

/// `atomic_add(t[i], addmm(zeros, a, r[…]) [* s])` in the key loop (see
/// [`super::AtomicProduct`]), the step's keys its rows: `a` (the scores'
/// layout: the block's rows by the step's keys) rounded into this step's
/// `dS` buffer as it lies (a key of the block a 128-byte swizzled row), which
/// is `aᵀ` MN-major; after a barrier, `aᵀ·r` by `wgmma` (`r`'s tile in
/// shared memory, MN-major too), then each element added into `t` (masked at
/// its edges), times `s`. Two buffers by step parity: a step overwrites one
/// only after every warpgroup passed the last step's barrier, its product
/// done.
pub(super) fn atomic_product(
    e: &mut Emitter,
    a: &AttentionShape,
    f: &mut Frags,
    s: &Stmt,
    x: &super::AtomicProduct,
    flight: &mut super::InFlight,
    packed: Option<&str>,
) -> Result<(), CodegenError> {
    // An update issued after this product (see `InFlight::deferred`).
    let then = flight.deferred.take();
    let Stmt::Atomic {
        tensor,
        index,
        value,
        at,
        ..
    } = s
    else {
        return Ok(());
    };
    if e.spec.tensors[*tensor].dtype != crate::dtype::DType::F32 {
        return Err(CodegenError::Argument {
            kernel: e.k.name.clone(),
            arg: e.k.tensors[*tensor].name.clone(),
            message: format!(
                "the wgmma attention path adds products into f32 tensors; this one is {}",
                e.spec.tensors[*tensor].dtype
            ),
        });
    }
    let g = *f.geo;
    let ind = f.ind.clone();
    let split = atomic_split(&g);
    let consumers = g.warps / 4;
    let (mm, scale) = match value {
        Expr::Binary {
            op: BinOp::Mul,
            lhs,
            rhs,
            ..
        } => match (lhs.as_ref(), rhs.as_ref()) {
            (m @ Expr::Addmm { .. }, s) | (s, m @ Expr::Addmm { .. }) => (m, Some(s)),
            _ => (value, None),
        },
        m => (m, None),
    };
    let Expr::Addmm { a: pa, .. } = mm else {
        return Ok(());
    };
    // The pair of keys a thread stores: an update's packed operand where it is
    // the same value, else packed here.
    let (values, pair) = match packed {
        Some(pa) => (
            String::new(),
            format!("{pa}[tf_j >> 1][((tf_j & 1) << 1) + tf_h]"),
        ),
        None => {
            let pc = super::operand_element(e, f, pa, e.spec.tensors[x.rows].dtype, at)?;
            (
                format!(
                    "{ind}    float tf_v[2];\n\
                     {ind}    #pragma unroll\n\
                     {ind}    for (int tf_e = 0; tf_e < 2; ++tf_e) tf_v[tf_e] = {pc};\n"
                ),
                "tf_pack(tf_v[0], tf_v[1])".to_string(),
            )
        }
    };
    let scale = match scale {
        Some(sx) => {
            let (c, ty) = f.ctx(e, Layout::Scalar, &[]).emit(sx, at)?;
            format!(
                " * ({})",
                super::super::expr::convert(&c, ty, crate::dtype::CTy::F32)
            )
        }
        None => String::new(),
    };
    // The element's place in `t`: the key operands' index, the step's key
    // and the head dimension's column this thread holds.
    // A thread's two columns (`tf_qc`, `tf_qc1`) of a row go in one vector
    // reduction where both are in the tensor, next to each other (the last
    // index the column, of stride 1) and 8-byte aligned (tested at run time:
    // strides and offsets are data).
    let place = |col: &str| -> Result<(String, String), CodegenError> {
        let mut coords: Vec<(DimId, String)> =
            f.batch.iter().map(|&b| (b, format!("tb{b}"))).collect();
        coords.push((g.n, "tf_qr".into()));
        coords.push((g.d, col.into()));
        let cx = e.ctx(&coords);
        let mut comps = Vec::new();
        for c in index {
            let (c, ty) = cx.emit(c, at)?;
            comps.push(super::super::expr::convert(&c, ty, crate::dtype::CTy::I64));
        }
        Ok((
            super::super::expr::tensor_mask_signed(*tensor, &comps),
            super::super::expr::tensor_offset(*tensor, &comps),
        ))
    };
    let ((mask0, off0), (mask1, off1)) = (place("tf_qc")?, place("tf_qc1")?);
    let rows = a.row_operands();
    let r = rows.iter().position(|&t| t == x.rows).unwrap_or(0);
    let row_base = format!("tf_sqo + {}u", r * g.bm * g.hd * 2);
    let buf = g.bm * g.bn * 2;
    let (barrier, a0, b0, ksteps, col0) = if split.split_n {
        (
            format!(
                "asm volatile(\"bar.sync {}, {};\" ::: \"memory\");",
                2 + consumers,
                128 * consumers
            ),
            "0u".to_string(),
            format!("(tf_cw >> 2) * {}u", split.n / 64 * g.bm * 128),
            g.bm / 16,
            format!("(tf_cw >> 2) * {}", split.n),
        )
    } else {
        (
            format!(
                "asm volatile(\"bar.sync %0, 128;\" :: \"r\"({} + (tf_cw >> 2)) : \"memory\");",
                2 + consumers
            ),
            "(tf_cw >> 2) * 8192u".to_string(),
            "(tf_cw >> 2) * 8192u".to_string(),
            4,
            "0".to_string(),
        )
    };
    let _ = write!(
        e.out,
        "{ind}{{  // {line}\n\
         {ind}  // dS as the scores lie (a key a swizzled row): dSᵀ, MN-major.\n\
         {ind}  const tf_u32 tf_dsb = tf_sds + (tf_it & 1) * {buf}u;\n\
         {ind}  #pragma unroll\n\
         {ind}  for (int tf_mi = 0; tf_mi < 1; ++tf_mi)\n\
         {ind}  #pragma unroll\n\
         {ind}  for (int tf_j = 0; tf_j < {ni}; ++tf_j)\n\
         {ind}  #pragma unroll\n\
         {ind}  for (int tf_h = 0; tf_h < 2; ++tf_h) {{\n\
         {values}\
         {ind}    const int tf_r = tf_wr + tf_h * 8 + tf_g;\n\
         {ind}    asm volatile(\"st.shared.b32 [%0], %1;\" :: \"r\"(tf_dsb + tf_r * 128 + ((tf_j ^ (tf_r & 7)) << 4) + (tf_t << 2)), \"r\"({pair}) : \"memory\");\n\
         {ind}  }}\n\
         {ind}  asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");  // for the wgmma's reads\n\
         {ind}  {barrier}\n\
         {wait}\
         {ind}  float tf_dq[{half}];\n\
         {ind}  asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n\
         {ind}  #pragma unroll\n\
         {ind}  for (int tf_kk = 0; tf_kk < {ksteps}; ++tf_kk)\n\
         {ind}    tf_wgmma_dq(tf_dq, tf_wgmma_desc(tf_dsb + {a0} + tf_kk * 2048u, {lbo}u, {ATOM}u),\n\
         {ind}        tf_wgmma_desc({row_base} + {b0} + tf_kk * 2048u, {lbo}u, {ATOM}u), tf_kk);\n\
         {ind}  asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n",
        line = super::super::one_line(at),
        wait = {
            // All but the last update complete (all, where an update is
            // issued after this product): their packed operands free before
            // the product's accumulators live.
            let mut w = String::new();
            flight.wait_all_but(&mut w, &format!("{ind}  "), usize::from(then.is_none()));
            w
        },
        ni = g.ni,
        half = split.n / 2,
        lbo = g.bm * 128,
    );
    flight.issued(super::Product::Atomic(x.at));
    if let Some((issue, p)) = then {
        e.out.push_str(&issue);
        flight.issued(p);
    }
    let inner = format!("{ind}  ");
    flight.wait(&mut e.out, &inner, |p| p == super::Product::Atomic(x.at));
    if e.cfg.tma_store {
        tma_add_axis(e, &g, s)?;
        // The boxes' origin: each index at the step's first row and this
        // warpgroup's first column (innermost first for the TMA unit).
        let mut coords: Vec<(DimId, String)> =
            f.batch.iter().map(|&b| (b, format!("tb{b}"))).collect();
        coords.push((g.n, format!("tb{}", g.n)));
        coords.push((g.d, format!("({col0})")));
        let cx = e.ctx(&coords);
        let mut origin = Vec::new();
        for (i, c) in index.iter().enumerate() {
            let (c, ty) = cx.emit(c, at)?;
            let c = super::super::expr::convert(&c, ty, crate::dtype::CTy::I64);
            origin.push(if i + 1 == index.len() {
                format!("(int)({c}) + tf_box * 32")
            } else {
                format!("(int)({c})")
            });
        }
        origin.reverse();
        let _ = write!(
            e.out,
            "{ind}  // dQ's adds by the TMA unit: the warpgroup's rows by its {n} columns staged\n\
             {ind}  // (boxes of 32 f32 columns, 128-byte swizzled), once the last step's adds read them.\n\
             {ind}  const bool tf_lead = (tf_cw & 3) == 0 && lane == 0;\n\
             {ind}  const tf_u32 tf_dqb = tf_sdq + (tf_cw >> 2) * {wg_bytes}u;\n\
             {ind}  if (tf_lead) asm volatile(\"cp.async.bulk.wait_group.read 0;\" ::: \"memory\");\n\
             {ind}  asm volatile(\"bar.sync %0, 128;\" :: \"r\"(2 + (tf_cw >> 2)) : \"memory\");\n\
             {ind}  // Rows of odd `tf_g` store column group `tf_j ^ 2` where the others store\n\
             {ind}  // `tf_j` (each lane both, over the loop): a half-warp's four rows then meet\n\
             {ind}  // eight distinct 16-byte chunks of the swizzled rows, where one `tf_j` put\n\
             {ind}  // rows `g` and `g ^ 1` on the same banks.\n\
             {ind}  const bool tf_odd = (tf_g & 1) != 0;\n\
             {ind}  #pragma unroll\n\
             {ind}  for (int tf_j = 0; tf_j < {nj}; ++tf_j)\n\
             {ind}  #pragma unroll\n\
             {ind}  for (int tf_h = 0; tf_h < 2; ++tf_h) {{\n\
             {ind}    const int tf_r = (tf_cw & 3) * 16 + tf_h * 8 + tf_g;\n\
             {ind}    const int tf_jo = tf_odd ? tf_j ^ 2 : tf_j;  // the column group stored\n\
             {ind}    const int tf_ch = (tf_jo & 3) * 2 + (tf_t >> 1);  // the 16-byte chunk in the box's row\n\
             {ind}    const float tf_x0 = tf_odd ? tf_dq[(tf_j ^ 2) * 4 + tf_h * 2] : tf_dq[tf_j * 4 + tf_h * 2];\n\
             {ind}    const float tf_x1 = tf_odd ? tf_dq[(tf_j ^ 2) * 4 + tf_h * 2 + 1] : tf_dq[tf_j * 4 + tf_h * 2 + 1];\n\
             {ind}    asm volatile(\"st.shared.v2.f32 [%0], {{%1, %2}};\" :: \"r\"(tf_dqb + (tf_jo >> 2) * {box}u + tf_r * 128 + ((tf_ch ^ (tf_r & 7)) << 4) + ((tf_t & 1) << 3)),\n\
             {ind}        \"f\"(tf_x0{scale}), \"f\"(tf_x1{scale}) : \"memory\");\n\
             {ind}  }}\n\
             {ind}  asm volatile(\"fence.proxy.async.shared::cta;\" ::: \"memory\");  // for the TMA unit's reads\n\
             {ind}  asm volatile(\"bar.sync %0, 128;\" :: \"r\"(2 + (tf_cw >> 2)) : \"memory\");\n\
             {ind}  if (tf_lead) {{\n\
             {ind}    #pragma unroll\n\
             {ind}    for (int tf_box = 0; tf_box < {boxes}; ++tf_box)\n\
             {ind}      tf_tma_add_{rank}d(&tf_map_add, tf_dqb + tf_box * {box}u, {origin});\n\
             {ind}    asm volatile(\"cp.async.bulk.commit_group;\" ::: \"memory\");\n\
             {ind}  }}\n\
             {ind}}}\n",
            n = split.n,
            nj = split.n / 8,
            wg_bytes = split.n * 64 * 4,
            box = 64 * 128,
            boxes = split.n / 32,
            rank = index.len(),
            origin = origin.join(", "),
        );
        return Ok(());
    }
    let _ = write!(
        e.out,
        "{ind}  #pragma unroll\n\
         {ind}  for (int tf_j = 0; tf_j < {nj}; ++tf_j)\n\
         {ind}  #pragma unroll\n\
         {ind}  for (int tf_h = 0; tf_h < 2; ++tf_h) {{\n\
         {ind}    const long long tf_qr = tb{n} + (tf_cw & 3) * 16 + tf_h * 8 + tf_g;\n\
         {ind}    const long long tf_qc = {col0} + tf_j * 8 + 2 * tf_t, tf_qc1 = tf_qc + 1;\n\
         {ind}    const float tf_v0 = tf_dq[tf_j * 4 + tf_h * 2]{scale}, tf_v1 = tf_dq[tf_j * 4 + tf_h * 2 + 1]{scale};\n\
         {ind}    const bool tf_in0 = {mask0}, tf_in1 = {mask1};\n\
         {ind}    if ({pair} tf_in0 && tf_in1 && ((unsigned long long)(t{tensor} + {off0}) & 7ull) == 0)\n\
         {ind}      asm volatile(\"red.global.add.v2.f32 [%0], {{%1, %2}};\" :: \"l\"(t{tensor} + {off0}), \"f\"(tf_v0), \"f\"(tf_v1) : \"memory\");\n\
         {ind}    else {{\n\
         {ind}      if (tf_in0) atomicAdd(t{tensor} + {off0}, tf_v0);\n\
         {ind}      if (tf_in1) atomicAdd(t{tensor} + {off1}, tf_v1);\n\
         {ind}    }}\n\
         {ind}  }}\n\
         {ind}}}\n",
        nj = split.n / 8,
        // The columns are neighbours where the last index is the column and
        // its stride 1.
        pair = match index.last() {
            Some(Expr::TileIndex(d)) if *d == g.d => {
                format!("t{tensor}_s{} == 1 &&", index.len() - 1)
            }
            _ => "false &&".to_string(),
        },
        n = g.n,
    );
    Ok(())
}

/// The tensors streamed through the ring a key step, one ring each: the
/// forward's `k` and `v` (both, even where they are one tensor: its products
/// release them apart), else the key operands
/// ([`AttentionShape::key_operands`]).
pub(super) fn rings(a: &AttentionShape) -> Vec<TensorId> {
    if a.is_forward() {
        vec![a.k, a.v]
    } else {
        a.key_operands()
    }
}

/// Whether `s` is emitted for the whole block (a scalar `let`, a `wait`).
fn is_block_level(e: &Emitter, s: &Stmt) -> bool {
    match s {
        Stmt::Let { var, .. } => e.checked.vars[*var].dims.is_empty(),
        Stmt::Wait { .. } | Stmt::Signal { .. } => true,
        _ => false,
    }
}

/// The block sizes, warps and stages of the config, checked against what the
/// lowering does.
fn geometry(e: &Emitter, a: &AttentionShape) -> Result<Geo, CodegenError> {
    let c = e.cfg;
    let b = |d: DimId| c.block_sizes[d];
    super::shared_blocks(e, a)?;
    let (bm, bn, hd, warps) = (b(a.m), b(a.n), b(a.d), c.num_warps);
    if !matches!(warps, 4 | 8 | 12) || bm != 16 * warps {
        return Err(config_err(
            e.k,
            c,
            format!(
                "the wgmma attention path runs 4, 8 or 12 consumer warps (one to three warpgroups of 64 rows) with \
                 a row block of 16 × num_warps; got {warps} warps and a row block of {bm}"
            ),
        ));
    }
    if bn % 16 != 0 || !(16..=256).contains(&bn) {
        return Err(config_err(
            e.k,
            c,
            format!("the wgmma attention path takes a key block that is a multiple of 16 up to 256, not {bn}"),
        ));
    }
    if !(2..=4).contains(&c.num_stages) {
        return Err(config_err(
            e.k,
            c,
            format!(
                "the wgmma attention path keeps 2 to 4 stages of k and v, not {}",
                c.num_stages
            ),
        ));
    }
    // Panels of 64 columns (one 128-byte swizzle row): smaller head dimensions
    // compute on zero columns that TMA fills in.
    let hd = hd.max(64);
    let (products, outputs) = (1 + a.more_scores.len(), 1 + a.more_updates.len());
    let mut held = (products * bn + outputs * hd) / 2;
    if let Some(x) = a.atomics.first() {
        if bn != 64 {
            return Err(config_err(
                e.k,
                c,
                format!(
                    "the wgmma attention path adds `{}` as one `wgmma` of the step's keys (64 rows): take 64 keys \
                     a step, not {bn}",
                    e.k.tensors[x.tensor].name
                ),
            ));
        }
        // Its accumulators live once the scores' are dead.
        let n = atomic_split_of(warps / 4, hd).n;
        held = outputs * hd / 2 + (products * bn / 2).max(n / 2);
    }
    let consumers = warps / 4;
    let limit = if a.is_forward() {
        held_limit(consumers)
    } else {
        held_limit_backward(consumers)
    };
    if held > limit {
        return Err(config_err(
            e.k,
            c,
            format!(
                "a consumer thread would hold {held} accumulator registers (scores {} + output {}) of its {} \
                 ({consumers} consumer warpgroups; at most {limit} for accumulators); take a smaller key block{}",
                products * bn / 2,
                outputs * hd / 2,
                consumer_regs(consumers),
                if consumers == 3 { " or fewer warps" } else { "" }
            ),
        ));
    }
    Ok(Geo {
        m: a.m,
        n: a.n,
        d: a.d,
        bm,
        bn,
        hd,
        warps,
        mi: 1,
        ni: bn / 8,
        di: hd / 8,
        wgmma: true,
        stages: c.num_stages,
        defer_pv: false,
        overlap: false,
        persistent: false,
        split: false,
    })
}

/// `q·kᵀ` into the warpgroup's scores `tf_s` (initialized): one `wgmma` per 16
/// columns of the head dimension, then wait for them. With [`Geo::defer_pv`]
/// the previous tile's `p·v` goes first in the same group; when the group
/// completes, this tile's `k` and the previous tile's `v` are released (apart,
/// so the producer refills `k` a tile before `v`: with a shared release, two
/// stages left every tile waiting for its loads); with two or three consumer
/// warpgroups each issues its group in turn (warpgroup `i` waits at named barrier
/// `2 + i`, then gives the next its turn), so one warpgroup's softmax runs while
/// another's products keep the tensor cores busy.
pub(super) fn scores_product(g: &Geo, ind: &str, acc: &str) -> String {
    let panel = |rows: usize| rows * 128;
    let groups = g.warps / 4;
    let pingpong = g.defer_pv && groups >= 2;
    let mut out = String::new();
    if pingpong {
        // Immediate barrier ids, a branch per warpgroup (uniform in each).
        let _ = writeln!(
            out,
            "{ind}if (tf_cw < 4) asm volatile(\"bar.sync 2, 256;\" ::: \"memory\");"
        );
        for w in 1..groups {
            let cond = if w + 1 < groups {
                format!("if (tf_cw < {}) ", 4 * (w + 1))
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "{ind}else {cond}asm volatile(\"bar.sync {}, 256;\" ::: \"memory\");",
                2 + w
            );
        }
    }
    let _ = writeln!(
        out,
        "{ind}asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");"
    );
    let last_pv = format!(
        "{ind}const int tf_pst = (tf_ri + {s1}) % {stages};  // the last tile's stage\n\
         {ind}if (tf_it > {first}) {{\n\
         {ind}  const tf_u32 tf_vb = tf_sv + tf_pst * {kv}u;\n\
         {ind}  tf_mbar_spin(tf_bv + tf_pst * 8, ((tf_ri - 1) / {stages}) & 1);\n\
         {pv}\
         {ind}}}\n",
        s1 = g.stages - 1,
        stages = g.stages,
        kv = g.bn * g.hd * 2,
        pv = pv_issue(g, &format!("{ind}  "), acc, "tf_pa", "tf_vb"),
        first = g.first_step(),
    );
    let qk = format!(
        "{ind}#pragma unroll\n\
         {ind}for (int tf_ks = 0; tf_ks < {ks}; ++tf_ks)\n\
         {ind}  tf_wgmma_qk(&tf_s[0][0][0],\n\
         {ind}      tf_wgmma_desc(tf_qw + (tf_ks >> 2) * {qp}u + (tf_ks & 3) * 32u, 16u, {ATOM}u),\n\
         {ind}      tf_wgmma_desc(tf_kb + (tf_ks >> 2) * {kp}u + (tf_ks & 3) * 32u, 16u, {ATOM}u));\n",
        ks = g.hd / 16,
        qp = panel(g.bm),
        kp = panel(g.bn),
    );
    let commit =
        format!("{ind}asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n");
    if g.overlap {
        // Two groups, this tile's scores first: waiting for one group leaves
        // the last tile's `p·v` running under the softmax.
        out.push_str(&qk);
        out.push_str(&commit);
        out.push_str(&last_pv);
        out.push_str(&commit);
    } else {
        if g.defer_pv {
            out.push_str(&last_pv);
        }
        out.push_str(&qk);
        out.push_str(&commit);
    }
    if pingpong {
        // Every turn one warpgroup takes is one the previous gave: the last
        // gives none after its last tile (the first's initial turn was given
        // before the loop), except in a persistent walk.
        for w in 0..groups - 1 {
            let _ = writeln!(
                out,
                "{ind}{}if (tf_cw < {}) asm volatile(\"bar.arrive {}, 256;\" ::: \"memory\");",
                if w > 0 { "else " } else { "" },
                4 * (w + 1),
                3 + w
            );
        }
        // Persistent: the turns run on into the next tile (the first
        // warpgroup takes one more after its last tile).
        let _ = writeln!(
            out,
            "{ind}else {}asm volatile(\"bar.arrive 2, 256;\" ::: \"memory\");",
            if g.persistent {
                ""
            } else {
                "if (tf_it + 1 < tf_nt) "
            }
        );
    }
    if g.overlap {
        let _ = writeln!(
            out,
            "{ind}asm volatile(\"wgmma.wait_group.sync.aligned 1;\" ::: \"memory\");  // the scores\n\
             {ind}if (lane == 0) tf_mbar_arrive(tf_ek + tf_st * 8);  // this tile's k is done with"
        );
        return out;
    }
    let _ = writeln!(
        out,
        "{ind}asm volatile(\"wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");"
    );
    if g.defer_pv {
        let _ = writeln!(
            out,
            "{ind}if (lane == 0) {{\n\
             {ind}  tf_mbar_arrive(tf_ek + tf_st * 8);  // this tile's k is done with\n\
             {ind}  if (tf_it > {first}) tf_mbar_arrive(tf_ev + tf_pst * 8);  // and the last tile's v\n\
             {ind}}}",
            first = g.first_step()
        );
    }
    out
}

/// In a program with more products a step than the forward's (the
/// backward's), a score-like product `out = row·keyᵀ` as its own `wgmma`
/// group: the row operand's tile at byte `row_off` of the row tiles (this
/// warpgroup's rows, from `tf_qwo`: see the step's header), the key
/// operand's stage at `buf`; from zero (`zero`:
/// the first `wgmma` overwrites `out`, left unset) or onto `out`. The step
/// waits for it where its result is first read (see `InFlight` in the
/// parent module).
pub(super) fn scores_issue(
    g: &Geo,
    ind: &str,
    out: &str,
    (row_off, buf): (usize, &str),
    zero: bool,
) -> String {
    format!(
        "{ind}asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n\
         {ind}#pragma unroll\n\
         {ind}for (int tf_ks = 0; tf_ks < {ks}; ++tf_ks)\n\
         {ind}  tf_wgmma_sd(&{out}[0][0][0],\n\
         {ind}      tf_wgmma_desc(tf_qwo + {row_off}u + (tf_ks >> 2) * {qp}u + (tf_ks & 3) * 32u, 16u, {ATOM}u),\n\
         {ind}      tf_wgmma_desc({buf} + (tf_ks >> 2) * {kp}u + (tf_ks & 3) * 32u, 16u, {ATOM}u), {acc});\n\
         {ind}asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n",
        ks = g.hd / 16,
        qp = g.bm * 128,
        kp = g.bn * 128,
        acc = if zero { "tf_ks" } else { "1" },
    )
}

/// In a program with more products a step (see [`scores_issue`]), an
/// update `acc += p·keys` as its own `wgmma` group, in two parts: `p` (the
/// `[1][NI][4]` floats `p`) packed into the A fragments `pa` (live until the
/// group completes), then the group's issue, the key operand's stage at `buf`
/// as the transposed operand. The issue may be deferred past a later product
/// (see `step_body`'s deferred update).
pub(super) fn update_issue(
    g: &Geo,
    ind: &str,
    acc: &str,
    (pa, p): (&str, &str),
    buf: &str,
) -> (String, String) {
    let kk = g.bn / 16;
    (
        format!(
            "{ind}tf_u32 {pa}[{kk}][4];\n\
             {ind}#pragma unroll\n\
             {ind}for (int tf_kk = 0; tf_kk < {kk}; ++tf_kk) {{\n\
             {pack}\
             {ind}}}\n",
            pack = super::pack_p(
                &format!("{ind}  "),
                &format!("{pa}[tf_kk]"),
                &format!("{p}[0]")
            ),
        ),
        format!(
            "{ind}asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n\
             {pv}\
             {ind}asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n",
            pv = pv_issue(g, ind, acc, pa, buf),
        ),
    )
}

/// With [`Geo::overlap`], before the step next touches the output: the last
/// tile's `p·v` is complete, and its `v` stage is released.
pub(super) fn last_pv_done(g: &Geo, ind: &str) -> String {
    format!(
        "{ind}asm volatile(\"wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");  // the last tile's p·v\n\
         {ind}if (lane == 0 && tf_it > {first}) tf_mbar_arrive(tf_ev + tf_pst * 8);  // its v is done with\n",
        first = g.first_step()
    )
}

/// The `wgmma`s of `acc += p·v` from the packed `pa` (the forward's `tf_pa`)
/// and the stage at `buf` (`tf_vb`).
fn pv_issue(g: &Geo, ind: &str, acc: &str, pa: &str, buf: &str) -> String {
    format!(
        "{ind}#pragma unroll\n\
         {ind}for (int tf_kk = 0; tf_kk < {kk}; ++tf_kk)\n\
         {ind}  tf_wgmma_pv(&{acc}[0][0][0], {pa}[tf_kk], tf_wgmma_desc({buf} + tf_kk * {k16}u, {vp}u, {ATOM}u));\n",
        kk = g.bn / 16,
        k16 = 16 * 128,
        vp = g.bn * 128,
    )
}

/// `acc += p·v` from `tf_p`: `p` packed into A fragments first (a `wgmma`
/// reads its registers after it is issued); then, unless deferred to the next
/// tile ([`Geo::defer_pv`]), one `wgmma` per 16 keys once the stage's `v` has
/// landed.
pub(super) fn update_product(g: &Geo, ind: &str, acc: &str) -> String {
    let kk = g.bn / 16;
    let mut out = String::new();
    if !g.defer_pv {
        let _ = writeln!(out, "{ind}tf_u32 tf_pa[{kk}][4];");
    }
    let _ = write!(
        out,
        "{ind}#pragma unroll\n\
         {ind}for (int tf_kk = 0; tf_kk < {kk}; ++tf_kk) {{\n\
         {pack}\
         {ind}}}\n",
        pack = super::pack_p(&format!("{ind}  "), "tf_pa[tf_kk]", "tf_p[0]"),
    );
    if !g.defer_pv {
        let _ = write!(
            out,
            "{ind}tf_mbar_spin(tf_bv + tf_st * 8, tf_ph);  // this tile's `v`\n\
             {ind}asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");\n\
             {pv}\
             {ind}asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");\n\
             {ind}asm volatile(\"wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");\n",
            pv = pv_issue(g, ind, acc, "tf_pa", "tf_vb"),
        );
    }
    out
}

/// Whether statement `s` may read variable `v` (anything but a `let`, an
/// assignment, a store or an atomic counts as reading it).
pub(super) fn stmt_reads(s: &Stmt, v: VarId) -> bool {
    match s {
        Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Store { value, .. } => {
            super::super::reads_var(value, v)
        }
        Stmt::Atomic { value, index, .. } => {
            super::super::reads_var(value, v) || index.iter().any(|i| super::super::reads_var(i, v))
        }
        _ => true,
    }
}
