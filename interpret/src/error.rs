//! What can go wrong when a kernel runs in interpret mode.

use thiserror::Error;

/// An error of an interpreted kernel, naming the kernel and the code as written.
#[derive(Debug, Error)]
pub enum InterpretError {
    /// A load or store reached outside its tensor: on the GPU a silent zero or a
    /// dropped write.
    #[error("{0}")]
    OutOfBounds(Box<OutOfBounds>),
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
    /// The IR holds something this interpreter cannot run (a checker bug, or an
    /// unspecialized branch).
    #[error("kernel `{kernel}`: {message}")]
    Unsupported { kernel: String, message: String },
}

/// Where a load or store left its tensor.
#[derive(Debug)]
pub struct OutOfBounds {
    pub kernel: String,
    /// The code as written.
    pub at: String,
    /// `reads`, `writes`, `waits on`.
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
             clip the index or size the tensor to the tile loop's extent",
            self.kernel, self.at, self.access, self.tensor, self.index, self.shape, self.tiles
        )
    }
}
