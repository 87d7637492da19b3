//! The GEMM lowering's tuning space: block sizes, warps, stages and tile
//! order on both paths, the Hopper path's own options on a target that has
//! it, and proven starting points.

use super::tiles::{tiles_of, HopperTiles};
use super::GemmShape;
use crate::config::{Config, Target};
use crate::space::{Axis, ConfigSpace};
use crate::spec::Spec;

const GEMM_BLOCKS_MN: [usize; 4] = [32, 64, 128, 256];
const GEMM_BLOCKS_K: [usize; 3] = [32, 64, 128];

/// The axes of a GEMM on `target`: with `wgmma`, the Hopper path's options too.
pub(super) fn axes(g: &GemmShape, target: Target) -> Vec<Axis> {
    let mut axes = vec![
        Axis::Block {
            dim: g.m,
            values: GEMM_BLOCKS_MN.to_vec(),
        },
        Axis::Block {
            dim: g.n,
            values: GEMM_BLOCKS_MN.to_vec(),
        },
        Axis::Block {
            dim: g.k,
            values: GEMM_BLOCKS_K.to_vec(),
        },
        Axis::Warps(vec![2, 4, 8, 16]),
        Axis::Stages(vec![2, 3, 4, 5, 6]),
        Axis::GroupM(vec![1, 4, 8, 16]),
    ];
    if target.wgmma {
        axes.push(Axis::Persistent);
        axes.push(Axis::ClusterM(vec![1, 2]));
        axes.push(Axis::StreamK);
        axes.push(Axis::TmaStore);
        axes.push(Axis::PingPong);
    }
    axes
}

/// The Hopper seeds first where the target has `wgmma` (for the tiles of the
/// space's extents), then the portable ones; staged where operands are
/// unaligned.
pub(super) fn seeds(g: &GemmShape, space: &ConfigSpace, spec: &Spec, quick: bool) -> Vec<Config> {
    let dims = space.kernel().dims.len();
    let stageable = space.stageable();
    let mut p = Vec::new();
    if space.target().wgmma {
        let tiles = tiles_of(g, space.extents(), space.target().sms);
        // Unaligned operands: every Hopper seed staged (TMA needs it).
        let hopper = wgmma_seeds(dims, g, quick, tiles)
            .into_iter()
            .map(|c| c.stage(stageable));
        // The TMA-store epilogue where the output takes it (faster
        // at every shape measured, docs/perf-history.md, "the TMA-store epilogue");
        // the fastest seed also storing fragments, so the search
        // still weighs the two.
        for (i, c) in hopper.enumerate() {
            let t = c.clone().tma_store(true);
            let twin = space.fits(&t, spec).is_ok();
            if twin {
                p.push(t);
            }
            if !twin || i == 0 {
                p.push(c);
            }
        }
    }
    let portable = gemm_seeds(dims, g, quick);
    if stageable {
        // Unaligned operands: the portable seeds staged, and the best
        // one also as it is, so the search weighs the copies against
        // the narrow loads.
        p.extend(portable.iter().map(|c| c.clone().stage(true)));
        p.extend(portable.into_iter().take(1));
    } else {
        p.extend(portable);
    }
    p
}

/// Proven GEMM configs (M block, N block, K block, warps, stages), fastest first
/// at large bf16 shapes on an H200 (docs/PERFORMANCE.md, the swept configs).
fn gemm_seeds(dims: usize, g: &GemmShape, quick: bool) -> Vec<Config> {
    const PROVEN: [(usize, usize, usize, usize, usize); 12] = [
        (128, 256, 64, 8, 4),
        (256, 128, 64, 8, 4),
        (128, 256, 32, 8, 4),
        (128, 256, 64, 8, 3),
        (256, 128, 32, 8, 4),
        (128, 128, 64, 4, 3),
        (128, 128, 32, 4, 4),
        (128, 128, 64, 8, 4),
        (64, 128, 64, 4, 4),
        (128, 64, 64, 4, 4),
        (64, 64, 64, 4, 3),
        (64, 256, 64, 8, 4),
    ];
    let take = if quick { 6 } else { PROVEN.len() };
    PROVEN[..take]
        .iter()
        .map(|&(bm, bn, bk, w, s)| {
            let mut bs = vec![64; dims];
            bs[g.m] = bm;
            bs[g.n] = bn;
            bs[g.k] = bk;
            Config::new(&bs).num_warps(w).num_stages(s)
        })
        .collect()
}

/// Hopper configs (M block, N block, consumer warps, stages, persistent, blocks
/// per cluster, ping-pong), fastest first on an H200: BK is 64 and the M block
/// 16 x warps, or with ping-pong each warpgroup's (64 or 128 rows). Ping-pong
/// comes last: it measured 3–18% slower than the default at nine of ten shapes
/// (docs/perf-history.md, "a ping-pong Hopper GEMM, measured slower"), so only the full level tries it.
fn wgmma_seeds(dims: usize, g: &GemmShape, quick: bool, tiles: HopperTiles) -> Vec<Config> {
    type Seed = (usize, usize, usize, usize, bool, usize, bool);
    const PROVEN: [Seed; 12] = [
        (128, 256, 8, 4, true, 2, false),
        (128, 256, 8, 4, false, 1, false),
        (128, 192, 8, 4, true, 1, false),
        (128, 256, 8, 4, false, 2, false),
        (128, 128, 8, 6, true, 2, false),
        (128, 256, 8, 3, false, 1, false),
        (128, 128, 8, 5, false, 1, false),
        (64, 256, 4, 4, false, 1, false),
        (128, 192, 8, 4, false, 1, false),
        (128, 128, 8, 5, true, 1, true),
        (128, 128, 8, 5, true, 2, true),
        (64, 256, 8, 4, true, 2, true),
    ];
    // Launches whose 128×128 tiles fit one wave (the default's own tiles
    // there): the configs of small tiles that came closest to it or beat it
    // at nine such shapes on an H200 (docs/perf-history.md, "the tuner's duel with the default"), first.
    const ONE_WAVE: [Seed; 3] = [
        (64, 256, 4, 4, false, 1, false),
        (128, 128, 8, 5, false, 1, false),
        (128, 192, 8, 4, true, 1, false),
    ];
    // Quick: four proven configs, or where those tiles leave SMs idle the three
    // above and the pairs (the default of larger launches) for scale.
    let take = match (quick, tiles) {
        (false, _) => PROVEN.len(),
        (true, HopperTiles::Narrow) => 1,
        (true, _) => 4,
    };
    let first: &[Seed] = match tiles {
        HopperTiles::Narrow => &ONE_WAVE,
        _ => &[],
    };
    first
        .iter()
        .chain(PROVEN.iter().filter(|s| !first.contains(s)).take(take))
        .map(|&(bm, bn, w, s, p, cl, pp)| {
            let mut bs = vec![64; dims];
            bs[g.m] = bm;
            bs[g.n] = bn;
            bs[g.k] = 64;
            Config::new(&bs)
                .num_warps(w)
                .num_stages(s)
                .wgmma(true)
                .persistent(p)
                .cluster_m(cl)
                .pingpong(pp)
        })
        .collect()
}
