//! Which lowering a kernel takes, decided once: a [`Planned`] kernel holds the
//! lowering the registry (`crate::emit::LOWERINGS`) chose for it and the
//! plan that lowering made of it, and every job that depends on the choice
//! (configs, tuning space, size rules, the CUDA C) reads it from there.
//!
//! The fast paths (attention, GEMM, rows: see their plans,
//! [`crate::emit::AttentionShape`], [`crate::emit::GemmShape`], and their
//! folders under `emit/`) take the forms they were written for, in the form
//! they share (see `form`): plain tile indices (`t[(tm, tn)]`), no atomics, no
//! runtime `if`s and no computed loop bounds. The general lowering takes every
//! kernel the checker accepts.

pub(crate) mod form;
pub(crate) mod lowering;
#[cfg(test)]
mod tests;

use crate::config::Config;
use crate::error::CodegenError;
use crate::ir::Kernel;
use crate::rules::SizeRule;
use lowering::Chosen;
use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

/// A kernel with the lowering it takes and that lowering's plan of it,
/// decided once. Derefs to the [`Kernel`]; cheap to clone.
///
/// ```
/// # fn demo(kernel: tilefuse_codegen::Kernel) {
/// use tilefuse_codegen::{emit::GemmShape, Planned};
/// let planned = Planned::new(kernel);
/// if let Some(g) = planned.plan::<GemmShape>() {
///     println!("`{}` is a GEMM over {:?}", planned.name, (g.m, g.n, g.k));
/// }
/// println!("lowered by the {} lowering", planned.lowering());
/// # }
/// ```
#[derive(Clone)]
pub struct Planned {
    kernel: Arc<Kernel>,
    chosen: Arc<dyn Chosen>,
    /// The `#[constexpr]` values the kernel was specialized for, if it was.
    consts: Option<Arc<[i64]>>,
    /// The size rules a launch checks, derived on first use (shared by clones).
    rules: Arc<OnceLock<Vec<SizeRule>>>,
    /// Planned by the general lowering whatever the registry would choose
    /// ([`Planned::general`]); its specializations are too.
    general: bool,
}

impl Planned {
    /// Plans `kernel`: the first lowering of the registry that takes it.
    pub fn new(kernel: Kernel) -> Planned {
        Planned::plan_by(kernel, false)
    }

    /// Plans `kernel` with the general lowering, which takes every kernel,
    /// even one a fast path would take: to compare the two, or to test the
    /// general lowering on a kernel of a fast path's form.
    pub fn general(kernel: Kernel) -> Planned {
        Planned::plan_by(kernel, true)
    }

    /// The kernel as `config` lowers it: planned by the general lowering
    /// when the config asks for it ([`Config::general`]) and the registry
    /// chose a fast path, else itself.
    pub fn for_config(&self, config: &Config) -> Cow<'_, Planned> {
        if !config.general || self.general {
            return Cow::Borrowed(self);
        }
        Cow::Owned(Planned {
            consts: self.consts.clone(),
            ..Planned::plan_by((*self.kernel).clone(), true)
        })
    }

    fn plan_by(kernel: Kernel, general_only: bool) -> Planned {
        let general = &crate::emit::general::lowering::General;
        let chosen = crate::emit::LOWERINGS
            .iter()
            .filter(|_| !general_only)
            .find_map(|l| l.try_plan(&kernel))
            // The general lowering, last in the registry, takes every kernel.
            .unwrap_or_else(|| {
                lowering::chosen(
                    general,
                    lowering::Lowering::take(general, &kernel).unwrap_or_default(),
                )
            });
        Planned {
            kernel: Arc::new(kernel),
            chosen,
            consts: None,
            rules: Arc::default(),
            general: general_only,
        }
    }

    /// The kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// The name of the lowering the kernel takes (such as `"gemm"` or
    /// `"general"`), for logs and errors.
    pub fn lowering(&self) -> &'static str {
        self.chosen.name()
    }

    /// The lowering's plan of the kernel, if it is a `T` (a GEMM's
    /// [`crate::emit::GemmShape`], an attention kernel's
    /// [`crate::emit::AttentionShape`]).
    pub fn plan<T: 'static>(&self) -> Option<&T> {
        self.chosen.plan().downcast_ref()
    }

    /// The kernel specialized for these `#[constexpr]` values (see
    /// [`Kernel::specialize`]), planned once: borrowed when there is nothing
    /// to decide or it already is specialized for them.
    pub fn specialize(&self, consts: &[i64]) -> Result<Cow<'_, Planned>, CodegenError> {
        if self.consts.as_deref() == Some(consts) {
            return Ok(Cow::Borrowed(self));
        }
        Ok(match self.kernel.specialize(consts)? {
            Cow::Borrowed(_) => Cow::Borrowed(self),
            Cow::Owned(k) => Cow::Owned(Planned {
                consts: Some(consts.into()),
                ..Planned::plan_by(k, self.general)
            }),
        })
    }

    /// The kernel with its literal-made values typed as the integers they
    /// meet ([`crate::literals`]), planned again where that changed it: what
    /// a launch with `spec` lowers and interpret mode runs. Borrowed when no
    /// literal changes.
    pub fn with_literal_types(
        &self,
        spec: &crate::spec::Spec,
    ) -> Result<Cow<'_, Planned>, CodegenError> {
        Ok(
            match crate::literals::with_literal_types(&self.kernel, spec)? {
                Cow::Borrowed(_) => Cow::Borrowed(self),
                Cow::Owned(k) => Cow::Owned(Planned {
                    consts: self.consts.clone(),
                    ..Planned::plan_by(k, self.general)
                }),
            },
        )
    }

    /// The tensor sizes a launch checks ([`crate::rules`]), derived once.
    pub fn size_rules(&self) -> &[SizeRule] {
        self.rules.get_or_init(|| crate::rules::derive(self))
    }

    /// The chosen lowering's jobs, for this kernel.
    pub(crate) fn chosen(&self) -> &dyn Chosen {
        &*self.chosen
    }
}

impl std::ops::Deref for Planned {
    type Target = Kernel;
    fn deref(&self) -> &Kernel {
        &self.kernel
    }
}

impl From<Kernel> for Planned {
    fn from(kernel: Kernel) -> Planned {
        Planned::new(kernel)
    }
}

impl std::fmt::Debug for Planned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planned")
            .field("kernel", &self.kernel.name)
            .field("chosen", &self.chosen)
            .field("consts", &self.consts)
            .finish()
    }
}
