//! Atomics privatized in shared memory: a histogram's `atomic_add(counts[bin],
//! 1)` sends every element of the launch to a few hundred addresses, which
//! the L2 serializes. Where a small 1-D tensor (at most [`BINS`] elements, tested
//! at run time) only receives gathered `atomic_add`s, each program adds into
//! its own copy in shared memory and adds the copy's nonzero entries into the
//! tensor once, at its end: one global atomic per bin and program instead of
//! one per element. Larger tensors take the global atomics as before.

use super::Gen;
use crate::dtype::DType;
use crate::ir::*;
use crate::prims::AtomicOp;
use crate::spec::Spec;
use std::fmt::Write;

/// Entries of a program's private copy: 8 KiB of 4-byte counts.
pub(super) const BINS: usize = 2048;

/// The tensors whose atomics a program keeps in shared memory: rank 1, 4-byte
/// (i32, u32, f32), written only by `atomic_add` and at least once at a
/// gathered index, never loaded or stored; none in a kernel that waits or
/// signals (a flag could publish counts still in shared memory).
pub(super) fn private_tensors(k: &Kernel, spec: &Spec) -> Vec<TensorId> {
    let mut sync = false;
    let mut plain: Vec<TensorId> = Vec::new();
    let mut adds: Vec<(TensorId, bool)> = Vec::new();
    k.walk_stmts(&mut |s| match s {
        Stmt::Wait { .. } | Stmt::Signal { .. } => sync = true,
        Stmt::Store { tensor, .. } => plain.push(*tensor),
        Stmt::Atomic {
            op, tensor, index, ..
        } => {
            // An index per element: computed from loads or variables, or a
            // tile's index other than as itself (`x[tn]`, one element each).
            let gathered = index.iter().any(|c| {
                let mut g = false;
                c.walk(&mut |x| match x {
                    Expr::Load { .. } | Expr::Var(_) => g = true,
                    Expr::TileIndex(d) => g |= !k.is_each(*d),
                    _ => {}
                });
                g && super::memory::affine_dim(k, c).is_none()
            });
            if *op == AtomicOp::Add {
                adds.push((*tensor, gathered));
            } else {
                plain.push(*tensor);
            }
        }
        _ => {}
    });
    k.walk_exprs(&mut |e| {
        if let Expr::Load { tensor, .. } = e {
            plain.push(*tensor);
        }
    });
    if sync {
        return Vec::new();
    }
    let mut out: Vec<TensorId> = Vec::new();
    for &(t, gathered) in &adds {
        let ok = gathered
            && k.tensors[t].rank == 1
            && matches!(spec.tensors[t].dtype, DType::I32 | DType::U32 | DType::F32)
            && !plain.contains(&t);
        if ok && !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

impl Gen<'_, '_> {
    /// The pointer an atomic on `t` at element `idx` (offset `offset`) goes to:
    /// the program's copy where `t` is private and small enough.
    pub(super) fn atomic_target(&self, t: TensorId, idx: &str, offset: &str) -> String {
        if self.private.contains(&t) {
            format!("(tf_pv{t} ? tf_bins{t} + ({idx}) : t{t} + ({offset}))")
        } else {
            format!("t{t} + ({offset})")
        }
    }

    /// The copies' start, at `base` bytes of shared memory: pointers, the
    /// run-time size test and the zeroing (every thread reaches it).
    pub(super) fn private_head(&self, base: usize) -> String {
        let mut s = String::new();
        for (i, &t) in self.private.iter().enumerate() {
            let ty = self.e.spec.tensors[t].dtype.c_storage();
            let _ = writeln!(
                s,
                "  {ty}* tf_bins{t} = ({ty}*)(tf_smem + {});\n  \
                 const bool tf_pv{t} = t{t}_n0 <= {BINS};\n  \
                 if (tf_pv{t}) for (int tf_i = tid; tf_i < (int)t{t}_n0; tf_i += {}) tf_bins{t}[tf_i] = 0;",
                base + i * BINS * 4,
                self.threads
            );
        }
        if !self.private.is_empty() {
            s.push_str("  __syncthreads();\n");
        }
        s
    }

    /// The program's end: each private copy's nonzero entries added into the
    /// tensor.
    pub(super) fn private_flush(&self) -> String {
        let mut s = String::new();
        if self.private.is_empty() {
            return s;
        }
        s.push_str("  __syncthreads();\n");
        for &t in &self.private {
            let ty = self.e.spec.tensors[t].dtype.c_storage();
            let _ = writeln!(
                s,
                "  if (tf_pv{t}) for (int tf_i = tid; tf_i < (int)t{t}_n0; tf_i += {}) {{ const {ty} tf_c = tf_bins{t}[tf_i]; if (tf_c != 0) tf_atomic_add(t{t} + tf_i * t{t}_s0, tf_c); }}",
                self.threads
            );
        }
        s
    }

    /// Bytes of shared memory the private copies take.
    pub(super) fn private_bytes(&self) -> usize {
        self.private.len() * BINS * 4
    }
}
