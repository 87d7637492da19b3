//! The corpus: everyday kernels of a tile DSL, written the way a user writes
//! them, one family per module. Each [`Case`] makes its inputs from a seed on
//! a device (a GPU, or [`tilefuse::Device::interpreter`]), runs its kernels, and returns
//! each output with its float64 reference; the same seed gives the same inputs
//! on every device, so the GPU's outputs are also compared with interpret
//! mode's. Its benchmark runs it at a large shape, next to the same operation
//! in PyTorch (`scripts/corpus_bench.py`).
//!
//! The tests: `tests/interpret.rs` (every case in interpret mode, in CI),
//! `tests/nvrtc.rs` (every kernel compiled for sm_90a and sm_80 by NVRTC, in
//! CI), `tests/gpu.rs` (every case on the GPU and against the interpreter).
//! `cargo run --release -p tilefuse-kernels --bin corpus -- --bench` times them.

pub mod activations;
pub mod elementwise;
pub mod harness;
pub mod ints;
pub mod jagged;
pub mod losses;
pub mod movement;
pub mod norms;
pub mod reductions;
pub mod scans;

pub use harness::{Bench, Case, Output};

/// Every case of the corpus.
pub fn cases() -> Vec<Case> {
    let mut all = Vec::new();
    all.extend(elementwise::cases());
    all.extend(activations::cases());
    all.extend(movement::cases());
    all.extend(ints::cases());
    all.extend(reductions::cases());
    all.extend(scans::cases());
    all.extend(norms::cases());
    all.extend(losses::cases());
    all.extend(jagged::cases());
    all
}
