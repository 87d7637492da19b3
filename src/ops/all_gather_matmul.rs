//! `out = all_gather(A) · B + bias`, A sharded along rows or columns.
//!
//! Fused: the gathered A lives in symmetric memory; each rank copies its shard
//! into its own part, tells the peers, and pulls theirs with the copy engine in
//! chunks, setting one flag per chunk. The GEMM, launched at once, waits per
//! tile for the chunks its rows need. Along rows the tile order starts at this
//! rank's own rows (there first); along columns every tile needs every rank's
//! columns of its rows, so the chunks are rows of all ranks at once, in order.

use super::check::{self, arg};
use super::kernels::gemm_wait;
use super::workspace::{FusedNeeds, Workspace};
use super::{run_call, unfused, with_gemm_config, Algorithm, GatherDim, OpOptions};
use crate::{bf16, Result, Tensor};
use tilefuse_runtime::dist::ProcessGroup;

const OP: &str = "all_gather_matmul";

struct Call<'a> {
    out: &'a Tensor<bf16>,
    a_shard: &'a Tensor<bf16>,
    b: &'a Tensor<bf16>,
    bias: Option<(Tensor<bf16>, Tensor<bf16>)>,
    zero_bias: (Tensor<bf16>, Tensor<bf16>),
    dim: GatherDim,
    /// Shard rows and columns; gathered [m, k].
    shard: [usize; 2],
    m: usize,
    k: usize,
    /// Chunks per rank (rows) or in all (columns), and rows per chunk.
    chunks: usize,
    rows_per_chunk: usize,
    opts: &'a OpOptions<'a>,
}

/// `out[M, N] = all_gather(A) · B + bias` over the ranks of `pg`.
///
/// - `GatherDim::Rows`: `a_shard` is `[M/w, K]`, rank `r`'s rows `r·M/w ..` of A;
/// - `GatherDim::Cols`: `a_shard` is `[M, K/w]`, rank `r`'s columns `r·K/w ..`.
///
/// `b` is `[K, N]` on every rank. The bias (length M or N) is added once. See
/// [`crate::ops`] for the options and the workspace.
pub fn all_gather_matmul(
    pg: &ProcessGroup,
    out: &Tensor<bf16>,
    a_shard: &Tensor<bf16>,
    b: &Tensor<bf16>,
    dim: GatherDim,
    opts: &OpOptions<'_>,
    workspace: Option<Workspace>,
) -> Result<Workspace> {
    let w = pg.world_size();
    let [sr, sc] = check::matrix(pg, OP, "a_shard", a_shard)?;
    let [kb, n] = check::matrix(pg, OP, "b", b)?;
    let [mo, no] = check::matrix(pg, OP, "out", out)?;
    let (m, k) = match dim {
        GatherDim::Rows => (sr * w, sc),
        GatherDim::Cols => (sr, sc * w),
    };
    if kb != k {
        return Err(arg(
            OP,
            "b",
            format!("has {kb} rows, but the gathered A ({dim:?}: {w} shards of [{sr}, {sc}]) has {k} columns"),
        ));
    }
    check::shape_is(OP, "out", [mo, no], [m, n], "all_gather(A) · B")?;
    let asked = check::chunks(OP, opts.config.chunks)?;
    let (chunks, rows_per_chunk) = match dim {
        // Flags are per rank and chunk: chunks must tile each shard exactly.
        GatherDim::Rows => {
            let c = (1..=asked.min(sr)).rev().find(|c| sr % c == 0).unwrap_or(1);
            (c, sr / c)
        }
        GatherDim::Cols => {
            let rpc = m.div_ceil(asked.min(m));
            (m.div_ceil(rpc), rpc)
        }
    };
    let key = format!("{OP}/{dim:?}/a_shard{sr}x{sc}/b{k}x{n}/world{w}/chunks{chunks}");
    let ws = Workspace::prepare(workspace, pg, key, opts.config.algorithm, m.max(n), || {
        FusedNeeds {
            data_bytes: m * k * 2,
            flag_slots: w * chunks + w,
            local: vec![],
        }
    })?;
    let (bias, zero_bias) = check::bias_views(pg, OP, opts.bias, m, n, &ws.zeros)?;
    let call = Call {
        out,
        a_shard,
        b,
        bias,
        zero_bias,
        dim,
        shard: [sr, sc],
        m,
        k,
        chunks,
        rows_per_chunk,
        opts,
    };
    run_call(ws, pg, OP, opts, |ws, p| run(ws, pg, p, &call))
}

fn run(ws: &mut Workspace, pg: &ProcessGroup, path: Algorithm, c: &Call<'_>) -> Result<()> {
    if path == Algorithm::Unfused {
        return run_unfused(ws, pg, c);
    }
    let (r, w) = (pg.rank(), pg.world_size());
    let [sr, sc] = c.shard;
    let (m, k, chunks, rpc) = (c.m, c.k, c.chunks, c.rows_per_chunk);
    let ex = ws.exchange()?;
    let gathered = ex.data::<bf16>(0, &[m, k])?;
    let own = match c.dim {
        GatherDim::Rows => gathered.narrow(0, r * sr, sr)?,
        GatherDim::Cols => gathered.narrow(1, r * sc, sc)?,
    };
    // A shard written in place (a view of the workspace) needs no copy.
    if own.device_ptr() != c.a_shard.device_ptr() || own.strides() != c.a_shard.strides() {
        own.copy_from(c.a_shard)?;
    }
    let epoch = ex.start()?;
    let ready = w * chunks; // + p: rank p's shard is written
    let others = (1..w).map(|i| (r + i) % w);
    for p in others.clone() {
        ex.notify(p, ready + r)?;
    }
    let (bias_m, bias_n) = c.bias.as_ref().unwrap_or(&c.zero_bias);
    match c.dim {
        GatherDim::Rows => {
            // Flag p·chunks + i: chunk i of rank p's rows.
            for i in 0..chunks {
                ex.set_slot(r * chunks + i)?;
            }
            for p in others {
                ex.await_slot(ready + p)?;
                for i in 0..chunks {
                    let row = p * sr + i * rpc;
                    ex.pull(p, row * k * 2, k, &gathered.narrow(0, row, rpc)?)?;
                    ex.set_slot(p * chunks + i)?;
                }
            }
            let flags = ex.flags(0, w * chunks)?;
            with_gemm_config(gemm_wait::kernel(), &c.opts.config.gemm, || {
                gemm_wait(
                    &gathered,
                    c.b,
                    c.out,
                    bias_m,
                    bias_n,
                    &flags,
                    rpc,
                    1,
                    epoch as usize,
                    r * sr,
                )
            })?;
        }
        GatherDim::Cols => {
            // Flag i·w + p: rank p's columns of row chunk i.
            for i in 0..chunks {
                ex.set_slot(i * w + r)?;
            }
            for p in others.clone() {
                ex.await_slot(ready + p)?;
            }
            for i in 0..chunks {
                let (row, rows) = (i * rpc, rpc.min(m - i * rpc));
                for p in others.clone() {
                    let dst = gathered.narrow(0, row, rows)?.narrow(1, p * sc, sc)?;
                    ex.pull(p, (row * k + p * sc) * 2, k, &dst)?;
                    ex.set_slot(i * w + p)?;
                }
            }
            let flags = ex.flags(0, w * chunks)?;
            with_gemm_config(gemm_wait::kernel(), &c.opts.config.gemm, || {
                gemm_wait(
                    &gathered,
                    c.b,
                    c.out,
                    bias_m,
                    bias_n,
                    &flags,
                    rpc,
                    w,
                    epoch as usize,
                    0,
                )
            })?;
        }
    }
    ex.close()
}

fn run_unfused(ws: &mut Workspace, pg: &ProcessGroup, c: &Call<'_>) -> Result<()> {
    let dev = pg.device().clone();
    let w = pg.world_size();
    let [sr, sc] = c.shard;
    let send = unfused::contiguous(ws, &dev, 0, c.a_shard)?;
    let gathered = match c.dim {
        GatherDim::Rows => {
            let g = ws.scratch(&dev, 1, &[c.m, c.k])?;
            pg.nccl()?.all_gather(&send, &g)?;
            g
        }
        GatherDim::Cols => {
            // NCCL gathers rank after rank: [w·M, K/w]; the columns go in place after.
            let g3 = ws.scratch(&dev, 1, &[w * sr, sc])?;
            pg.nccl()?.all_gather(&send, &g3)?;
            let g = ws.scratch(&dev, 2, &[c.m, c.k])?;
            for p in 0..w {
                g.narrow(1, p * sc, sc)?
                    .copy_from(&g3.narrow(0, p * sr, sr)?)?;
            }
            g
        }
    };
    unfused::matmul_bias(c.out, &gathered, c.b, c.bias.as_ref())
}
