//! `reduce_scatter(A · B + bias)` and `all_reduce(A · B + bias)`.
//!
//! Fused, as a ring over the output's `w` slabs (column or row blocks): at step
//! `s` rank `r` computes its partial product of slab `j = r - 1 - s (mod w)`,
//! adding the partial sum of the same slab that rank `r - 1` computed at step
//! `s - 1`, and leaves the result in symmetric staging for rank `r + 1`; at the
//! last step the slab is its own, and the sum of every rank's product.
//! Each GEMM counts the area it finished per chunk of rows (`signal`), its tiles
//! visited band by band; the backend stream waits for each chunk's count and
//! tells the next rank, which pulls the chunk with the copy engine while the
//! GEMM is still computing the later ones; the next GEMM waits per tile for the
//! chunks of its rows. The all-reduce's last GEMM also stages its finished slab,
//! and every peer pulls it chunk by chunk the same way.
//!
//! Partial sums travel in bf16, rounded once per hop, as NCCL's ring does; the
//! sum of the products inside a hop is exact to f32.

use super::check::{self, arg};
use super::epilogue::{
    self, check_signal_config, chunk_area, gemm, signal_chunks, Epilogue, Gemm, Signal, Wait,
};
use super::workspace::{FusedNeeds, Workspace};
use super::{run_call, unfused, Algorithm, AllReduceVariant, OpOptions, ScatterDim};
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
    variant: AllReduceVariant,
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
    if let Some(v) = opts.config.all_reduce {
        return Err(arg(
            OP,
            "config.all_reduce",
            format!("{v:?} chooses how matmul_all_reduce sums; the reduce-scatter has no such choice, leave it None"),
        ));
    }
    let kind = Kind::ReduceScatter;
    let shapes = Shapes::check(
        pg,
        OP,
        kind,
        [("out", out), ("a", a), ("b", b)],
        dim,
        opts.config.chunks,
        None,
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
        opts.config.all_reduce,
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
    /// The all-reduce's variant (the ring for the reduce-scatter).
    variant: AllReduceVariant,
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
        variant: Option<AllReduceVariant>,
    ) -> Result<Shapes> {
        let variant = match (kind, variant) {
            (Kind::ReduceScatter, _) => AllReduceVariant::Ring,
            (Kind::AllReduce, v) => v.unwrap_or(AllReduceVariant::Ring),
        };
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
        // The ring all-reduce signals both its GEMMs: more, shorter chunks visit
        // tiles in narrower bands, which costs those GEMMs L2 reuse. Measured at
        // 4096×6656×16384 on 2×H200: 2 chunks 0.817 ms, 4 0.839, 8 0.929.
        let default = match variant {
            AllReduceVariant::Ring if kind == Kind::AllReduce => 2,
            _ => 4,
        };
        let chunks = check::chunks_or(op, chunks, default)?;
        Ok(Shapes {
            kind,
            variant,
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
        let slots = match self.kind {
            // Staged and received partials of w - 1 hops, and every rank's finished slab.
            Kind::AllReduce => 3 * w - 2,
            Kind::ReduceScatter => 2 * (w - 1),
        };
        // One-shot: every peer's whole partial product.
        let partials = match self.variant {
            AllReduceVariant::OneShot => (w - 1) * m * n * 2,
            AllReduceVariant::Ring => 0,
        };
        let key = format!("{key}/{:?}", self.variant);
        Workspace::prepare(given, pg, key, algorithm, m.max(n), || FusedNeeds {
            data_bytes: (slot_bytes * slots).max(partials).max(1),
            // Ring: counters (w steps), got flags (w - 1 hops), fin flags (w
            // ranks); one-shot: counters and every rank's got flags.
            flag_slots: (3 * w - 1) * chunks,
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
            variant: self.variant,
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
        match (self.kind, self.variant) {
            (Kind::AllReduce, AllReduceVariant::OneShot) => self.run_one_shot(ws, pg),
            _ => self.run_fused(ws, pg),
        }
    }

    /// The one-shot all-reduce (see [`AllReduceVariant::OneShot`]).
    fn run_one_shot(&self, ws: &mut Workspace, pg: &ProcessGroup) -> Result<()> {
        const OP: &str = "matmul_all_reduce";
        let c = self;
        let (r, w, cap) = (pg.rank(), pg.world_size(), c.chunks);
        let (m, n) = (c.m, c.n);
        check_signal_config(OP, &c.gemm_config)?;
        let (per, chunks) = signal_chunks(m, cap);
        let rows_of = |i: usize| (i * per, per.min(m - i * per));
        for i in 0..chunks {
            chunk_area(OP, rows_of(i).1, n)?;
        }
        let whole = Slab {
            row0: 0,
            rows: m,
            col0: 0,
            cols: n,
        };
        let zeros = [c.zeros.narrow(0, 0, m)?, c.zeros.narrow(0, 0, n)?];
        let after = c.epi.after_reduce(c.bias_per_rank, &zeros[0], &zeros[1]);
        let partial = c.partial_epilogue(whole)?;
        // Regions: partials(j), the whole partial product of rank r + 1 + j.
        // Flags: cnt(i) counts the area this rank's GEMM finished in chunk i;
        // got(j, i): chunk i of partials(j) is here.
        let region = |from: usize, to: usize| ((from + w - to - 1) % w) * m * n * 2;
        let cnt = |i: usize| i;
        let got = |j: usize, i: usize| cap + j * cap + i;
        let unused = ws.unused.clone();
        let ex = ws.exchange()?;
        ex.start()?;
        let counters = ex.flags(cnt(0), cap)?;
        gemm(
            Gemm {
                a: &c.a,
                b: &c.b,
                out: &c.out,
                copies: &[],
                addend: None,
                signal: Some(Signal {
                    counters: &counters,
                    rows_per_signal: per,
                }),
            },
            &partial,
            None,
            &unused,
            &c.gemm_config,
        )?;
        let peers = (1..w).map(|d| (r + d) % w);
        // As each chunk is done: push it to every peer.
        for i in 0..chunks {
            let (lo, rows) = rows_of(i);
            ex.await_count(cnt(i), chunk_area(OP, rows, n)?)?;
            let part = c.out.narrow(0, lo, rows)?;
            for p in peers.clone() {
                ex.push(p, region(r, p) + lo * n * 2, n, &part)?;
                ex.notify(p, got((r + w - p - 1) % w, i))?;
            }
        }
        for j in 0..w - 1 {
            for i in 0..chunks {
                ex.await_slot(got(j, i))?;
            }
        }
        // Every partial is here (and this rank's pushes of `out` are done):
        // add them, the last pass with the epilogue.
        ex.launch_follows()?;
        for j in 0..w - 1 {
            let theirs = ex.data::<bf16>(j * m * n * 2, &[m, n])?;
            let epi = match j == w - 2 {
                true => after.clone(),
                false => Epilogue::bias(zeros[0].clone(), zeros[1].clone(), false),
            };
            epilogue::apply_with(&c.out, Some(&theirs), &epi, &unused)?;
        }
        ex.close()
    }

    fn run_fused(&self, ws: &mut Workspace, pg: &ProcessGroup) -> Result<()> {
        let c = self;
        let (r, w, cap) = (pg.rank(), pg.world_size(), c.chunks);
        let next = (r + 1) % w;
        let op = match c.kind {
            Kind::ReduceScatter => "matmul_reduce_scatter",
            Kind::AllReduce => "matmul_all_reduce",
        };
        check_signal_config(op, &c.gemm_config)?;
        // Regions (slots of `slot_bytes`): staged(s), this rank's hop-s partial;
        // received(s), rank r - 1's, pushed here; finished(p), rank p's finished
        // slab (all-reduce), pushed here.
        let staged = |s: usize| s * c.slot_bytes;
        let received = |s: usize| (w - 1 + s) * c.slot_bytes;
        let finished = |p: usize| (2 * (w - 1) + p) * c.slot_bytes;
        // Flags, `cap` per step or rank: cnt(s, i) counts the area step s's GEMM
        // finished in chunk i of its slab; got(s, i): chunk i of rank r - 1's
        // hop-s partial is here; fin(p, i): chunk i of p's finished slab is here.
        let cnt = |s: usize, i: usize| s * cap + i;
        let got = |s: usize, i: usize| (w + s) * cap + i;
        let fin = |p: usize, i: usize| (2 * w - 1 + p) * cap + i;
        let chunking = |s: Slab| signal_chunks(s.rows, cap);
        // Before anything is queued: every chunk's count fits its counter.
        for s in &c.slabs {
            chunk_area(op, chunking(*s).0.min(s.rows), s.cols)?;
        }
        let unused = ws.unused.clone();
        let ex = ws.exchange()?;
        ex.start()?;
        for step in 0..w {
            let slab = c.slabs[(r + w - 1 - step) % w];
            let [a, b] = c.operands(slab)?;
            let last = step == w - 1;
            let shape = [slab.rows, slab.cols];
            let epi = match last {
                true => c.slab_bias(slab)?,
                false => c.partial_epilogue(slab)?,
            };
            let dst = match (last, c.kind) {
                (false, _) => ex.data::<bf16>(staged(step), &shape)?,
                (true, Kind::ReduceScatter) => c.out.clone(),
                (true, Kind::AllReduce) => c.out.narrow(0, slab.row0, slab.rows)?,
            };
            // Whoever reads this step's result gets it chunk by chunk.
            let signalled = !last || (c.kind == Kind::AllReduce && w > 1);
            let (per, chunks) = chunking(slab);
            let counters = ex.flags(cnt(step, 0), cap)?;
            let (flags, addend) = match step {
                0 => (None, None),
                _ => (
                    Some(ex.flags(got(step - 1, 0), cap)?),
                    Some(ex.data::<bf16>(received(step - 1), &shape)?),
                ),
            };
            gemm(
                Gemm {
                    a: &a,
                    b: &b,
                    out: &dst,
                    copies: &[],
                    addend: addend.as_ref(),
                    signal: signalled.then_some(Signal {
                        counters: &counters,
                        rows_per_signal: per,
                    }),
                },
                &epi,
                flags.as_ref().map(|flags| Wait {
                    flags,
                    rows_per_chunk: per,
                    flags_per_chunk: 1,
                    first_row: 0,
                    along_k: None,
                    group_rows: None,
                }),
                &unused,
                &c.gemm_config,
            )?;
            if !signalled {
                continue;
            }
            // The backend, as the GEMM finishes each chunk: push it to its
            // readers and tell them; at the end of an all-reduce, also copy the
            // peers' finished chunks out of their regions here.
            let rounds = match last {
                false => chunks,
                true => (0..w).map(|p| chunking(c.slabs[p]).1).max().unwrap_or(1),
            };
            for i in 0..rounds {
                if i < chunks {
                    let (lo, rows) = (i * per, per.min(slab.rows - i * per));
                    ex.await_count(cnt(step, i), chunk_area(op, rows, slab.cols)?)?;
                    let part = dst.narrow(0, lo, rows)?;
                    let offset = lo * slab.cols * 2;
                    if last {
                        for p in (1..w).map(|d| (r + d) % w) {
                            ex.push(p, finished(r) + offset, slab.cols, &part)?;
                            ex.notify(p, fin(r, i))?;
                        }
                    } else {
                        ex.push(next, received(step) + offset, slab.cols, &part)?;
                        ex.notify(next, got(step, i))?;
                    }
                }
                if !last {
                    continue;
                }
                for p in (1..w).map(|d| (r + d) % w) {
                    let theirs = c.slabs[p];
                    let (per, n) = chunking(theirs);
                    if i >= n {
                        continue;
                    }
                    let (lo, rows) = (i * per, per.min(theirs.rows - i * per));
                    ex.await_slot(fin(p, i))?;
                    // A copy within this GPU, by the copy engine.
                    ex.pull(
                        r,
                        finished(p) + lo * theirs.cols * 2,
                        theirs.cols,
                        &c.out.narrow(0, theirs.row0 + lo, rows)?,
                    )?;
                }
            }
        }
        // The barrier in `close` also waits for every rank's GEMMs: the next call
        // pushes into the regions they read.
        ex.follow_launch()?;
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
