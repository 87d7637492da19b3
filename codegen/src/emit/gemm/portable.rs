//! The portable tensor-core GEMM: `mma.sync.m16n8k16` fed by `ldmatrix` from an
//! XOR-swizzled shared-memory ring filled by a multi-stage `cp.async` pipeline,
//! with the kernel's elementwise statements fused before the loop (accumulator
//! init) and after it (epilogue), evaluated on the accumulator fragments in registers.
//!
//! Layouts: A is `[m][k]` with k contiguous, B is `[k][n]` with n contiguous. A tile
//! row of 16-byte chunks is swizzled so that the eight rows an `ldmatrix` reads land
//! in eight different bank groups.

use super::GemmShape;
use crate::dtype::DType;
use crate::emit::expr::{float_lit, narrow, tensor_mask, tensor_offset, CTy};
use crate::emit::{config_err, one_line, reads_var, Emitter, Lowered, Param, SplitTail};
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

/// Block and warp geometry derived from the config. The accumulator is
/// `acc[mi][ni][4]` per thread in the `mma.sync` C-fragment layout, the warp's tile
/// starting at (`wm0`, `wn0`) in the block's (the `wgmma` layout is the same).
pub(super) struct Geometry {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub wm: usize,
    pub wn: usize,
    pub mi: usize,
    pub ni: usize,
    /// Rows from one fragment row block (`acc[i]`) to the next: 16 for a warp's
    /// `mma.sync` tiles, 64 for a warpgroup's `wgmma` instructions.
    pub mi_rows: usize,
    pub threads: usize,
    pub stages: usize,
}

fn geometry(e: &Emitter, g: &GemmShape) -> Result<Geometry, CodegenError> {
    let c = e.cfg;
    let (bm, bn, bk) = (c.block_sizes[g.m], c.block_sizes[g.n], c.block_sizes[g.k]);
    let err = |m: String| config_err(e.k, c, m);
    if !matches!(bk, 16 | 32 | 64 | 128) {
        return Err(err(format!("the K block ({bk}) must be 16, 32, 64 or 128")));
    }
    if bn % 16 != 0 || (bn > 32 && bn % 64 != 0) {
        return Err(err(format!(
            "the N block ({bn}) must be 16, 32 or a multiple of 64"
        )));
    }
    if bm % 16 != 0 {
        return Err(err(format!("the M block ({bm}) must be a multiple of 16")));
    }
    if !(2..=8).contains(&c.num_stages) {
        return Err(err(format!(
            "num_stages ({}) must be 2..=8 for the cp.async pipeline",
            c.num_stages
        )));
    }
    // Split the warps into a grid whose warp tiles are as square as possible.
    let w = c.num_warps;
    let mut best: Option<(usize, usize, f64)> = None;
    for wm in [1, 2, 4, 8, 16] {
        if w % wm != 0 {
            continue;
        }
        let wn = w / wm;
        if bm % (16 * wm) != 0 || bn % (16 * wn) != 0 {
            continue;
        }
        let skew = ((bm / wm) as f64 / (bn / wn) as f64).ln().abs();
        if best.is_none_or(|b| skew < b.2) {
            best = Some((wm, wn, skew));
        }
    }
    let Some((wm, wn, _)) = best else {
        return Err(err(format!(
            "{w} warps cannot split a {bm}x{bn} block into warp tiles of at least 16x16"
        )));
    };
    let (mi, ni) = (bm / wm / 16, bn / wn / 8);
    if mi * ni * 4 > 128 {
        return Err(err(format!(
            "each thread would hold {} accumulators (at most 128 fit in registers); use more warps or smaller blocks",
            mi * ni * 4
        )));
    }
    Ok(Geometry {
        bm,
        bn,
        bk,
        wm,
        wn,
        mi,
        ni,
        mi_rows: 16,
        threads: w * 32,
        stages: c.num_stages,
    })
}

/// The swizzle of 16-byte chunk `ch` in row `row` of a tile with `cpr` chunks a row.
fn swizzle_fn(name: &str, cpr: usize) -> String {
    let body = if cpr >= 8 {
        "ch ^ (row & 7)".to_string()
    } else {
        let shift = (8 / cpr).trailing_zeros();
        format!("ch ^ ((row >> {shift}) & {})", cpr - 1)
    };
    format!("__device__ __forceinline__ int {name}(int row, int ch) {{ return {body}; }}\n")
}

pub(super) fn operand_check(e: &Emitter, t: TensorId, role: &str) -> Result<bool, CodegenError> {
    let ts = &e.spec.tensors[t];
    if !ts.last_contiguous {
        return Err(CodegenError::Argument {
            kernel: e.k.name.clone(),
            arg: e.k.tensors[t].name.clone(),
            message: format!(
                "`addmm` reads its {role} operand with its last dimension contiguous (stride 1); \
                 this tensor's last stride is not 1: make it contiguous first"
            ),
        });
    }
    Ok(ts.align >= 16)
}

pub(super) fn emit(e: &mut Emitter, g: &GemmShape) -> Result<Lowered, CodegenError> {
    let geo = geometry(e, g)?;
    let a_vec = operand_check(e, g.a, "first")?;
    let b_vec = operand_check(e, g.b, "second")?;
    let dtype = e.spec.tensors[g.a].dtype;
    let mma = if dtype == DType::BF16 {
        "tf_mma_bf16"
    } else {
        "tf_mma_f16"
    };
    let Geometry {
        bm,
        bn,
        bk,
        wm: _,
        wn,
        mi,
        ni,
        mi_rows: _,
        threads: nt,
        stages,
    } = geo;
    let a_stage = bm * bk * 2;
    let b_stage = bk * bn * 2;
    let shared = stages * (a_stage + b_stage);

    let (ext_m, ext_n, ext_k) = (
        e.host_extent(g.m)?,
        e.host_extent(g.n)?,
        e.host_extent(g.k)?,
    );
    let (dm, dn) = (g.m, g.n);

    let mut pre = String::new();
    pre.push_str(&swizzle_fn("tf_swz_a", bk / 8));
    pre.push_str(&swizzle_fn("tf_swz_b", bn / 8));
    let params = e.begin(
        nt,
        1,
        &pre,
        &[
            (Param::SplitWhole, "long long tf_whole"),
            (Param::SplitWays, "int tf_ways"),
            (Param::SplitPartials, "float* tf_partials"),
            (Param::SplitCounters, "unsigned* tf_counters"),
        ],
    );
    let rotate = grid_rotation(e, g, bm, bn)?;
    let o = &mut e.out;
    let gm = e.cfg.group_m.max(1);
    let _ = write!(
        o,
        r#"  extern __shared__ __align__(128) unsigned char tf_smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long M = s{ext_m}, N = s{ext_n}, K = s{ext_k};
  // Output tile of this program, visited in groups of {gm} tile rows for L2 reuse.
  const long long tiles_m = (M + {bm} - 1) / {bm}, tiles_n = (N + {bn} - 1) / {bn};
  // Programs [0, tf_whole) compute one tile each; the tiles after those (the last,
  // partial wave) are shared by tf_ways programs each, split along K.
  long long pid = blockIdx.x;
  int tf_part = 0, tf_w = 1;
  if (pid >= tf_whole) {{
    const long long u = pid - tf_whole;
    pid = tf_whole + u / tf_ways;
    tf_part = (int)(u % tf_ways);
    tf_w = tf_ways;
  }}
{tile}  const int wm0 = (warp / {wn}) * {wtm}, wn0 = (warp % {wn}) * {wtn};
  float acc[{mi}][{ni}][4];
"#,
        wtm = bm / geo.wm,
        wtn = bn / wn,
        tile = grouped_tile(gm, &rotate, g, (bm, bn), ""),
    );

    before_loop(e, g, &geo, Some("  "))?;
    // Only the first part of a split tile starts from the accumulator's init.
    let _ = writeln!(
        e.out,
        "  if (tf_part > 0) {{\n  #pragma unroll\n  for (int i = 0; i < {mi}; ++i)\n  #pragma unroll\n  for (int j = 0; j < {ni}; ++j)\n  #pragma unroll\n  for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.f;\n  }}"
    );

    // `wait`s inside the K loop: every thread tests them before it loads a
    // k-tile (as each waits before the loop: see `before_loop`'s caller).
    let (k_wait_decls, k_waits) = e.k_wait_code(g, "tf_kt", bk, "    ", "tf_kfailed", "")?;
    let k_wait = !k_waits.is_empty();
    if k_wait {
        let _ = write!(
            e.out,
            "  int tf_kfailed = 0;\n{k_wait_decls}  auto kwait = [&](int tf_kt) {{\n{k_waits}  }};\n"
        );
    }
    // The K loop.
    super::mainloop::emit(
        &mut e.out,
        &super::mainloop::Mainloop {
            bm,
            bn,
            bk,
            mi,
            ni,
            threads: nt,
            stages,
            a: g.a,
            b: g.b,
            a_vec,
            b_vec,
            m0: format!("tb{dm}"),
            n0: format!("tb{dn}"),
            mma,
            k_wait,
        },
    );

    split_fixup(
        &mut e.out,
        mi,
        ni,
        nt,
        &FixupSite {
            head: "  if ((long long)blockIdx.x >= tf_whole && tf_ways > 1) {\n    \
                   // Recomputed from blockIdx rather than kept live through the K loop, where\n    \
                   // every register is taken (keeping them cost 150 bytes of spills).\n    \
                   const long long u = (long long)blockIdx.x - tf_whole, slot = u / tf_ways;\n    \
                   const int tf_part = (int)(u % tf_ways), tf_w = tf_ways;",
            tid: "tid",
            sync: "__syncthreads();",
            leave: "return;",
            groups: (1, "0"),
        },
    );

    after_loop(e, g, &geo, "  ")?;
    e.out.push_str("}\n");
    let mut lowered = e.finish(params, nt, shared, "gemm/mma.sync");
    lowered.split_tail = Some(SplitTail {
        m: ext_m,
        n: ext_n,
        k: ext_k,
        bm,
        bn,
        bk,
        stream_k: false,
        min_part_k_tiles: crate::emit::PORTABLE_MIN_PART_K_TILES,
    });
    Ok(lowered)
}

/// The statements before the K loop, in order: block-level ones (emitted at
/// `block_indent`; with `None`, `wait`s are skipped, emitted earlier by the
/// caller for every thread), the accumulator's init (at its `let`), tile lets, stores.
pub(super) fn before_loop(
    e: &mut Emitter,
    g: &GemmShape,
    geo: &Geometry,
    block_indent: Option<&str>,
) -> Result<(), CodegenError> {
    let body = e.k.body.clone();
    let mut acc_ready = false;
    for s in &body[..g.k_loop] {
        if block_indent.is_none() && matches!(s, Stmt::Wait { .. }) {
            continue;
        }
        if e.block_stmt(s, block_indent.unwrap_or("    "))? {
            continue;
        }
        match s {
            Stmt::Let { var, value, .. } if *var == g.acc => {
                init_accumulator(e, value, geo, g)?;
                acc_ready = true;
            }
            Stmt::Let { var, value, at } => {
                if reads_var(value, g.acc) {
                    return Err(CodegenError::Unsupported {
                        kernel: e.k.name.clone(),
                        at: at.clone(),
                        message: format!(
                            "`{}` reads the accumulator before the K loop; compute it after the loop, or from the tensors the accumulator starts from",
                            e.k.vars[*var].name
                        ),
                    });
                }
                e.bind_inline(*var, value);
            }
            Stmt::Store { .. } => fragment_stores(e, std::slice::from_ref(s), geo, g)?,
            other => {
                return Err(CodegenError::Unsupported {
                    kernel: e.k.name.clone(),
                    at: stmt_at(other),
                    message: "this statement is not supported before the K loop of a matmul".into(),
                })
            }
        }
    }
    if !acc_ready {
        init_accumulator(e, &Expr::Float(0.0), geo, g)?;
    }
    Ok(())
}

/// The statements after the K loop: the epilogue, on the accumulator fragments.
pub(super) fn after_loop(
    e: &mut Emitter,
    g: &GemmShape,
    geo: &Geometry,
    block_indent: &str,
) -> Result<(), CodegenError> {
    let rest: Vec<Stmt> = e.k.body[g.k_loop + 1..].to_vec();
    let mut pending: Vec<Stmt> = Vec::new();
    for s in &rest {
        if matches!(s, Stmt::Store { .. }) {
            pending.push(s.clone());
            continue;
        }
        if !pending.is_empty() {
            fragment_stores(e, &pending, geo, g)?;
            pending.clear();
        }
        if e.block_stmt(s, block_indent)? {
            continue;
        }
        match s {
            Stmt::Let { var, value, .. } => e.bind_inline(*var, value),
            Stmt::Assign { var, value, at } if *var == g.acc => {
                return Err(CodegenError::Unsupported {
                    kernel: e.k.name.clone(),
                    at: at.clone(),
                    message: format!(
                        "reassigning the accumulator after the K loop is not supported; bind the result with `let`, e.g. `let y = {};`",
                        at.split_once('=').map(|x| x.1.trim()).unwrap_or("…")
                    ),
                })
            }
            other => {
                return Err(CodegenError::Unsupported {
                    kernel: e.k.name.clone(),
                    at: stmt_at(other),
                    message: "this statement is not supported after the K loop of a matmul".into(),
                })
            }
        }
    }
    if !pending.is_empty() {
        fragment_stores(e, &pending, geo, g)?;
    }
    Ok(())
}

/// Where a split tile's parts meet: what differs between the portable path (one
/// program per part, done with `return`) and the Hopper consumers (a loop over
/// work units, done with `continue`).
pub(super) struct FixupSite<'a> {
    /// Opens the fix-up (`if (...) {`) and defines `slot` (the part's tile in the
    /// scratch and counters), `tf_part` and `tf_w` unless already in scope.
    pub head: &'a str,
    /// This thread's index among the threads holding accumulators.
    pub tid: &'a str,
    /// A barrier over those threads.
    pub sync: &'a str,
    /// Leaves when another part will finish the tile.
    pub leave: &'a str,
    /// Groups of threads that may fix up tiles at once (ping-pong's warpgroups),
    /// and this thread's group: each needs its own "last part" flag.
    pub groups: (usize, &'a str),
}

/// The parts of a split tile meet here: each writes its partial accumulators to
/// scratch (fragment order, coalesced), the last to arrive adds all parts in part
/// order from there (so the sum does not depend on arrival order) and runs the
/// epilogue; the others are done. The classic fence / counter handshake: writes, fence, barrier,
/// one atomic; then the last block fences again before reading.
pub(super) fn split_fixup(o: &mut String, mi: usize, ni: usize, nt: usize, site: &FixupSite) {
    let count = mi * ni * 4;
    let FixupSite {
        head,
        tid,
        sync,
        leave,
        groups: (groups, group),
    } = site;
    let _ = write!(
        o,
        r#"{head}
    float* tf_p = tf_partials + slot * tf_ways * {tile_floats}ll;
    #pragma unroll
    for (int i = 0; i < {mi}; ++i)
    #pragma unroll
    for (int j = 0; j < {ni}; ++j)
    #pragma unroll
    for (int r = 0; r < 4; ++r)
      tf_st_cg(tf_p + ((long long)tf_part * {count} + (i * {ni} + j) * 4 + r) * {nt} + {tid}, acc[i][j][r]);
    __threadfence();
    {sync}
    __shared__ int tf_last_of[{groups}];
    int& tf_last = tf_last_of[{group}];
    if ({tid} == 0) tf_last = tf_arrive_last(tf_counters + slot, (unsigned)tf_w);
    {sync}
    if (!tf_last) {leave}
    __threadfence();
    // Every part, this one's too, is read back from scratch in part order into
    // the accumulators (dead since they were written out). Part 0 is peeled so
    // the accumulators are not live into the loop (that cost 150 bytes of spills
    // in the K loop), and a part's loads are independent, so they overlap (a
    // per-element loop over the parts waited out one L2 round trip per load).
    #pragma unroll
    for (int i = 0; i < {mi}; ++i)
    #pragma unroll
    for (int j = 0; j < {ni}; ++j)
    #pragma unroll
    for (int r = 0; r < 4; ++r)
      acc[i][j][r] = tf_ld_cg(tf_p + ((i * {ni} + j) * 4 + r) * {nt} + {tid});
    #pragma unroll 1
    for (int q = 1; q < tf_w; ++q) {{
      const float* src = tf_p + (long long)q * {count} * {nt} + {tid};
      #pragma unroll
      for (int i = 0; i < {mi}; ++i)
      #pragma unroll
      for (int j = 0; j < {ni}; ++j)
      #pragma unroll
      for (int r = 0; r < 4; ++r)
        acc[i][j][r] += tf_ld_cg(src + ((i * {ni} + j) * 4 + r) * {nt});
    }}
  }}
"#,
        tile_floats = count * nt,
    );
}

/// The program's output tile from `pid`: tile rows visited in groups of `gm` (blocks
/// that run together share rows of A and columns of B in L2), then `rotate`
/// (`starting_at`); defines `tile_m`, `tile_n` and the tile's first row and column
/// (plus `m_offset`, an expression: the block's rows within a cluster's tile).
pub(super) fn grouped_tile(
    gm: usize,
    rotate: &str,
    g: &GemmShape,
    (bm, bn): (usize, usize),
    m_offset: &str,
) -> String {
    let (dm, dn) = (g.m, g.n);
    format!(
        r#"  const long long group_width = {gm}ll * tiles_n;
  const long long first_m = (pid / group_width) * {gm}ll;
  const long long group_rows = tf_min_i(tiles_m - first_m, {gm}ll);
  long long tile_m = first_m + (pid % group_width) % group_rows, tile_n = (pid % group_width) / group_rows;
{rotate}  const long long tb{dm} = tile_m * {bm}{m_offset};
  const long long tb{dn} = tile_n * {bn};
"#
    )
}

/// `tile([m, n]).starting_at([i, j])`: the tile order starts at the tiles holding
/// row `i` and column `j` and wraps around (an all-gather matmul starts on the
/// rank's own rows, which are there first).
pub(super) fn grid_rotation(
    e: &Emitter,
    g: &GemmShape,
    bm: usize,
    bn: usize,
) -> Result<String, CodegenError> {
    let k = e.k;
    if k.grid_start.is_empty() {
        return Ok(String::new());
    }
    let mut out = String::new();
    for (pos, &d) in k.grid.iter().enumerate() {
        let s = k.grid_start[pos];
        if !e.spec.scalars.get(s).is_some_and(|k| k.is_int()) {
            return Err(CodegenError::Argument {
                kernel: k.name.clone(),
                arg: k.scalars[s].name.clone(),
                message: "a `starting_at` index must be an integer".into(),
            });
        }
        let (var, tiles, block) = if d == g.m {
            ("tile_m", "tiles_m", bm)
        } else {
            ("tile_n", "tiles_n", bn)
        };
        let _ = writeln!(
            out,
            "  {var} = ({var} + ((s{s} / {block}) % {tiles} + {tiles})) % {tiles};  // starting_at: `{}`",
            k.scalars[s].name
        );
    }
    Ok(out)
}

/// Sets every accumulator element from `init` (a constant, or per element from tensors).
fn init_accumulator(
    e: &mut Emitter,
    init: &Expr,
    geo: &Geometry,
    g: &GemmShape,
) -> Result<(), CodegenError> {
    let (mi, ni, dm, dn, step) = (geo.mi, geo.ni, g.m, g.n, geo.mi_rows);
    if let Expr::Full { value, .. } | Expr::Float(value) = init {
        let v = float_lit(*value);
        let _ = writeln!(
            e.out,
            "  #pragma unroll\n  for (int i = 0; i < {mi}; ++i)\n  #pragma unroll\n  for (int j = 0; j < {ni}; ++j)\n  #pragma unroll\n  for (int r = 0; r < 4; ++r) acc[i][j][r] = {v};"
        );
        return Ok(());
    }
    let _ = writeln!(
        e.out,
        "  #pragma unroll\n  for (int mi = 0; mi < {mi}; ++mi)\n  #pragma unroll\n  for (int ni = 0; ni < {ni}; ++ni)\n  #pragma unroll\n  for (int r = 0; r < 4; ++r) {{\n    const long long row = tb{dm} + wm0 + mi * {step} + (lane >> 2) + (r >> 1) * 8;\n    const long long col = tb{dn} + wn0 + ni * 8 + (lane & 3) * 2 + (r & 1);"
    );
    let (c, ty) = e
        .ctx(&[(dm, "row".to_string()), (dn, "col".to_string())])
        .emit(init, "accumulator init")?;
    let c = crate::emit::expr::convert(&c, ty, CTy::F32);
    let _ = writeln!(e.out, "    acc[mi][ni][r] = {c};\n  }}");
    Ok(())
}

fn stmt_at(s: &Stmt) -> String {
    match s {
        Stmt::Loop { .. } => "an inner tile loop".into(),
        _ => s.at_text().to_string(),
    }
}

/// Stores evaluated on the accumulator fragments: each thread owns pairs of
/// adjacent columns, stored as one 32-bit access where the layout allows.
fn fragment_stores(
    e: &mut Emitter,
    stores: &[Stmt],
    geo: &Geometry,
    g: &GemmShape,
) -> Result<(), CodegenError> {
    let (mi, ni, step) = (geo.mi, geo.ni, geo.mi_rows);
    let (dm, dn) = (g.m, g.n);
    let mut body = String::new();
    let mut tma_staged = false;
    for s in stores {
        let Stmt::Store {
            tensor,
            index,
            value,
            at,
        } = s
        else {
            continue;
        };
        let index = &e.plain(index, at)?;
        let ts = &e.spec.tensors[*tensor];
        let mut e2 = e.ctx(&[(dm, "row".into()), (dn, "col".into())]);
        e2.named_vars.insert(g.acc, "acc[mi][ni][h * 2]".into());
        let (v0, t0) = e2.emit(value, at)?;
        e2.coords.insert(dn, "(col + 1)".into());
        e2.named_vars.insert(g.acc, "acc[mi][ni][h * 2 + 1]".into());
        let (v1, t1) = e2.emit(value, at)?;
        let coords = |c: &str| -> Vec<String> {
            index
                .iter()
                .map(|d| {
                    if *d == dm {
                        "row".to_string()
                    } else {
                        c.to_string()
                    }
                })
                .collect()
        };
        let (i0, i1) = (coords("col"), coords("(col + 1)"));
        let (off0, off1) = (tensor_offset(*tensor, &i0), tensor_offset(*tensor, &i1));
        let (m0, m1) = (tensor_mask(*tensor, &i0), tensor_mask(*tensor, &i1));
        let (n0, n1) = (narrow(ts.dtype, "v0", t0), narrow(ts.dtype, "v1", t1));
        let cty = |t: CTy| t.c();
        let _ = write!(
            body,
            "      {{  // {}\n        const {} v0 = {v0};\n        const {} v1 = {v1};\n",
            one_line(at),
            cty(t0),
            cty(t1)
        );
        let pairable =
            index.last() == Some(&dn) && ts.last_contiguous && ts.dtype.is_half() && ts.align >= 4;
        if e.tma_store.as_ref().is_some_and(|t| t.tensor == *tensor) {
            // Into the staging boxes (see `TmaStore`); the TMA unit clips the
            // tile to the tensor, so no masks.
            tma_staged = true;
            let _ = write!(
                body,
                "        asm volatile(\"st.shared.b32 [%0], %1;\" :: \"r\"(tf_stage_at), \"r\"((tf_u32){n0} | ((tf_u32){n1} << 16)));\n      }}\n"
            );
        } else if pairable {
            let _ = write!(
                body,
                "        if (({m1}) && (col & 1) == 0) {{\n          *(tf_u32*)(t{tensor} + {off0}) = (tf_u32){n0} | ((tf_u32){n1} << 16);\n        }} else {{\n          if ({m0}) t{tensor}[{off0}] = {n0};\n          if ({m1}) t{tensor}[{off1}] = {n1};\n        }}\n      }}\n"
            );
        } else {
            let _ = write!(
                body,
                "        if ({m0}) t{tensor}[{off0}] = {n0};\n        if ({m1}) t{tensor}[{off1}] = {n1};\n      }}\n"
            );
        }
    }
    if let (Some(t), true) = (&e.tma_store, tma_staged) {
        let code = super::tma_store::fragment_loop(t, dm, dn, &body);
        e.out.push_str(&code);
        return Ok(());
    }
    // A warpgroup's 64-row blocks go innermost: a column's operands (a bias)
    // are loaded once for all of them, not held for the whole row block.
    let (outer, inner) = match step {
        64 => (
            format!("ni = 0; ni < {ni}; ++ni"),
            format!("mi = 0; mi < {mi}; ++mi"),
        ),
        _ => (
            format!("mi = 0; mi < {mi}; ++mi"),
            format!("ni = 0; ni < {ni}; ++ni"),
        ),
    };
    let _ = write!(
        e.out,
        r#"  #pragma unroll
  for (int {outer})
  #pragma unroll
  for (int {inner})
  #pragma unroll
  for (int h = 0; h < 2; ++h) {{
      const long long row = tb{dm} + wm0 + mi * {step} + (lane >> 2) + h * 8;
      const long long col = tb{dn} + wn0 + ni * 8 + (lane & 3) * 2;
{body}  }}
"#
    );
    Ok(())
}
