//! The GEMM form ([`GemmShape`]): a 2-D grid `(tm, tn)`, an f32 accumulator,
//! exactly one inner loop whose only statement is
//! `acc = addmm(acc, a[(tm, tk)], b[(tk, tn)])` (after `wait`s, maybe switched by
//! a `#[constexpr]`), and elementwise statements (the fused epilogue, no
//! reductions) around it.

use crate::ir::*;
use crate::plan::form::{addmm_stmts, fast_form};

/// The parts of a GEMM-shaped kernel: what the GEMM lowering found in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmShape {
    pub m: DimId,
    pub n: DimId,
    pub k: DimId,
    pub acc: VarId,
    pub a: TensorId,
    pub b: TensorId,
    /// Position of the K loop in the kernel body.
    pub k_loop: usize,
}

impl GemmShape {
    /// The `wait`s inside the K loop, before its `addmm`: each k-tile's loads
    /// go out once they pass (an all-gather chunked along K feeds a GEMM that
    /// starts on the first columns while later ones arrive). Of a specialized
    /// kernel (its `#[constexpr]` branches taken).
    pub fn k_waits<'a>(&self, k: &'a Kernel) -> &'a [Stmt] {
        match &k.body[self.k_loop] {
            Stmt::Loop { body, .. } => &body[..body.len().saturating_sub(1)],
            _ => &[],
        }
    }
}

/// The GEMM form of `k`, if it has it.
pub(super) fn find(k: &Kernel) -> Option<GemmShape> {
    if !fast_form(k) {
        return None;
    }
    gemm(k, &addmm_stmts(k))
}

/// The GEMM form, if `k` has it.
fn gemm(k: &Kernel, loops: &[usize]) -> Option<GemmShape> {
    let [i] = loops else { return None };
    let Stmt::Loop {
        dim: kd,
        body,
        until: None,
        range: None,
    } = &k.body[*i]
    else {
        return None;
    };
    // `wait`s (maybe switched by a `#[constexpr]`: the shape is the same for
    // every value), then the accumulation.
    let [waits @ .., Stmt::Assign { var, value, .. }] = body.as_slice() else {
        return None;
    };
    if !waits.iter().all(only_waits) {
        return None;
    }
    let Expr::Addmm { acc, a, b, .. } = value else {
        return None;
    };
    let (
        Expr::Var(acc_var),
        Expr::Load {
            tensor: ta,
            index: ia,
            ..
        },
        Expr::Load {
            tensor: tb,
            index: ib,
            ..
        },
    ) = (acc.as_ref(), a.as_ref(), b.as_ref())
    else {
        return None;
    };
    let (ia, ib) = (plain_index(ia)?, plain_index(ib)?);
    if acc_var != var || ia.len() != 2 || ib.len() != 2 || ia[1] != *kd || ib[0] != *kd {
        return None;
    }
    let (m, n) = (ia[0], ib[1]);
    if m == n || m == *kd || n == *kd {
        return None;
    }
    let mut grid = k.grid.clone();
    grid.sort_unstable();
    let mut mn = vec![m, n];
    mn.sort_unstable();
    if grid != mn {
        return None;
    }
    for (j, s) in k.body.iter().enumerate() {
        // The epilogue is elementwise: a reduction of the accumulator (a
        // matmul + LayerNorm over a `whole(n)` row) is the general lowering's.
        if j != *i {
            let mut reduces = false;
            walk_stmts(std::slice::from_ref(s), &mut |t| {
                for e in t.exprs() {
                    e.walk(&mut |x| {
                        reduces |= matches!(x, Expr::Reduce { .. } | Expr::ArgReduce { .. })
                    });
                }
            });
            if reduces {
                return None;
            }
        }
        match s {
            Stmt::Loop { .. } if j != *i => return None,
            Stmt::Store { index, .. } => {
                let mut ix = plain_index(index)?;
                ix.sort_unstable();
                if ix != mn {
                    return None;
                }
            }
            _ => {}
        }
    }
    Some(GemmShape {
        m,
        n,
        k: *kd,
        acc: *var,
        a: *ta,
        b: *tb,
        k_loop: *i,
    })
}

/// A `wait`, or a branch on `#[constexpr]` values holding only such.
fn only_waits(s: &Stmt) -> bool {
    match s {
        Stmt::Wait { .. } => true,
        Stmt::If {
            cond,
            then,
            otherwise,
            ..
        } => const_cond(cond) && then.iter().all(only_waits) && otherwise.iter().all(only_waits),
        _ => false,
    }
}

/// A condition made of `#[constexpr]` values and literals only.
fn const_cond(c: &Cond) -> bool {
    fn const_expr(e: &Expr) -> bool {
        let mut ok = true;
        e.walk(&mut |x| {
            ok &= matches!(
                x,
                Expr::Int(_) | Expr::Const(_) | Expr::Unary { .. } | Expr::Binary { .. }
            )
        });
        ok
    }
    match c {
        Cond::Cmp { lhs, rhs, .. } => const_expr(lhs) && const_expr(rhs),
        Cond::Not(c) => const_cond(c),
        Cond::And(a, b) | Cond::Or(a, b) => const_cond(a) && const_cond(b),
        Cond::NonZero(e) => const_expr(e),
    }
}
