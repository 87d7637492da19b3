//! Arguments for interpret mode (`tilefuse::interpret::run`), by the names the
//! kernel's IR gives them.
#![allow(dead_code)]

use tilefuse::codegen::ir::Kernel;
use tilefuse::interpret::{HostTensor, Scalar};

/// The kernel's scalar arguments by the names its IR gives them (`m`, `n as
/// f32`, `eps`).
pub fn scalars(k: &Kernel, values: &[(&str, Scalar)]) -> Vec<Scalar> {
    k.scalars
        .iter()
        .map(|s| {
            values
                .iter()
                .find(|(name, _)| *name == s.name)
                .map(|&(_, v)| v)
                .unwrap_or_else(|| panic!("no value for scalar `{}` of `{}`", s.name, k.name))
        })
        .collect()
}

/// The kernel's tensor arguments in its IR's order (which is not always the
/// Rust signature's), from `(name, tensor)` pairs.
pub fn tensors(k: &Kernel, named: Vec<(&str, HostTensor)>) -> Vec<HostTensor> {
    k.tensors
        .iter()
        .map(|p| {
            named
                .iter()
                .find(|(name, _)| *name == p.name)
                .map(|(_, t)| t.clone())
                .unwrap_or_else(|| panic!("no tensor `{}` for `{}`", p.name, k.name))
        })
        .collect()
}

/// The elements of the tensor argument named `name` after a run.
pub fn out(k: &Kernel, t: &[HostTensor], name: &str) -> Vec<f64> {
    let i = k.tensors.iter().position(|p| p.name == name);
    t[i.unwrap_or_else(|| panic!("`{}` has no tensor `{name}`", k.name))].values()
}
