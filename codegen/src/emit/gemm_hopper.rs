//! The Hopper GEMM (sm_90a): TMA loads into a ring of 128-byte-swizzled shared
//! memory stages, `mbarrier` handshakes, and `wgmma` from shared-memory
//! descriptors, with warp specialization: warpgroup 0 produces (one thread issues
//! the TMA loads), warpgroups 1..=C consume (each a 64-row slice of the block's
//! tile, `wgmma.m64nBNk16`). The kernel's statements before and after the K loop
//! are the portable path's, on the same fragment layout.
//!
//! Config: `wgmma = true`; `num_warps` counts the consumer warps (4 or 8: BM = 64
//! or 128), the producer warpgroup comes on top; BK = 64 (one 128-byte swizzle row
//! of 16-bit elements); BN a multiple of 64 up to 256.
//!
//! Layouts: A `[m][k]` (k contiguous) is K-major for `wgmma`; B `[k][n]` (n
//! contiguous) is MN-major, loaded as BN/64 slabs of 64 columns and read
//! transposed (`imm-trans-b`). Rows and K beyond the tensors are zero-filled by
//! the TMA unit, so ragged shapes need no masks in the K loop.

use super::gemm::{after_loop, before_loop, grid_rotation, grouped_tile, Geometry};
use super::{config_err, Emitter, Lowered, Param};
use crate::dtype::DType;
use crate::error::CodegenError;
use crate::ir::*;
use crate::plan::GemmShape;
use std::fmt::Write;

/// The bytes of one 64-element (128-byte) swizzle row times 8 rows.
const ATOM: usize = 1024;

const HELPERS: &str = r#"
struct __align__(64) tf_tmap { tf_u64 v[16]; };
__device__ __forceinline__ void tf_mbar_init(tf_u32 bar, tf_u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void tf_mbar_expect_tx(tf_u32 bar, tf_u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tf_mbar_arrive(tf_u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ bool tf_mbar_test(tf_u32 bar, tf_u32 parity) {
  tf_u32 ok;
  asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
               : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok != 0;
}
__device__ __forceinline__ void tf_mbar_wait(tf_u32 bar, tf_u32 parity) { while (!tf_mbar_test(bar, parity)) {} }
__device__ __forceinline__ void tf_tma_2d(tf_u32 dst, const tf_tmap* map, int c0, int c1, tf_u32 bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               :: "r"(dst), "l"((tf_u64)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// A shared-memory matrix descriptor: 128-byte swizzle, byte offsets >> 4.
__device__ __forceinline__ tf_u64 tf_wgmma_desc(tf_u32 addr, tf_u32 lbo, tf_u32 sbo) {
  return (tf_u64)((addr & 0x3FFFF) >> 4) | ((tf_u64)(lbo >> 4) << 16) | ((tf_u64)(sbo >> 4) << 32) | (1ull << 62);
}
"#;

/// The `wgmma.m64n{bn}k16` wrapper: `d` is the thread's `bn / 2` accumulators.
fn wgmma_fn(bn: usize, dtype: DType) -> String {
    let ty = if dtype == DType::BF16 { "bf16" } else { "f16" };
    let n = bn / 2;
    let regs: Vec<String> = (0..n).map(|i| format!("%{i}")).collect();
    let outs: Vec<String> = (0..n).map(|i| format!("\"+f\"(d[{i}])")).collect();
    format!(
        r#"__device__ __forceinline__ void tf_wgmma(float* d, tf_u64 da, tf_u64 db) {{
  asm volatile("{{ .reg .pred p; setp.ne.b32 p, %{s}, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ty}.{ty} {{{regs}}}, %{da}, %{db}, p, 1, 1, 0, 1; }}"
               : {outs}
               : "l"(da), "l"(db), "r"(1));
}}
"#,
        s = n + 2,
        da = n,
        db = n + 1,
        regs = regs.join(", "),
        outs = outs.join(", "),
    )
}

pub(super) fn emit(e: &mut Emitter, g: &GemmShape) -> Result<Lowered, CodegenError> {
    let c = e.cfg.clone();
    let (bm, bn, bk) = (c.block_sizes[g.m], c.block_sizes[g.n], c.block_sizes[g.k]);
    let err = |m: String| config_err(e.k, &c, m);
    let consumers = c.num_warps / 4;
    if !matches!(c.num_warps, 4 | 8) || bm != 64 * consumers {
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
                "the wgmma path loads with TMA, which needs the {role} operand `{}` contiguous along its last dimension with 16-byte aligned rows",
                e.k.tensors[t].name
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

    let stages = c.num_stages;
    let a_stage = bm * bk * 2;
    let b_stage = bk * bn * 2;
    let slab = bk * 64 * 2;
    let tiles_bytes = stages * (a_stage + b_stage);
    // Barriers after the tiles; 1024 bytes of slack to align the ring to a swizzle atom.
    let shared = tiles_bytes + 2 * stages * 8 + ATOM;
    let threads = 128 * (consumers + 1);
    let (ext_m, ext_n, ext_k) = (
        e.k.dims[g.m].extent,
        e.k.dims[g.n].extent,
        e.k.dims[g.k].extent,
    );
    let (dm, dn) = (g.m, g.n);
    let (ta, tb) = (g.a, g.b);

    let helpers = format!("{HELPERS}{}", wgmma_fn(bn, dtype));
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
                },
                "const __grid_constant__ tf_tmap tf_map_a",
            ),
            (
                Param::TensorMap {
                    tensor: tb,
                    box_inner: 64,
                    box_outer: bk,
                },
                "const __grid_constant__ tf_tmap tf_map_b",
            ),
        ],
    );
    let rotate = grid_rotation(e, g, bm, bn)?;
    let gm = c.group_m.max(1);
    let _ = write!(
        e.out,
        r#"  extern __shared__ __align__(1024) unsigned char tf_smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const long long M = s{ext_m}, N = s{ext_n}, K = s{ext_k};
  const long long tiles_m = (M + {bm} - 1) / {bm}, tiles_n = (N + {bn} - 1) / {bn};
  const long long pid = blockIdx.x;
{tile}  // The ring: stage s holds A at sA + s * {a_stage} and B's {slabs} slabs of 64 columns
  // at sB + s * {b_stage}; full[s] / empty[s] barriers after it.
  const tf_u32 tf_base = (tf_smem_u32(tf_smem) + {atom_m1}u) & ~{atom_m1}u;
  const tf_u32 sA = tf_base, sB = tf_base + {a_ring}u, tf_full = tf_base + {tiles_bytes}u, tf_empty = tf_full + {bar_bytes}u;
  const int KT = (int)((K + {bk} - 1) / {bk});
  if (tid == 0) {{
    for (int s = 0; s < {stages}; ++s) {{
      tf_mbar_init(tf_full + s * 8, 1);
      tf_mbar_init(tf_empty + s * 8, {consumer_threads});
    }}
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }}
  __syncthreads();
"#,
        slabs = bn / 64,
        atom_m1 = ATOM - 1,
        a_ring = stages * a_stage,
        bar_bytes = stages * 8,
        consumer_threads = 128 * consumers,
        tile = grouped_tile(gm, &rotate, g, bm, bn),
    );
    // Block-level statements before the K loop (`wait`s, scalar lets): every thread.
    let body = e.k.body.clone();
    for s in &body[..g.k_loop] {
        if matches!(s, Stmt::Wait { .. }) {
            e.block_stmt(s, "  ")?;
        }
    }
    let has_wait = body[..g.k_loop]
        .iter()
        .any(|s| matches!(s, Stmt::Wait { .. }));
    let proxy_fence = if has_wait {
        // Flags acquired by a generic load; the TMA unit reads through the async proxy.
        "      asm volatile(\"fence.proxy.async.global;\" ::: \"memory\");\n"
    } else {
        ""
    };
    let b_loads: String = (0..bn / 64)
        .map(|j| {
            format!(
                "      tf_tma_2d(sB + s * {b_stage}u + {off}u, &tf_map_b, (int)(tb{dn} + {col}), kt * {bk}, tf_full + s * 8);\n",
                off = j * slab,
                col = j * 64
            )
        })
        .collect();
    let _ = write!(
        e.out,
        r#"  if (warp < 4) {{
    // Producer warpgroup: one thread issues the loads.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (tid == 0) {{
{proxy_fence}      for (int kt = 0; kt < KT; ++kt) {{
        const int s = kt % {stages};
        if (kt >= {stages}) tf_mbar_wait(tf_empty + s * 8, ((kt / {stages}) & 1) ^ 1);
        tf_mbar_expect_tx(tf_full + s * 8, {stage_bytes}u);
        tf_tma_2d(sA + s * {a_stage}u, &tf_map_a, kt * {bk}, (int)tb{dm}, tf_full + s * 8);
{b_loads}      }}
    }}
  }} else {{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 {maxreg};");
    // Consumer warp w (0..{cw}) owns rows 16w..16w+15 of the block's tile.
    const int wm0 = (warp - 4) * 16, wn0 = 0;
    const int wg = (warp - 4) >> 2;
    float acc[1][{ni}][4];
"#,
        stage_bytes = a_stage + b_stage,
        maxreg = if consumers == 2 { 232 } else { 240 },
        cw = 4 * consumers - 1,
        ni = bn / 8,
    );
    let geo = Geometry {
        bm,
        bn,
        bk,
        wm: 4 * consumers,
        wn: 1,
        mi: 1,
        ni: bn / 8,
        threads,
        stages,
    };
    before_loop(e, g, &geo, None)?;
    let mut kk = String::new();
    for k16 in 0..bk / 16 {
        let _ = writeln!(
            kk,
            "        tf_wgmma(&acc[0][0][0], tf_wgmma_desc(a_s + {}u, 16u, {ATOM}u), tf_wgmma_desc(b_s + {}u, {slab}u, {ATOM}u));",
            k16 * 32,
            k16 * 16 * 128
        );
    }
    let _ = write!(
        e.out,
        r#"    for (int kt = 0; kt < KT; ++kt) {{
      const int s = kt % {stages};
      tf_mbar_wait(tf_full + s * 8, (kt / {stages}) & 1);
      const tf_u32 a_s = sA + s * {a_stage}u + wg * {wg_rows}u, b_s = sB + s * {b_stage}u;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
{kk}      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      tf_mbar_arrive(tf_empty + s * 8);
    }}
"#,
        wg_rows = 64 * 128,
    );
    after_loop(e, g, &geo, "    ")?;
    e.out.push_str("  }\n}\n");
    Ok(e.finish(params, threads, shared, "gemm/wgmma"))
}
