//! Staged matmul operands ([`Config::stage`]): which operands the runtime copies
//! into aligned scratch before a launch, and the specialization the kernel is
//! then compiled for.
//!
//! The fast operand loads (TMA on the Hopper path, 16-byte `cp.async` on the
//! portable one) need rows that start on 16-byte boundaries. An operand with an
//! odd row length (K = 3333 in bf16) or an offset view fails that and would be
//! loaded 2 or 4 bytes at a time. One pitched copy of it (a read and a write of
//! the operand, small next to the GEMM's reads of it from every tile row) lifts
//! the whole GEMM onto the fast path.

use crate::config::Config;
use crate::ir::TensorId;
use crate::plan::Planned;
use crate::spec::Spec;

/// The operands of `kernel` that a staged launch copies for `spec`, as the
/// lowering it takes decides: a matmul's A and B where they are 2-D,
/// contiguous along their last dimension, not 16-byte aligned, and only read
/// by the kernel. Empty when the kernel is not a matmul or waits on flags (its
/// operands are still being written when the launch is queued, so a copy made
/// before it would read stale data).
pub fn unaligned_operands(kernel: &Planned, spec: &Spec) -> Vec<TensorId> {
    kernel.chosen().unaligned_operands(kernel, spec)
}

/// What `lower` compiles for: `spec` with the staged operands 16-byte aligned
/// (the copies are), and which operands those are. Without `config.stage` the
/// spec is unchanged and nothing is staged.
pub fn staged_spec(kernel: &Planned, spec: &Spec, config: &Config) -> (Spec, Vec<TensorId>) {
    if !config.stage {
        return (spec.clone(), Vec::new());
    }
    let staged = unaligned_operands(kernel, spec);
    let mut out = spec.clone();
    for &t in &staged {
        out.tensors[t].align = 16;
    }
    (out, staged)
}
