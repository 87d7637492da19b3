//! The registry of lowerings: which one a kernel takes, decided once from the
//! shape of its body. The fast paths take the forms they were written for;
//! the general lowering takes every kernel the checker accepts.
//!
//! - GEMM: a 2-D grid `(tm, tn)`, an f32 accumulator, exactly one inner loop whose
//!   only statement is `acc = addmm(acc, a[(tm, tk)], b[(tk, tn)])`, and elementwise
//!   statements (the fused epilogue) around it.
//! - Attention: a grid over rows (plus batch tiles and a whole head dimension),
//!   one inner loop over key tiles holding two `addmm`s: scores `q·kᵀ` from
//!   tile loads, then `acc = addmm(…, p, v[…])` with `p` computed from the
//!   scores (see [`AttentionShape`]).
//! - Rows: no matmul; one grid dimension (the rows), tiles reduced along the
//!   columns walked by `tile()` loops directly inside the grid loop.
//! - General: everything else (gathers, offsets, atomics, jagged and nested
//!   loops, reductions anywhere, elementwise kernels).
//!
//! The fast paths take plain tile indices only (`t[(tm, tn)]`), no atomics,
//! no runtime `if`s and no computed loop bounds.

use crate::ir::*;

/// The parts of a GEMM-shaped kernel.
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

/// The parts of a flash-attention-shaped kernel:
///
/// ```text
/// for (tb.., tm, td) in tile([.., m, whole(d)]) {      // batch tiles, rows, head dim
///     …                                                // per-row state: m_i, l_i, acc
///     for tn in tile(n) /* .until(bound) */ {
///         let s = addmm(zeros([.., tm, tn]), q[(.., tm, td)], k[(.., tn, td)]) …;
///         …                                            // elementwise, row reductions over tn
///         acc = addmm(f(acc), p, v[(.., tn, td)]);     // p: computed over [tm, tn]
///         …
///     }
///     …                                                // elementwise over [tm] / [tm, td], stores
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Grid tiles other than the rows and the head dimension (each one index a program).
    pub batch: Vec<DimId>,
    /// Query rows (grid).
    pub m: DimId,
    /// Keys: the inner loop's tile.
    pub n: DimId,
    /// The head dimension: a `whole` grid tile.
    pub d: DimId,
    pub q: TensorId,
    pub k: TensorId,
    pub v: TensorId,
    /// Position of the key loop in the kernel body.
    pub kv_loop: usize,
    /// Position, in the key loop, of the statement holding `q·kᵀ`, and of `acc = addmm(…, p, v)`.
    pub scores: usize,
    pub update: usize,
    /// The output accumulator (over `[tm, td]`).
    pub acc: VarId,
}

/// The lowering a kernel takes, with what it found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    Gemm(GemmShape),
    Attention(AttentionShape),
    /// No matmul, and tiles reduced along a dimension (`x.sum(tn)`): rows of the
    /// grid dimension, columns walked in `tile()` loops.
    Rows,
    /// The general lowering ([`crate::emit::general`]).
    General,
}

impl Shape {
    /// The lowering's name, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Shape::Gemm(_) => "gemm",
            Shape::Attention(_) => "attention",
            Shape::Rows => "rows",
            Shape::General => "general",
        }
    }
}

fn addmm_at(e: &Expr) -> Option<&str> {
    let mut found = None;
    e.walk(&mut |x| {
        if let Expr::Addmm { at, .. } = x {
            found.get_or_insert(at.as_str());
        }
    });
    found
}

/// Whether `s` (or a statement inside it) has an `addmm`.
fn stmt_addmm(s: &Stmt) -> bool {
    let mut found = false;
    walk_stmts(std::slice::from_ref(s), &mut |x| {
        found |= x.exprs().into_iter().any(|e| addmm_at(e).is_some())
    });
    found
}

/// Whether every construct of `k` is one the fast paths know: plain tile
/// indices, loops over host extents, no atomics or runtime `if`s.
fn fast_form(k: &Kernel) -> bool {
    let mut ok = k.dims.iter().all(|d| !d.each && d.extent.is_some());
    k.walk_stmts(&mut |s| match s {
        Stmt::Store { index, .. } => ok &= plain_index(index).is_some(),
        // An `if` on `#[constexpr]` values is decided before lowering (an
        // unspecialized kernel is classified by both branches); one on
        // runtime values is a branch of the program.
        Stmt::If { cond, .. } => ok &= cond.is_compile_time(),
        Stmt::Atomic { .. } => ok = false,
        Stmt::Loop { range, .. } => ok &= range.is_none(),
        _ => {}
    });
    k.walk_exprs(&mut |e| {
        if let Expr::Load { index, .. } = e {
            ok &= plain_index(index).is_some();
        }
    });
    ok
}

/// Decides which lowering `k` takes (see the module's doc): a fast path
/// where one takes it, else the general lowering.
pub fn classify(k: &Kernel) -> Shape {
    if !fast_form(k) {
        return Shape::General;
    }
    let loops: Vec<usize> = (0..k.body.len())
        .filter(|&i| stmt_addmm(&k.body[i]))
        .collect();
    if loops.is_empty() {
        return if crate::emit::rows_take(k) {
            Shape::Rows
        } else {
            Shape::General
        };
    }
    if let Some(att) = attention(k, loops[0]) {
        return Shape::Attention(att);
    }
    match gemm(k, &loops) {
        Some(g) => Shape::Gemm(g),
        None => Shape::General,
    }
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

/// Counts the `addmm`s in `e`.
fn addmms(e: &Expr) -> usize {
    let mut n = 0;
    e.walk(&mut |x| n += usize::from(matches!(x, Expr::Addmm { .. })));
    n
}

/// The `addmm` inside `e`, if there is one.
fn find_addmm(e: &Expr) -> Option<&Expr> {
    let mut found = None;
    e.walk(&mut |x| {
        if matches!(x, Expr::Addmm { .. }) && found.is_none() {
            found = Some(x);
        }
    });
    found
}

/// The attention form (see [`AttentionShape`]), if the loop at `body[i]` has it.
fn attention(k: &Kernel, i: usize) -> Option<AttentionShape> {
    let Stmt::Loop { dim: n, body, .. } = &k.body[i] else {
        return None;
    };
    let sites: Vec<usize> = (0..body.len()).filter(|&j| stmt_addmm(&body[j])).collect();
    let count: usize = body
        .iter()
        .map(|s| match s {
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => addmms(value),
            _ => 0,
        })
        .sum();
    if count != 2 || sites.len() != 2 {
        return None;
    }
    for s in body {
        if let Stmt::Loop { .. } | Stmt::Store { .. } | Stmt::Wait { .. } | Stmt::Signal { .. } = s
        {
            return None;
        }
    }
    let (Stmt::Let { value: sv, .. } | Stmt::Assign { value: sv, .. }) = &body[sites[0]] else {
        return None;
    };
    let Some(Expr::Addmm { a: qa, b: kb, .. }) = find_addmm(sv) else {
        return None;
    };
    let (
        Expr::Load {
            tensor: q,
            index: qi,
            ..
        },
        Expr::Load {
            tensor: kt,
            index: ki,
            ..
        },
    ) = (qa.as_ref(), kb.as_ref())
    else {
        return None;
    };
    let Stmt::Assign {
        var: acc,
        value: Expr::Addmm { b: vb, .. },
        ..
    } = &body[sites[1]]
    else {
        return None;
    };
    let Expr::Load {
        tensor: v,
        index: vi,
        ..
    } = vb.as_ref()
    else {
        return None;
    };
    let (qi, ki, vi) = (plain_index(qi)?, plain_index(ki)?, plain_index(vi)?);
    let (Some((&d, qb)), Some((&kd, kbatch)), Some((&vd, vbatch))) =
        (qi.split_last(), ki.split_last(), vi.split_last())
    else {
        return None;
    };
    let (Some((&m, qb)), Some((&kn, kbatch)), Some((&vn, vbatch))) =
        (qb.split_last(), kbatch.split_last(), vbatch.split_last())
    else {
        return None;
    };
    if kd != d || vd != d || kn != *n || vn != *n || kbatch != qb || vbatch != qb {
        return None;
    }
    if !k.dims[d].whole || !k.grid.contains(&d) || !k.grid.contains(&m) {
        return None;
    }
    let mut grid: Vec<DimId> = k.grid.clone();
    grid.retain(|x| *x != m && *x != d);
    let mut want = qb.to_vec();
    want.sort_unstable();
    grid.sort_unstable();
    if grid != want {
        return None;
    }
    Some(AttentionShape {
        batch: qb.to_vec(),
        m,
        n: *n,
        d,
        q: *q,
        k: *kt,
        v: *v,
        kv_loop: i,
        scores: sites[0],
        update: sites[1],
        acc: *acc,
    })
}
