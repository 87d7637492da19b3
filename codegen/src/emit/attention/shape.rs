//! The attention form ([`AttentionShape`]): a grid over rows (plus batch tiles
//! and a whole head dimension), one inner loop over key tiles holding two
//! `addmm`s, scores `q·kᵀ` from tile loads, then `acc = addmm(…, p, v[…])` with
//! `p` computed from the scores. Keys and values may share a head among a
//! group of query heads (grouped-query attention): their batch index
//! `th / group` for a query head `th`.

use crate::ir::*;
use crate::plan::form::{addmm_stmts, fast_form_loading, stmt_addmm};

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
#[derive(Clone, Debug, PartialEq)]
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
    /// Per batch tile (as [`AttentionShape::batch`]), the divisor of its index
    /// into `k` and `v` (a scalar expression: `group` in `k[(tb, th / group,
    /// tn, td)]`), `None` where they take the query's index.
    pub kv_group: Vec<Option<Expr>>,
}

/// A key or value batch index against the query's tile `b`: the tile's own
/// index (`None`) or its index over a scalar divisor (`Some(divisor)`).
fn kv_batch_index(e: &Expr, b: DimId) -> Option<Option<Expr>> {
    match (e, grouped_head(e)) {
        (Expr::TileIndex(d), _) if *d == b => Some(None),
        (_, Some((d, g))) if d == b => Some(Some(g.clone())),
        _ => None,
    }
}

/// The attention form of `k`, if it has it: the first statement with an
/// `addmm` is the key loop.
pub(super) fn find(k: &Kernel) -> Option<AttentionShape> {
    let grouped = |index: &[Expr]| {
        index
            .iter()
            .all(|e| matches!(e, Expr::TileIndex(_)) || grouped_head(e).is_some())
    };
    if !fast_form_loading(k, grouped) {
        return None;
    }
    let first = *addmm_stmts(k).first()?;
    let a = attention(k, first)?;
    // A grouped head only in the keys' and values' loads of the two `addmm`s
    // (which `attention` read): any other load has plain tile indices.
    let mut others_plain = true;
    k.walk_exprs(&mut |e| {
        if let Expr::Load { tensor, index, .. } = e {
            others_plain &= plain_index(index).is_some() || *tensor == a.k || *tensor == a.v;
        }
    });
    others_plain.then_some(a)
}

/// `tb / g` with `g` a scalar: the tile `tb` and the divisor `g`.
fn grouped_head(e: &Expr) -> Option<(DimId, &Expr)> {
    match e {
        Expr::Binary {
            op: BinOp::Div,
            lhs,
            rhs,
            ..
        } => match (lhs.as_ref(), rhs.as_ref()) {
            (Expr::TileIndex(d), g @ (Expr::Scalar(_) | Expr::Const(_) | Expr::Int(_))) => {
                Some((*d, g))
            }
            _ => None,
        },
        _ => None,
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
    let qi = plain_index(qi)?;
    let (Some((&d, qb)), Some((kd, kbatch)), Some((vd, vbatch))) =
        (qi.split_last(), ki.split_last(), vi.split_last())
    else {
        return None;
    };
    let (Some((&m, qb)), Some((kn, kbatch)), Some((vn, vbatch))) =
        (qb.split_last(), kbatch.split_last(), vbatch.split_last())
    else {
        return None;
    };
    let tile = |e: &Expr, t: DimId| matches!(e, Expr::TileIndex(x) if *x == t);
    if !tile(kd, d) || !tile(vd, d) || !tile(kn, *n) || !tile(vn, *n) {
        return None;
    }
    // Keys and values: the query's batch index, or a group's shared head.
    if kbatch != vbatch || kbatch.len() != qb.len() {
        return None;
    }
    let kv_group = kbatch
        .iter()
        .zip(qb)
        .map(|(e, &b)| kv_batch_index(e, b))
        .collect::<Option<Vec<_>>>()?;
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
        kv_group,
    })
}
