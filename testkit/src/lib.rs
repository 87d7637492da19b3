//! What tilefuse's examples, tests and kernel corpus share to check kernels:
//! fresh random inputs and poisoned outputs ([`Rng`], [`random_tensor`],
//! [`poisoned`]), references in float64 and the relative error
//! ‖out − ref‖ / ‖ref‖ ([`rel_error`], [`matmul_f64`]), bandwidth timing
//! ([`bench_bandwidth`]) and the examples' command lines ([`args`],
//! [`rows_main`], [`mnk_main`]). A development crate, not part of tilefuse's
//! API.
//!
//! ```no_run
//! use tilefuse_testkit::{poisoned, random_tensor, rel_error_tensors};
//! # fn main() -> tilefuse_runtime::Result<()> {
//! let x = random_tensor::<f32>([4, 8], 1.0)?;
//! let out = poisoned::<f32>([4, 8])?;
//! out.copy_from(&x)?;
//! assert!(rel_error_tensors(&out, &x)? == 0.0);
//! # Ok(()) }
//! ```

mod bench;
mod cli;
mod compare;
mod ptxas;
mod rng;
mod skip;

pub use bench::{bench_bandwidth, print_versus};
pub use cli::{
    args, config_json, exit_code, mnk_main, rows_main, sizes, INTERPRET_MNK, INTERPRET_ROWS,
};
pub use compare::{erf_f64, gelu_f64, matmul_f64, rel_error, rel_error_tensors};
pub use ptxas::kernel_spill_stores;
pub use rng::{poisoned, random_tensor, random_vec, Rng};
pub use skip::nvrtc_or_skip;
