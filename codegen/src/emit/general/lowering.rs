//! The general lowering's entry in the registry: it takes every kernel; its
//! configs, tuning space and emitter are the general lowering's own
//! ([`super::default_config`], [`super::axes`], [`super::seeds`]).

use crate::config::{Config, Target};
use crate::emit::options::{no_matmul_options, no_occupancy, MATMUL_ONLY};
use crate::emit::{Emitter, Lowered};
use crate::error::CodegenError;
use crate::ir::Kernel;
use crate::plan::lowering::Lowering;
use crate::space::{Axis, ConfigSpace};
use crate::spec::Spec;

/// The general lowering: any checked kernel.
pub(crate) struct General;

impl Lowering for General {
    type Plan = ();

    fn name(&self) -> &'static str {
        "general"
    }

    fn take(&self, _k: &Kernel) -> Option<()> {
        Some(())
    }

    /// Its accesses are masked by the extents and nothing fills past them, so
    /// a tensor may be larger than its tiles cover.
    fn exact_sizes(&self) -> bool {
        false
    }

    fn default_config(&self, k: &Kernel, _p: &()) -> Config {
        super::default_config(k, &[])
    }

    /// Its default for these extents.
    fn fit_default(
        &self,
        k: &Kernel,
        _p: &(),
        _default: Config,
        extents: &[Option<usize>],
    ) -> Config {
        super::default_config(k, extents)
    }

    fn axes(&self, k: &Kernel, _p: &(), _target: Target) -> Vec<Axis> {
        super::axes(k)
    }

    fn seeds(&self, _p: &(), space: &ConfigSpace, _spec: &Spec, _quick: bool) -> Vec<Config> {
        super::seeds(space.kernel(), space.default_config())
    }

    /// None of the matmul's options, no `occupancy`.
    fn check_options(&self, k: &Kernel, _p: &(), c: &Config) -> Result<(), CodegenError> {
        no_matmul_options(k, c, false, MATMUL_ONLY)?;
        no_occupancy(k, c)
    }

    fn emit(&self, _p: &(), e: &mut Emitter) -> Result<Lowered, CodegenError> {
        super::emit(e)
    }
}
