//! The example programs, as modules, so tests can reach their kernels.
#![allow(dead_code)]

#[path = "../../examples/matmul.rs"]
pub mod matmul;

#[path = "../../examples/all_gather_matmul.rs"]
pub mod all_gather_matmul;

#[path = "../../examples/matmul_bias_gelu.rs"]
pub mod bias_gelu;

#[path = "../../examples/softmax.rs"]
pub mod softmax;

#[path = "../../examples/rms_norm.rs"]
pub mod rms_norm;

#[path = "../../examples/layer_norm.rs"]
pub mod layer_norm;

#[path = "../../examples/cross_entropy.rs"]
pub mod cross_entropy;

#[path = "../../examples/all_reduce_bias_rms_norm.rs"]
pub mod all_reduce_rms_norm;

#[path = "../../examples/attention.rs"]
pub mod attention;

#[path = "../../examples/attention_backward.rs"]
pub mod attention_backward;
