//! Reductions along a loop's own dimension, done once after the loop.
//!
//! `acc = acc + x[(tm, tn)].sum(tm)` inside `for tm in tile(m)` reduces each
//! tile across the threads that hold its rows (shuffles, and warps through
//! shared memory with two barriers) on every iteration. Summing the tiles
//! elementwise into a register tile first and reducing that once after the
//! loop gives the same sum (in another order, as any reduction's) for a few
//! adds an iteration: what a Triton user writes by hand (`acc += x` over a
//! 2-D accumulator, `tl.sum` after the loop). Rows past the extent are left
//! out as they arrive, so the final reduction needs no mask but its copies'.

use super::{Gen, Val};
use crate::emit::expr::{convert, fill};
use crate::error::CodegenError;
use crate::ir::*;

/// One deferred accumulation: `acc = acc ⊕ arg.op(dim)` in a loop over `dim`.
#[derive(Clone, Debug)]
pub(super) struct Deferred {
    pub acc: VarId,
    /// The loop's dimension.
    pub dim: DimId,
    pub op: ReduceOp,
    /// The statement's `arg.op(dim)`.
    pub reduce: Expr,
    pub arg: Expr,
    /// The register tile the loop accumulates `arg` into (the loop's layout).
    pub total: Val,
}

/// The reduction an accumulation `acc = acc ⊕ x.op(dim)` may defer: `⊕`
/// and `op` the same (a sum, max or min), either operand order.
fn deferrable(acc: VarId, value: &Expr, dim: DimId) -> Option<(ReduceOp, &Expr)> {
    let Expr::Binary { op, lhs, rhs, .. } = value else {
        return None;
    };
    let red = match (&**lhs, &**rhs) {
        (Expr::Var(v), r) | (r, Expr::Var(v)) if *v == acc => r,
        _ => return None,
    };
    let Expr::Reduce {
        op: rop,
        arg,
        dim: d,
        ..
    } = red
    else {
        return None;
    };
    let same = rop.binary() == *op;
    (same && *d == dim && !reads(arg, acc)).then_some((*rop, red))
}

fn reads(e: &Expr, var: VarId) -> bool {
    let mut found = false;
    e.walk(&mut |x| found |= matches!(x, Expr::Var(v) if *v == var));
    found
}

impl Gen<'_, '_> {
    /// Before a loop over `dim` (layout `li`): the accumulations of `body`
    /// it can defer, each with its register tile declared and set to the
    /// identity. Keyed by statement address in `self.deferred`.
    pub(super) fn defer(
        &mut self,
        body: &[Stmt],
        dim: DimId,
        li: usize,
        depth: usize,
    ) -> Result<Vec<Deferred>, CodegenError> {
        let mut out = Vec::new();
        for s in body {
            let Stmt::Assign { var, value, .. } = s else {
                continue;
            };
            let Some((op, red)) = deferrable(*var, value, dim) else {
                continue;
            };
            // The accumulator is read and written by this statement alone.
            let mut touched = 0;
            walk_stmts(body, &mut |t| {
                if matches!(t, Stmt::Assign { var: v, .. } if v == var) {
                    touched += 1;
                }
                touched += t.exprs().iter().filter(|e| reads(e, *var)).count();
            });
            // One for the assignment, one for its own read.
            if touched != 2 {
                continue;
            }
            let Expr::Reduce { arg, .. } = red else {
                continue;
            };
            let t = self.ty(arg);
            let cty = op.result(t.dtype).cty();
            // The same type as the accumulator: each step adds without rounding.
            if self.e.checked.vars[*var].dtype != op.result(t.dtype) || !t.dims.contains(&dim) {
                continue;
            }
            let total = Val {
                name: self.temp("tf_d"),
                dims: t.dims.clone(),
                cty,
                layout: li,
                raw: None,
                view: None,
            };
            let decl = self.decl(&total);
            self.w(
                depth,
                format!(
                    "{decl};  // `{}`'s terms, reduced after the loop",
                    self.k().vars[*var].name
                ),
            );
            let n = self.open(li, &total.dims, depth);
            let access = self.access(&total);
            self.w(depth + n, format!("{access} = {};", op.identity_c(cty)));
            self.close(n, depth);
            let d = Deferred {
                acc: *var,
                dim,
                op,
                reduce: red.clone(),
                arg: (**arg).clone(),
                total,
            };
            self.deferred.insert(s as *const Stmt as usize, d.clone());
            out.push(d);
        }
        Ok(out)
    }

    /// Inside the loop: this tile's `arg` added into the register tile, rows
    /// past the extent (and copies) left out.
    pub(super) fn accumulate(
        &mut self,
        d: &Deferred,
        at: &str,
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        let pre = self.hoist(&d.arg, at, l, depth)?;
        let (x, xt) = self.ctx(l, &pre).emit(&d.arg, at)?;
        let x = convert(&x, xt, d.total.cty);
        let live = self.live_c(l, &[d.dim]);
        // A thread's rows all go into its first register along the loop's
        // dimension: the others stay the identity (constants once
        // unrolled, so they take no registers), and the loads keep theirs.
        let own = self.rsub.insert(d.dim, "0".into());
        let access = self.access(&d.total);
        match own {
            Some(r) => self.rsub.insert(d.dim, r),
            None => self.rsub.remove(&d.dim),
        };
        let sum = fill(d.op.entry().cuda, &[("a", &access), ("b", &x)]);
        let stmt = format!("{access} = {sum};");
        self.masked_loops(l, &d.total.dims, &[d.dim], &live, &stmt, depth)
    }

    /// After the loop (`tb{dim}` at 0, so the reduction masks nothing the
    /// loop let in): each register tile reduced and combined into its
    /// accumulator as the statement says.
    pub(super) fn finish_deferred(
        &mut self,
        deferred: &[Deferred],
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        for d in deferred {
            let name = self.k().vars[d.acc].name.clone();
            let at = format!("{name}'s deferred reduction");
            let seed = vec![(d.arg.clone(), d.total.clone())];
            let r = self.reduce(d.op, &d.arg, d.dim, &at, l, depth, &seed)?;
            let Some(acc) = self.vars.get(&d.acc).cloned() else {
                return Err(self.unsupported(&at, format!("`{name}` has no value")));
            };
            let value = Expr::Binary {
                op: d.op.binary(),
                lhs: Box::new(Expr::Var(d.acc)),
                rhs: Box::new(d.reduce.clone()),
                at: at.clone(),
            };
            let dtype = self.e.checked.vars[d.acc].dtype;
            self.assign_seeded(
                &acc,
                dtype,
                &value,
                &at,
                l,
                depth,
                vec![(d.reduce.clone(), r)],
            )?;
        }
        Ok(())
    }
}
