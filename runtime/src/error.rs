//! The runtime's error type: what went wrong, with enough context to act on it.

use thiserror::Error;
use tilefuse_codegen::CodegenError;

/// Everything a tilefuse call can fail with.
#[derive(Debug, Error)]
pub enum Error {
    /// A CUDA library could not be loaded, or there is no GPU.
    #[error("{what} is not available: {hint}")]
    Unavailable { what: &'static str, hint: String },
    /// A CUDA driver call failed.
    #[error("CUDA driver error in {context}: {message}")]
    Driver { context: String, message: String },
    /// NVRTC rejected generated code (a tilefuse bug, or an unsupported GPU).
    #[error("NVRTC could not compile kernel `{kernel}` for {arch}: {log}")]
    Compile {
        kernel: String,
        arch: String,
        log: String,
    },
    /// The kernel cannot be checked or lowered for this config or uses an
    /// unsupported construct (argument problems come as [`Error::Argument`]).
    #[error(transparent)]
    Codegen(CodegenError),
    /// An argument does not fit the kernel or the call.
    #[error("{context}: argument `{arg}`: {message}")]
    Argument {
        context: String,
        arg: String,
        message: String,
    },
    /// A `wait` in a kernel gave up: the flag never reached the value.
    #[error(
        "kernel `{kernel}` stopped waiting at `{site}` after {timeout_ms} ms: flag index {index} holds {seen}, \
         expected >= {expected}; the producer never set it (raise TILEFUSE_WAIT_TIMEOUT_MS if it is only slow)"
    )]
    WaitTimeout {
        kernel: String,
        site: String,
        index: i64,
        expected: i64,
        seen: i64,
        timeout_ms: u64,
    },
    /// A `wait` asked for a flag outside its flag tensor.
    #[error("kernel `{kernel}` at `{site}`: flag index {index} is outside the flag tensor of length {len}")]
    WaitIndex {
        kernel: String,
        site: String,
        index: i64,
        len: i64,
    },
    /// cuBLAS failed.
    #[error("cuBLAS error in {context}: {message}")]
    Cublas { context: String, message: String },
    /// The kernel definition embedded by the macro could not be read.
    #[error("kernel `{kernel}`: {message}")]
    Definition { kernel: String, message: String },
    /// The rendezvous store could not be reached, or went away.
    #[error("store at {addr}: {message}")]
    Store { addr: String, message: String },
    /// Waiting on the store (a key, a barrier, the other ranks) ran out of time.
    #[error("rank {rank} waited {waited_ms} ms for {what}; {hint}")]
    Timeout {
        rank: usize,
        what: String,
        waited_ms: u64,
        hint: String,
    },
    /// The ranks of a distributed call disagree, or the process group is not set up.
    #[error("{context}: {message}")]
    Distributed { context: String, message: String },
    /// A kernel in interpret mode read or wrote outside a tensor, or used what
    /// the interpreter cannot run.
    #[error(transparent)]
    Interpret(Box<tilefuse_interpret::InterpretError>),
    /// NCCL failed.
    #[error("NCCL error in {context}: {message}")]
    Nccl { context: String, message: String },
}

impl From<CodegenError> for Error {
    fn from(e: CodegenError) -> Error {
        match e {
            CodegenError::Argument {
                kernel,
                arg,
                message,
            } => Error::Argument {
                context: format!("kernel `{kernel}`"),
                arg,
                message,
            },
            other => Error::Codegen(other),
        }
    }
}

/// `Result` with the tilefuse [`Error`](enum@Error).
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Wraps a cudarc driver error with what the caller was doing, for `map_err`.
pub fn driver(context: impl Into<String>) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    let context = context.into();
    // Formatting a DriverError asks libcuda for its text; we only get one when libcuda is loaded.
    move |e| {
        let mut message = e.to_string();
        if stopped(e.0) {
            message.push_str(STOP_HINT);
        }
        Error::Driver { context, message }
    }
}

/// What these errors mean in a tilefuse kernel: a pipeline barrier wait that
/// ran past its bound (`tf_mbar_wait`, Hopper kernels) stops the kernel with a
/// store outside shared memory, which the driver reports as an illegal
/// instruction (an H200 with driver 580); a `trap` would be a failed launch.
const STOP_HINT: &str = " (a kernel stopped; tilefuse's Hopper kernels stop this way when \
     a pipeline barrier stays incomplete for about 10 s, which only a tilefuse lowering bug \
     causes: set TILEFUSE_DUMP_DIR=dir to keep the kernel source, and report it with the config)";

/// Whether a driver result is what a kernel stopped on the device leaves.
fn stopped(code: cudarc::driver::sys::CUresult) -> bool {
    use cudarc::driver::sys::CUresult;
    matches!(
        code,
        CUresult::CUDA_ERROR_LAUNCH_FAILED | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
    )
}

pub(crate) fn argument(
    context: impl Into<String>,
    arg: impl Into<String>,
    message: impl Into<String>,
) -> Error {
    Error::Argument {
        context: context.into(),
        arg: arg.into(),
        message: message.into(),
    }
}
