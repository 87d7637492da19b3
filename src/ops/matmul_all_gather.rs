//! `out = all_gather(A · B + bias)` along rows.
//!
//! Fused, [`GatherVariant::PeerStores`] (up to 4 ranks, asked for): one GEMM stores each
//! tile into this rank's rows of `out` and into the same rows of every peer's
//! landing buffer (symmetric memory, NVLink stores spread over the GEMM's
//! epilogues), and counts the area it finished. Once every count is reached the
//! backend stream tells the peers; as each peer's notice arrives, this rank
//! copies that peer's rows from its own landing buffer into `out` (a copy
//! within the GPU), before the closing barrier lets the next call's stores in.
//!
//! Fused, [`GatherVariant::CopyEngine`] (the default): the GEMM stores its rows twice, into
//! this rank's rows of `out` and into a symmetric staging buffer, and counts the
//! area it finished per chunk of rows (`signal`; its tiles visited band by
//! band). As each chunk's count is reached, the backend stream tells the peers,
//! and pulls the same chunk of every peer's staging into `out` with the copy
//! engine, while the GEMM computes the later chunks; only the last chunk's
//! transfer is left after the GEMM. A GEMM of one wave finishes every chunk at
//! once, so there all of the transfer comes after it.

use super::check::{self, arg};
use super::epilogue::{
    check_signal_config, chunk_area, gemm, signal_chunks, Epilogue, Gemm, Signal, MAX_COPIES,
};
use super::workspace::{FusedNeeds, Workspace};
use super::{run_call, unfused, Algorithm, GatherVariant, OpOptions};
use crate::{bf16, Config, Result, Tensor};
use tilefuse_runtime::dist::ProcessGroup;

const OP: &str = "matmul_all_gather";

/// One matmul + all-gather, its checks done: what a call or a plan runs.
pub(crate) struct Schedule {
    pub out: Tensor<bf16>,
    pub a: Tensor<bf16>,
    pub b: Tensor<bf16>,
    /// The epilogue of this rank's product (`[M, N]`, its rows of `out`).
    pub epi: Epilogue,
    shapes: Shapes,
    gemm_config: Option<Config>,
}

/// The shapes of a matmul + all-gather, checked.
#[derive(Clone, Copy)]
pub(crate) struct Shapes {
    m: usize,
    k: usize,
    n: usize,
    chunks: usize,
    rows_per_chunk: usize,
    variant: GatherVariant,
}

impl Shapes {
    /// Checks `out`, `a` and `b` (names as the caller knows them) and the
    /// variant asked for (`None`: the copy engine).
    pub fn check(
        pg: &ProcessGroup,
        op: &str,
        [out, a, b]: [(&str, &Tensor<bf16>); 3],
        chunks: Option<usize>,
        variant: Option<GatherVariant>,
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
        check::shape_is(
            op,
            out.0,
            [mo, no],
            [w * m, n],
            "world × a's rows, b's columns",
        )?;
        let (rows_per_chunk, chunks) = signal_chunks(m, check::chunks(op, chunks)?);
        let variant = variant_for(op, w, variant)?;
        Ok(Shapes {
            m,
            k,
            n,
            chunks,
            rows_per_chunk,
            variant,
        })
    }

    /// This rank's product's `[m, n]`.
    pub fn product(&self) -> [usize; 2] {
        [self.m, self.n]
    }

    pub fn workspace(
        &self,
        pg: &ProcessGroup,
        given: Option<Workspace>,
        algorithm: Algorithm,
    ) -> Result<Workspace> {
        let (w, m, k, n, chunks) = (pg.world_size(), self.m, self.k, self.n, self.chunks);
        let variant = self.variant;
        let key = format!("{OP}/a{m}x{k}/b{k}x{n}/world{w}/chunks{chunks}/{variant:?}");
        // Peer stores land in a buffer of every rank's rows; pulls read a
        // staging buffer of this rank's.
        let rows = match variant {
            GatherVariant::PeerStores => w * m,
            GatherVariant::CopyEngine => m,
        };
        Workspace::prepare(given, pg, key, algorithm, m.max(n), || FusedNeeds {
            data_bytes: rows * n * 2,
            // Counters, and a ready flag per rank and chunk.
            flag_slots: (w + 1) * chunks,
        })
    }

    pub fn schedule(
        &self,
        [out, a, b]: [&Tensor<bf16>; 3],
        epi: Epilogue,
        gemm_config: Option<Config>,
    ) -> Schedule {
        Schedule {
            out: out.clone(),
            a: a.clone(),
            b: b.clone(),
            epi,
            shapes: *self,
            gemm_config,
        }
    }
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
    let shapes = Shapes::check(
        pg,
        OP,
        [("out", out), ("a", a), ("b", b)],
        opts.config.chunks,
        opts.config.gather,
    )?;
    let ws = shapes.workspace(pg, workspace, opts.config.algorithm)?;
    let [m, n] = shapes.product();
    let epi = check::bias_epilogue(pg, OP, opts.bias, m, n, &ws.zeros)?;
    let s = shapes.schedule([out, a, b], epi, opts.config.gemm.clone());
    run_call(ws, pg, OP, opts, |ws, p| s.run(ws, pg, p))
}

/// The variant a call of `world` ranks runs when `asked` for one (`None`: the
/// copy engine); peer stores reach at most [`MAX_COPIES`] peers.
fn variant_for(op: &str, world: usize, asked: Option<GatherVariant>) -> Result<GatherVariant> {
    let peers = world.saturating_sub(1);
    match asked {
        Some(GatherVariant::PeerStores) if peers > MAX_COPIES => Err(arg(
            op,
            "config.gather",
            format!(
                "PeerStores stores into at most {MAX_COPIES} peers, and this group has {peers}; use GatherVariant::CopyEngine"
            ),
        )),
        Some(v) => Ok(v),
        None => Ok(GatherVariant::CopyEngine),
    }
}

impl Schedule {
    pub fn run(&self, ws: &mut Workspace, pg: &ProcessGroup, path: Algorithm) -> Result<()> {
        let c = self;
        let (r, w) = (pg.rank(), pg.world_size());
        let Shapes {
            m,
            n,
            chunks,
            rows_per_chunk: rpc,
            ..
        } = c.shapes;
        let own = c.out.narrow(0, r * m, m)?;
        if path == Algorithm::Unfused {
            if c.out.is_contiguous() {
                unfused::matmul_epilogue(&own, &c.a, &c.b, &c.epi, &ws.unused)?;
                // In place: this rank's part of the output is its send buffer.
                return pg.nccl()?.all_gather(&own, &c.out);
            }
            let dev = pg.device().clone();
            let mine = ws.scratch(&dev, 0, &[m, n])?;
            unfused::matmul_epilogue(&mine, &c.a, &c.b, &c.epi, &ws.unused)?;
            let all = ws.scratch(&dev, 1, &[w * m, n])?;
            pg.nccl()?.all_gather(&mine, &all)?;
            return c.out.copy_from(&all);
        }
        check_signal_config(OP, &c.gemm_config)?;
        chunk_area(OP, rpc.min(m), n)?;
        let unused = ws.unused.clone();
        let ex = ws.exchange()?;
        let peers = (1..w).map(|d| (r + d) % w);
        // Flags: cnt(i) counts the area finished in chunk i of this rank's rows;
        // ready(p, i): chunk i of rank p's rows is written (with peer stores,
        // all of them: i = 0).
        let cnt = |i: usize| i;
        let ready = |p: usize, i: usize| chunks + p * chunks + i;
        let stores = c.shapes.variant == GatherVariant::PeerStores;
        let copies = match stores {
            // This rank's rows of every peer's landing buffer.
            true => peers
                .clone()
                .map(|p| ex.peer_data::<bf16>(p, r * m * n * 2, &[m, n]))
                .collect::<Result<Vec<_>>>()?,
            false => vec![ex.data::<bf16>(0, &[m, n])?],
        };
        ex.start()?;
        let counters = ex.flags(cnt(0), chunks)?;
        gemm(
            Gemm {
                a: &c.a,
                b: &c.b,
                out: &own,
                copies: &copies,
                addend: None,
                signal: Some(Signal {
                    counters: &counters,
                    rows_per_signal: rpc,
                }),
            },
            &c.epi,
            None,
            &unused,
            &c.gemm_config,
        )?;
        if stores {
            // Every tile's stores are visible on the peers once its count is in
            // (the tiles fence before they signal).
            for i in 0..chunks {
                let rows = rpc.min(m - i * rpc);
                ex.await_count(cnt(i), chunk_area(OP, rows, n)?)?;
            }
            let notices: Vec<_> = peers.clone().map(|p| (p, ready(r, 0))).collect();
            ex.notify_all(&notices)?;
            for p in peers {
                ex.await_slot(ready(p, 0))?;
                ex.launch_follows()?;
                let landed = ex.data::<bf16>(p * m * n * 2, &[m, n])?;
                c.out.narrow(0, p * m, m)?.copy_from(&landed)?;
            }
            return ex.close();
        }
        // As each chunk of rows is done: tell the peers, and pull theirs.
        for i in 0..chunks {
            let (lo, rows) = (i * rpc, rpc.min(m - i * rpc));
            ex.await_count(cnt(i), chunk_area(OP, rows, n)?)?;
            for p in peers.clone() {
                ex.notify(p, ready(r, i))?;
            }
            for p in peers.clone() {
                ex.await_slot(ready(p, i))?;
                ex.pull(p, lo * n * 2, n, &c.out.narrow(0, p * m + lo, rows)?)?;
            }
        }
        ex.close()
    }
}

#[cfg(test)]
mod tests {
    use super::{variant_for, GatherVariant};

    #[test]
    fn peer_stores_up_to_four_ranks_and_the_copy_engine_by_default() {
        for world in 1..=8 {
            assert_eq!(
                variant_for("op", world, None).unwrap(),
                GatherVariant::CopyEngine
            );
            let stores = variant_for("op", world, Some(GatherVariant::PeerStores));
            match world <= 4 {
                true => assert_eq!(stores.unwrap(), GatherVariant::PeerStores),
                false => {
                    let msg = stores.unwrap_err().to_string();
                    assert!(
                        msg.contains("config.gather") && msg.contains("CopyEngine"),
                        "{msg}"
                    );
                }
            }
        }
    }
}
