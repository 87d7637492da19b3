//! What the launch checks before a kernel runs: the sizes of the tensors the
//! kernel indexes by a tile's own indices. `t[(tm, tn)]` needs `t`'s sizes to
//! be at least the extents of `tm` and `tn` (a kernel may work on the first
//! columns of a wider tensor), so the lowerings mask those accesses by the
//! extents alone. The fast paths need them equal: their tile copies (TMA) fill
//! past the tensor's end with zeros, not past the extent. Components with an
//! offset, a gathered or scalar index, or a tile whose bounds the program
//! computes are tested against the tensor instead, element by element.

use crate::ir::*;
use crate::plan::Planned;

/// `tensors[tensor].shape[axis]` must equal (`exact`) or be at least the
/// extent of tile `dim`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeRule {
    pub tensor: TensorId,
    pub axis: usize,
    pub dim: DimId,
    pub exact: bool,
    /// The access that makes the rule, for the error message.
    pub at: String,
}

impl SizeRule {
    /// Why a tensor of size `have` along the axis breaks the rule for an
    /// extent `want`, or `None` when it keeps it.
    pub fn broken(&self, k: &Kernel, have: i64, want: i64) -> Option<String> {
        let bad = if self.exact {
            have != want
        } else {
            have < want
        };
        bad.then(|| {
            let d = &k.dims[self.dim];
            let n = d
                .extent
                .map_or("?".to_string(), |e| k.scalars[e].name.clone());
            format!(
                "dimension {} has size {have}, but `{}` indexes it with tile `{}`, which covers {n} = {want}{}",
                self.axis,
                self.at,
                d.name,
                if self.exact {
                    " (this kernel's lowering needs them equal)"
                } else {
                    ""
                }
            )
        })
    }
}

/// The size rules of `k` (specialized), one per (tensor, axis, tile), in
/// source order; exact where the lowering it takes needs them so. Read them
/// through [`Planned::size_rules`], which derives them once.
pub(crate) fn derive(k: &Planned) -> Vec<SizeRule> {
    let exact = k.chosen().exact_sizes();
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
                    exact,
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
