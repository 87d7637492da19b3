//! `tilefuse-run`, a launcher in the spirit of torchrun: it starts the ranks of
//! one node with the environment torchrun gives (so programs also run under
//! torchrun or a cluster launcher), prefixes their output, and stops them all
//! when one fails or it is interrupted.
//!
//! ```text
//! tilefuse-run --nproc-per-node 2 target/release/examples/all_gather_matmul
//! ```

pub mod args;
pub mod supervise;

pub use args::{parse, LaunchArgs};
pub use supervise::{describe, reserve_store_port, run, Outcome, StorePort};
