//! Kernels that multiply tiles (`addmm`) in the general lowering: which tile
//! dimensions the products run over, found once per kernel, and the untuned
//! default that gives those the blocks the tensor cores take.
//!
//! The memory-bound default ([`super::config`]) spreads about 4096 elements
//! over the contiguous dimensions first and then the grid's others: for
//! attention's backward at 4×16×2048×128 it made `[4, 8, 8, 128, 1]` (a
//! product of one key, so no `mma.sync`, and 32 heads a program), and for
//! varlen attention 16 heads a program and single-row products.

use crate::config::Config;
use crate::ir::{DimId, Expr, Kernel, Stmt, VarId};
use crate::space::Axis;
use std::collections::HashMap;

/// Rows, columns and the contracted dimension of the products take this
/// block untuned: the `mma.sync` path's 16×16 pieces, two a side, and (with
/// [`WARPS`]) a loop level that keeps its scores, operands and accumulators
/// in registers at head dimensions up to 128 (ptxas, sm_90a: varlen
/// attention at `[1, 1, 32, 128, 32, 32]` with 8 warps spills nothing;
/// docs/perf-history.md, "Threads spread by the registers a level's values
/// need").
pub const BLOCK: usize = 32;
/// Warps of a program untuned: at 4, attention's backward at 32-row blocks
/// spilled 1.5–3 times as much as at 8.
pub const WARPS: usize = 8;

/// The tile dimensions of a kernel's products.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Products {
    /// Rows, columns and contracted dimensions of every `addmm`.
    pub dims: Vec<DimId>,
    /// Dimensions both operands and the accumulator have (a batch's or a
    /// head's): one index a program.
    pub batch: Vec<DimId>,
}

/// The products' dimensions of `k`, if it has an `addmm`.
pub fn find(k: &Kernel) -> Option<Products> {
    let mut vars: HashMap<VarId, Vec<DimId>> = HashMap::new();
    let mut p = Products::default();
    let mut found = false;
    visit(k, &k.body, &mut vars, &mut p, &mut found);
    // A dimension some product runs over is not a batch of another.
    let dims = p.dims.clone();
    p.batch.retain(|d| !dims.contains(d));
    found.then_some(p)
}

fn visit(
    k: &Kernel,
    stmts: &[Stmt],
    vars: &mut HashMap<VarId, Vec<DimId>>,
    p: &mut Products,
    found: &mut bool,
) {
    for s in stmts {
        for e in s.exprs() {
            e.walk(&mut |x| {
                if let Expr::Addmm { acc, a, b, .. } = x {
                    *found = true;
                    let (c, a, b) = (dims(acc, vars), dims(a, vars), dims(b, vars));
                    for d in a.iter().chain(&b).chain(&c) {
                        let (in_a, in_b, in_c) = (a.contains(d), b.contains(d), c.contains(d));
                        let list = if in_a && in_b && in_c {
                            &mut p.batch
                        } else {
                            &mut p.dims
                        };
                        if !k.is_each(*d) && !list.contains(d) {
                            list.push(*d);
                        }
                    }
                }
            });
        }
        match s {
            Stmt::Let { var, value, .. } => {
                let d = dims(value, vars);
                vars.insert(*var, d);
            }
            Stmt::Assign { var, value, .. } => {
                let d = dims(value, vars);
                vars.entry(*var).or_insert(d);
            }
            Stmt::Loop { body, .. } => visit(k, body, vars, p, found),
            Stmt::If {
                then, otherwise, ..
            } => {
                visit(k, then, vars, p, found);
                visit(k, otherwise, vars, p, found);
            }
            _ => {}
        }
    }
}

/// The tile dimensions of `e`'s value (as the checker's rules give them:
/// a load has its index's, a reduction loses its dimension, elementwise
/// operations broadcast).
fn dims(e: &Expr, vars: &HashMap<VarId, Vec<DimId>>) -> Vec<DimId> {
    let mut out: Vec<DimId> = Vec::new();
    let mut add = |ds: Vec<DimId>| {
        for d in ds {
            if !out.contains(&d) {
                out.push(d);
            }
        }
    };
    match e {
        Expr::Var(v) => add(vars.get(v).cloned().unwrap_or_default()),
        Expr::TileIndex(d) => add(vec![*d]),
        Expr::Full { dims, .. } => add(dims.clone()),
        Expr::Load { index, .. } => index.iter().for_each(|i| add(dims(i, vars))),
        Expr::Addmm { acc, .. } => add(dims(acc, vars)),
        Expr::Reduce { arg, dim, .. } | Expr::ArgReduce { arg, dim, .. } => {
            add(dims(arg, vars).into_iter().filter(|d| d != dim).collect())
        }
        Expr::Binary { lhs, rhs, .. } | Expr::Compare { lhs, rhs, .. } => {
            add(dims(lhs, vars));
            add(dims(rhs, vars));
        }
        Expr::Unary { arg, .. } | Expr::Cast { arg, .. } | Expr::Scan { arg, .. } => {
            add(dims(arg, vars))
        }
        Expr::Rand { offset, .. } => add(dims(offset, vars)),
        Expr::Select {
            mask,
            then,
            otherwise,
            ..
        } => {
            add(dims(mask, vars));
            add(dims(then, vars));
            add(dims(otherwise, vars));
        }
        Expr::IfConst {
            then, otherwise, ..
        } => {
            add(dims(then, vars));
            add(dims(otherwise, vars));
        }
        Expr::Int(_)
        | Expr::Float(_)
        | Expr::Scalar(_)
        | Expr::Const(_)
        | Expr::TileBegin(_)
        | Expr::TileEnd(_)
        | Expr::TileSize(_) => {}
    }
    out
}

/// The untuned config of a kernel with products, for extents `extents[d]`
/// where known: [`BLOCK`] along the products' rows, columns and contracted
/// dimensions (16 at least, as the tensor cores need, and no more than the
/// extent takes), and along the grid's other tiles (a program's block of
/// query rows, which a loop over the products' rows walks); one index of a
/// batch's or a head's; `whole` tiles fitted at the launch; other loops'
/// tiles [`BLOCK`] too. [`WARPS`] warps, one stage.
pub fn default_config(k: &Kernel, p: &Products, extents: &[Option<usize>]) -> Config {
    let cap = |d: DimId, most: usize| -> usize {
        match extents.get(d).copied().flatten() {
            Some(e) => e.max(1).next_power_of_two().clamp(16, most),
            None => most,
        }
    };
    let bs: Vec<usize> = k
        .dims
        .iter()
        .enumerate()
        .map(|(d, dim)| {
            if dim.each || p.batch.contains(&d) {
                1
            } else if dim.whole {
                cap(d, 16).max(16)
            } else {
                cap(d, BLOCK)
            }
        })
        .collect();
    Config::new(&bs).num_warps(WARPS).num_stages(1)
}

/// What the tuner may change in a kernel with products: the general
/// lowering's axes (`general`), but the products' tiles only from 16 to 64
/// (below 16 the products leave the tensor cores for unrolled FMA sums that
/// ptxas takes minutes over; past 64 the level's values spill), a batch's
/// tile fixed at one index, and 4 or 8 warps.
pub fn axes(p: &Products, general: Vec<Axis>) -> Vec<Axis> {
    general
        .into_iter()
        .filter_map(|a| match a {
            Axis::Block { dim, .. } if p.batch.contains(&dim) => None,
            Axis::Block { dim, .. } if p.dims.contains(&dim) => Some(Axis::Block {
                dim,
                values: vec![16, 32, 64],
            }),
            Axis::Warps(_) => Some(Axis::Warps(vec![4, 8])),
            other => Some(other),
        })
        .collect()
}

/// The tuner's first configs for a kernel with products: the default, with 4
/// warps, and with the products' tiles at 16 and at 64.
pub fn seeds(k: &Kernel, p: &Products, default: &Config) -> Vec<Config> {
    let with = |b: usize| {
        let mut c = default.clone();
        for &d in &p.dims {
            if !k.dims[d].whole && !k.dims[d].each {
                c.block_sizes[d] = b;
            }
        }
        c
    };
    let mut out = vec![default.clone()];
    for c in [default.clone().num_warps(4), with(16), with(64)] {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dimension_of_every_operand_is_a_batch_and_takes_one_index() {
        let mut vars = HashMap::new();
        vars.insert(0, vec![0, 2, 3]);
        let acc = Expr::Var(0);
        // acc [b, m, d] += p [b, m, n] · v [b, n, d]
        let load = |ix: &[usize]| Expr::Load {
            tensor: 0,
            index: ix.iter().map(|&d| Expr::TileIndex(d)).collect(),
            at: String::new(),
        };
        assert_eq!(dims(&load(&[0, 1, 3]), &vars), vec![0, 1, 3]);
        assert_eq!(dims(&acc, &vars), vec![0, 2, 3]);
        let r = Expr::Reduce {
            op: crate::ir::ReduceOp::Sum,
            arg: Box::new(load(&[0, 1, 3])),
            dim: 1,
            at: String::new(),
        };
        assert_eq!(dims(&r, &vars), vec![0, 3]);
    }
}
