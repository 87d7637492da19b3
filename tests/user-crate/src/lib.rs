//! Kernels a user might write in their own crate, with nothing but `tilefuse`.

use tilefuse::prelude::*;

/// SwiGLU's elementwise half: `silu(gate) * up * scale`.
#[fused_kernel]
pub fn swiglu(gate: &Tensor<bf16>, up: &Tensor<bf16>, scale: f32) -> Tensor<bf16> {
    let [m, n] = gate.shape();
    let mut out = Tensor::<bf16>::empty([m, n])?;
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = (silu(gate[(tm, tn)]) * up[(tm, tn)] * scale).cast();
    }
    out
}

/// A linear layer with a residual: `x · w + residual`, pinned to a small config.
#[fused_kernel(block_sizes = [64, 64, 32], num_warps = 4, num_stages = 3)]
pub fn linear_residual(x: &Tensor<f16>, w: &Tensor<f16>, residual: &Tensor<f16>) -> Tensor<f16> {
    let [m, k] = x.shape();
    let [_, n] = w.shape();
    let mut out = Tensor::<f16>::empty([m, n])?;
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, x[(tm, tk)], w[(tk, tn)]);
        }
        out[(tm, tn)] = (acc + residual[(tm, tn)]).cast();
    }
    out
}
