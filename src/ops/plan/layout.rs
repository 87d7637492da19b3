//! How the distributions of A, B and D pick the algorithm, and the local shape
//! each rank's tensors must have.

use super::Distribution::{self, Cols, Replicated, Rows};
use crate::ops::check::arg;
use crate::Result;

/// What a plan runs, from the distributions (as in cuBLASMp).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanAlgorithm {
    /// A's row slabs gathered, times this rank's B (`all_gather_matmul`, rows).
    AllGatherRows,
    /// A's column slabs gathered, times the whole B (`all_gather_matmul`, columns).
    AllGatherCols,
    /// This rank's rows of D, then gathered (`matmul_all_gather`).
    MatmulAllGather,
    /// Partial products over K, reduced and scattered by D's rows or columns.
    ReduceScatterRows,
    ReduceScatterCols,
    /// Partial products over K, all-reduced.
    AllReduce,
    /// Nothing to communicate: each rank's D is its A times its B.
    Local,
}

impl PlanAlgorithm {
    /// Whether each rank computes every element of its D itself (so a forward
    /// `_aux` output is whole); the gathers and the all-reduce copy them in.
    pub fn computes_local_d(self) -> bool {
        !matches!(
            self,
            PlanAlgorithm::MatmulAllGather | PlanAlgorithm::AllReduce
        )
    }
}

/// The supported (A, B, D) distributions, for messages.
pub const SUPPORTED: &str = "(A, B, D) = (Rows, Cols, Cols) all-gather + GEMM; (Cols, Replicated, Replicated) \
     all-gather + GEMM; (Rows, Replicated, Replicated) GEMM + all-gather; (Cols, Rows, Rows) and \
     (Cols, Rows, Cols) GEMM + reduce-scatter; (Cols, Rows, Replicated) GEMM + all-reduce; \
     (Rows, Replicated, Rows), (Replicated, Cols, Cols) and (Replicated, Replicated, Replicated) local";

pub fn algorithm(op: &str, [a, b, d]: [Distribution; 3]) -> Result<PlanAlgorithm> {
    use PlanAlgorithm::*;
    Ok(match (a, b, d) {
        (Rows, Cols, Cols) => AllGatherRows,
        (Cols, Replicated, Replicated) => AllGatherCols,
        (Rows, Replicated, Replicated) => MatmulAllGather,
        (Cols, Rows, Rows) => ReduceScatterRows,
        (Cols, Rows, Cols) => ReduceScatterCols,
        (Cols, Rows, Replicated) => AllReduce,
        (Rows, Replicated, Rows)
        | (Replicated, Cols, Cols)
        | (Replicated, Replicated, Replicated) => Local,
        other => {
            return Err(arg(
                op,
                "distributions",
                format!("{other:?} is not supported; supported: {SUPPORTED}"),
            ))
        }
    })
}

/// The global `[rows, cols]` of a matrix whose local piece is `local` under `dist`.
pub fn global(dist: Distribution, local: [usize; 2], world: usize) -> [usize; 2] {
    match dist {
        Replicated => local,
        Rows => [local[0] * world, local[1]],
        Cols => [local[0], local[1] * world],
    }
}

/// The local piece of a `global` matrix under `dist`.
pub fn local(
    op: &str,
    name: &str,
    dist: Distribution,
    global: [usize; 2],
    world: usize,
) -> Result<[usize; 2]> {
    let split = |len: usize, what: &str| {
        if len % world == 0 {
            Ok(len / world)
        } else {
            Err(arg(
                op,
                name,
                format!("its {what} ({len}) must split evenly over the {world} ranks ({dist:?})"),
            ))
        }
    };
    Ok(match dist {
        Replicated => global,
        Rows => [split(global[0], "row count")?, global[1]],
        Cols => [global[0], split(global[1], "column count")?],
    })
}
