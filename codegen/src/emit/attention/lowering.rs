//! The attention lowering's entry in the registry: which kernels it takes,
//! its untuned configs (FlashAttention-2's and -3's shapes) and their fitting
//! to the head dimension, the options it accepts, and its emitters.

use super::shape::{self, AttentionShape};
use crate::config::{Config, Target};
use crate::emit::options::{no_matmul_options, no_occupancy, no_split, SPLIT_GENERAL_ONLY};
use crate::emit::{lower, Emitter, Lowered};
use crate::error::CodegenError;
use crate::ir::Kernel;
use crate::plan::lowering::Lowering;
use crate::plan::Planned;
use crate::space::{Axis, ConfigSpace};
use crate::spec::Spec;

/// The attention lowering (see [`AttentionShape`]).
pub(crate) struct Attention;

impl Lowering for Attention {
    type Plan = AttentionShape;

    fn name(&self) -> &'static str {
        "attention"
    }

    fn take(&self, k: &Kernel) -> Option<AttentionShape> {
        shape::find(k)
    }

    /// As every fast path (see [`crate::rules`]).
    fn exact_sizes(&self) -> bool {
        true
    }

    /// FlashAttention-2's shape for head dimensions up to 128: 4 warps of 32
    /// query rows, 64 keys a step. With more products a step (the backward's
    /// dQ: `dO·Vᵀ` too) 16 rows a warp, so their scores fit a thread's
    /// registers beside the output's; with two outputs (dK and dV) 32 keys
    /// (the loop's queries) a step as well.
    fn default_config(&self, k: &Kernel, a: &AttentionShape) -> Config {
        if !a.atomics.is_empty() {
            // Only the Hopper program adds products atomically: elsewhere the
            // general lowering runs the kernel.
            return general_default(k);
        }
        let more = !a.is_forward();
        let rows = if more { 64 } else { 128 };
        let mut bs = vec![1; k.dims.len()];
        bs[a.row_tile()] = rows;
        bs[a.m] = rows;
        bs[a.n] = if a.more_updates.is_empty() { 64 } else { 32 };
        bs[a.d] = 128;
        Config::new(&bs).num_warps(4)
    }

    /// On a target with `wgmma`, the Hopper program's default
    /// ([`default_wgmma_attention`]) where this specialization lowers with it:
    /// for the forward at any head dimension; for the backward's kernels (dQ,
    /// dK/dV, and the one pass with dQ's atomic adds, those by the TMA unit)
    /// at head dimensions 64 and 128, those checked against float64 on an
    /// H200. There the two
    /// kernels took 1.260 ms against `mma.sync`'s 2.288 at 4×16×2048×128
    /// (causal 0.779 against 1.298; docs/perf-history.md, "The backward's
    /// Hopper program measured"). Other head dimensions keep `mma.sync` (the
    /// one pass the general lowering) until checked.
    fn default_at(
        &self,
        k: &Planned,
        a: &AttentionShape,
        spec: &Spec,
        target: Target,
        extents: &[Option<usize>],
    ) -> Config {
        let checked_backward = || matches!(extents.get(a.d), Some(Some(64 | 128)));
        if target.wgmma && (a.is_forward() || checked_backward()) {
            let mut c = wgmma_default(k, a);
            // Persistent blocks up to 4096 keys at head dimensions up to
            // 128 (causal ones taking their tiles from a counter, longest
            // first), on an H200: 8×16×4096×128 1.836 → 1.799 ms, causal
            // 1.090 → 1.050; 32×16×1024 0.637 → 0.586, causal 0.500 →
            // 0.443; GQA and 64 2–4% faster. 16k keys: equal or up to 5%
            // slower (blocks walking apart share less of L2), causal 1%
            // slower; 256: 6% slower, causal 1% faster (docs/perf-history.md,
            // "Persistent blocks on the forward's Hopper program", "Causal
            // tiles from a counter").
            let small_head = matches!(extents.get(a.d), Some(Some(d)) if *d <= 128);
            let few_keys = matches!(extents.get(a.n), Some(Some(n)) if *n <= 4096);
            if a.is_forward() && a.packed.is_none() && small_head && few_keys {
                c = c.persistent(true);
            }
            // Past 4096 keys at head dimension 128, without a causal order:
            // persistent blocks of FlashAttention-3's 176 keys a step in two
            // stages (the per-step work of the softmax and the turns spread
            // over more keys): 1×16×16384×128 3.272 → 3.145 ms on an H200;
            // at 4096 keys equal, at 1024 4% slower, causal 1% slower
            // (docs/perf-history.md, "176 keys a step at long sequences").
            let head_128 = matches!(extents.get(a.d), Some(Some(128)));
            let long_keys = matches!(extents.get(a.n), Some(Some(n)) if *n > 4096);
            if a.is_forward()
                && a.packed.is_none()
                && head_128
                && long_keys
                && super::work_order(k.kernel(), a).is_none()
            {
                c = c.persistent(true).num_stages(2);
                c.block_sizes[a.n] = 176;
            }
            // The one pass's dQ added by the TMA unit, in three stages where
            // they fit beside its staging, else two (at head dimension 128
            // three pass 227 KB): 1.212 → 1.013 ms at 4×16×2048×128 on an
            // H200, causal 0.744 → 0.630 (docs/perf-history.md, "The one
            // pass's dQ by TMA measured").
            let tma = (!a.atomics.is_empty()).then(|| c.clone().tma_store(true));
            // From 4096 keys, persistent blocks share the last tiles' key
            // steps where the kernel allows it (`split`): no SM idles
            // through a last, partial wave. 8×16×4096×128 on an H200 1.668
            // → 1.640 ms, GQA 4×32×4096 on 8 heads 1.665 → 1.644; at 1024
            // keys 1.5% slower (a split tile's two ends cost more than the
            // idle SMs a short tile leaves; docs/perf-history.md, "The
            // split tail").
            let many_keys = matches!(extents.get(a.n), Some(Some(n)) if *n >= 4096);
            let split = (c.persistent && many_keys).then(|| c.clone().stream_k(true));
            let candidates = tma
                .into_iter()
                .flat_map(|t| [t.clone(), t.num_stages(2)])
                .chain(split)
                .chain([c]);
            for c in candidates {
                // Fitted to the launch's head dimension, as it will run.
                let fitted = crate::fit_whole_dims(k, c.clone(), extents);
                let fits = lower(k, spec, &fitted)
                    .is_ok_and(|l| l.shared_bytes as usize <= target.shared_limit);
                if fits {
                    return c;
                }
            }
        }
        if !a.atomics.is_empty() {
            let g = Planned::general(k.kernel().clone());
            return crate::config::default_config_at(&g, spec, target, extents).general(true);
        }
        self.default_within(k, a, self.default_config(k, a), target.shared_limit)
    }

    /// For head dimensions past 128, where the output accumulators grow, the
    /// default takes 8 warps (16 rows each) instead of 4 (32 rows each), and
    /// the Hopper default 64 keys a step instead of 128, in two stages; up to
    /// 64, the Hopper default's forward takes 192 rows (12 consumer warps) in
    /// two stages. A
    /// packed kernel's row loop takes the block of the grid tile it walks one
    /// block of (see [`super::Packed`]): the config's choice is the grid's.
    fn fit_whole_dims(
        &self,
        k: &Kernel,
        a: &AttentionShape,
        given: &Config,
        mut fitted: Config,
    ) -> Config {
        if let Some(b) = fitted.block_sizes.get(a.row_tile()).copied() {
            if let Some(m) = fitted.block_sizes.get_mut(a.m) {
                *m = b;
            }
        }
        if *given == self.default_config(k, a) && fitted.block_sizes[a.d] > 128 && a.is_forward() {
            fitted = fitted.num_warps(8);
        }
        // The Hopper default's fits, with or without its persistent blocks.
        let hopper_default = given.clone().persistent(false).stream_k(false) == wgmma_default(k, a);
        if hopper_default && fitted.block_sizes[a.d] > 128 {
            fitted.block_sizes[a.n] = 64;
            fitted = fitted.num_stages(2).overlap(false);
        }
        // Head dimension 64 or less: three consumer warpgroups (192-row tiles,
        // FlashAttention-3's shape there), two stages. 8×16×4096×64 on an H200:
        // 1.423 → 1.200 ms, causal 0.828 → 0.781 (docs/perf-history.md, "Three
        // consumer warpgroups at head dimension 64").
        // Packed sequences keep 128 rows: their causal program spills 8 bytes at 192.
        if hopper_default && fitted.block_sizes[a.d] <= 64 && a.is_forward() && a.packed.is_none() {
            fitted.block_sizes[a.row_tile()] = 192;
            fitted.block_sizes[a.m] = 192;
            fitted = fitted.num_warps(12).num_stages(2);
        }
        fitted
    }

    fn axes(&self, _k: &Kernel, a: &AttentionShape, _target: Target) -> Vec<Axis> {
        super::space::axes(a)
    }

    fn seeds(
        &self,
        a: &AttentionShape,
        space: &ConfigSpace,
        _spec: &Spec,
        _quick: bool,
    ) -> Vec<Config> {
        super::space::seeds(a, space)
    }

    /// `wgmma` (its Hopper program), `tma_store` there for an atomic product
    /// (its adds by the TMA unit), `persistent` there for a forward kernel
    /// (one wave of blocks walking the tiles), none of the matmul's other
    /// options, no `occupancy`.
    fn check_options(
        &self,
        k: &Kernel,
        a: &AttentionShape,
        c: &Config,
    ) -> Result<(), CodegenError> {
        if c.tma_store && (!c.wgmma || a.atomics.is_empty()) {
            return Err(crate::emit::config_err(
                k,
                c,
                "`tma_store` on an attention kernel has the TMA unit add its atomic product (the one-pass \
                 backward's dQ) on the Hopper program: set `wgmma` for a kernel with one, else drop `tma_store`",
            ));
        }
        if c.persistent && !(c.wgmma && a.is_forward()) {
            return Err(crate::emit::config_err(
                k,
                c,
                "`persistent` walks a forward attention kernel's tiles on the Hopper program: set `wgmma` \
                 on a forward kernel, else drop `persistent`",
            ));
        }
        if c.stream_k && !c.persistent {
            return Err(crate::emit::config_err(
                k,
                c,
                "`stream_k` on an attention kernel shares the last tiles' key steps among the persistent \
                 blocks: set `persistent` too, or drop `stream_k`",
            ));
        }
        no_matmul_options(
            k,
            &c.clone().tma_store(false).persistent(false).stream_k(false),
            true,
            "`cluster_m`, `stage` and `pingpong` are options of a matmul (one tile loop with `addmm`); leave them unset for an attention kernel",
        )?;
        no_occupancy(k, c)?;
        if c.overlap && !c.wgmma {
            return Err(crate::emit::config_err(
                k,
                c,
                "`overlap` is an option of the Hopper attention program; set `wgmma` too, or drop `overlap`",
            ));
        }
        if c.overlap && !a.is_forward() {
            return Err(crate::emit::config_err(
                k,
                c,
                "`overlap` runs the softmax under the last tile's `p·v`: the forward's form (two products a key \
                 step); this kernel has more (each its own `wgmma` group already); drop `overlap`",
            ));
        }
        no_split(k, c, SPLIT_GENERAL_ONLY)
    }

    fn emit(&self, a: &AttentionShape, e: &mut Emitter) -> Result<Lowered, CodegenError> {
        super::emit(e, a)
    }
}

/// The Hopper attention program's default (FlashAttention-3's shape for head
/// dimensions up to 128): two consumer warpgroups of 64 query rows, 128 keys a
/// step, three stages of `k` and `v` (a stage is released one tile late, when
/// its `p·v` completes with the next tile's `q·kᵀ`: with two, every tile waited
/// for its loads, 430 TFLOP/s against 544 at batch 8 × 16 heads × 4096 × 128 on
/// an H200), each step's softmax under the last tile's `p·v` ([`Config::overlap`]:
/// 2.025 → 1.920 ms there, causal 1.198 → 1.137 ms; a forward's only: the
/// backward's programs have more products a step). [`crate::fit_whole_dims`]
/// takes 64 keys a step and two stages, without the overlap, for head
/// dimensions past 128 (the output accumulators and the tiles grow).
/// `None` where `kernel` is not an attention kernel.
pub fn default_wgmma_attention(kernel: &Planned) -> Option<Config> {
    Some(wgmma_default(kernel, kernel.plan()?))
}

/// The general lowering's default for `k`, asking for it ([`Config::general`]).
fn general_default(k: &Kernel) -> Config {
    crate::config::default_config(&Planned::general(k.clone())).general(true)
}

/// [`default_wgmma_attention`] of an attention kernel: the backward's (more
/// products a step) take 64 keys a step, not 128 (FlashAttention-3's tile
/// there), and no `overlap`.
fn wgmma_default(k: &Kernel, a: &AttentionShape) -> Config {
    let forward = a.is_forward();
    let mut bs = vec![1; k.dims.len()];
    bs[a.row_tile()] = 128;
    bs[a.m] = 128;
    bs[a.n] = if forward { 128 } else { 64 };
    bs[a.d] = 128;
    Config::new(&bs)
        .num_warps(8)
        .num_stages(3)
        .wgmma(true)
        .overlap(forward)
}
