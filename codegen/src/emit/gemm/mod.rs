//! The GEMM lowering: kernels of the GEMM form ([`GemmShape`]), on the
//! portable tensor-core path (`mma.sync`, a `cp.async` pipeline) or the Hopper
//! path (`Config::wgmma`: TMA, `wgmma`, warp specialization), with the
//! kernel's elementwise statements fused around the K loop.

mod hopper;
pub(super) mod lowering;
mod mainloop;
mod portable;
mod shape;
mod space;
mod tiles;
mod tma_store;

pub use lowering::default_wgmma_config;
pub use shape::GemmShape;
pub use tiles::{hopper_tiles, hopper_tiles_for, HopperTiles};
