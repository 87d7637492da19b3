//! The GEMM lowering's entry in the registry: which kernels it takes, its
//! untuned configs (portable and Hopper), the options it accepts, which
//! operands it stages, and its two emitters.

use super::shape::{self, GemmShape};
use super::tiles::{tiles_of, HopperTiles};
use crate::config::{Config, Target};
use crate::emit::options::{
    no_bounded_loops, no_occupancy, no_overlap, no_split, SPLIT_GENERAL_ONLY,
};
use crate::emit::{lower, Emitter, Lowered};
use crate::error::CodegenError;
use crate::ir::{Kernel, Stmt, TensorId};
use crate::plan::lowering::Lowering;
use crate::plan::Planned;
use crate::space::{Axis, ConfigSpace};
use crate::spec::Spec;

/// The GEMM lowering (see [`GemmShape`]).
pub(crate) struct Gemm;

impl Lowering for Gemm {
    type Plan = GemmShape;

    fn name(&self) -> &'static str {
        "gemm"
    }

    fn take(&self, k: &Kernel) -> Option<GemmShape> {
        shape::find(k)
    }

    /// Tile copies (TMA, `cp.async`) fill past the tensor's end with zeros,
    /// not past the extent.
    fn exact_sizes(&self) -> bool {
        true
    }

    /// 128x256x64 blocks (M x N x K), 8 warps (64x64 warp tiles) and 4
    /// stages: 192 KB of shared memory, the fastest of the swept configs on an
    /// H200 at large shapes (docs/PERFORMANCE.md).
    fn default_config(&self, k: &Kernel, g: &GemmShape) -> Config {
        let mut bs = vec![64; k.dims.len()];
        bs[g.m] = 128;
        bs[g.n] = 256;
        bs[g.k] = 64;
        Config::new(&bs).num_warps(8).num_stages(4)
    }

    /// Drops pipeline stages (down to 2) until the ring fits, so an A100
    /// (164 KB) runs the default 128x256x64 blocks with 3 stages.
    fn default_within(
        &self,
        _k: &Kernel,
        g: &GemmShape,
        mut c: Config,
        shared_limit: usize,
    ) -> Config {
        let b = &c.block_sizes;
        // The GEMM's ring of stages, bf16/f16 operands (see `portable`).
        let per_stage = (b[g.m] * b[g.k] + b[g.k] * b[g.n]) * 2;
        while c.num_stages > 2 && c.num_stages * per_stage > shared_limit {
            c.num_stages -= 1;
        }
        c
    }

    /// On a target with `wgmma`, the Hopper path when this specialization
    /// can take it (16-bit operands with rows TMA can load, or that can be
    /// staged into such rows: [`Config::stage`]), with tiles that keep the
    /// SMs busy ([`crate::hopper_tiles`]) and the TMA-store epilogue where
    /// the output takes it ([`Config::tma_store`]); else the portable default.
    fn default_at(
        &self,
        k: &Planned,
        g: &GemmShape,
        spec: &Spec,
        target: Target,
        extents: &[Option<usize>],
    ) -> Config {
        if target.wgmma {
            // The TMA-store epilogue where the output allows it and it fits:
            // faster at every shape measured, 1.006-1.41x on an H200
            // (docs/perf-history.md, "the TMA-store epilogue").
            let with_tma = |c: Config| {
                let t = c.clone().tma_store(true);
                match lower(k, spec, &t) {
                    Ok(l) if l.shared_bytes as usize <= target.shared_limit => t,
                    _ => c,
                }
            };
            let hopper = |tiles| {
                let c = wgmma_default(k, g, target.shared_limit, tiles)?;
                if lower(k, spec, &c).is_ok() {
                    return Some(with_tma(c));
                }
                // Operands TMA cannot load as they are: copied into aligned
                // scratch, the Hopper path still beats the portable one's
                // narrow loads by far.
                let staged = c.stage(true);
                (!self.unaligned_operands(k, g, spec).is_empty() && lower(k, spec, &staged).is_ok())
                    .then(|| with_tma(staged))
            };
            let tiles = tiles_of(g, extents, target.sms);
            if let Some(c) = hopper(tiles).or_else(|| hopper(HopperTiles::Pairs)) {
                return c;
            }
        }
        self.default_within(k, g, self.default_config(k, g), target.shared_limit)
    }

    /// A band of tile rows is the M block times the blocks of a cluster.
    fn group_rows(&self, _k: &Kernel, g: &GemmShape, mut config: Config, rows: usize) -> Config {
        let band =
            config.block_sizes.get(g.m).copied().unwrap_or(1).max(1) * config.cluster_m.max(1);
        config.group_m = config.group_m.min((rows / band).max(1));
        config
    }

    /// The operands A and B that are 2-D, contiguous along their last
    /// dimension, not 16-byte aligned, and only read by the kernel. None when
    /// the kernel waits on flags: its operands are still being written when
    /// the launch is queued, so a copy made before it would read stale data.
    fn unaligned_operands(&self, k: &Kernel, g: &GemmShape, spec: &Spec) -> Vec<TensorId> {
        let mut written = vec![false; k.tensors.len()];
        let mut waits = false;
        k.walk_stmts(&mut |s| match s {
            Stmt::Store { tensor, .. } => written[*tensor] = true,
            Stmt::Wait { .. } => waits = true,
            _ => {}
        });
        if waits {
            return Vec::new();
        }
        let mut out = Vec::new();
        for t in [g.a, g.b] {
            let Some(ts) = spec.tensors.get(t) else {
                continue;
            };
            if ts.rank == 2
                && ts.last_contiguous
                && ts.align < 16
                && !written[t]
                && !out.contains(&t)
            {
                out.push(t);
            }
        }
        out
    }

    fn axes(&self, _k: &Kernel, g: &GemmShape, target: Target) -> Vec<Axis> {
        super::space::axes(g, target)
    }

    fn seeds(&self, g: &GemmShape, space: &ConfigSpace, spec: &Spec, quick: bool) -> Vec<Config> {
        super::space::seeds(g, space, spec, quick)
    }

    /// Every matmul option; no `occupancy`, and loops walk their whole extent.
    fn check_options(&self, k: &Kernel, _g: &GemmShape, c: &Config) -> Result<(), CodegenError> {
        no_occupancy(k, c)?;
        no_overlap(k, c)?;
        no_split(k, c, SPLIT_GENERAL_ONLY)?;
        no_bounded_loops(k)
    }

    fn emit(&self, g: &GemmShape, e: &mut Emitter) -> Result<Lowered, CodegenError> {
        if e.cfg.wgmma {
            super::hopper::emit(e, g)
        } else {
            super::portable::emit(e, g)
        }
    }
}

/// The Hopper path's default matmul config for `tiles` (see [`HopperTiles`]),
/// two consumer warpgroups, 64 K a step, a persistent grid; `None` where
/// `kernel` is not a GEMM or two stages do not fit in `shared_limit`:
/// - [`HopperTiles::Pairs`]: 128x256 blocks, 4 stages (3 where shared memory is
///   short), in pairs that share B tiles through multicast, the fastest of the
///   Hopper configs measured on an H200 at large bf16 shapes; with the
///   TMA-store epilogue ([`crate::default_config_for`] adds it where the output
///   allows) 100-108% of cuBLAS there (docs/PERFORMANCE.md);
/// - [`HopperTiles::Wide`]: the same blocks without the pairs;
/// - [`HopperTiles::Narrow`]: 128x128 blocks, 6 stages (fewer where shared
///   memory is short).
pub fn default_wgmma_config(
    kernel: &Planned,
    shared_limit: usize,
    tiles: HopperTiles,
) -> Option<Config> {
    wgmma_default(kernel, kernel.plan()?, shared_limit, tiles)
}

/// [`default_wgmma_config`] of a GEMM.
fn wgmma_default(
    k: &Kernel,
    g: &GemmShape,
    shared_limit: usize,
    tiles: HopperTiles,
) -> Option<Config> {
    let (bn, max_stages, cluster) = match tiles {
        HopperTiles::Pairs => (256, 4, 2),
        HopperTiles::Wide => (256, 4, 1),
        HopperTiles::Narrow => (128, 6, 1),
    };
    let mut bs = vec![64; k.dims.len()];
    bs[g.m] = 128;
    bs[g.n] = bn;
    bs[g.k] = 64;
    let per_stage = (128 + bn) * 64 * 2;
    let stages = (2..=max_stages)
        .rev()
        .find(|s| s * per_stage + 2048 <= shared_limit)?;
    Some(
        Config::new(&bs)
            .num_warps(8)
            .num_stages(stages)
            .wgmma(true)
            .persistent(true)
            .cluster_m(cluster),
    )
}
