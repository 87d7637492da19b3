//! Pieces of the unfused NCCL + cuBLAS paths.

use super::epilogue::{self, Epilogue, Unused};
use super::workspace::Workspace;
use crate::{bf16, Device, Result, Tensor};
use std::sync::Arc;

/// `out = epi(a · b)`: cuBLAS, then the epilogue kernel unless there is nothing to do.
pub(crate) fn matmul_epilogue(
    out: &Tensor<bf16>,
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    epi: &Epilogue,
    unused: &Unused,
) -> Result<()> {
    crate::cublas::matmul_into(&mut out.clone(), a, b)?;
    epilogue::apply(out, epi, unused)
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
