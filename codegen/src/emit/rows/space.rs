//! The row lowering's tuning space: the columns per step of each `tile()`
//! loop, the rows per program, warps and occupancy, and proven starting points.

use crate::config::Config;
use crate::ir::Kernel;
use crate::space::{Axis, ConfigSpace};

/// The columns per step of each `tile()` loop, the rows per program, and warps.
pub(super) fn axes(kernel: &Kernel) -> Vec<Axis> {
    let mut axes = Vec::new();
    for d in 0..kernel.dims.len() {
        if !kernel.grid.contains(&d) {
            axes.push(Axis::Block {
                dim: d,
                values: vec![256, 512, 1024, 2048, 4096, 8192],
            });
        }
    }
    for &d in &kernel.grid {
        axes.push(Axis::Block {
            dim: d,
            values: vec![1, 2, 4, 8, 16],
        });
    }
    axes.push(Axis::Warps(vec![1, 2, 4, 8, 16]));
    axes.push(Axis::Occupancy(vec![0, 512, 768, 1024]));
    axes
}

/// A warp per row for short rows, a whole block per row (one pass, the row
/// in registers) for long ones. (rows per program, columns per step, warps.)
pub(super) fn seeds(space: &ConfigSpace) -> Vec<Config> {
    // (rows, columns, warps, threads an SM or 0 for no bound). The last: a row
    // kernel that reduces each step across its threads before the next
    // (welford's per-step means, 16384×8192 bf16 on an H200) ran 0.082 ms at
    // 16 × 512 with 4 warps, against 0.107 at (4, 1024, 4) and 0.100 at
    // (16, 512, 8); without the occupancy bound that tile spills softmax's
    // per-row state.
    const PROVEN: [(usize, usize, usize, usize); 9] = [
        (4, 1024, 4, 0),
        (1, 4096, 8, 0),
        (1, 8192, 8, 0),
        (1, 8192, 16, 0),
        (2, 4096, 8, 0),
        (8, 1024, 8, 0),
        (1, 2048, 4, 0),
        (16, 512, 16, 0),
        (16, 512, 4, 512),
    ];
    let grid = &space.kernel().grid;
    let mut seeds: Vec<Config> = PROVEN
        .iter()
        .map(|&(rows, cols, w, occupancy)| {
            let mut c = space.default_config().clone().num_warps(w);
            if occupancy > 0 {
                c = c.occupancy(occupancy);
            }
            for (d, b) in c.block_sizes.iter_mut().enumerate() {
                *b = if grid.contains(&d) { rows } else { cols };
            }
            c
        })
        .collect();
    // A long first walk and narrower later ones, 4 warps: one row of a kernel
    // that walks it three times (LayerNorm with a two-pass variance, 8192
    // columns) ran 0.158 ms as 4096 then 2048, against 0.204 as one
    // 8192-column step a walk with 8 warps (H200, docs/perf-history.md,
    // "Column reductions: a tile for one warp").
    let walks = (0..space.kernel().dims.len())
        .filter(|d| !grid.contains(d))
        .count();
    if walks >= 2 {
        let mut c = space.default_config().clone().num_warps(4);
        let mut seen = 0;
        for (d, b) in c.block_sizes.iter_mut().enumerate() {
            *b = if grid.contains(&d) {
                1
            } else {
                seen += 1;
                if seen == 1 {
                    4096
                } else {
                    2048
                }
            };
        }
        seeds.push(c);
    }
    seeds
}
