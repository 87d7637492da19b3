//! `out = all_gather(A · B + bias)` along rows.
//!
//! Fused: the GEMM runs in row chunks, each storing its rows twice, into this
//! rank's rows of `out` and into a symmetric staging buffer. After each chunk the
//! backend stream tells the peers, and pulls the same chunk of every peer's
//! staging into `out` with the copy engine while the next chunk computes; only
//! the last chunk's transfer is left after the GEMM.

use super::check::{self, arg};
use super::kernels::gemm_dual;
use super::workspace::{FusedNeeds, Workspace};
use super::{run_call, unfused, with_gemm_config, Algorithm, OpOptions};
use crate::{bf16, Result, Tensor};
use tilefuse_runtime::dist::ProcessGroup;

const OP: &str = "matmul_all_gather";

struct Call<'a> {
    out: &'a Tensor<bf16>,
    a: &'a Tensor<bf16>,
    b: &'a Tensor<bf16>,
    bias: Option<(Tensor<bf16>, Tensor<bf16>)>,
    zero_bias: (Tensor<bf16>, Tensor<bf16>),
    m: usize,
    n: usize,
    chunks: usize,
    rows_per_chunk: usize,
    opts: &'a OpOptions<'a>,
}

/// `out[w·M, N] = all_gather(A · B + bias)`: rank `r`'s product `a[M, K] · b[K, N]`
/// (plus its own bias, of length M or N) becomes rows `r·M ..` of `out` on every
/// rank. See [`crate::ops`] for the options and the workspace.
pub fn matmul_all_gather(
    pg: &ProcessGroup,
    out: &Tensor<bf16>,
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    opts: &OpOptions<'_>,
    workspace: Option<Workspace>,
) -> Result<Workspace> {
    let w = pg.world_size();
    let [m, k] = check::matrix(pg, OP, "a", a)?;
    let [kb, n] = check::matrix(pg, OP, "b", b)?;
    if kb != k {
        return Err(arg(
            OP,
            "b",
            format!("has {kb} rows, but a has {k} columns"),
        ));
    }
    let [mo, no] = check::matrix(pg, OP, "out", out)?;
    check::shape_is(
        OP,
        "out",
        [mo, no],
        [w * m, n],
        "world × a's rows, b's columns",
    )?;
    let asked = check::chunks(OP, opts.config.chunks)?;
    let rows_per_chunk = m.div_ceil(asked.min(m));
    let chunks = m.div_ceil(rows_per_chunk);
    let key = format!("{OP}/a{m}x{k}/b{k}x{n}/world{w}/chunks{chunks}");
    let ws = Workspace::prepare(workspace, pg, key, opts.config.algorithm, m.max(n), || {
        FusedNeeds {
            data_bytes: m * n * 2,
            flag_slots: w * chunks,
            local: vec![],
        }
    })?;
    let (bias, zero_bias) = check::bias_views(pg, OP, opts.bias, m, n, &ws.zeros)?;
    let call = Call {
        out,
        a,
        b,
        bias,
        zero_bias,
        m,
        n,
        chunks,
        rows_per_chunk,
        opts,
    };
    run_call(ws, pg, OP, opts, |ws, p| run(ws, pg, p, &call))
}

fn run(ws: &mut Workspace, pg: &ProcessGroup, path: Algorithm, c: &Call<'_>) -> Result<()> {
    let (r, w) = (pg.rank(), pg.world_size());
    let (m, n) = (c.m, c.n);
    if path == Algorithm::Unfused {
        let own = c.out.narrow(0, r * m, m)?;
        if c.out.is_contiguous() {
            unfused::matmul_bias(&own, c.a, c.b, c.bias.as_ref())?;
            // In place: this rank's part of the output is its send buffer.
            return pg.nccl()?.all_gather(&own, c.out);
        }
        let dev = pg.device().clone();
        let mine = ws.scratch(&dev, 0, &[m, n])?;
        unfused::matmul_bias(&mine, c.a, c.b, c.bias.as_ref())?;
        let all = ws.scratch(&dev, 1, &[w * m, n])?;
        pg.nccl()?.all_gather(&mine, &all)?;
        return c.out.copy_from(&all);
    }
    let (chunks, rpc) = (c.chunks, c.rows_per_chunk);
    let (bias_m, bias_n) = c.bias.as_ref().unwrap_or(&c.zero_bias);
    let ex = ws.exchange()?;
    let staging = ex.data::<bf16>(0, &[m, n])?;
    ex.start()?;
    for i in 0..chunks {
        let (lo, rows) = (i * rpc, rpc.min(m - i * rpc));
        with_gemm_config(gemm_dual::kernel(), &c.opts.config.gemm, || {
            gemm_dual(
                &c.a.narrow(0, lo, rows)?,
                c.b,
                &c.out.narrow(0, r * m + lo, rows)?,
                &staging.narrow(0, lo, rows)?,
                &bias_m.narrow(0, lo, rows)?,
                bias_n,
            )
        })?;
        // Flag p·chunks + i: chunk i of rank p's staging is written.
        ex.follow_launch()?;
        for p in (1..w).map(|d| (r + d) % w) {
            ex.notify(p, r * chunks + i)?;
        }
        for p in (1..w).map(|d| (r + d) % w) {
            ex.await_slot(p * chunks + i)?;
            ex.pull(p, lo * n * 2, n, &c.out.narrow(0, p * m + lo, rows)?)?;
        }
    }
    ex.close()
}
