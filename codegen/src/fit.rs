//! Fitting a kernel's untuned config to a launch's extents: the Hopper
//! matmul's tiles to the GPU's SMs, a row kernel's block to its row, and each
//! `whole(…)` tile's block to its extent. `extents[d]` is dimension `d`'s extent
//! at the launch, where known.

use crate::config::{default_config, default_wgmma_attention, Config};
use crate::plan::{classify, Shape};

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
    /// H200; docs/PERFORMANCE.md, session 22).
    Narrow,
}

/// Which tiles the Hopper matmul default takes for these extents on a GPU of
/// `sms` SMs (a block per SM): [`HopperTiles::Narrow`] where 128×128 tiles fit
/// one wave, [`HopperTiles::Wide`] where 128×256 ones do, else (or where M, N or
/// the SM count are unknown, or `kernel` is not a matmul) [`HopperTiles::Pairs`].
///
/// ```
/// # use tilefuse_codegen::fit::{hopper_tiles, HopperTiles};
/// # fn demo(matmul: &tilefuse_codegen::Kernel) {
/// // M, N, K = 512, 4096, 4096 on 132 SMs: 4 × 32 tiles of 128×128.
/// let ext = [Some(512), Some(4096), Some(4096)];
/// assert_eq!(hopper_tiles(matmul, &ext, 132), HopperTiles::Narrow);
/// # }
/// ```
pub fn hopper_tiles(
    kernel: &crate::ir::Kernel,
    extents: &[Option<usize>],
    sms: usize,
) -> HopperTiles {
    let Shape::Gemm(g) = classify(kernel) else {
        return HopperTiles::Pairs;
    };
    let (Some(&Some(m)), Some(&Some(n))) = (extents.get(g.m), extents.get(g.n)) else {
        return HopperTiles::Pairs;
    };
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

/// The untuned config fitted to a launch's extents: for the general
/// lowering its default for these extents
/// ([`crate::emit::general::default_config`]); for a row kernel, for its row
/// length: `default` (what [`crate::default_config_for`] gave) unless `kernel`
/// walks its rows more than once
/// (softmax, norms: a reduction, then a pass that uses it) and `default` is the
/// shape-blind [`default_config`]. Then the row's block fits the row up to 8192
/// columns, 32 values a thread, so the second walk reads registers instead of
/// memory: 2 rows × 2048 columns with 4 warps up to 2048 columns, 1 × 4096 with
/// 4 warps up to 4096, 1 × 8192 with 8 warps beyond. Measured on an H200 at
/// 16384 rows (docs/PERFORMANCE.md, session 15): softmax and RMSNorm go from
/// 65-78% of the copy bandwidth to 93-98% at 4096 and 8192 columns, LayerNorm
/// from 83% to 86% at 4096 and stays at 63% at 8192. A single online walk
/// (cross-entropy's log-sum-exp) reads each element once whatever the block,
/// and runs best with several rows a block: it keeps the default.
/// `extents[d]`: dimension `d`'s extent at this launch, where known.
pub fn fit_default(
    kernel: &crate::ir::Kernel,
    default: Config,
    extents: &[Option<usize>],
) -> Config {
    if default != default_config(kernel) {
        return default;
    }
    match classify(kernel) {
        Shape::Rows => {}
        Shape::General => return crate::emit::general::default_config(kernel, extents),
        _ => return default,
    }
    let mut walks = 0;
    kernel.walk_stmts(&mut |s| walks += usize::from(matches!(s, crate::ir::Stmt::Loop { .. })));
    let cols = (0..kernel.dims.len())
        .filter(|d| !kernel.grid.contains(d))
        .filter_map(|d| extents.get(d).copied().flatten())
        .max()
        .unwrap_or(0);
    // Up to 1024 columns the default's warp per row covers the row in one pass.
    if walks < 2 || cols <= 1024 {
        return default;
    }
    let (rows, block, warps) = match cols {
        1025..=2048 => (2, 2048, 4),
        2049..=4096 => (1, 4096, 4),
        _ => (1, 8192, 8),
    };
    let bs: Vec<usize> = (0..kernel.dims.len())
        .map(|d| {
            if kernel.grid.contains(&d) {
                rows
            } else {
                block
            }
        })
        .collect();
    Config {
        block_sizes: bs,
        ..default
    }
    .num_warps(warps)
}

/// `config` with the block of each `whole(…)` tile fitted to its extent at this
/// launch (`extents[d]`, where known): the extent rounded up to a power of two,
/// 16 at least. A `whole` tile's block is not a choice, so this applies to
/// pinned and tuned configs too. For head dimensions past 128, where the
/// output accumulators grow, an attention kernel's shape-blind default takes 8
/// warps (16 rows each) instead of 4 (32 rows each), and the Hopper default
/// ([`default_wgmma_attention`]) 64 keys a step instead of 128, in two stages.
pub fn fit_whole_dims(
    kernel: &crate::ir::Kernel,
    config: Config,
    extents: &[Option<usize>],
) -> Config {
    let is_default = config == default_config(kernel);
    let is_hopper_default = Some(&config) == default_wgmma_attention(kernel).as_ref();
    let mut c = config;
    for (d, dim) in kernel.dims.iter().enumerate() {
        if let (true, Some(Some(x)), Some(b)) =
            (dim.whole, extents.get(d), c.block_sizes.get_mut(d))
        {
            *b = (*x).max(16).next_power_of_two();
        }
        // An `each` dimension walks one index at a time.
        if let (true, Some(b)) = (dim.each, c.block_sizes.get_mut(d)) {
            *b = 1;
        }
    }
    if let (true, crate::plan::Shape::Attention(a)) = (is_default, crate::plan::classify(kernel)) {
        if c.block_sizes[a.d] > 128 {
            c = c.num_warps(8);
        }
    }
    if let (true, crate::plan::Shape::Attention(a)) =
        (is_hopper_default, crate::plan::classify(kernel))
    {
        if c.block_sizes[a.d] > 128 {
            c.block_sizes[a.n] = 64;
            c = c.num_stages(2);
        }
    }
    c
}
