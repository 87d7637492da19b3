//! The form the fast paths take: plain tile indices, loops over host
//! extents, no atomics or runtime `if`s; and where the `addmm`s are, which
//! tells the matmul-shaped fast paths from the others.

use crate::ir::*;

/// Whether every construct of `k` is one the fast paths know: plain tile
/// indices, loops over host extents, no atomics, runtime `if`s or scans.
pub(crate) fn fast_form(k: &Kernel) -> bool {
    let mut ok = fast_statements(k) && k.dims.iter().all(|d| !d.each && d.extent.is_some());
    k.walk_stmts(&mut |s| {
        if let Stmt::Loop { range, .. } = s {
            ok &= range.is_none();
        }
    });
    k.walk_exprs(&mut |e| {
        if let Expr::Load { index, .. } = e {
            ok &= plain_index(index).is_some();
        }
    });
    ok
}

/// The statements every fast path takes: stores at plain tile indices, no
/// atomics, no runtime `if`s, no scans or `argmax` (the general lowering's alone; loops
/// and loads are each path's to check).
pub(crate) fn fast_statements(k: &Kernel) -> bool {
    fast_statements_but(k, false)
}

/// [`fast_statements`], with atomics allowed where `atomics` (a fast path
/// that takes them, and checks where they stand).
pub(crate) fn fast_statements_but(k: &Kernel, atomics: bool) -> bool {
    let mut ok = true;
    k.walk_exprs(&mut |e| ok &= !matches!(e, Expr::Scan { .. } | Expr::ArgReduce { .. }));
    k.walk_stmts(&mut |s| match s {
        Stmt::Store { index, .. } => ok &= plain_index(index).is_some(),
        // An `if` on `#[constexpr]` values is decided before lowering (an
        // unspecialized kernel is planned by both branches); one on
        // runtime values is a branch of the program.
        Stmt::If { cond, .. } => ok &= cond.is_compile_time(),
        // A fetch (`let old = atomic_add(…)`) is the general lowering's alone.
        Stmt::Atomic { old, .. } => ok &= atomics && old.is_none(),
        _ => {}
    });
    ok
}

/// The positions of the statements of `k`'s body that hold an `addmm`
/// (themselves or a statement inside them).
pub(crate) fn addmm_stmts(k: &Kernel) -> Vec<usize> {
    (0..k.body.len())
        .filter(|&i| stmt_addmm(&k.body[i]))
        .collect()
}

/// Whether `s` (or a statement inside it) has an `addmm`.
pub(crate) fn stmt_addmm(s: &Stmt) -> bool {
    let mut found = false;
    walk_stmts(std::slice::from_ref(s), &mut |x| {
        found |= x.exprs().into_iter().any(has_addmm)
    });
    found
}

/// Whether `e` has an `addmm`.
fn has_addmm(e: &Expr) -> bool {
    let mut found = false;
    e.walk(&mut |x| found |= matches!(x, Expr::Addmm { .. }));
    found
}
