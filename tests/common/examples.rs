//! The example programs, as modules, so tests can reach their kernels.
#![allow(dead_code)]

#[path = "../../examples/matmul.rs"]
pub mod matmul;
