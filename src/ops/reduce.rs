//! `reduce_scatter(A · B + bias)` and `all_reduce(A · B + bias)`.
//!
//! Fused, as a ring over the output's `w` slabs (column or row blocks): at step
//! `s` rank `r` computes its partial product of slab `j = r - 1 - s (mod w)`,
//! adding the partial sum of the same slab that rank `r - 1` computed at step
//! `s - 1`, and leaves the result in symmetric staging for rank `r + 1`; at the
//! last step the slab is its own, and the sum of every rank's product. The
//! backend stream pulls each incoming partial sum with the copy engine in row
//! chunks, one flag each, while the GEMM of the step before it runs; the next
//! GEMM waits per tile for the chunks of its rows. The all-reduce then needs
//! every peer's finished slab: over two ranks the last GEMM's epilogue stores it
//! into the peer's memory as well (NVLink stores, hidden in part under the
//! GEMM), and the peer copies it into `out`; over more, each rank pulls them.
//!
//! Partial sums travel in bf16, rounded once per hop, as NCCL's ring does; the
//! sum of the products inside a hop is exact to f32.

use super::check::{self, arg};
use super::kernels::{gemm_wait, gemm_wait_add, gemm_wait_add_dual};
use super::workspace::{FusedNeeds, Workspace};
use super::{run_call, unfused, with_gemm_config, Algorithm, OpOptions, ScatterDim};
use crate::{bf16, Result, Tensor};
use tilefuse_runtime::dist::ProcessGroup;

/// A block of the output: rows `row0 .. row0 + rows`, columns `col0 .. col0 + cols`.
#[derive(Clone, Copy, Debug)]
struct Slab {
    row0: usize,
    rows: usize,
    col0: usize,
    cols: usize,
}

/// The `w` slabs of an `[m, n]` output cut along `dim` (boundaries at `j·len/w`).
fn slabs(dim: ScatterDim, m: usize, n: usize, w: usize) -> Vec<Slab> {
    (0..w)
        .map(|j| match dim {
            ScatterDim::Rows => Slab {
                row0: j * m / w,
                rows: (j + 1) * m / w - j * m / w,
                col0: 0,
                cols: n,
            },
            ScatterDim::Cols => Slab {
                row0: 0,
                rows: m,
                col0: j * n / w,
                cols: (j + 1) * n / w - j * n / w,
            },
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    ReduceScatter,
    AllReduce,
}

struct Call<'a> {
    kind: Kind,
    out: &'a Tensor<bf16>,
    a: &'a Tensor<bf16>,
    b: &'a Tensor<bf16>,
    bias: Option<(Tensor<bf16>, Tensor<bf16>)>,
    zero_bias: (Tensor<bf16>, Tensor<bf16>),
    dim: ScatterDim,
    m: usize,
    n: usize,
    slabs: Vec<Slab>,
    chunks: usize,
    /// Bytes of one staging slot (the largest slab, 256-byte aligned).
    slot_bytes: usize,
    opts: &'a OpOptions<'a>,
}

/// `out = reduce_scatter(A · B + bias)` over the ranks of `pg`: every rank passes
/// its `a[M, K]` and `b[K, N]` (e.g. its K-shards), and rank `r` gets slab `r` of
/// the sum of all ranks' products: columns `r·N/w ..` (`ScatterDim::Cols`,
/// `out[M, N/w]`) or rows `r·M/w ..` (`ScatterDim::Rows`, `out[M/w, N]`). Each
/// rank's bias (length M or N) is added, so a bias given on every rank counts
/// `w` times (see [`crate::ops`]).
pub fn matmul_reduce_scatter(
    pg: &ProcessGroup,
    out: &Tensor<bf16>,
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    dim: ScatterDim,
    opts: &OpOptions<'_>,
    workspace: Option<Workspace>,
) -> Result<Workspace> {
    const OP: &str = "matmul_reduce_scatter";
    let w = pg.world_size();
    let [m, n] = product_shape(pg, OP, a, b)?;
    let [mo, no] = check::matrix(pg, OP, "out", out)?;
    let want = match dim {
        ScatterDim::Cols => [m, check::divides(OP, "b", "column count N", n, w)?],
        ScatterDim::Rows => [check::divides(OP, "a", "row count M", m, w)?, n],
    };
    check::shape_is(OP, "out", [mo, no], want, "this rank's slab of the product")?;
    execute(
        pg,
        Kind::ReduceScatter,
        OP,
        out,
        a,
        b,
        dim,
        [m, n],
        opts,
        workspace,
    )
}

/// `out[M, N] = all_reduce(A · B + bias)` over the ranks of `pg`: the sum of every
/// rank's `a[M, K] · b[K, N]` (plus each rank's bias, so a bias given on every
/// rank counts `w` times; see [`crate::ops`]), on every rank.
pub fn matmul_all_reduce(
    pg: &ProcessGroup,
    out: &Tensor<bf16>,
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    opts: &OpOptions<'_>,
    workspace: Option<Workspace>,
) -> Result<Workspace> {
    const OP: &str = "matmul_all_reduce";
    let [m, n] = product_shape(pg, OP, a, b)?;
    let [mo, no] = check::matrix(pg, OP, "out", out)?;
    check::shape_is(OP, "out", [mo, no], [m, n], "the product a · b")?;
    if m < pg.world_size() {
        return Err(arg(
            OP,
            "a",
            format!(
                "has {m} rows; the all-reduce cuts them into one slab per rank and needs at least {}",
                pg.world_size()
            ),
        ));
    }
    // Row slabs: each finished slab is one contiguous block to pull.
    execute(
        pg,
        Kind::AllReduce,
        OP,
        out,
        a,
        b,
        ScatterDim::Rows,
        [m, n],
        opts,
        workspace,
    )
}

fn product_shape(
    pg: &ProcessGroup,
    op: &str,
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
) -> Result<[usize; 2]> {
    let [m, k] = check::matrix(pg, op, "a", a)?;
    let [kb, n] = check::matrix(pg, op, "b", b)?;
    if kb != k {
        return Err(arg(
            op,
            "b",
            format!("has {kb} rows, but a has {k} columns"),
        ));
    }
    Ok([m, n])
}

#[allow(clippy::too_many_arguments)]
fn execute(
    pg: &ProcessGroup,
    kind: Kind,
    op: &'static str,
    out: &Tensor<bf16>,
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    dim: ScatterDim,
    [m, n]: [usize; 2],
    opts: &OpOptions<'_>,
    workspace: Option<Workspace>,
) -> Result<Workspace> {
    let w = pg.world_size();
    let k = a.size(1);
    let chunks = check::chunks(op, opts.config.chunks)?;
    let slabs = slabs(dim, m, n, w);
    let (max_rows, max_cols) = slabs
        .iter()
        .fold((0, 0), |(r, c), s| (r.max(s.rows), c.max(s.cols)));
    let slot_bytes = (max_rows * max_cols * 2).div_ceil(256) * 256;
    let key = format!("{op}/{dim:?}/a{m}x{k}/b{k}x{n}/world{w}/chunks{chunks}");
    let ws = Workspace::prepare(workspace, pg, key, opts.config.algorithm, m.max(n), || {
        FusedNeeds {
            // w - 1 hops, and the finished slab (all-reduce).
            data_bytes: slot_bytes * w,
            flag_slots: (w - 1) * chunks + (w - 1) + w,
            local: (0..w.saturating_sub(1))
                .map(|_| vec![max_rows, max_cols])
                .collect(),
        }
    })?;
    let (bias, zero_bias) = check::bias_views(pg, op, opts.bias, m, n, &ws.zeros)?;
    let call = Call {
        kind,
        out,
        a,
        b,
        bias,
        zero_bias,
        dim,
        m,
        n,
        slabs,
        chunks,
        slot_bytes,
        opts,
    };
    run_call(ws, pg, op, opts, |ws, p| run(ws, pg, p, &call))
}

/// The operands, bias and output views of slab `s`'s product.
fn slab_operands(c: &Call<'_>, s: Slab) -> Result<[Tensor<bf16>; 4]> {
    let (bias_m, bias_n) = c.bias.as_ref().unwrap_or(&c.zero_bias);
    Ok([
        c.a.narrow(0, s.row0, s.rows)?,
        c.b.narrow(1, s.col0, s.cols)?,
        bias_m.narrow(0, s.row0, s.rows)?,
        bias_n.narrow(0, s.col0, s.cols)?,
    ])
}

fn run(ws: &mut Workspace, pg: &ProcessGroup, path: Algorithm, c: &Call<'_>) -> Result<()> {
    if path == Algorithm::Unfused {
        return run_unfused(ws, pg, c);
    }
    let (r, w, chunks) = (pg.rank(), pg.world_size(), c.chunks);
    let (prev, next) = ((r + w - 1) % w, (r + 1) % w);
    // Flags: got(s, i) = s·chunks + i (chunk i of the hop-s partial pulled here),
    // ready(s) (rank r - 1's hop-s partial is staged), fin(p) (p's slab is done).
    let ready = |s: usize| (w - 1) * chunks + s;
    let fin = |p: usize| (w - 1) * chunks + (w - 1) + p;
    let rows_per_chunk = |s: Slab| s.rows.div_ceil(chunks.min(s.rows));
    // All-reduce over two ranks: the last GEMM's epilogue stores the finished
    // slab into the peer's memory too (measured: pulling it after the GEMM cost
    // 0.48 ms at 8192³, the stores 0.24 ms); more ranks pull it.
    let push_fin = c.kind == Kind::AllReduce && w == 2;
    let local = ws.local.clone();
    let ex = ws.exchange()?;
    let epoch = ex.start()? as usize;
    if push_fin {
        // The peer's copy out of its slot, last call, is done.
        ex.launch_barrier()?;
    }
    let cfg = &c.opts.config.gemm;
    for step in 0..w {
        let j = (r + w - 1 - step) % w;
        let slab = c.slabs[j];
        let [a, b, bm, bn] = slab_operands(c, slab)?;
        let last = step == w - 1;
        let dst = match (last, c.kind) {
            (false, _) => ex.data::<bf16>(step * c.slot_bytes, &[slab.rows, slab.cols])?,
            (true, Kind::ReduceScatter) => c.out.clone(),
            (true, Kind::AllReduce) => c.out.narrow(0, slab.row0, slab.rows)?,
        };
        if step == 0 {
            // Nothing to wait for: epoch 0 passes at once.
            let none = ex.flags(0, 1)?;
            with_gemm_config(gemm_wait::kernel(), cfg, || {
                gemm_wait(&a, &b, &dst, &bm, &bn, &none, slab.rows, 1, 0, 0)
            })?;
        } else {
            let addend = local[step - 1]
                .narrow(0, 0, slab.rows)?
                .narrow(1, 0, slab.cols)?;
            let flags = ex.flags((step - 1) * chunks, chunks)?;
            let rpc = rows_per_chunk(slab);
            if last && c.kind == Kind::AllReduce {
                let shape = [slab.rows, slab.cols];
                let fin_copy = if push_fin {
                    ex.peer_data::<bf16>(next, (w - 1) * c.slot_bytes, &shape)?
                } else {
                    ex.data::<bf16>((w - 1) * c.slot_bytes, &shape)?
                };
                with_gemm_config(gemm_wait_add_dual::kernel(), cfg, || {
                    gemm_wait_add_dual(
                        &a, &b, &addend, &dst, &fin_copy, &bm, &bn, &flags, rpc, epoch,
                    )
                })?;
            } else {
                with_gemm_config(gemm_wait_add::kernel(), cfg, || {
                    gemm_wait_add(&a, &b, &addend, &dst, &bm, &bn, &flags, rpc, epoch)
                })?;
            }
        }
        if !last {
            // Hand this partial to the next rank; pull the previous rank's, which
            // is the slab of the next step.
            ex.follow_launch()?;
            ex.notify(next, ready(step))?;
            ex.await_slot(ready(step))?;
            let incoming = c.slabs[(r + w - 2 - step) % w];
            let rpc = rows_per_chunk(incoming);
            for i in 0..incoming.rows.div_ceil(rpc) {
                let (lo, rows) = (i * rpc, rpc.min(incoming.rows - i * rpc));
                let dst = local[step]
                    .narrow(0, lo, rows)?
                    .narrow(1, 0, incoming.cols)?;
                ex.pull(
                    prev,
                    step * c.slot_bytes + lo * incoming.cols * 2,
                    incoming.cols,
                    &dst,
                )?;
                ex.set_slot(step * chunks + i)?;
            }
        }
    }
    if c.kind == Kind::AllReduce && w > 1 {
        ex.follow_launch()?;
        for p in (1..w).map(|d| (r + d) % w) {
            ex.notify(p, fin(r))?;
        }
        for p in (1..w).map(|d| (r + d) % w) {
            let slab = c.slabs[p];
            let dst = c.out.narrow(0, slab.row0, slab.rows)?;
            if push_fin {
                // Stored here by the peer's last kernel: a local copy on the launch stream.
                ex.await_slot_on_launch(fin(p))?;
                let src = ex.data::<bf16>((w - 1) * c.slot_bytes, &[slab.rows, slab.cols])?;
                dst.copy_from(&src)?;
            } else {
                ex.await_slot(fin(p))?;
                ex.pull(p, (w - 1) * c.slot_bytes, slab.cols, &dst)?;
            }
        }
    }
    ex.close()
}

fn run_unfused(ws: &mut Workspace, pg: &ProcessGroup, c: &Call<'_>) -> Result<()> {
    let dev = pg.device().clone();
    let (m, n) = (c.m, c.n);
    let nccl = pg.nccl()?;
    match (c.kind, c.dim) {
        (Kind::AllReduce, _) => {
            let target = if c.out.is_contiguous() {
                c.out.clone()
            } else {
                ws.scratch(&dev, 0, &[m, n])?
            };
            unfused::matmul_bias(&target, c.a, c.b, c.bias.as_ref())?;
            nccl.all_reduce(&target, &target)?;
            if !c.out.is_contiguous() {
                c.out.copy_from(&target)?;
            }
            Ok(())
        }
        (Kind::ReduceScatter, _) => {
            // NCCL scatters contiguous blocks: lay the slabs out one after the other.
            let parts = ws.scratch(&dev, 0, &[m * n])?;
            let mut offset = 0;
            for slab in &c.slabs {
                let view = parts.narrow(0, offset, slab.rows * slab.cols)?;
                let view = view.reshape([slab.rows, slab.cols])?;
                let [a, b, bm, bn] = slab_operands(c, *slab)?;
                let bias = c.bias.as_ref().map(|_| (bm, bn));
                unfused::matmul_bias(&view, &a, &b, bias.as_ref())?;
                offset += slab.rows * slab.cols;
            }
            let target = if c.out.is_contiguous() {
                c.out.clone()
            } else {
                ws.scratch(&dev, 1, c.out.dims())?
            };
            nccl.reduce_scatter(&parts.narrow(0, 0, m * n)?, &target)?;
            if !c.out.is_contiguous() {
                c.out.copy_from(&target)?;
            }
            Ok(())
        }
    }
}
