//! tilefuse-runtime: devices, tensors, the NVRTC JIT, compiled-kernel caches and
//! launches. Never parses Rust: kernels arrive as IR from `tilefuse-codegen`.
//!
//! Every entry point probes for the CUDA libraries first, so a machine with no GPU,
//! no driver or no NVRTC gets an [`Error`], never a panic from the loader.

pub mod args;
pub mod autotune;
pub mod buffer;
pub mod cache;
pub mod cublas;
pub mod device;
pub mod dist;
pub mod element;
pub mod error;
pub mod graph;
mod host_queue;
mod interpret;
pub mod jit;
pub mod kernel;
pub mod launcher;
pub mod libs;
pub mod log;
pub mod mode;
pub mod private_copies;
pub mod settings;
pub mod side_stream;
mod source_override;
pub mod split_loop;
pub mod split_tail;
mod staging;
pub mod status;
pub mod tensor;
pub mod timing;
mod tma;

pub use buffer::Memory;
pub use device::Device;
pub use element::Element;
pub use error::{Error, Result};
pub use kernel::KernelDef;
pub use side_stream::SideStream;
pub use tensor::Tensor;
pub use timing::{time_gpu, Timing};
