//! The attention lowering's tuning space: query rows and keys a step per
//! program, warps, and proven starting points on both programs.

use super::AttentionShape;
use crate::config::Config;
use crate::space::{Axis, ConfigSpace};

/// Rows and keys a step, and warps (a packed kernel's rows: its grid tile's
/// block, which its row loop follows).
pub(super) fn axes(a: &AttentionShape) -> Vec<Axis> {
    vec![
        Axis::Block {
            dim: a.row_tile(),
            values: vec![64, 128, 256],
        },
        Axis::Block {
            dim: a.n,
            values: vec![32, 64, 128],
        },
        Axis::Warps(vec![4, 8]),
    ]
}

/// On Hopper, the wgmma program's (rows, keys a step, stages),
/// FlashAttention-3's shapes first (176 keys: its non-causal choice at head
/// dimension 128), each with the default's `overlap` and `tma_store`, and the
/// default's tile without them; then the `mma.sync` program's (rows, keys a
/// step, warps), FlashAttention-2's shapes first.
pub(super) fn seeds(a: &AttentionShape, space: &ConfigSpace) -> Vec<Config> {
    // 192 rows: three consumer warpgroups (head dimension 64 only: their
    // registers hold 96 accumulators a thread), FlashAttention-3's tile there.
    const HOPPER: [(usize, usize, usize); 8] = [
        (128, 128, 3),
        (128, 176, 2),
        (128, 64, 4),
        (128, 128, 2),
        (64, 128, 3),
        (64, 64, 4),
        (192, 128, 2),
        (192, 128, 3),
    ];
    const PROVEN: [(usize, usize, usize); 7] = [
        (128, 64, 4),
        (128, 32, 4),
        (128, 128, 8),
        (128, 64, 8),
        (64, 64, 4),
        (256, 64, 8),
        (64, 128, 4),
    ];
    let (overlap, tma_add, persistent, split) = (
        space.default_config().overlap,
        space.default_config().tma_store,
        space.default_config().persistent,
        space.default_config().stream_k,
    );
    let seed = |bm: usize, bn: usize, warps: usize, wgmma: bool| {
        // The attention programs' configs (a default on the general lowering,
        // the one pass's off Hopper, asks for it: these do not).
        let mut c = Config {
            wgmma,
            overlap: wgmma && overlap,
            tma_store: wgmma && tma_add,
            persistent: wgmma && persistent,
            stream_k: wgmma && persistent && split,
            general: false,
            ..space.default_config().clone()
        }
        .num_warps(warps);
        c.block_sizes[a.row_tile()] = bm;
        c.block_sizes[a.m] = bm;
        c.block_sizes[a.n] = bn;
        c
    };
    let hopper = HOPPER
        .iter()
        .filter(|_| space.target().wgmma)
        .map(|&(bm, bn, stages)| seed(bm, bn, bm / 16, true).num_stages(stages));
    let (bm, bn, stages) = HOPPER[0];
    let without_overlap = overlap
        .then(|| {
            seed(bm, bn, bm / 16, true)
                .num_stages(stages)
                .overlap(false)
        })
        .filter(|_| space.target().wgmma);
    // The forward's default without its persistent blocks.
    let one_tile_a_block = persistent
        .then(|| {
            space
                .default_config()
                .clone()
                .persistent(false)
                .stream_k(false)
        })
        .filter(|_| space.target().wgmma);
    // The one pass's default with dQ added by the threads' atomics, in the
    // three stages the TMA unit's staging takes room from.
    let without_tma_add = tma_add
        .then(|| {
            space
                .default_config()
                .clone()
                .tma_store(false)
                .num_stages(3)
        })
        .filter(|_| space.target().wgmma);
    let portable = PROVEN.iter().map(|&(bm, bn, w)| seed(bm, bn, w, false));
    hopper
        .chain(without_overlap)
        .chain(without_tma_add)
        .chain(one_tile_a_block)
        .chain(portable)
        .collect()
}
