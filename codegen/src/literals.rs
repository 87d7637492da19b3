//! Integer literals take the type of the integer they meet, through the
//! values made of them.
//!
//! The checker types `x + 1` on an i32 tile as i32 (the literal adapts, as
//! Rust infers it), but a value made of literals only (`select(v > 0.0, 1, 0)`,
//! its `.sum(tm)`) is an i64 until it meets `count`: computed so, a count
//! carried down a loop took 64-bit selects, adds and shuffles every step, and
//! missed the loop's deferred reduction (its terms were not `count`'s type).
//! Here each literal of such a value becomes `(literal as T)` in the IR, `T`
//! the integer it meets, so the value is a `T` throughout: on the GPU, in
//! interpret mode and in every lowering alike. Only where each literal fits
//! `T`; otherwise the value stays an i64, converted where it meets.

use crate::check::{literal_types, Ty};
use crate::dtype::DType;
use crate::error::CodegenError;
use crate::ir::*;
use crate::spec::Spec;
use std::borrow::Cow;
use std::collections::HashMap;

/// Literals to retype: by the address of their `Expr::Int`, the type.
pub(crate) type Found = HashMap<usize, DType>;

fn addr(e: &Expr) -> usize {
    e as *const Expr as usize
}

/// `kernel` (specialized for `spec.constexprs`) with the literals of values
/// made of literals only cast to the integer type they meet; borrowed when
/// there are none.
pub fn with_literal_types<'k>(
    kernel: &'k Kernel,
    spec: &Spec,
) -> Result<Cow<'k, Kernel>, CodegenError> {
    let found = literal_types(kernel, spec)?;
    if found.is_empty() {
        return Ok(Cow::Borrowed(kernel));
    }
    fn expr(e: &Expr, found: &Found) -> Expr {
        match (e, found.get(&addr(e))) {
            (Expr::Int(_), Some(&t)) => Expr::Cast {
                arg: Box::new(e.clone()),
                dtype: Some(t),
            },
            _ => e.map_children(&mut |c| expr(c, found)),
        }
    }
    fn stmts(list: &[Stmt], found: &Found) -> Vec<Stmt> {
        list.iter()
            .map(|s| {
                let mapped: Result<Stmt, std::convert::Infallible> =
                    s.try_map(&mut |e| Ok(expr(e, found)), &mut |b| Ok(stmts(b, found)));
                match mapped {
                    Ok(s) => s,
                    Err(never) => match never {},
                }
            })
            .collect()
    }
    Ok(Cow::Owned(Kernel {
        body: stmts(&kernel.body, &found),
        ..kernel.clone()
    }))
}

/// Records the literals of `e`, a literal-made value meeting an integer of
/// type `t`, where every one of them fits `t`. `ty` gives the checker's
/// types of `e` and its parts.
pub(crate) fn resolve<'a>(
    e: &Expr,
    t: DType,
    ty: &impl Fn(&Expr) -> Option<&'a Ty>,
    out: &mut Found,
) {
    let range = match t {
        DType::I32 => i64::from(i32::MIN)..=i64::from(i32::MAX),
        DType::U32 => 0..=i64::from(u32::MAX),
        _ => return,
    };
    let mut literals = Vec::new();
    collect(e, ty, &mut literals);
    if literals
        .iter()
        .all(|l| matches!(l, Expr::Int(v) if range.contains(v)))
    {
        out.extend(literals.into_iter().map(|l| (addr(l), t)));
    }
}

/// The literals `e`'s value is made of: through `select`'s values (not its
/// mask), arithmetic (not a shift's amount), unary functions and
/// reductions, as long as the parts are literal-made integers.
fn collect<'e, 'a>(e: &'e Expr, ty: &impl Fn(&Expr) -> Option<&'a Ty>, out: &mut Vec<&'e Expr>) {
    if !ty(e).is_some_and(|t| t.weak && t.dtype.is_int()) {
        return;
    }
    match e {
        Expr::Int(_) => out.push(e),
        Expr::Select {
            then, otherwise, ..
        }
        | Expr::IfConst {
            then, otherwise, ..
        } => {
            collect(then, ty, out);
            collect(otherwise, ty, out);
        }
        Expr::Binary { op, lhs, rhs, .. } => {
            collect(lhs, ty, out);
            if op.entry().rule != crate::prims::binary::Rule::Shift {
                collect(rhs, ty, out);
            }
        }
        Expr::Unary { arg, .. } | Expr::Reduce { arg, .. } | Expr::Scan { arg, .. } => {
            collect(arg, ty, out)
        }
        _ => {}
    }
}
