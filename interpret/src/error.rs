//! What can go wrong when a kernel runs in interpret mode.

use thiserror::Error;

/// An error of an interpreted kernel, naming the kernel and the code as written.
#[derive(Debug, Error)]
pub enum InterpretError {
    /// A `wait` on a flag outside its tensor (the GPU records the same
    /// failure in its status block). Loads, stores and atomics outside their
    /// tensor are not errors: as on the GPU, a load reads zero there and a
    /// store or an atomic skips the element.
    #[error("{0}")]
    OutOfBounds(Box<OutOfBounds>),
    /// An integer division or remainder by zero whose result is used: stored,
    /// combined by an atomic, multiplied by `addmm`, or a scalar the program
    /// acts on (a loop bound, a flag's index or value, a condition, a seed).
    /// On the GPU it is an unspecified value: elementwise operations,
    /// reductions and loads (as an index) pass it on to their results, and
    /// where a `select` or a runtime `if` value discards it there is no error.
    #[error(
        "kernel `{kernel}`: `{at}` divides an integer by zero and the result is used (program tiles: {tiles}); \
         on the GPU it is an unspecified value: discard it, e.g. `select(d != 0, n / d, 0)`"
    )]
    DivideByZero {
        kernel: String,
        /// The division as written.
        at: String,
        /// The program's tiles: `tm = 896..1000, tk = 64..128`.
        tiles: String,
    },
    /// The kernel does not check or lower for these arguments and this config
    /// (`tilefuse_codegen::lower` refused it): the GPU would refuse the launch
    /// too. Arguments the lowering refuses are [`InterpretError::Argument`]s.
    #[error("{0}")]
    Refused(tilefuse_codegen::CodegenError),
    /// A `wait` whose flag was not set in time: the GPU's message, word for word.
    #[error(
        "kernel `{kernel}` stopped waiting at `{at}` after {timeout_ms} ms: flag index {index} holds {seen}, \
         expected >= {expected}; the producer never set it (raise TILEFUSE_WAIT_TIMEOUT_MS if it is only slow)"
    )]
    WaitTimeout {
        kernel: String,
        at: String,
        index: i64,
        expected: i64,
        seen: i64,
        timeout_ms: u64,
    },
    /// The arguments do not fit the kernel.
    #[error("kernel `{kernel}`: argument `{arg}`: {message}")]
    Argument {
        kernel: String,
        arg: String,
        message: String,
    },
    /// The IR holds something the checker let through but this interpreter
    /// cannot run (a bug of one of the two: the message says what).
    #[error("kernel `{kernel}`: {message}")]
    Unsupported { kernel: String, message: String },
}

/// Where a `wait` left its tensor of flags.
#[derive(Debug)]
pub struct OutOfBounds {
    pub kernel: String,
    /// The code as written.
    pub at: String,
    /// What the statement does there (`waits on`).
    pub access: &'static str,
    pub tensor: String,
    pub index: Vec<i64>,
    pub shape: Vec<usize>,
    /// The program's tiles: `tm = 896..1000, tk = 64..128`.
    pub tiles: String,
}

impl std::fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "kernel `{}`: `{}` {} `{}` at index {:?}, outside its shape {:?} (program tiles: {}); \
             clip the index or size the tensor to the flags it waits on",
            self.kernel, self.at, self.access, self.tensor, self.index, self.shape, self.tiles
        )
    }
}
