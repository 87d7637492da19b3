//! The GPU suite: one test binary (so the bundle for the GPU machine stays small).
//! Every test skips without a GPU and says so; `TILEFUSE_REQUIRE_GPU=1` makes a
//! missing GPU a failure.

#[path = "../common/mod.rs"]
mod common;

mod atomics;
mod attention;
mod autotune;
mod bad_input;
mod barrier;
mod epilogue;
mod interpret;
mod matmul;
mod pointwise;
mod primitives;
mod rows;
mod split_tail;
mod wait;
mod wgmma;
