//! What the launch checks before a kernel runs: the sizes of the tensors the
//! kernel indexes by a tile's own indices. `t[(tm, tn)]` needs `t`'s sizes to
//! be the extents of `tm` and `tn`; the lowerings then mask those accesses by
//! the extents alone. Components with an offset, a gathered or scalar index,
//! or a tile whose bounds the program computes are tested against the tensor
//! instead, element by element.

use crate::ir::*;

/// `tensors[tensor].shape[axis]` must equal the extent of tile `dim`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeRule {
    pub tensor: TensorId,
    pub axis: usize,
    pub dim: DimId,
    /// The access that makes the rule, for the error message.
    pub at: String,
}

/// The size rules of `k`, one per (tensor, axis, tile), in source order.
pub fn size_rules(k: &Kernel) -> Vec<SizeRule> {
    let mut rules: Vec<SizeRule> = Vec::new();
    let mut add = |tensor: TensorId, index: &[Expr], at: &str| {
        for (axis, c) in index.iter().enumerate() {
            let Expr::TileIndex(dim) = c else { continue };
            let d = &k.dims[*dim];
            if d.each || d.extent.is_none() {
                continue;
            }
            if !rules
                .iter()
                .any(|r| r.tensor == tensor && r.axis == axis && r.dim == *dim)
            {
                rules.push(SizeRule {
                    tensor,
                    axis,
                    dim: *dim,
                    at: at.to_string(),
                });
            }
        }
    };
    k.walk_stmts(&mut |s| {
        if let Stmt::Store {
            tensor, index, at, ..
        }
        | Stmt::Atomic {
            tensor, index, at, ..
        } = s
        {
            add(*tensor, index, at);
        }
    });
    k.walk_exprs(&mut |e| {
        if let Expr::Load { tensor, index, at } = e {
            add(*tensor, index, at);
        }
    });
    rules
}
