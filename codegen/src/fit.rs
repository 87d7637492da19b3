//! Fitting a kernel's untuned config to a launch: to its extents, by the
//! lowering the kernel takes (a row kernel's block to its row, the general
//! lowering's blocks to the extents; the Hopper matmul's tiles are chosen in
//! [`crate::default_config_at`]), each `whole(…)` tile's block to its extent,
//! and a matmul's tile order to bands of rows. `extents[d]` is dimension
//! `d`'s extent at the launch, where known.

use crate::config::{default_config, Config};
use crate::plan::Planned;

/// The untuned config fitted to a launch's extents, by the lowering the kernel
/// takes: `default` (what [`crate::default_config_for`] gave) unless it is the
/// shape-blind [`default_config`]. Then the general lowering takes its default
/// for these extents ([`crate::emit::general::default_config`]); a row kernel
/// that walks its rows more than once (softmax, norms: a reduction, then a
/// pass that uses it) a block that fits its row, up to 8192 columns, so the
/// second walk reads registers instead of memory (docs/perf-history.md, "row
/// defaults that fit the row"). `extents[d]`: dimension `d`'s extent at this
/// launch, where known.
pub fn fit_default(kernel: &Planned, default: Config, extents: &[Option<usize>]) -> Config {
    if default != default_config(kernel) {
        return default;
    }
    kernel.chosen().fit_default(kernel, default, extents)
}

/// `config` with the block of each `whole(…)` tile fitted to its extent at this
/// launch (`extents[d]`, where known): the extent rounded up to a power of two,
/// 16 at least. A `whole` tile's block is not a choice, so this applies to
/// pinned and tuned configs too. For head dimensions past 128, where the
/// output accumulators grow, an attention kernel's shape-blind default takes 8
/// warps (16 rows each) instead of 4 (32 rows each), and the Hopper default
/// ([`crate::default_wgmma_attention`]) 64 keys a step instead of 128, in two stages.
pub fn fit_whole_dims(kernel: &Planned, config: Config, extents: &[Option<usize>]) -> Config {
    let mut c = config.clone();
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
    let kernel = kernel.for_config(&config);
    kernel.chosen().fit_whole_dims(&kernel, &config, c)
}

/// `config` with its tile-order groups (`group_m`) capped so that bands of at
/// most `rows` output rows complete one after the other (a matmul's; other
/// kernels' configs are unchanged): for a consumer that moves the output in
/// row chunks as they complete.
pub fn group_rows(kernel: &Planned, config: Config, rows: usize) -> Config {
    kernel.chosen().group_rows(kernel, config, rows)
}
