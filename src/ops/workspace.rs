//! The reusable state of an op: what the first call builds and later calls of
//! the same shape reuse, and the choice between the fused and unfused paths.
// Sizes here come from users' arguments: arithmetic on them is checked.
#![warn(clippy::arithmetic_side_effects)]

use super::epilogue::Unused;
use super::Algorithm;
use crate::{bf16, Result, Tensor};
use tilefuse_runtime::dist::{Exchange, ProcessGroup};

/// Buffers, flags, a backend stream and the algorithm choice of one op at one
/// shape; returned by every op call, to be passed to the next (see the module
/// docs of [`crate::ops`]).
pub struct Workspace {
    key: String,
    world: usize,
    /// The fused path's symmetric regions, flags and backend stream (`None`
    /// across nodes, or when only the unfused path runs).
    pub(crate) exchange: Option<Exchange>,
    /// Temporaries of the unfused path, made on first use.
    pub(crate) scratch: Vec<Tensor<bf16>>,
    /// Zeros standing in for a bias not given.
    pub(crate) zeros: Tensor<bf16>,
    /// Stand-ins for the tensors a kernel launch switches off.
    pub(crate) unused: Unused,
    /// The path `Algorithm::Auto` settled on.
    choice: Option<Algorithm>,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace")
            .field("key", &self.key)
            .field("fused", &self.exchange.is_some())
            .field("choice", &self.choice)
            .finish()
    }
}

/// What an op's fused path needs: symmetric data bytes and flag slots.
pub(crate) struct FusedNeeds {
    pub data_bytes: usize,
    pub flag_slots: usize,
}

impl Workspace {
    /// `given` if it was built for `key`, else a new workspace (collective: every
    /// rank must get here with the same key). `zeros_len` is the longest bias.
    pub(crate) fn prepare(
        given: Option<Workspace>,
        pg: &ProcessGroup,
        key: String,
        algorithm: Algorithm,
        zeros_len: usize,
        fused: impl FnOnce() -> FusedNeeds,
    ) -> Result<Workspace> {
        let single_node = pg.env().single_node();
        let exchange_wanted = algorithm != Algorithm::Unfused && single_node;
        if let Some(ws) = given {
            // One built for the unfused path only lacks the fused path's buffers.
            if ws.key == key && (ws.exchange.is_some() || !exchange_wanted) {
                return Ok(ws);
            }
            tracing::info!(
                built_for = %ws.key,
                call = %key,
                fused = exchange_wanted,
                "the workspace passed was built for another call (or without the fused path): building a new one"
            );
        }
        let started = std::time::Instant::now();
        if algorithm == Algorithm::Fused && !single_node {
            return Err(crate::Error::Distributed {
                context: key,
                message: format!(
                    "the fused path needs every rank on one node (symmetric memory); these {} ranks span {} nodes: use Algorithm::Auto or Unfused",
                    pg.world_size(),
                    pg.world_size().div_ceil(pg.env().local_world_size.max(1))
                ),
            });
        }
        let mut exchange = None;
        if exchange_wanted {
            let needs = fused();
            exchange = Some(Exchange::new(pg, needs.data_bytes, needs.flag_slots)?);
        }
        let zeros = Tensor::<bf16>::zeros_on(pg.device(), [zeros_len.max(1)])?;
        tracing::info!(
            op = %key,
            fused = exchange.is_some(),
            ms = started.elapsed().as_secs_f64() * 1e3,
            "workspace built"
        );
        Ok(Workspace {
            key,
            world: pg.world_size(),
            exchange,
            scratch: Vec::new(),
            zeros,
            unused: Unused::new(pg.device())?,
            // Across nodes there is nothing to choose from.
            choice: (!single_node).then_some(Algorithm::Unfused),
        })
    }

    /// The number of ranks it was built for.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The key this workspace was built for (op, shapes, world, chunks).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The path `Algorithm::Auto` settled on with this workspace (`None` before
    /// its first Auto call).
    pub fn algorithm(&self) -> Option<Algorithm> {
        self.choice
    }

    /// The unfused path's temporary `i` of `shape` (made once, kept).
    pub(crate) fn scratch(
        &mut self,
        dev: &std::sync::Arc<crate::Device>,
        i: usize,
        shape: &[usize],
    ) -> Result<Tensor<bf16>> {
        while self.scratch.len() <= i {
            self.scratch.push(Tensor::<bf16>::empty_on(dev, [1])?);
        }
        if self.scratch[i].dims() != shape {
            self.scratch[i] = Tensor::<bf16>::empty_on(dev, shape)?;
        }
        Ok(self.scratch[i].clone())
    }

    pub(crate) fn exchange(&mut self) -> Result<&mut Exchange> {
        let key = &self.key;
        self.exchange.as_mut().ok_or_else(|| crate::Error::Distributed {
            context: key.clone(),
            message: "this workspace has no fused path (built for Algorithm::Unfused, or across nodes)".into(),
        })
    }

    /// The path to run this call: `asked` unless it is `Auto`; for `Auto`, on the
    /// first call, both paths are timed (`run` runs one) on every rank, in
    /// three interleaved rounds, and the one whose slowest rank is faster is kept.
    pub(crate) fn path(
        &mut self,
        pg: &ProcessGroup,
        asked: Algorithm,
        mut run: impl FnMut(&mut Workspace, Algorithm) -> Result<()>,
    ) -> Result<Algorithm> {
        if asked != Algorithm::Auto {
            return Ok(asked);
        }
        if let Some(c) = self.choice {
            return Ok(c);
        }
        let dev = pg.device().clone();
        // Interleaved rounds, each path's median of them: near a tie, one
        // timing each leaned on whichever ran at the better clock. L2 is
        // flushed before each run, as a call after other work finds it (and
        // as the benchmarks time them): warm, the two paths' order could flip.
        // Five rounds: with three, matmul_reduce_scatter at 1024×6656×16384 on
        // 2 H200s kept the fused path, 6% slower in the benchmark's six. In
        // interpret mode times mean nothing: one run each (both paths run).
        let (rounds_n, warm, reps) = match dev.is_host() {
            true => (1, 0, 1),
            false => (5, 2, 5),
        };
        let mut rounds = [Vec::with_capacity(rounds_n), Vec::with_capacity(rounds_n)];
        for _ in 0..rounds_n {
            for (times, alg) in rounds
                .iter_mut()
                .zip([Algorithm::Fused, Algorithm::Unfused])
            {
                pg.barrier("ops-auto")?;
                times.push(
                    tilefuse_runtime::time_gpu(&dev, warm, reps, true, || run(self, alg))?
                        .median_ms,
                );
            }
        }
        let ms = rounds.map(|mut r| {
            r.sort_by(f64::total_cmp);
            r[rounds_n / 2]
        });
        let slowest = pg.max_over_ranks("ops-auto-times", &ms)?;
        let (fused, unfused) = (slowest[0], slowest[1]);
        let choice = if fused <= unfused {
            Algorithm::Fused
        } else {
            Algorithm::Unfused
        };
        tracing::info!(op = %self.key, fused_ms = fused, unfused_ms = unfused, chosen = ?choice, "algorithm chosen");
        self.choice = Some(choice);
        Ok(choice)
    }
}
