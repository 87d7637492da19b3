//! The row lowering's entry in the registry: which kernels it takes, its
//! untuned config and its fitting to the row length, the options it accepts,
//! and its emitter (handing the kernel to the general lowering where a
//! construct passed its check but it cannot emit it).

use crate::config::Config;
use crate::emit::options::{
    no_bounded_loops, no_matmul_options, no_overlap, no_split, MATMUL_ONLY, SPLIT_GENERAL_ONLY,
};
use crate::emit::{Emitter, Lowered};
use crate::error::CodegenError;
use crate::ir::{Kernel, Stmt};
use crate::plan::form::{addmm_stmts, fast_form};
use crate::plan::lowering::Lowering;
use crate::space::{Axis, ConfigSpace};
use crate::spec::Spec;

/// The row lowering: no matmul; one grid dimension (the rows), tiles reduced
/// along the columns walked by `tile()` loops directly inside the grid loop.
pub(crate) struct Rows;

impl Lowering for Rows {
    type Plan = ();

    fn name(&self) -> &'static str {
        "rows"
    }

    fn take(&self, k: &Kernel) -> Option<()> {
        (fast_form(k) && addmm_stmts(k).is_empty() && super::takes(k)).then_some(())
    }

    /// As every fast path (see [`crate::rules`]).
    fn exact_sizes(&self) -> bool {
        true
    }

    /// A warp per row, 1024 columns per step: 32 values a thread (bf16),
    /// loaded 16 bytes at a time; one pass for rows of up to 1024.
    fn default_config(&self, k: &Kernel, _p: &()) -> Config {
        let bs: Vec<usize> = (0..k.dims.len())
            .map(|d| if k.grid.contains(&d) { 4 } else { 1024 })
            .collect();
        Config::new(&bs).num_warps(4)
    }

    /// Unless `k` walks its rows more than once (softmax, norms: a
    /// reduction, then a pass that uses it), the default. Then the row's
    /// block fits the row up to 8192 columns, 32 values a thread, so the second
    /// walk reads registers instead of memory: 2 rows × 2048 columns with 4
    /// warps up to 2048 columns, 1 × 4096 with 4 warps up to 4096, 1 × 8192
    /// with 8 warps beyond. Measured on an H200 at 16384 rows
    /// (docs/perf-history.md, "row defaults that fit the row"): softmax and RMSNorm go from 65-78% of
    /// the copy bandwidth to 93-98% at 4096 and 8192 columns, LayerNorm from 83%
    /// to 86% at 4096 and stays at 63% at 8192. A single online walk
    /// (cross-entropy's log-sum-exp) reads each element once whatever the
    /// block, and runs best with several rows a block: it keeps the default.
    /// Two walks past 4096 columns keep 8 warps (32 values a thread): with 4
    /// (64 values) quantize_i8 ran 0.1038 ms against 0.1237 and rms_norm 0.1348
    /// against 0.1400, but softmax spilled at the 72 registers its launch
    /// bounds leave (0.3614 against 0.1337) and layer_norm_bwd ran 0.2975
    /// against 0.1988 (H200, 16384×8192 bf16, docs/perf-history.md, "Causal
    /// tiles from a counter; the row kernels' warps at 8192 columns"); the
    /// tuner weighs 4 warps per kernel.
    /// A kernel that walks the row three times or more (LayerNorm's mean,
    /// variance, output) past 4096 columns: the first walk covers the row
    /// (8192 columns, 4 warps, 64 values a thread), the second 4096 a step,
    /// the later ones 2048: LayerNorm at 8192 columns ran 0.152 ms with 2048
    /// for every later walk against 0.199 with 8192 a step and 8 warps
    /// throughout (H200, docs/perf-history.md, "Fewer instructions an
    /// element"), and 0.145 with the second walk at 4096 (the full tuner's
    /// pick against 0.153, one call: "Multi-GPU on 2 ranks again; …").
    fn fit_default(
        &self,
        k: &Kernel,
        _p: &(),
        default: Config,
        extents: &[Option<usize>],
    ) -> Config {
        let mut walks = 0;
        k.walk_stmts(&mut |s| walks += usize::from(matches!(s, Stmt::Loop { .. })));
        let cols = (0..k.dims.len())
            .filter(|d| !k.grid.contains(d))
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
            4097..=8192 if walks >= 3 => (1, 8192, 4),
            _ => (1, 8192, 8),
        };
        // Later walks narrower where the first one covers 8192 columns with 4 warps.
        let later = |walk: usize| match (warps, block, walk) {
            (4, 8192, 2) => 4096,
            (4, 8192, _) => 2048,
            _ => block,
        };
        let mut walked = 0;
        let bs: Vec<usize> = (0..k.dims.len())
            .map(|d| {
                if k.grid.contains(&d) {
                    rows
                } else {
                    walked += 1;
                    if walked == 1 {
                        block
                    } else {
                        later(walked)
                    }
                }
            })
            .collect();
        Config {
            block_sizes: bs,
            ..default
        }
        .num_warps(warps)
    }

    fn axes(&self, k: &Kernel, _p: &(), _target: crate::config::Target) -> Vec<Axis> {
        super::space::axes(k)
    }

    fn seeds(&self, _p: &(), space: &ConfigSpace, _spec: &Spec, _quick: bool) -> Vec<Config> {
        super::space::seeds(space)
    }

    /// The general lowering's blocked layouts run some row kernels faster
    /// (argmax and row_max_min lower there already): the tuner weighs them.
    fn compare_general(&self) -> bool {
        true
    }

    /// `occupancy`, none of the matmul options; loops walk their whole extent.
    fn check_options(&self, k: &Kernel, _p: &(), c: &Config) -> Result<(), CodegenError> {
        no_matmul_options(k, c, false, MATMUL_ONLY)?;
        no_overlap(k, c)?;
        no_split(k, c, SPLIT_GENERAL_ONLY)?;
        no_bounded_loops(k)
    }

    fn emit(&self, _p: &(), e: &mut Emitter) -> Result<Lowered, CodegenError> {
        match super::emit(e) {
            // A construct the row lowering's check let through: the general
            // lowering takes every kernel.
            Err(CodegenError::Unsupported { .. }) => {
                crate::emit::general::emit(&mut e.fresh(), &Default::default())
            }
            other => other,
        }
    }
}
