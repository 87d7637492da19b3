//! tilefuse-codegen: the tile IR, its checks, and the lowering to self-contained
//! CUDA C. Pure Rust: nothing here touches a GPU, a driver or NVRTC.
//!
//! The pipeline is [`Kernel`] (built by the `#[fused_kernel]` macro) →
//! [`Planned`] (the lowering it takes, chosen once from the registry
//! `emit::LOWERINGS`) → [`check()`] for a [`Spec`] (the argument facts known
//! at launch) → [`lower`] for a [`Config`] → [`Lowered`] (CUDA C source,
//! parameter ABI, launch geometry).

pub mod check;
pub mod config;
pub mod dtype;
pub mod emit;
pub mod error;
pub mod fit;
pub mod hash;
pub mod integral;
pub mod ir;
pub mod literals;
pub mod narrow;
mod parse;
pub mod plan;
pub mod prims;
mod print;
pub mod rules;
pub mod space;
pub mod spec;
mod specialize;
pub mod staging;

pub use check::check;
pub use config::{
    default_config, default_config_at, default_config_for, default_config_within, Config, Target,
};
pub use dtype::DType;
pub use emit::{
    default_wgmma_attention, default_wgmma_config, hopper_tiles, hopper_tiles_for, lower,
    HopperTiles, Lowered, Param, SplitTail, MAX_PROGRAMS,
};
pub use error::CodegenError;
pub use fit::{fit_default, fit_whole_dims, group_rows};
pub use ir::Kernel;
pub use parse::ParseError;
pub use plan::Planned;
pub use space::{Axis, ConfigSpace};
pub use spec::{ScalarKind, Spec, TensorSpec};
