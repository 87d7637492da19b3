//! The general lowering's entry in the registry: it takes every kernel; its
//! configs, tuning space and emitter are the general lowering's own
//! ([`super::default_config`], [`super::axes`], [`super::seeds`]).

use super::products::{self, Products};
use super::split::{self, SplitLoop};
use crate::config::{Config, Target};
use crate::emit::options::{no_matmul_options, no_overlap, no_split, MATMUL_ONLY};
use crate::emit::{Emitter, Lowered};
use crate::error::CodegenError;
use crate::ir::Kernel;
use crate::plan::lowering::Lowering;
use crate::space::{Axis, ConfigSpace};
use crate::spec::Spec;

/// The general lowering: any checked kernel.
pub(crate) struct General;

/// What the general lowering finds in a kernel once.
#[derive(Clone, Debug, Default)]
pub(crate) struct GeneralPlan {
    /// The loop its programs may share ([`split`]).
    pub split: Option<SplitLoop>,
    /// The tiles its `addmm`s run over, if it has any ([`products`]).
    pub products: Option<Products>,
}

impl Lowering for General {
    type Plan = GeneralPlan;

    fn name(&self) -> &'static str {
        "general"
    }

    fn take(&self, k: &Kernel) -> Option<GeneralPlan> {
        Some(GeneralPlan {
            split: split::find(k),
            products: products::find(k),
        })
    }

    /// Its accesses are masked by the extents and nothing fills past them, so
    /// a tensor may be larger than its tiles cover.
    fn exact_sizes(&self) -> bool {
        false
    }

    fn default_config(&self, k: &Kernel, p: &GeneralPlan) -> Config {
        match &p.products {
            Some(m) => products::default_config(k, m, &[]),
            None => super::config::fitted(k, &[], p.split.as_ref()),
        }
    }

    /// Its default for these extents.
    fn fit_default(
        &self,
        k: &Kernel,
        p: &GeneralPlan,
        _default: Config,
        extents: &[Option<usize>],
    ) -> Config {
        match &p.products {
            Some(m) => products::default_config(k, m, extents),
            None => super::config::fitted(k, extents, p.split.as_ref()),
        }
    }

    fn axes(&self, k: &Kernel, p: &GeneralPlan, _target: Target) -> Vec<Axis> {
        let mut axes = match &p.products {
            Some(m) => products::axes(m, super::axes(k)),
            None => super::axes(k),
        };
        if p.split.is_some() {
            axes.push(Axis::Split(vec![1, 8, 32, 128]));
        }
        axes
    }

    fn seeds(
        &self,
        p: &GeneralPlan,
        space: &ConfigSpace,
        _spec: &Spec,
        _quick: bool,
    ) -> Vec<Config> {
        match &p.products {
            Some(m) => products::seeds(space.kernel(), m, space.default_config()),
            None => super::seeds(space.kernel(), space.default_config()),
        }
    }

    /// None of the matmul's options; `split` where a loop can be shared.
    fn check_options(&self, k: &Kernel, p: &GeneralPlan, c: &Config) -> Result<(), CodegenError> {
        no_matmul_options(k, c, false, MATMUL_ONLY)?;
        no_overlap(k, c)?;
        if p.split.is_none() {
            no_split(
                k,
                c,
                "this kernel has no loop to share (the program's first tile loop, over its whole extent, with only `let`s before it, accumulating `acc = acc + …` (or max, min, product, `addmm`, or a running best's position: `at = select(x < best, t, at)` ahead of `best = min(best, x)`), and no tile loop after it)",
            )?;
        }
        Ok(())
    }

    fn emit(&self, p: &GeneralPlan, e: &mut Emitter) -> Result<Lowered, CodegenError> {
        super::emit(e, p)
    }
}
