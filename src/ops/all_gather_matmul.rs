//! `out = all_gather(A) · B + bias`, A sharded along rows or columns.
//!
//! Fused: the gathered A lives in symmetric memory; each rank copies its shard
//! into its own part, tells the peers, and pulls theirs with the copy engine in
//! chunks, setting one flag per chunk. The GEMM, launched at once, waits per
//! tile for the chunks its rows need. Along rows the tile order starts at this
//! rank's own rows (there first) and finishes one rank's rows before the next
//! rank's (its groups of tile rows never span two ranks), so its first waves
//! run on rows already here instead of waiting on every rank's at once (2×H200,
//! 1024×6656×16384: 1.03× the GEMM alone, against 1.14–1.29× in groups of
//! eight tile rows); along columns every tile needs every rank's
//! columns of its rows, so the chunks are rows of all ranks at once, in order.
//! A GEMM of few waves ([`super::chunks_along_k`]) starts most tiles at once,
//! so A's rows are pulled in bands of columns instead (band 0 of every peer
//! first), and each tile waits per k-tile, inside its K loop.

use super::check::{self, arg};
use super::epilogue::{gemm, Epilogue, Gemm, Wait};
use super::workspace::{FusedNeeds, Workspace};
use super::{run_call, unfused, Algorithm, GatherDim, OpOptions};
use crate::{bf16, Config, Result, Tensor};
use tilefuse_runtime::dist::ProcessGroup;

const OP: &str = "all_gather_matmul";

/// One all-gather matmul, its checks done: what a call or a plan runs.
pub(crate) struct Schedule {
    pub out: Tensor<bf16>,
    pub a_shard: Tensor<bf16>,
    pub b: Tensor<bf16>,
    pub epi: Epilogue,
    dim: GatherDim,
    /// Shard rows and columns; gathered [m, k].
    shard: [usize; 2],
    m: usize,
    k: usize,
    /// Chunks per rank (rows) or in all (columns), and rows per chunk.
    chunks: usize,
    rows_per_chunk: usize,
    /// Shards along rows pulled in `chunks` bands of this many columns.
    along_k: Option<usize>,
    gemm_config: Option<Config>,
}

/// The shapes of an all-gather matmul, checked: gathered `[m, k]`, `n`.
pub(crate) struct Shapes {
    dim: GatherDim,
    shard: [usize; 2],
    m: usize,
    k: usize,
    n: usize,
    chunks: usize,
    rows_per_chunk: usize,
    along_k: Option<usize>,
}

impl Shapes {
    /// Checks `out`, `a_shard` and `b` (names as the caller knows them).
    pub fn check(
        pg: &ProcessGroup,
        op: &str,
        [out, a_shard, b]: [(&str, &Tensor<bf16>); 3],
        dim: GatherDim,
        chunks: Option<usize>,
        along_k: Option<bool>,
    ) -> Result<Shapes> {
        let w = pg.world_size();
        let [sr, sc] = check::matrix(pg, op, a_shard.0, a_shard.1)?;
        let [kb, n] = check::matrix(pg, op, b.0, b.1)?;
        let [mo, no] = check::matrix(pg, op, out.0, out.1)?;
        let (m, k) = match dim {
            GatherDim::Rows => (sr * w, sc),
            GatherDim::Cols => (sr, sc * w),
        };
        if kb != k {
            return Err(arg(
                op,
                b.0,
                format!("has {kb} rows, but the gathered A ({dim:?}: {w} shards of [{sr}, {sc}]) has {k} columns"),
            ));
        }
        check::shape_is(op, out.0, [mo, no], [m, n], "all_gather(A) · B")?;
        let along_k =
            along_k.unwrap_or_else(|| super::chunks_along_k(m, n, pg.device().sm_count()));
        if dim == GatherDim::Rows && along_k {
            // Bands of whole 64-column k-tiles, 8 unless asked otherwise.
            let bands = check::chunks_or(op, chunks, 8)?.min(k);
            let cols = k.div_ceil(bands).next_multiple_of(64).min(k);
            return Ok(Shapes {
                dim,
                shard: [sr, sc],
                m,
                k,
                n,
                chunks: k.div_ceil(cols),
                rows_per_chunk: sr,
                along_k: Some(cols),
            });
        }
        let asked = check::chunks(op, chunks)?;
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
        Ok(Shapes {
            dim,
            shard: [sr, sc],
            m,
            k,
            n,
            chunks,
            rows_per_chunk,
            along_k: None,
        })
    }

    /// The product's `[m, n]`.
    pub fn output(&self) -> [usize; 2] {
        [self.m, self.n]
    }

    /// The workspace for these shapes (`given` when it fits).
    pub fn workspace(
        &self,
        pg: &ProcessGroup,
        given: Option<Workspace>,
        algorithm: Algorithm,
    ) -> Result<Workspace> {
        let (w, [sr, sc], (m, k, n)) = (pg.world_size(), self.shard, (self.m, self.k, self.n));
        let (dim, chunks) = (self.dim, self.chunks);
        let along = self
            .along_k
            .map_or(String::new(), |c| format!("/bands_of{c}"));
        let key = format!("{OP}/{dim:?}/a_shard{sr}x{sc}/b{k}x{n}/world{w}/chunks{chunks}{along}");
        Workspace::prepare(given, pg, key, algorithm, m.max(n), || FusedNeeds {
            data_bytes: m * k * 2,
            flag_slots: w * chunks + w,
        })
    }

    pub fn schedule(
        &self,
        [out, a_shard, b]: [&Tensor<bf16>; 3],
        epi: Epilogue,
        gemm_config: Option<Config>,
    ) -> Schedule {
        Schedule {
            out: out.clone(),
            a_shard: a_shard.clone(),
            b: b.clone(),
            epi,
            dim: self.dim,
            shard: self.shard,
            m: self.m,
            k: self.k,
            chunks: self.chunks,
            rows_per_chunk: self.rows_per_chunk,
            along_k: self.along_k,
            gemm_config,
        }
    }
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
    let shapes = Shapes::check(
        pg,
        OP,
        [("out", out), ("a_shard", a_shard), ("b", b)],
        dim,
        opts.config.chunks,
        opts.config.chunks_along_k,
    )?;
    let ws = shapes.workspace(pg, workspace, opts.config.algorithm)?;
    let [m, n] = shapes.output();
    let epi = check::bias_epilogue(pg, OP, opts.bias, m, n, &ws.zeros)?;
    let s = shapes.schedule([out, a_shard, b], epi, opts.config.gemm.clone());
    run_call(ws, pg, OP, opts, |ws, p| s.run(ws, pg, p))
}

impl Schedule {
    pub fn run(&self, ws: &mut Workspace, pg: &ProcessGroup, path: Algorithm) -> Result<()> {
        if path == Algorithm::Unfused {
            return self.run_unfused(ws, pg);
        }
        let c = self;
        let (r, w) = (pg.rank(), pg.world_size());
        let [sr, sc] = c.shard;
        let (m, k, chunks, rpc) = (c.m, c.k, c.chunks, c.rows_per_chunk);
        let unused = ws.unused.clone();
        let ex = ws.exchange()?;
        let gathered = ex.data::<bf16>(0, &[m, k])?;
        let own = match c.dim {
            GatherDim::Rows => gathered.narrow(0, r * sr, sr)?,
            GatherDim::Cols => gathered.narrow(1, r * sc, sc)?,
        };
        // A shard written in place (a view of the workspace) needs no copy.
        if own.device_ptr() != c.a_shard.device_ptr() || own.strides() != c.a_shard.strides() {
            own.copy_from(&c.a_shard)?;
        }
        ex.start()?;
        let ready = w * chunks; // + p: rank p's shard is written
        let others = (1..w).map(|i| (r + i) % w);
        // This rank's own chunks are in place: their flags, then the peers
        // told its shard is written, in one batch of the backend stream.
        let own: Vec<usize> = match (c.dim, c.along_k) {
            (GatherDim::Rows, Some(_)) | (GatherDim::Cols, _) => {
                (0..chunks).map(|j| j * w + r).collect()
            }
            (GatherDim::Rows, None) => (0..chunks).map(|i| r * chunks + i).collect(),
        };
        let told = others.clone().map(|p| (p, ready + r));
        let flags: Vec<(usize, usize)> = own.iter().map(|&s| (r, s)).chain(told).collect();
        ex.notify_all(&flags)?;
        let (flags_per_chunk, first_row) = match (c.dim, c.along_k) {
            (GatherDim::Rows, Some(cols)) => {
                // Flag j·w + p: band j of rank p's rows, band 0 of every peer first.
                for p in others.clone() {
                    ex.await_slot(ready + p)?;
                }
                for j in 0..chunks {
                    let (col, n) = (j * cols, cols.min(k - j * cols));
                    for p in others.clone() {
                        let dst = gathered.narrow(0, p * sr, sr)?.narrow(1, col, n)?;
                        ex.pull(p, (p * sr * k + col) * 2, k, &dst)?;
                        ex.set_slot(j * w + p)?;
                    }
                }
                (1, r * sr)
            }
            (GatherDim::Rows, None) => {
                // Flag p·chunks + i: chunk i of rank p's rows.
                for p in others {
                    ex.await_slot(ready + p)?;
                    for i in 0..chunks {
                        let row = p * sr + i * rpc;
                        ex.pull(p, row * k * 2, k, &gathered.narrow(0, row, rpc)?)?;
                        ex.set_slot(p * chunks + i)?;
                    }
                }
                (1, r * sr)
            }
            (GatherDim::Cols, _) => {
                // Flag i·w + p: rank p's columns of row chunk i.
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
                (w, 0)
            }
        };
        let flags = ex.flags(0, w * chunks)?;
        gemm(
            Gemm {
                a: &gathered,
                b: &c.b,
                out: &c.out,
                copies: &[],
                addend: None,
                signal: None,
            },
            &c.epi,
            Some(Wait {
                flags: &flags,
                rows_per_chunk: rpc,
                flags_per_chunk,
                first_row,
                along_k: c.along_k.map(|cols| (cols, w)),
                // A rank's rows (along rows), or a chunk of every rank's.
                group_rows: Some(if c.dim == GatherDim::Rows { sr } else { rpc }),
            }),
            &unused,
            &c.gemm_config,
        )?;
        ex.close()
    }

    fn run_unfused(&self, ws: &mut Workspace, pg: &ProcessGroup) -> Result<()> {
        let c = self;
        let dev = pg.device().clone();
        let w = pg.world_size();
        let [sr, sc] = c.shard;
        let send = unfused::contiguous(ws, &dev, 0, &c.a_shard)?;
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
        unfused::matmul_epilogue(&c.out, &gathered, &c.b, &c.epi, &ws.unused)
    }
}
