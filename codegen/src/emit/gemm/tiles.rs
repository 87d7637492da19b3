//! The tiles of the Hopper GEMM's untuned default at a launch: the largest
//! whose tiles keep the SMs busy.

use super::GemmShape;
use crate::plan::Planned;

/// The tiles of the Hopper matmul default at a launch ([`hopper_tiles`]), from
/// the largest to the smallest: the default takes the largest whose tiles keep
/// the SMs busy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HopperTiles {
    /// 128×256 tiles in pairs of blocks that share their B tiles (clusters of
    /// two): the tiles need more than one wave of blocks, or the extents are not
    /// known.
    Pairs,
    /// 128×256 tiles, a block each: they need one wave at most, where a pair's
    /// cluster costs more than its shared loads save (1.03–1.05× at 2048×2048
    /// and 1024×4096 on an H200).
    Wide,
    /// 128×128 tiles: even these need one wave at most, so 128×256 ones would
    /// leave half the SMs or more idle (1.14–1.44× at nine such shapes on an
    /// H200; docs/perf-history.md, "the tuner's duel with the default").
    Narrow,
}

/// Which tiles the Hopper matmul default takes for these extents on a GPU of
/// `sms` SMs (a block per SM): [`HopperTiles::Narrow`] where 128×128 tiles fit
/// one wave, [`HopperTiles::Wide`] where 128×256 ones do, else (or where M, N or
/// the SM count are unknown, or `kernel` is not a matmul) [`HopperTiles::Pairs`].
///
/// ```
/// # use tilefuse_codegen::{hopper_tiles, HopperTiles};
/// # fn demo(matmul: &tilefuse_codegen::Planned) {
/// // M, N, K = 512, 4096, 4096 on 132 SMs: 4 × 32 tiles of 128×128.
/// let ext = [Some(512), Some(4096), Some(4096)];
/// assert_eq!(hopper_tiles(matmul, &ext, 132), HopperTiles::Narrow);
/// # }
/// ```
pub fn hopper_tiles(kernel: &Planned, extents: &[Option<usize>], sms: usize) -> HopperTiles {
    match kernel.plan::<GemmShape>() {
        Some(g) => tiles_of(g, extents, sms),
        None => HopperTiles::Pairs,
    }
}

/// [`hopper_tiles`] of a GEMM.
pub(super) fn tiles_of(g: &GemmShape, extents: &[Option<usize>], sms: usize) -> HopperTiles {
    let (Some(&Some(m)), Some(&Some(n))) = (extents.get(g.m), extents.get(g.n)) else {
        return HopperTiles::Pairs;
    };
    hopper_tiles_for(m, n, sms)
}

impl HopperTiles {
    /// Output tiles of an `m × n` product in these tiles.
    pub fn count(self, m: usize, n: usize) -> usize {
        let bn = match self {
            HopperTiles::Narrow => 128,
            HopperTiles::Wide | HopperTiles::Pairs => 256,
        };
        m.div_ceil(128).saturating_mul(n.div_ceil(bn))
    }
}

/// [`hopper_tiles`] of an `m × n` product on `sms` SMs.
pub fn hopper_tiles_for(m: usize, n: usize, sms: usize) -> HopperTiles {
    let tiles = |bm: usize, bn: usize| m.div_ceil(bm).saturating_mul(n.div_ceil(bn));
    if sms == 0 || m == 0 || n == 0 {
        HopperTiles::Pairs
    } else if tiles(128, 128) <= sms {
        HopperTiles::Narrow
    } else if tiles(128, 256) <= sms {
        HopperTiles::Wide
    } else {
        HopperTiles::Pairs
    }
}
