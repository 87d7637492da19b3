//! The Hopper GEMM (sm_90a): TMA loads into a ring of 128-byte-swizzled shared
//! memory stages, `mbarrier` handshakes, and `wgmma` from shared-memory
//! descriptors, with warp specialization: warpgroup 0 produces (one thread runs
//! the tile's `wait`s, then issues its TMA loads), warpgroups 1..=C consume (each
//! a 64-row slice of the block's tile, `wgmma.m64nBNk16`, one wgmma group kept in
//! flight). The kernel's statements before and after the K loop are the portable
//! path's, on the same fragment layout.
//!
//! Work: blocks walk work units (`unit += gridDim.x`): one per output tile, then
//! `tf_parts` units that share the K iterations of the tiles left (the last,
//! partial wave) evenly and in order, the parts of a tile meeting in scratch.
//! With as many parts per tile as units that is the portable path's split tail;
//! with one wave of units it is stream-K (`Config::stream_k`), a unit crossing
//! from the end of one tile into the start of the next. One block per unit, or a
//! persistent grid (`Config::persistent`: the producer loads the next tile while
//! the consumers run the epilogue). With `cluster_m = 2`, a cluster of two blocks
//! takes two vertically adjacent tiles and each loads half of their common B
//! tile into both blocks (TMA multicast); both blocks' consumers release a stage.
//!
//! Epilogue: fragments stored from registers, or (`Config::tma_store`) staged
//! box by box in shared memory and stored by the TMA unit (`tma_store`).
//!
//! Ping-pong (`Config::pingpong`, persistent grids): each consumer warpgroup
//! computes whole tiles (64 or 128 rows: one or two `wgmma` rows of 64) and
//! the two take the block's segments in turn, one's epilogue under the other's
//! K loop. Both walk every segment (counting the other's K steps keeps stage
//! and phase in step), a stage is released by one warpgroup, and the K loops
//! take turns (named barriers 4 and 5, see `PP_MY_TURN`). Measured slower than
//! the shared tiles at large shapes: a warpgroup's own 128×128 tile moves a
//! quarter more shared memory per flop (TMA writes and `wgmma` reads) than two
//! warpgroups sharing a 128×256 tile's B.
//!
//! Config: `wgmma = true`; `num_warps` counts the consumer warps (4 or 8: BM = 64
//! or 128), the producer warpgroup comes on top; BK = 64 (one 128-byte swizzle row
//! of 16-bit elements); BN a multiple of 64 up to 256.
//!
//! Layouts: A `[m][k]` (k contiguous) is K-major for `wgmma`; B `[k][n]` (n
//! contiguous) is MN-major, loaded as BN/64 slabs of 64 columns and read
//! transposed (`imm-trans-b`). Rows and K beyond the tensors are zero-filled by
//! the TMA unit, so ragged shapes need no masks in the K loop.

use super::portable::{
    after_loop, before_loop, grid_rotation, grouped_tile, split_fixup, FixupSite, Geometry,
};
use super::GemmShape;
use crate::emit::hopper::WgmmaA;
use crate::emit::{config_err, Emitter, Lowered, Param, SplitTail, TmaStore};
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

/// The bytes of one 64-element (128-byte) swizzle row times 8 rows.
const ATOM: usize = 1024;

pub(super) fn emit(e: &mut Emitter, g: &GemmShape) -> Result<Lowered, CodegenError> {
    let c = e.cfg.clone();
    let (bm, bn, bk) = (c.block_sizes[g.m], c.block_sizes[g.n], c.block_sizes[g.k]);
    let err = |m: String| config_err(e.k, &c, m);
    let consumers = c.num_warps / 4;
    let pp = c.pingpong;
    if pp {
        if c.num_warps != 8 || !c.persistent {
            return Err(err(format!(
                "pingpong takes tiles in turn between two consumer warpgroups of a persistent grid: set num_warps 8 and persistent (got {} warps{})",
                c.num_warps,
                if c.persistent { "" } else { ", not persistent" }
            )));
        }
        if !matches!(bm, 64 | 128) || bm * bn / 128 > 128 {
            return Err(err(format!(
                "pingpong gives each consumer warpgroup a whole {bm}x{bn} tile: the M block must be 64 or 128 and the tile at most 128 accumulators a thread (64x256 or 128x128), got {} a thread",
                bm * bn / 128
            )));
        }
    } else if !matches!(c.num_warps, 4 | 8) || bm != 64 * consumers {
        return Err(err(format!(
            "the wgmma path takes num_warps 4 or 8 consumer warps with an M block of 16 x num_warps (64 or 128); got {} warps and M block {bm}",
            c.num_warps
        )));
    }
    if bk != 64 {
        return Err(err(format!(
            "the wgmma path takes a K block of 64 (one 128-byte swizzle row), got {bk}"
        )));
    }
    if bn % 64 != 0 || bn > 256 {
        return Err(err(format!(
            "the wgmma path takes an N block of 64, 128, 192 or 256, got {bn}"
        )));
    }
    if !(2..=8).contains(&c.num_stages) {
        return Err(err(format!("num_stages ({}) must be 2..=8", c.num_stages)));
    }
    let cl = c.cluster_m;
    if cl == 2 && bn % 128 != 0 {
        return Err(err(format!(
            "cluster_m 2 splits the B tile's 64-column slabs between the pair; the N block must be 128 or 256, got {bn}"
        )));
    }
    let dtype = e.spec.tensors[g.a].dtype;
    for (t, role) in [(g.a, "first"), (g.b, "second")] {
        let ts = &e.spec.tensors[t];
        if !ts.dtype.is_half() || ts.dtype != dtype {
            return Err(err(format!(
                "the wgmma path multiplies bf16 or f16 operands of one dtype; the {role} operand `{}` is {}",
                e.k.tensors[t].name, ts.dtype
            )));
        }
        if !ts.last_contiguous || ts.align < 16 {
            return Err(err(format!(
                "the wgmma path loads with TMA, which needs the {role} operand `{}` contiguous along its last dimension with 16-byte aligned rows{}",
                e.k.tensors[t].name,
                if ts.last_contiguous {
                    "; set `stage` to copy it into such rows before the launch"
                } else {
                    ""
                }
            )));
        }
    }
    if let Some(Stmt::Wait { at, .. }) = e.k.body[g.k_loop + 1..]
        .iter()
        .find(|s| matches!(s, Stmt::Wait { .. }))
    {
        return Err(CodegenError::Unsupported {
            kernel: e.k.name.clone(),
            at: at.clone(),
            message: "the wgmma path waits before the K loop only; move the `wait` before it"
                .into(),
        });
    }

    let tma_out = match c.tma_store {
        true => Some(super::tma_store::target(e, g).map_err(err)?),
        false => None,
    };

    // Fragment row blocks (64-row `wgmma`s) a consumer thread holds.
    let mi = if pp { bm / 64 } else { 1 };
    // Warpgroups that consume each stage.
    let sharers = if pp { 1 } else { consumers };
    let stages = c.num_stages;
    let a_stage = bm * bk * 2;
    let b_stage = bk * bn * 2;
    let slab = bk * 64 * 2;
    let ring_bytes = stages * (a_stage + b_stage);
    // The TMA-store epilogue's staging boxes follow the ring (both multiples
    // of the 1024-byte swizzle atom).
    let stage_bytes_out = match tma_out {
        Some(_) => consumers * super::tma_store::WG_BYTES,
        None => 0,
    };
    let tiles_bytes = ring_bytes + stage_bytes_out;
    // Barriers after the tiles; 1024 bytes of slack to align the ring to a swizzle atom.
    let shared = tiles_bytes + 2 * stages * 8 + ATOM;
    let threads = 128 * (consumers + 1);
    let (ext_m, ext_n, ext_k) = (
        e.host_extent(g.m)?,
        e.host_extent(g.n)?,
        e.host_extent(g.k)?,
    );
    let (dm, dn) = (g.m, g.n);
    let (ta, tb) = (g.a, g.b);

    let helpers = format!(
        "{}{}",
        crate::emit::hopper::HELPERS,
        crate::emit::hopper::wgmma_fn("tf_wgmma", bn, dtype, WgmmaA::Shared, true)
    );
    let out_map = tma_out.map(|(t, _)| {
        (
            Param::TensorMap {
                tensor: t,
                box_inner: 64,
                box_outer: 64,
                rows_axis: None,
            },
            "const __grid_constant__ tf_tmap tf_map_out",
        )
    });
    let params = e.begin(
        threads,
        1,
        &helpers,
        &[
            (
                Param::TensorMap {
                    tensor: ta,
                    box_inner: bk,
                    box_outer: bm,
                    rows_axis: None,
                },
                "const __grid_constant__ tf_tmap tf_map_a",
            ),
            (
                Param::TensorMap {
                    tensor: tb,
                    box_inner: 64,
                    box_outer: bk,
                    rows_axis: None,
                },
                "const __grid_constant__ tf_tmap tf_map_b",
            ),
            (Param::SplitWhole, "long long tf_whole"),
            (Param::SplitWays, "int tf_ways"),
            (Param::SplitParts, "long long tf_parts"),
            (Param::SplitPartials, "float* tf_partials"),
            (Param::SplitCounters, "unsigned* tf_counters"),
        ]
        .into_iter()
        .chain(out_map)
        .collect::<Vec<_>>(),
    );
    e.tma_store = tma_out.map(|(tensor, signal_after)| TmaStore {
        tensor,
        bn,
        offset: ring_bytes,
        signal_after,
        mi,
        box_row: if pp { "mi * 64" } else { "wg * 64" },
    });
    // A cluster computes `cl` vertically adjacent tiles: the tile order walks the
    // clusters' tiles (bm * cl rows), each block takes its rows of one.
    let rotate = grid_rotation(e, g, bm * cl, bn)?;
    let gm = c.group_m.max(1);
    let m_offset = if cl > 1 {
        // Read where used (a special register): a variable held through the K loop
        // cost a 4-byte spill.
        format!(" + (long long)tf_cluster_rank() * {bm}")
    } else {
        String::new()
    };
    let tile = indent(&grouped_tile(gm, &rotate, g, (bm * cl, bn), &m_offset), 4);
    let (tiles_m, first_pid, pid_step) = if cl > 1 {
        (
            format!("((M + {bm} - 1) / {bm} + {cl} - 1) / {cl}"),
            format!("blockIdx.x / {cl}"),
            format!("gridDim.x / {cl}"),
        )
    } else {
        (
            format!("(M + {bm} - 1) / {bm}"),
            "blockIdx.x".to_string(),
            "gridDim.x".to_string(),
        )
    };
    let sync = if cl > 1 {
        // The peer's barriers must be initialized before a multicast or an arrive reaches them.
        "tf_cluster_sync();"
    } else {
        "__syncthreads();"
    };
    let k_waiter = !g.k_waits(e.k).is_empty();
    let _ = write!(
        e.out,
        r#"  extern __shared__ __align__(1024) unsigned char tf_smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long M = s{ext_m}, N = s{ext_n}, K = s{ext_k};
  const long long tiles_m = {tiles_m}, tiles_n = (N + {bn} - 1) / {bn};
  const long long tf_tiles = tiles_m * tiles_n;
  // Work units: tiles [0, tf_whole) one each, then tf_parts units sharing the
  // later tiles' tf_iters K iterations (tile by tile) evenly.
  const long long tf_units = tf_whole + tf_parts;

  // The ring: stage s holds A at sA + s * {a_stage} and B's {slabs} slabs of 64 columns
  // at sB + s * {b_stage}; full[s] / empty[s] barriers after it. Producer and
  // consumers walk the same tiles and count k-steps over all of them (`it`), so
  // stage and phase carry from one tile to the next.
  const tf_u32 tf_base = (tf_smem_u32(tf_smem) + {atom_m1}u) & ~{atom_m1}u;
  const tf_u32 sA = tf_base, sB = tf_base + {a_ring}u, tf_full = tf_base + {tiles_bytes}u, tf_empty = tf_full + {bar_bytes}u;
  const int KT = (int)((K + {bk} - 1) / {bk});
  const long long tf_iters = (tf_tiles - tf_whole) * KT;
  // Set by the producer when a `wait` timed out (the status block says which): it
  // stops waiting, the consumers stop storing, and the kernel ends.
  __shared__ volatile int tf_failed;
{kready_decl}  if (tid == 0) {{
    tf_failed = 0;{kready_init}
    tf_mbar_init(tf_done(), {consumer_warps_here});
    for (int s = 0; s < {stages}; ++s) {{
      tf_mbar_init(tf_full + s * 8, 1);
      tf_mbar_init(tf_empty + s * 8, {consumer_warps});
    }}
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }}
  {sync}
"#,
        slabs = bn / 64,
        atom_m1 = ATOM - 1,
        a_ring = stages * a_stage,
        bar_bytes = stages * 8,
        consumer_warps = 4 * sharers * cl,
        consumer_warps_here = 4 * consumers,
        kready_decl = if k_waiter { KFlags::DECL } else { "" },
        kready_init = if k_waiter { KFlags::INIT } else { "" },
    );
    // The producer runs the block-level statements before the K loop (scalar lets,
    // `wait`s) per tile, before it issues the tile's loads; consumers are gated by
    // the full barriers, so they never spin on flags.
    let body = e.k.body.clone();
    let mut waits = String::new();
    let kernel_so_far = std::mem::take(&mut e.out);
    for s in &body[..g.k_loop] {
        match s {
            Stmt::Wait { at, .. } => {
                let test = e.wait_test(s, "          ", "tf_failed")?;
                let _ = write!(
                    waits,
                    "        {{  // {}\n{test}        }}\n",
                    crate::emit::one_line(at)
                );
            }
            // Scalar lets (tile lets are the consumers' business and emit nothing here).
            Stmt::Let { .. } => {
                e.block_stmt(s, "      ")?;
            }
            _ => {}
        }
    }
    let producer_lets = std::mem::replace(&mut e.out, kernel_so_far);
    // `wait`s inside the K loop: a second producer warp tests them, a lane per
    // k-tile, and publishes in `tf_kready` how many k-steps may load; the issuing
    // thread reads that word. Tested by the issuer itself, the range arithmetic
    // (divisions) of every k-tile outlasted the k-tile's MMAs at small M.
    let (k_wait_decls, k_waits) = e.k_wait_code(g, "kt", bk, "          ", "tf_kf", "")?;
    let k_flags = KFlags::new(&k_waits);
    let acquire = if waits.is_empty() {
        String::new()
    } else {
        // Flags acquired by a generic load; the TMA unit reads through the async proxy.
        format!(
            "      if (!tf_failed) {{\n{waits}      }}\n      asm volatile(\"fence.proxy.async.global;\" ::: \"memory\");\n"
        )
    };
    let b_loads: String = if cl > 1 {
        // Each block of the pair loads half of B's slabs into both blocks.
        let half = bn / 64 / cl;
        format!(
            "        for (int j = (int)tf_cluster_rank() * {half}; j < ((int)tf_cluster_rank() + 1) * {half}; ++j)\n          tf_tma_2d_multicast(sB + s * {b_stage}u + j * {slab}u, &tf_map_b, (int)(tb{dn} + j * 64), kt * {bk}, tf_full + s * 8, (tf_u16){mask});\n",
            mask = (1u32 << cl) - 1
        )
    } else {
        (0..bn / 64)
            .map(|j| {
                format!(
                    "        tf_tma_2d(sB + s * {b_stage}u + {off}u, &tf_map_b, (int)(tb{dn} + {col}), kt * {bk}, tf_full + s * 8);\n",
                    off = j * slab,
                    col = j * 64
                )
            })
            .collect()
    };
    // Producer and consumers walk the same work units, and within a shared unit
    // the same segments: the tile (`pid`) and its K tiles [kt_lo, kt_hi).
    let units = format!(
        r#"for (long long unit = {first_pid}; unit < tf_units; unit += {pid_step}) {{
  // A shared unit's iterations [tf_it, tf_end) of the split tiles' tf_iters.
  long long tf_it = 0, tf_end = 0;
  if (unit >= tf_whole) {{
    tf_it = (unit - tf_whole) * tf_iters / tf_parts;
    tf_end = (unit - tf_whole + 1) * tf_iters / tf_parts;
    if (tf_it == tf_end) continue;
  }}
  do {{
  long long pid = unit;
  [[maybe_unused]] int tf_part = 0, tf_w = 1;  // the producer reads neither
  int kt_lo = 0, kt_hi = KT;
  if (unit >= tf_whole) {{
    const long long t = tf_it / KT;
    kt_lo = (int)(tf_it - t * KT);
    kt_hi = (int)tf_min_i((long long)KT, kt_lo + tf_end - tf_it);
    tf_it += kt_hi - kt_lo;
    // The units holding the tile's first and last iterations (unit q holds
    // [q * I / P, (q + 1) * I / P)): this one's rank among them, and their count.
    const long long q0 = ((t * KT + 1) * tf_parts + tf_iters - 1) / tf_iters - 1;
    const long long q1 = ((t + 1) * KT * tf_parts + tf_iters - 1) / tf_iters - 1;
    tf_part = (int)(unit - tf_whole - q0);
    tf_w = (int)(q1 - q0 + 1);
    pid = tf_whole + t;
  }}
"#
    );
    let _ = write!(
        e.out,
        r#"  if (warp < 4) {{
    // Producer warpgroup: one thread issues the loads.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 {minreg};");
    if (tid == 0) {{
      int it = 0;{seen}
{producer_units}{tile}{producer_lets}{acquire}      for (int kt = kt_lo; kt < kt_hi; ++kt, ++it) {{
{k_ready}        const int s = it % {stages};
        if (it >= {stages}) tf_mbar_wait(tf_empty + s * 8, ((it / {stages}) & 1) ^ 1);
        tf_mbar_expect_tx(tf_full + s * 8, {stage_bytes}u);
        tf_tma_2d(sA + s * {a_stage}u, &tf_map_a, kt * {bk}, (int)tb{dm}, tf_full + s * 8);
{b_loads}      }}
      }} while (tf_it < tf_end);
      }}
      tf_mbar_wait(tf_done(), 0);  // the consumers finished: bounded, see tf_mbar_spin
    }}{waiter}
  }} else {{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 {maxreg};");
{owner}    const int wg = (warp - 4) >> 2;
    int it = 0{seg};
{consumer_units}{take}{tile}    float acc[{mi}][{ni}][4];
"#,
        producer_units = indent(&units, 6),
        seen = k_flags.seen,
        k_ready = k_flags.ready,
        waiter = k_flags.waiter(
            &indent(&units, 6),
            &format!("{tile}      (void)tb{dm}; (void)tb{dn};  // the waits may read neither\n"),
            &producer_lets,
            &k_wait_decls
        ),
        consumer_units = indent(&units, 4),
        stage_bytes = a_stage + b_stage,
        minreg = 56,
        maxreg = if consumers == 2 { 224 } else { 240 },
        owner = if pp {
            "    // Ping-pong: warpgroup wg computes the block's segments wg, wg + 2, ...\n    // (its stages are the ones the producer fills for them); warp w of it owns\n    // rows 16w..16w+15 of each 64-row block of the tile.\n    const int wm0 = ((warp - 4) & 3) * 16, wn0 = 0;\n".to_string()
        } else {
            format!("    // Consumer warp w (0..{}) owns rows 16w..16w+15 of the block's tile.\n    const int wm0 = (warp - 4) * 16, wn0 = 0;\n", 4 * consumers - 1)
        },
        seg = if pp { ", tf_seg = 0" } else { "" },
        take = if pp {
            "    // The other warpgroup's segment: count its K steps (stage and phase) and go on.\n    if ((tf_seg++ & 1) != wg) {\n      it += kt_hi - kt_lo;\n      continue;\n    }\n"
        } else {
            ""
        },
        ni = bn / 8,
    );
    let geo = Geometry {
        bm,
        bn,
        bk,
        wm: 4 * sharers,
        wn: 1,
        mi,
        ni: bn / 8,
        mi_rows: 64,
        threads,
        stages,
    };
    before_loop(e, g, &geo, None)?;
    // Only the first part of a split tile starts from the accumulator's init.
    let _ = writeln!(
        e.out,
        "    if (tf_part > 0) {{\n    #pragma unroll\n    for (int i = 0; i < {mi}; ++i)\n    #pragma unroll\n    for (int j = 0; j < {}; ++j)\n    #pragma unroll\n    for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;\n    }}",
        bn / 8
    );
    let mut kk = String::new();
    for k16 in 0..bk / 16 {
        for i in 0..mi {
            let _ = writeln!(
                kk,
                "        tf_wgmma(&acc[{i}][0][0], tf_wgmma_desc(a_s + {}u, 16u, {ATOM}u), tf_wgmma_desc(b_s + {}u, {slab}u, {ATOM}u));",
                i * 64 * 128 + k16 * 32,
                k16 * 16 * 128
            );
        }
    }
    // One wgmma group stays in flight: a stage is released when the group after it
    // has been issued and its own has completed; in a cluster, in every block (the
    // peer's producer writes into this block's stages too).
    let release = if cl > 1 {
        format!(
            "if (prev >= 0 && lane == 0) for (int r = 0; r < {cl}; ++r) tf_mbar_arrive_in(tf_empty + prev * 8, r);"
        )
    } else {
        "if (prev >= 0 && lane == 0) tf_mbar_arrive(tf_empty + prev * 8);".to_string()
    };
    let _ = write!(
        e.out,
        r#"{my_turn}    int prev = -1;
    for (int kt = kt_lo; kt < kt_hi; ++kt, ++it) {{
      const int s = it % {stages};
      tf_mbar_spin(tf_full + s * 8, (it / {stages}) & 1);
      const tf_u32 a_s = sA + s * {a_stage}u{wg_rows}, b_s = sB + s * {b_stage}u;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
{kk}      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
      {release}
      prev = s;
    }}
{their_turn}    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    {release}
    if (tf_failed) continue;
"#,
        // Cooperative warpgroups read their own 64 rows of the A stage.
        wg_rows = if pp {
            String::new()
        } else {
            format!(" + wg * {}u", 64 * 128)
        },
        my_turn = if pp { PP_MY_TURN } else { "" },
        their_turn = if pp { PP_THEIR_TURN } else { "" },
    );
    let head = format!(
        "    if (tf_w > 1) {{\n      const long long slot = (pid - tf_whole) * {cl}{rank};",
        rank = if cl > 1 { " + tf_cluster_rank()" } else { "" }
    );
    // The threads holding the tile: every consumer warp (named barrier 1), or
    // with ping-pong the tile's warpgroup (barrier 2 + wg, a register id as in
    // the TMA-store epilogue).
    let (holders, holders_n, holders_sync) = if pp {
        (
            "(tid & 127)",
            128,
            "asm volatile(\"bar.sync %0, 128;\" :: \"r\"(2 + wg) : \"memory\");".to_string(),
        )
    } else {
        (
            "(tid - 128)",
            128 * consumers,
            format!(
                "asm volatile(\"bar.sync 1, {};\" ::: \"memory\");",
                128 * consumers
            ),
        )
    };
    split_fixup(
        &mut e.out,
        mi,
        bn / 8,
        holders_n,
        &FixupSite {
            head: &head,
            tid: holders,
            sync: &holders_sync,
            leave: "continue;",
            groups: if pp { (2, "wg") } else { (1, "0") },
        },
    );
    // Only the consumer warps store the tile.
    e.storers = (holders.into(), holders_sync);
    after_loop(e, g, &geo, "    ")?;
    e.out.push_str("    } while (tf_it < tf_end);\n    }\n");
    if pp {
        e.out.push_str(PP_LAST_TURN);
    }
    if e.tma_store.is_some() {
        // Shared memory must outlive the TMA unit's last reads of it.
        e.out.push_str(
            "    if ((tid & 127) == 0) asm volatile(\"cp.async.bulk.wait_group 0;\" ::: \"memory\");\n",
        );
    }
    e.out
        .push_str("    if (lane == 0) tf_mbar_arrive(tf_done());\n  }\n");
    if cl > 1 {
        // No block leaves while its peer may still arrive on its barriers.
        e.out.push_str("  tf_cluster_sync();\n");
    }
    e.out.push_str("}\n");
    let mut l = e.finish(params, threads, shared, "gemm/wgmma");
    l.persistent = c.persistent;
    l.cluster = cl as u32;
    l.tiles_in_flight = if pp { 2 } else { 1 };
    // A program (a cluster's tile) holds `cl` blocks' accumulators in scratch.
    l.split_tail = Some(SplitTail {
        m: ext_m,
        n: ext_n,
        k: ext_k,
        bm: bm * cl,
        bn,
        bk,
        stream_k: c.stream_k,
        min_part_k_tiles: crate::emit::HOPPER_MIN_PART_K_TILES,
    });
    // One program per cluster tile; the launch multiplies by the cluster size.
    for (&d, (_, b)) in e.k.grid.iter().zip(&mut l.grid) {
        if d == g.m {
            *b *= cl;
        }
    }
    Ok(l)
}

/// Ping-pong's turns: a warpgroup's K loop starts once the other's last K loop
/// has waited on all of its stages. The stages' `full` barriers are waited on
/// by phase parity, which tells a phase from the next but one only if no
/// waiter runs a phase ahead; without turns the warpgroup holding a later tile
/// would wait on the producer's earlier phases (and release stages it never
/// read). Named barrier 4 + wg: this warpgroup's turn, given by the other's
/// `bar.arrive` after its K loop; segment 0 (warpgroup 0's first) needs none.
const PP_MY_TURN: &str =
    "    if (tf_seg > 1) asm volatile(\"bar.sync %0, 256;\" :: \"r\"(4 + wg) : \"memory\");\n";
const PP_THEIR_TURN: &str =
    "    asm volatile(\"bar.arrive %0, 256;\" :: \"r\"(5 - wg) : \"memory\");  // the other's turn\n";
/// The turn given after the last segment is taken, so no barrier is left half
/// arrived when the block exits.
const PP_LAST_TURN: &str = "    if (tf_seg > 0 && (tf_seg & 1) == wg) asm volatile(\"bar.sync %0, 256;\" :: \"r\"(4 + wg) : \"memory\");\n";

/// `text` with every line indented `n` more spaces.
fn indent(text: &str, n: usize) -> String {
    let pad = " ".repeat(n);
    text.lines().map(|l| format!("{pad}{l}\n")).collect()
}

/// The K loop's `wait`s, off the issuing thread: warp 1 of the producer
/// warpgroup walks the same work units, each lane testing one k-tile's flags,
/// 32 k-tiles a round, and publishes the count of k-steps (`it`, over all of the
/// block's units) whose flags passed. The issuer waits on that count only when
/// it catches up with the last one it read; a timed-out wait sets `tf_failed`
/// and publishes every k-step, so neither spin outlives the flags' timeout.
/// Empty strings where the loop waits on nothing.
struct KFlags<'a> {
    /// The lanes' tests of k-tile `kt` (setting `tf_kf`).
    tests: &'a str,
    seen: &'static str,
    ready: &'static str,
}

impl<'a> KFlags<'a> {
    /// The published count, declared and zeroed with the block's barriers.
    const DECL: &'static str =
        "  __shared__ int tf_kready;  // k-steps whose flags passed (see the waiter warp)\n";
    const INIT: &'static str = "\n    tf_kready = 0;";

    fn new(tests: &'a str) -> KFlags<'a> {
        if tests.is_empty() {
            return KFlags {
                tests,
                seen: "",
                ready: "",
            };
        }
        KFlags {
            tests,
            seen: "\n      int tf_seen = 0;  // the last count read from tf_kready",
            // The TMA unit reads through the async proxy: fence after the
            // acquire that ordered the flags' data before these loads.
            ready: "        if (it >= tf_seen) {\n          int r;\n          while ((r = tf_ld_acquire_cta(&tf_kready)) <= it) tf_nanosleep(32);\n          tf_seen = r;\n          asm volatile(\"fence.proxy.async.global;\" ::: \"memory\");\n        }\n",
        }
    }

    /// Warp 1's branch: `units` and `tile` walk the work as the issuer does,
    /// `lets` are the scalar lets the waits may read, `decls` the lanes' caches.
    fn waiter(&self, units: &str, tile: &str, lets: &str, decls: &str) -> String {
        if self.tests.is_empty() {
            return String::new();
        }
        format!(
            r#" else if (warp == 1) {{
      // The flag waiter (see `tf_kready`).
      int it = 0;
{units}{tile}{lets}{decls}      for (int kt0 = kt_lo; kt0 < kt_hi; kt0 += 32) {{
        const int kt = kt0 + lane, tf_n = tf_min_i(32, kt_hi - kt0);
        int tf_kf = tf_failed;
        if (kt < kt_hi) {{
{tests}        }}
        // Every lane's flags were acquired before lane 0 publishes them.
        tf_kf = __any_sync(0xffffffffu, tf_kf);
        if (lane == 0) {{
          if (tf_kf) tf_failed = 1;
          tf_st_release_cta(&tf_kready, tf_kf ? 0x7fffffff : it + tf_n);
        }}
        it += tf_n;
      }}
      }} while (tf_it < tf_end);
      }}
    }}"#,
            tests = self.tests,
        )
    }
}
