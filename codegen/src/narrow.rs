//! Values whose only fate is a rounding to a 16-bit float.
//!
//! `out[(tm, tn)] = pow(x, p).cast()` into a bf16 tensor keeps 8 bits of the
//! f32 `pow`: an accurate `powf` (~60 instructions an element) buys digits
//! the store drops. An expression is *narrow* where its value reaches a
//! 16-bit float rounding (a `.cast::<bf16>()` or `f16`, a store into a bf16 or
//! f16 tensor) through operations that keep its relative error (`-x`, `|x|`,
//! `select`'s values, casts to f32, a variable all of whose uses are narrow),
//! and nowhere else. A primitive with a narrow form ([`crate::prims::binary`]'s
//! `narrow` column) uses it there; its error must stay far below the 16-bit
//! rounding (2⁻⁹ of bf16, 2⁻¹² of f16). An argument of such a primitive is
//! never narrow itself (`pow` scales its argument's relative error by the
//! exponent), nor anything under an arithmetic operation (cancellation).

use crate::dtype::DType;
use crate::ir::*;
use crate::spec::Spec;
use std::collections::HashSet;

/// The narrow expressions of a kernel, by address (the kernel the lowering
/// walks: a clone's expressions are not in it, and so not narrow).
#[derive(Clone, Debug, Default)]
pub struct Narrow {
    exprs: HashSet<usize>,
}

impl Narrow {
    /// Finds the narrow expressions of `k` for the tensor types of `spec`.
    pub fn of(k: &Kernel, spec: &Spec) -> Narrow {
        // Variables all of whose uses are narrow: the largest such set, found
        // by dropping, until nothing changes, those with a use that is not.
        let mut vars: HashSet<VarId> = (0..k.vars.len()).collect();
        loop {
            let mut found = Narrow::default();
            let mut wide = HashSet::new();
            walk_stmts(&k.body, &mut |s| {
                for (e, narrow) in roots(s, spec, &vars) {
                    visit(e, narrow, &mut found, &mut wide);
                }
            });
            let before = vars.len();
            vars.retain(|v| !wide.contains(v));
            if vars.len() == before {
                return found;
            }
        }
    }

    /// Whether `e` (an expression of the kernel this was found for) is narrow.
    pub fn contains(&self, e: &Expr) -> bool {
        self.exprs.contains(&(e as *const Expr as usize))
    }
}

/// A statement's expressions, each with whether its value is narrow.
fn roots<'a>(s: &'a Stmt, spec: &Spec, vars: &HashSet<VarId>) -> Vec<(&'a Expr, bool)> {
    match s {
        Stmt::Let { var, value, .. } | Stmt::Assign { var, value, .. } => {
            vec![(value, vars.contains(var))]
        }
        Stmt::Store {
            tensor,
            index,
            value,
            ..
        } => {
            let half = spec.tensors.get(*tensor).is_some_and(|t| t.dtype.is_half());
            index
                .iter()
                .map(|e| (e, false))
                .chain([(value, half)])
                .collect()
        }
        _ => s.exprs().into_iter().map(|e| (e, false)).collect(),
    }
}

/// Records `e` (narrow or not) and its sub-expressions; a variable read where
/// the value is not narrow goes into `wide`.
fn visit(e: &Expr, narrow: bool, found: &mut Narrow, wide: &mut HashSet<VarId>) {
    if narrow {
        found.exprs.insert(e as *const Expr as usize);
    } else if let Expr::Var(v) = e {
        wide.insert(*v);
    }
    for c in e.children() {
        visit(c, child(e, c, narrow), found, wide);
    }
}

/// Whether child `c` of `e` is narrow, `e` being so or not.
fn child(e: &Expr, c: &Expr, narrow: bool) -> bool {
    match e {
        Expr::Unary {
            op: UnOp::Neg | UnOp::Abs,
            ..
        } => narrow,
        Expr::Select {
            then, otherwise, ..
        }
        | Expr::IfConst {
            then, otherwise, ..
        } => narrow && (std::ptr::eq(c, &**then) || std::ptr::eq(c, &**otherwise)),
        Expr::Cast { dtype: None, .. }
        | Expr::Cast {
            dtype: Some(DType::F32),
            ..
        } => narrow,
        Expr::Cast { dtype: Some(t), .. } => t.is_half(),
        _ => false,
    }
}
