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
use super::epilogue::{self, gemm, Epilogue, Gemm, Wait};
use super::workspace::{FusedNeeds, Workspace};
use super::{run_call, unfused, Algorithm, OpOptions, ScatterDim};
use crate::{bf16, Config, Result, Tensor};
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

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Kind {
    ReduceScatter,
    AllReduce,
}

/// One matmul + reduce-scatter or all-reduce, its checks done: what a call or
/// a plan runs.
pub(crate) struct Schedule {
    kind: Kind,
    pub out: Tensor<bf16>,
    pub a: Tensor<bf16>,
    pub b: Tensor<bf16>,
    /// Bias vectors along the whole product (`[M]`, `[N]`) when added per
    /// rank, else like `C` and the aux in `out`'s coordinates.
    pub epi: Epilogue,
    /// The bias goes into every rank's partial product (the ops' formula,
    /// `reduce(A·B + bias)`), not once after the reduction (plans).
    pub bias_per_rank: bool,
    m: usize,
    n: usize,
    slabs: Vec<Slab>,
    chunks: usize,
    /// Bytes of one staging slot (the largest slab, 256-byte aligned).
    slot_bytes: usize,
    gemm_config: Option<Config>,
    zeros: Tensor<bf16>,
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
    let kind = Kind::ReduceScatter;
    let shapes = Shapes::check(
        pg,
        OP,
        kind,
        [("out", out), ("a", a), ("b", b)],
        dim,
        opts.config.chunks,
    )?;
    call(pg, OP, shapes, [out, a, b], opts, workspace)
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
    let kind = Kind::AllReduce;
    // Row slabs: each finished slab is one contiguous block to pull.
    let shapes = Shapes::check(
        pg,
        OP,
        kind,
        [("out", out), ("a", a), ("b", b)],
        ScatterDim::Rows,
        opts.config.chunks,
    )?;
    call(pg, OP, shapes, [out, a, b], opts, workspace)
}

fn call(
    pg: &ProcessGroup,
    op: &'static str,
    shapes: Shapes,
    tensors: [&Tensor<bf16>; 3],
    opts: &OpOptions<'_>,
    workspace: Option<Workspace>,
) -> Result<Workspace> {
    let ws = shapes.workspace(pg, op, workspace, opts.config.algorithm)?;
    let [m, n] = shapes.product();
    let epi = check::bias_epilogue(pg, op, opts.bias, m, n, &ws.zeros)?;
    let s = shapes.schedule(tensors, epi, true, opts.config.gemm.clone(), &ws);
    run_call(ws, pg, op, opts, |ws, p| s.run(ws, pg, p))
}

/// The shapes of a matmul + reduce-scatter or all-reduce, checked.
pub(crate) struct Shapes {
    kind: Kind,
    dim: ScatterDim,
    m: usize,
    k: usize,
    n: usize,
    chunks: usize,
}

impl Shapes {
    /// Checks `out`, `a` and `b` (names as the caller knows them); the
    /// all-reduce takes `ScatterDim::Rows`.
    pub fn check(
        pg: &ProcessGroup,
        op: &str,
        kind: Kind,
        [out, a, b]: [(&str, &Tensor<bf16>); 3],
        dim: ScatterDim,
        chunks: Option<usize>,
    ) -> Result<Shapes> {
        let w = pg.world_size();
        let [m, k] = check::matrix(pg, op, a.0, a.1)?;
        let [kb, n] = check::matrix(pg, op, b.0, b.1)?;
        if kb != k {
            return Err(arg(
                op,
                b.0,
                format!("has {kb} rows, but {} has {k} columns", a.0),
            ));
        }
        let [mo, no] = check::matrix(pg, op, out.0, out.1)?;
        match kind {
            Kind::ReduceScatter => {
                let want = match dim {
                    ScatterDim::Cols => [m, check::divides(op, b.0, "column count N", n, w)?],
                    ScatterDim::Rows => [check::divides(op, a.0, "row count M", m, w)?, n],
                };
                check::shape_is(op, out.0, [mo, no], want, "this rank's slab of the product")?;
            }
            Kind::AllReduce => {
                check::shape_is(op, out.0, [mo, no], [m, n], "the product a · b")?;
                if m < w {
                    return Err(arg(
                        op,
                        a.0,
                        format!(
                            "has {m} rows; the all-reduce cuts them into one slab per rank and needs at least {w}"
                        ),
                    ));
                }
            }
        }
        let chunks = check::chunks(op, chunks)?;
        Ok(Shapes {
            kind,
            dim,
            m,
            k,
            n,
            chunks,
        })
    }

    /// The product's `[m, n]`.
    pub fn product(&self) -> [usize; 2] {
        [self.m, self.n]
    }

    fn slot_bytes(&self, w: usize) -> usize {
        let (max_rows, max_cols) = self.max_slab(w);
        (max_rows * max_cols * 2).div_ceil(256) * 256
    }

    fn max_slab(&self, w: usize) -> (usize, usize) {
        slabs(self.dim, self.m, self.n, w)
            .iter()
            .fold((0, 0), |(r, c), s| (r.max(s.rows), c.max(s.cols)))
    }

    pub fn workspace(
        &self,
        pg: &ProcessGroup,
        op: &str,
        given: Option<Workspace>,
        algorithm: Algorithm,
    ) -> Result<Workspace> {
        let w = pg.world_size();
        let (m, k, n, dim, chunks) = (self.m, self.k, self.n, self.dim, self.chunks);
        let key = format!("{op}/{dim:?}/a{m}x{k}/b{k}x{n}/world{w}/chunks{chunks}");
        let slot_bytes = self.slot_bytes(w);
        let (max_rows, max_cols) = self.max_slab(w);
        Workspace::prepare(given, pg, key, algorithm, m.max(n), || FusedNeeds {
            // w - 1 hops, and the finished slab (all-reduce).
            data_bytes: slot_bytes * w,
            flag_slots: (w - 1) * chunks + (w - 1) + w,
            local: (0..w.saturating_sub(1))
                .map(|_| vec![max_rows, max_cols])
                .collect(),
        })
    }

    pub fn schedule(
        &self,
        [out, a, b]: [&Tensor<bf16>; 3],
        epi: Epilogue,
        bias_per_rank: bool,
        gemm_config: Option<Config>,
        ws: &Workspace,
    ) -> Schedule {
        let w = ws.world();
        Schedule {
            kind: self.kind,
            out: out.clone(),
            a: a.clone(),
            b: b.clone(),
            epi,
            bias_per_rank,
            m: self.m,
            n: self.n,
            slabs: slabs(self.dim, self.m, self.n, w),
            chunks: self.chunks,
            slot_bytes: self.slot_bytes(w),
            gemm_config,
            zeros: ws.zeros.clone(),
        }
    }
}

impl Schedule {
    /// The operands of slab `s`'s product.
    fn operands(&self, s: Slab) -> Result<[Tensor<bf16>; 2]> {
        Ok([
            self.a.narrow(0, s.row0, s.rows)?,
            self.b.narrow(1, s.col0, s.cols)?,
        ])
    }

    /// The epilogue of this rank's partial product of slab `s` (before the
    /// reduction): alpha, and the bias when it goes in per rank.
    fn partial_epilogue(&self, s: Slab) -> Result<Epilogue> {
        let e = self.slab_bias(s)?;
        let zeros = [
            self.zeros.narrow(0, 0, s.rows)?,
            self.zeros.narrow(0, 0, s.cols)?,
        ];
        Ok(e.partial(self.bias_per_rank, &zeros[0], &zeros[1]))
    }

    /// The whole epilogue with the bias vectors of slab `s`; `C` and the aux
    /// cut to the slab where `out` holds more than it (the all-reduce).
    fn slab_bias(&self, s: Slab) -> Result<Epilogue> {
        let mut e = self.epi.clone();
        // A bias added once (plans) is in `out`'s coordinates, like `C`: for
        // the reduce-scatter that is this rank's slab already.
        if self.bias_per_rank || self.kind == Kind::AllReduce {
            e.bias_m = e.bias_m.narrow(0, s.row0, s.rows)?;
            e.bias_n = e.bias_n.narrow(0, s.col0, s.cols)?;
        }
        if self.kind == Kind::AllReduce {
            let rows = |t: &Tensor<bf16>| t.narrow(0, s.row0, s.rows);
            e.c =
                e.c.map(|(beta, c)| rows(&c).map(|c| (beta, c)))
                    .transpose()?;
            e.aux_out = e.aux_out.as_ref().map(rows).transpose()?;
            e.aux_in = e.aux_in.as_ref().map(rows).transpose()?;
        }
        Ok(e)
    }

    pub fn run(&self, ws: &mut Workspace, pg: &ProcessGroup, path: Algorithm) -> Result<()> {
        if path == Algorithm::Unfused {
            return self.run_unfused(ws, pg);
        }
        self.run_fused(ws, pg)
    }

    fn run_fused(&self, ws: &mut Workspace, pg: &ProcessGroup) -> Result<()> {
        let c = self;
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
        let unused = ws.unused.clone();
        let ex = ws.exchange()?;
        let epoch = ex.start()? as usize;
        if push_fin {
            // The peer's copy out of its slot, last call, is done.
            ex.launch_barrier()?;
        }
        for step in 0..w {
            let j = (r + w - 1 - step) % w;
            let slab = c.slabs[j];
            let [a, b] = c.operands(slab)?;
            let last = step == w - 1;
            let epi = if last {
                c.slab_bias(slab)?
            } else {
                c.partial_epilogue(slab)?
            };
            let dst = match (last, c.kind) {
                (false, _) => ex.data::<bf16>(step * c.slot_bytes, &[slab.rows, slab.cols])?,
                (true, Kind::ReduceScatter) => c.out.clone(),
                (true, Kind::AllReduce) => c.out.narrow(0, slab.row0, slab.rows)?,
            };
            if step == 0 {
                gemm(
                    Gemm {
                        a: &a,
                        b: &b,
                        out: &dst,
                        copy: None,
                        addend: None,
                    },
                    &epi,
                    None,
                    &unused,
                    &c.gemm_config,
                )?;
            } else {
                let addend = local[step - 1]
                    .narrow(0, 0, slab.rows)?
                    .narrow(1, 0, slab.cols)?;
                let flags = ex.flags((step - 1) * chunks, chunks)?;
                let shape = [slab.rows, slab.cols];
                let fin_copy = match (last && c.kind == Kind::AllReduce, push_fin) {
                    (false, _) => None,
                    (true, true) => {
                        Some(ex.peer_data::<bf16>(next, (w - 1) * c.slot_bytes, &shape)?)
                    }
                    (true, false) => Some(ex.data::<bf16>((w - 1) * c.slot_bytes, &shape)?),
                };
                gemm(
                    Gemm {
                        a: &a,
                        b: &b,
                        out: &dst,
                        copy: fin_copy.as_ref(),
                        addend: Some(&addend),
                    },
                    &epi,
                    Some(Wait {
                        flags: &flags,
                        rows_per_chunk: rows_per_chunk(slab),
                        flags_per_chunk: 1,
                        epoch,
                        first_row: 0,
                    }),
                    &unused,
                    &c.gemm_config,
                )?;
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

    fn run_unfused(&self, ws: &mut Workspace, pg: &ProcessGroup) -> Result<()> {
        let c = self;
        let dev = pg.device().clone();
        let (m, n) = (c.m, c.n);
        let nccl = pg.nccl()?;
        let unused = ws.unused.clone();
        // What is left after the reduction: for the all-reduce the whole
        // product's, for the reduce-scatter this rank's slab's.
        let whole = Slab {
            row0: 0,
            rows: m,
            col0: 0,
            cols: n,
        };
        let mine = match c.kind {
            Kind::AllReduce => whole,
            Kind::ReduceScatter => c.slabs[pg.rank()],
        };
        let zeros = [
            self.zeros.narrow(0, 0, mine.rows)?,
            self.zeros.narrow(0, 0, mine.cols)?,
        ];
        let after = match c.kind {
            Kind::AllReduce => c.epi.clone(),
            Kind::ReduceScatter => c.slab_bias(mine)?,
        }
        .after_reduce(c.bias_per_rank, &zeros[0], &zeros[1]);
        match c.kind {
            Kind::AllReduce => {
                let target = if c.out.is_contiguous() {
                    c.out.clone()
                } else {
                    ws.scratch(&dev, 0, &[m, n])?
                };
                let partial = c.partial_epilogue(whole)?;
                unfused::matmul_epilogue(&target, &c.a, &c.b, &partial, &unused)?;
                nccl.all_reduce(&target, &target)?;
                if !c.out.is_contiguous() {
                    c.out.copy_from(&target)?;
                }
            }
            Kind::ReduceScatter => {
                // NCCL scatters contiguous blocks: lay the slabs out one after the other.
                let parts = ws.scratch(&dev, 0, &[m * n])?;
                let mut offset = 0;
                for slab in &c.slabs {
                    let view = parts.narrow(0, offset, slab.rows * slab.cols)?;
                    let view = view.reshape([slab.rows, slab.cols])?;
                    let [a, b] = c.operands(*slab)?;
                    unfused::matmul_epilogue(&view, &a, &b, &c.partial_epilogue(*slab)?, &unused)?;
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
            }
        }
        epilogue::apply(&c.out, &after, &unused)
    }
}
