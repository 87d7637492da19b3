//! Several processes, one GPU each: rendezvous through a TCP store, the process
//! group (NCCL for baselines and across nodes), symmetric memory on one node, and
//! the copy-engine all-gather that fused GEMMs wait on.

pub mod all_gather;
mod backend;
pub mod env;
pub mod exchange;
pub mod group;
pub mod nccl;
mod shm;
mod sm_copy;
pub mod store;
pub(crate) mod stream_ops;
pub mod symmetric;

pub use all_gather::{AllGather, Chunks};
pub use env::DistEnv;
pub use exchange::Exchange;
pub use group::{default_timeout, ProcessGroup};
pub use nccl::Nccl;
pub use sm_copy::copy_kernel_report;
pub use store::{Store, StoreServer};
pub use symmetric::SymmetricMemory;
