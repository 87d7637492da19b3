//! Pieces of the unfused NCCL + cuBLAS paths.

use super::kernels::add_bias;
use super::workspace::Workspace;
use crate::{bf16, Device, Result, Tensor};
use std::sync::Arc;

/// `out = a · b (+ bias_m + bias_n)`: cuBLAS, then the bias kernel if given.
pub(crate) fn matmul_bias(
    out: &Tensor<bf16>,
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    bias: Option<&(Tensor<bf16>, Tensor<bf16>)>,
) -> Result<()> {
    crate::cublas::matmul_into(&mut out.clone(), a, b)?;
    if let Some((bm, bn)) = bias {
        add_bias(out, bm, bn)?;
    }
    Ok(())
}

/// `t` if it is contiguous (NCCL needs that), else a copy in scratch `i`.
pub(crate) fn contiguous(
    ws: &mut Workspace,
    dev: &Arc<Device>,
    i: usize,
    t: &Tensor<bf16>,
) -> Result<Tensor<bf16>> {
    if t.is_contiguous() {
        return Ok(t.clone());
    }
    let s = ws.scratch(dev, i, t.dims())?;
    s.copy_from(t)?;
    Ok(s)
}
