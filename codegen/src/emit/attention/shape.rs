//! The attention form ([`AttentionShape`]): a grid over rows (plus batch tiles
//! and a whole head dimension), one inner loop over key tiles holding two
//! `addmm`s, scores `q·kᵀ` from tile loads, then `acc = addmm(…, p, v[…])` with
//! `p` computed from the scores. Keys and values may share a head among a
//! group of query heads (grouped-query attention): their batch index
//! `th / group` for a query head `th`. Packed (variable-length) sequences
//! take the same form one level down: the program's rows are a loop of at
//! most one tile inside a grid tile over the longest sequence ([`Packed`]).

use crate::ir::*;
use crate::plan::form::{fast_form_loading, stmt_addmm};

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
///
/// The operands' rows may sit at any axis but the last (packed `[total, H, D]`
/// operands: the first, [`AttentionShape::row_axis`]).
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionShape {
    /// The operands' tiles other than the rows and the head dimension (each
    /// one index a program), in their index order.
    pub batch: Vec<DimId>,
    /// Query rows: a grid tile, or the loop over a packed sequence's rows.
    pub m: DimId,
    /// Keys: the inner loop's tile.
    pub n: DimId,
    /// The head dimension: a `whole` grid tile.
    pub d: DimId,
    pub q: TensorId,
    pub k: TensorId,
    pub v: TensorId,
    /// The axis of `q`, `k` and `v` (and the output) their rows (keys) run
    /// along: the one before the head dimension, or another (0 for packed
    /// `[total, H, D]` sequences).
    pub row_axis: usize,
    /// Position of the key loop in the program's statements ([`AttentionShape::stmts`]).
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
    /// Packed sequences: the rows are a loop inside the program; `None`, a grid tile.
    pub packed: Option<Packed>,
}

/// Packed (variable-length) sequences, FlashAttention's varlen layout:
///
/// ```text
/// for (b, th, tq, td) in tile([each(nb), h, max_seqlen, whole(d)]) {
///     let begin = cu_seqlens[b];                        // scalar `let`s
///     let end = cu_seqlens[b + 1];
///     for tm in tile(begin + tq.begin()..min(begin + tq.end(), end)) {
///         …                                             // the attention form, over rows `tm`
///         for tn in tile(begin..end) { … }              // keys: any range
///         out[(tm, th, td)] = …;
///     }
/// }
/// ```
///
/// The row loop walks at most one tile when its block is the grid tile's (the
/// lowering fits it so): a program's rows start at `begin + tq.begin()` and
/// stop at the range's end, and a program past its sequence's end has none.
#[derive(Clone, Debug, PartialEq)]
pub struct Packed {
    /// The grid tile a program takes a block of rows of (`tq`).
    pub rows: DimId,
    /// The position of the loop over the program's rows in the kernel body.
    pub rows_loop: usize,
}

impl AttentionShape {
    /// The statements a program runs, in order: the kernel body, with a packed
    /// kernel's row loop replaced by its statements (what comes before it are
    /// scalar `let`s and `wait`s; nothing comes after it).
    pub fn stmts(&self, k: &Kernel) -> Vec<Stmt> {
        match &self.packed {
            None => k.body.clone(),
            Some(p) => flatten(&k.body, p.rows_loop),
        }
    }

    /// The tile whose block is the rows a program takes (the config's
    /// choice): the rows, or a packed kernel's grid tile over them.
    pub fn row_tile(&self) -> DimId {
        self.packed.as_ref().map_or(self.m, |p| p.rows)
    }

    /// A packed kernel's row loop bounds (see [`Packed`]).
    pub fn row_range<'k>(&self, k: &'k Kernel) -> Option<&'k LoopRange> {
        match k.body.get(self.packed.as_ref()?.rows_loop)? {
            Stmt::Loop { range, .. } => range.as_deref(),
            _ => None,
        }
    }

    /// The grid tiles besides the rows and the head dimension, in grid order:
    /// one index of each a program (the batch tiles, and a packed kernel's
    /// sequence).
    pub fn programs(&self, k: &Kernel) -> Vec<DimId> {
        let rows = self.row_tile();
        k.grid
            .iter()
            .copied()
            .filter(|&x| x != rows && x != self.d)
            .collect()
    }
}

/// `body` with the loop at `at` replaced by its statements.
fn flatten(body: &[Stmt], at: usize) -> Vec<Stmt> {
    let mut out = body[..at].to_vec();
    if let Some(Stmt::Loop { body: inner, .. }) = body.get(at) {
        out.extend(inner.iter().cloned());
    }
    out.extend(body[(at + 1).min(body.len())..].iter().cloned());
    out
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
/// `addmm` is the key loop; rows a grid tile, or a packed sequence's loop.
pub(super) fn find(k: &Kernel) -> Option<AttentionShape> {
    if let Some(p) = packed(k) {
        return packed_attention(k, p);
    }
    let grouped = |index: &[Expr]| {
        index
            .iter()
            .all(|e| matches!(e, Expr::TileIndex(_)) || grouped_head(e).is_some())
    };
    if !fast_form_loading(k, grouped) {
        return None;
    }
    let a = attention(k, &k.body)?;
    // Rows and head dimension on the grid, with one index of every other
    // operand tile a program.
    let mut grid: Vec<DimId> = k.grid.clone();
    grid.retain(|x| *x != a.m && *x != a.d);
    let mut want = a.batch.clone();
    want.sort_unstable();
    grid.sort_unstable();
    (k.grid.contains(&a.m) && grid == want && others_plain(&k.body, &a)).then_some(a)
}

/// A grouped head only in the keys' and values' loads of the two `addmm`s
/// (which `attention` read): any other load of `stmts` has plain tile indices.
fn others_plain(stmts: &[Stmt], a: &AttentionShape) -> bool {
    let mut ok = true;
    walk_stmts(stmts, &mut |s| {
        for e in s.exprs() {
            e.walk(&mut |x| {
                if let Expr::Load { tensor, index, .. } = x {
                    ok &= plain_index(index).is_some() || *tensor == a.k || *tensor == a.v;
                }
            });
        }
    });
    ok
}

/// The packed form's outline (see [`Packed`]), if `k` has it: scalar `let`s
/// (and `wait`s), then a loop of at most one tile of a grid tile's rows,
/// last.
fn packed(k: &Kernel) -> Option<Packed> {
    let (last, prefix) = k.body.split_last()?;
    let Stmt::Loop {
        dim: tm,
        range: Some(range),
        until: None,
        ..
    } = last
    else {
        return None;
    };
    let scalar = |e: &Expr| {
        let mut ok = true;
        e.walk(&mut |x| match x {
            Expr::TileIndex(t) => ok &= k.dims[*t].each,
            Expr::Full { .. } | Expr::Addmm { .. } | Expr::Reduce { .. } | Expr::Rand { .. } => {
                ok = false
            }
            _ => {}
        });
        ok
    };
    let prefix_ok = prefix.iter().all(|s| match s {
        Stmt::Let { value, .. } => scalar(value),
        Stmt::Wait { .. } => true,
        _ => false,
    });
    let rows = one_tile_of(&range.begin, &range.end)?;
    let ok = prefix_ok
        && k.grid.contains(&rows)
        && !k.grid.contains(tm)
        && !k.dims[rows].each
        && !k.dims[rows].whole
        && k.dims[*tm].extent.is_none();
    ok.then_some(Packed {
        rows,
        rows_loop: prefix.len(),
    })
}

/// The grid tile `g` when `begin..end` is `x + g.begin()..min(x + g.end(), y)`
/// (or `..x + g.end()`; `x` may be absent, `min`'s arguments in either order):
/// at most one block of `g`'s rows.
fn one_tile_of(begin: &Expr, end: &Expr) -> Option<DimId> {
    // `x + t` (either order) or `t` alone: the tile expression and `x`.
    fn offset_of(e: &Expr) -> Vec<(&Expr, Option<&Expr>)> {
        match e {
            Expr::Binary {
                op: BinOp::Add,
                lhs,
                rhs,
                ..
            } => vec![
                (rhs.as_ref(), Some(lhs.as_ref())),
                (lhs.as_ref(), Some(rhs.as_ref())),
            ],
            other => vec![(other, None)],
        }
    }
    fn ends(e: &Expr) -> Vec<(DimId, Option<&Expr>)> {
        match e {
            Expr::Binary {
                op: BinOp::Min,
                lhs,
                rhs,
                ..
            } => {
                let mut v = ends(lhs);
                v.extend(ends(rhs));
                v
            }
            _ => offset_of(e)
                .into_iter()
                .filter_map(|(t, x)| match t {
                    Expr::TileEnd(d) => Some((*d, x)),
                    _ => None,
                })
                .collect(),
        }
    }
    let starts: Vec<(DimId, Option<&Expr>)> = offset_of(begin)
        .into_iter()
        .filter_map(|(t, x)| match t {
            Expr::TileBegin(d) => Some((*d, x)),
            _ => None,
        })
        .collect();
    let ends = ends(end);
    starts
        .into_iter()
        .find(|s| ends.contains(s))
        .map(|(d, _)| d)
}

/// The attention form of a packed kernel (see [`Packed`]): the row loop's
/// statements in the attention form, over operands indexed by plain tiles (a
/// grouped head for the keys and values), with the loops over the rows and
/// the keys the only ones whose bounds the program computes.
fn packed_attention(k: &Kernel, p: Packed) -> Option<AttentionShape> {
    let stmts = flatten(&k.body, p.rows_loop);
    let inner = &stmts[p.rows_loop..];
    let mut ok = true;
    walk_stmts(inner, &mut |s| match s {
        Stmt::Store { index, .. } => ok &= plain_index(index).is_some(),
        Stmt::If { cond, .. } => ok &= cond.is_compile_time(),
        Stmt::Atomic { .. } => ok = false,
        _ => {}
    });
    let mut a = attention(k, &stmts)?;
    let mut programs: Vec<DimId> = k.grid.clone();
    programs.retain(|x| *x != p.rows && *x != a.d);
    // The operands' batch tiles one index a program; the grid's others are
    // `each` tiles (the sequence), read by the scalar `let`s only.
    let grid_ok = programs
        .iter()
        .all(|x| a.batch.contains(x) || k.dims[*x].each)
        && a.batch
            .iter()
            .all(|x| programs.contains(x) && !k.dims[*x].each)
        && k.dims
            .iter()
            .enumerate()
            .all(|(i, d)| d.extent.is_some() || i == a.m || i == a.n);
    if !(ok && grid_ok && others_plain(inner, &a)) {
        return None;
    }
    a.packed = Some(p);
    Some(a)
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

/// The attention form (see [`AttentionShape`]) of a program's statements
/// `stmts`, if the first one with an `addmm` is a key loop that has it and no
/// other is a loop. The caller checks the grid.
fn attention(k: &Kernel, stmts: &[Stmt]) -> Option<AttentionShape> {
    let i = (0..stmts.len()).find(|&j| stmt_addmm(&stmts[j]))?;
    let loops = stmts
        .iter()
        .filter(|s| matches!(s, Stmt::Loop { .. }))
        .count();
    let Stmt::Loop { dim: n, body, .. } = &stmts[i] else {
        return None;
    };
    if loops != 1 {
        return None;
    }
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
    // The head dimension last; the rows (keys) at the same axis of all three.
    let (Some((&d, _)), Some((kd, _)), Some((vd, _))) =
        (qi.split_last(), ki.split_last(), vi.split_last())
    else {
        return None;
    };
    let tile = |e: &Expr, t: DimId| matches!(e, Expr::TileIndex(x) if *x == t);
    let rank = qi.len();
    if ki.len() != rank || vi.len() != rank || !tile(kd, d) || !tile(vd, d) {
        return None;
    }
    let row_axis = (0..rank - 1).find(|&r| tile(&ki[r], *n) && tile(&vi[r], *n))?;
    let m = qi[row_axis];
    let others = |ix: &[Expr]| -> Vec<Expr> {
        (0..rank - 1)
            .filter(|&r| r != row_axis)
            .map(|r| ix[r].clone())
            .collect()
    };
    let qb: Vec<DimId> = (0..rank - 1)
        .filter(|&r| r != row_axis)
        .map(|r| qi[r])
        .collect();
    // Keys and values: the query's batch index, or a group's shared head.
    let (kbatch, vbatch) = (others(ki), others(vi));
    if kbatch != vbatch {
        return None;
    }
    let kv_group = kbatch
        .iter()
        .zip(&qb)
        .map(|(e, &b)| kv_batch_index(e, b))
        .collect::<Option<Vec<_>>>()?;
    if !k.dims[d].whole || !k.grid.contains(&d) || m == d || qb.contains(&m) {
        return None;
    }
    Some(AttentionShape {
        batch: qb,
        m,
        n: *n,
        d,
        q: *q,
        k: *kt,
        v: *v,
        row_axis,
        kv_loop: i,
        scores: sites[0],
        update: sites[1],
        acc: *acc,
        kv_group,
        packed: None,
    })
}
