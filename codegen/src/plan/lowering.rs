//! The [`Lowering`] trait every lowering implements, and the type-erased form
//! the registry (`crate::emit::LOWERINGS`) and a [`Planned`] kernel hold.
//!
//! A lowering writes its jobs against its own typed plan (a GEMM's
//! [`crate::emit::GemmShape`], an attention kernel's
//! [`crate::emit::AttentionShape`]); the blanket impls below pair the plan with
//! its lowering once, when the kernel is planned, so no job downcasts or
//! re-derives it.

use super::Planned;
use crate::config::{Config, Target};
use crate::emit::{Emitter, Lowered};
use crate::error::CodegenError;
use crate::ir::{Kernel, TensorId};
use crate::space::{Axis, ConfigSpace};
use crate::spec::Spec;
use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;

/// One way of lowering kernels to CUDA C: which kernels it takes, and for
/// those its untuned configs, its tuning space, the config options it
/// accepts and its emitter. Each lives in its own folder under `emit/`, and
/// the registry lists it once.
///
/// Every job but [`Lowering::take`] gets the kernel and the plan `take` made
/// of it; the kernel is specialized for its `#[constexpr]` values wherever
/// the caller knows them (always for [`Lowering::emit`]).
pub(crate) trait Lowering: Sync + 'static {
    /// What [`Lowering::take`] found in a kernel it takes: what the other jobs read.
    type Plan: Clone + Debug + Send + Sync + 'static;

    /// The lowering's name, for logs and errors.
    fn name(&self) -> &'static str;

    /// The plan for `k` when this lowering takes it.
    fn take(&self, k: &Kernel) -> Option<Self::Plan>;

    /// Whether a tensor indexed by a tile's own indices must have the tile's
    /// extent exactly, rather than at least (see [`crate::rules`]).
    fn exact_sizes(&self) -> bool;

    /// The config that runs on any GPU without tuning.
    fn default_config(&self, k: &Kernel, p: &Self::Plan) -> Config;

    /// `default` (this lowering's [`Lowering::default_config`]) fitted to a GPU
    /// that allows `shared_limit` bytes of shared memory per block.
    fn default_within(
        &self,
        _k: &Kernel,
        _p: &Self::Plan,
        default: Config,
        _shared_limit: usize,
    ) -> Config {
        default
    }

    /// The untuned config on `target` for `spec` and the launch's extents
    /// (`extents[d]`: dimension `d`'s, where known); `k` is specialized for
    /// `spec`. Without a program of its own for the target, the default within
    /// the target's shared memory.
    fn default_at(
        &self,
        k: &Planned,
        p: &Self::Plan,
        _spec: &Spec,
        target: Target,
        _extents: &[Option<usize>],
    ) -> Config {
        self.default_within(k, p, self.default_config(k, p), target.shared_limit)
    }

    /// The untuned default (equal to [`Lowering::default_config`]) fitted to a
    /// launch's extents; `whole(…)` tiles are fitted afterwards, for every lowering.
    fn fit_default(
        &self,
        _k: &Kernel,
        _p: &Self::Plan,
        default: Config,
        _extents: &[Option<usize>],
    ) -> Config {
        default
    }

    /// `fitted`, which is `given` with its `whole(…)` and `each` tiles fitted
    /// to a launch's extents, adjusted to what those blocks need.
    fn fit_whole_dims(
        &self,
        _k: &Kernel,
        _p: &Self::Plan,
        _given: &Config,
        fitted: Config,
    ) -> Config {
        fitted
    }

    /// `config` with its tile-order groups (`group_m`) capped so that bands of
    /// at most `rows` output rows complete one after the other.
    fn group_rows(&self, _k: &Kernel, _p: &Self::Plan, config: Config, _rows: usize) -> Config {
        config
    }

    /// The operands a launch with [`Config::stage`] copies into 16-byte
    /// aligned scratch first (see [`crate::staging`]).
    fn unaligned_operands(&self, _k: &Kernel, _p: &Self::Plan, _spec: &Spec) -> Vec<TensorId> {
        Vec::new()
    }

    /// What the tuner may change on `target` (the `stage` axis, where operands
    /// can be staged, is added after these).
    fn axes(&self, k: &Kernel, p: &Self::Plan, target: Target) -> Vec<Axis>;

    /// Proven starting points for the tuner, best first (the space filters
    /// out those that do not fit and puts its default before them).
    fn seeds(&self, p: &Self::Plan, space: &ConfigSpace, spec: &Spec, quick: bool) -> Vec<Config>;

    /// Whether the tuner also tries the general lowering's default on this
    /// lowering's kernels ([`Config::general`]): a fast path the general
    /// lowering may beat on some kernels or shapes.
    fn compare_general(&self) -> bool {
        false
    }

    /// Refuses the config options this lowering does not take (the options
    /// every lowering checks the same way are checked before).
    fn check_options(&self, k: &Kernel, p: &Self::Plan, c: &Config) -> Result<(), CodegenError>;

    /// The kernel's CUDA C.
    fn emit(&self, p: &Self::Plan, e: &mut Emitter) -> Result<Lowered, CodegenError>;
}

/// A lowering as the registry lists it: one that may take a kernel.
pub(crate) trait AnyLowering: Sync {
    /// The lowering with its plan for `k`, when it takes `k`.
    fn try_plan(&'static self, k: &Kernel) -> Option<Arc<dyn Chosen>>;
}

impl<L: Lowering> AnyLowering for L {
    fn try_plan(&'static self, k: &Kernel) -> Option<Arc<dyn Chosen>> {
        Some(chosen(self, self.take(k)?))
    }
}

/// `lowering` with `plan`, a plan it made.
pub(crate) fn chosen<L: Lowering>(lowering: &'static L, plan: L::Plan) -> Arc<dyn Chosen> {
    Arc::new(ChosenBy { lowering, plan })
}

/// A lowering with the plan it made of one kernel: its jobs, for that kernel.
/// See [`Lowering`] for each.
pub(crate) trait Chosen: Debug + Send + Sync {
    fn name(&self) -> &'static str;
    fn plan(&self) -> &dyn Any;
    fn exact_sizes(&self) -> bool;
    fn default_config(&self, k: &Kernel) -> Config;
    fn default_within(&self, k: &Kernel, default: Config, shared_limit: usize) -> Config;
    fn default_at(
        &self,
        k: &Planned,
        spec: &Spec,
        target: Target,
        extents: &[Option<usize>],
    ) -> Config;
    fn fit_default(&self, k: &Kernel, default: Config, extents: &[Option<usize>]) -> Config;
    fn fit_whole_dims(&self, k: &Kernel, given: &Config, fitted: Config) -> Config;
    fn group_rows(&self, k: &Kernel, config: Config, rows: usize) -> Config;
    fn unaligned_operands(&self, k: &Kernel, spec: &Spec) -> Vec<TensorId>;
    fn axes(&self, k: &Kernel, target: Target) -> Vec<Axis>;
    fn seeds(&self, space: &ConfigSpace, spec: &Spec, quick: bool) -> Vec<Config>;
    fn compare_general(&self) -> bool;
    fn check_options(&self, k: &Kernel, c: &Config) -> Result<(), CodegenError>;
    fn emit(&self, e: &mut Emitter) -> Result<Lowered, CodegenError>;
}

/// [`Chosen`] for lowering `L`.
struct ChosenBy<L: Lowering> {
    lowering: &'static L,
    plan: L::Plan,
}

impl<L: Lowering> Debug for ChosenBy<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chosen")
            .field("lowering", &self.lowering.name())
            .field("plan", &self.plan)
            .finish()
    }
}

impl<L: Lowering> Chosen for ChosenBy<L> {
    fn name(&self) -> &'static str {
        self.lowering.name()
    }

    fn plan(&self) -> &dyn Any {
        &self.plan
    }

    fn exact_sizes(&self) -> bool {
        self.lowering.exact_sizes()
    }

    fn default_config(&self, k: &Kernel) -> Config {
        self.lowering.default_config(k, &self.plan)
    }

    fn default_within(&self, k: &Kernel, default: Config, shared_limit: usize) -> Config {
        self.lowering
            .default_within(k, &self.plan, default, shared_limit)
    }

    fn default_at(
        &self,
        k: &Planned,
        spec: &Spec,
        target: Target,
        extents: &[Option<usize>],
    ) -> Config {
        self.lowering
            .default_at(k, &self.plan, spec, target, extents)
    }

    fn fit_default(&self, k: &Kernel, default: Config, extents: &[Option<usize>]) -> Config {
        self.lowering.fit_default(k, &self.plan, default, extents)
    }

    fn fit_whole_dims(&self, k: &Kernel, given: &Config, fitted: Config) -> Config {
        self.lowering.fit_whole_dims(k, &self.plan, given, fitted)
    }

    fn group_rows(&self, k: &Kernel, config: Config, rows: usize) -> Config {
        self.lowering.group_rows(k, &self.plan, config, rows)
    }

    fn unaligned_operands(&self, k: &Kernel, spec: &Spec) -> Vec<TensorId> {
        self.lowering.unaligned_operands(k, &self.plan, spec)
    }

    fn axes(&self, k: &Kernel, target: Target) -> Vec<Axis> {
        self.lowering.axes(k, &self.plan, target)
    }

    fn seeds(&self, space: &ConfigSpace, spec: &Spec, quick: bool) -> Vec<Config> {
        self.lowering.seeds(&self.plan, space, spec, quick)
    }

    fn compare_general(&self) -> bool {
        self.lowering.compare_general()
    }

    fn check_options(&self, k: &Kernel, c: &Config) -> Result<(), CodegenError> {
        self.lowering.check_options(k, &self.plan, c)
    }

    fn emit(&self, e: &mut Emitter) -> Result<Lowered, CodegenError> {
        self.lowering.emit(&self.plan, e)
    }
}
