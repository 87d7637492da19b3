//! Errors of checking and lowering a kernel.

use thiserror::Error;

/// Why a kernel cannot be lowered for a given specialization and config.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CodegenError {
    /// The kernel's types or shapes do not fit together.
    #[error("in kernel `{kernel}`, at `{at}`: {message}")]
    Type {
        kernel: String,
        at: String,
        message: String,
    },
    /// A tensor argument does not have what the kernel needs (dtype, rank, layout).
    #[error("in kernel `{kernel}`, argument `{arg}`: {message}")]
    Argument {
        kernel: String,
        arg: String,
        message: String,
    },
    /// The kernel uses a construct this lowering does not support yet.
    #[error("in kernel `{kernel}`, at `{at}`: {message}")]
    Unsupported {
        kernel: String,
        at: String,
        message: String,
    },
    /// The config cannot lower this kernel (wrong number of block sizes, a block
    /// that does not divide into warps, too much shared memory, …).
    #[error("kernel `{kernel}` cannot use config {config}: {message}")]
    Config {
        kernel: String,
        config: String,
        message: String,
    },
}
