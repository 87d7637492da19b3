//! The attention form ([`AttentionShape`]): a grid over rows (plus batch tiles
//! and a whole head dimension), one inner loop over key tiles holding two
//! `addmm`s, scores `q·kᵀ` from tile loads, then `acc = addmm(…, p, v[…])` with
//! `p` computed from the scores. Keys and values may share a head among a
//! group of query heads (grouped-query attention): their batch index
//! `th / group` for a query head `th`. Packed (variable-length) sequences
//! take the same form one level down: the program's rows are a loop of at
//! most one tile inside a grid tile over the longest sequence ([`Packed`]).

use crate::ir::*;
use crate::plan::form::{fast_statements, fast_statements_but, stmt_addmm};

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
    /// The first product's row operand (the forward's `q`), key operand
    /// (`k`), and the first update's key operand (`v`).
    pub q: TensorId,
    pub k: TensorId,
    pub v: TensorId,
    /// The axis of `q`, `k` and `v` (and the output) their rows (keys) run
    /// along: the one before the head dimension, or another (0 for packed
    /// `[total, H, D]` sequences).
    pub row_axis: usize,
    /// Position of the key loop in the program's statements ([`AttentionShape::stmts`]),
    /// or of the outermost loop over `each` tiles around it.
    pub kv_loop: usize,
    /// Loops over `each` tiles around the key loop, outermost first (the
    /// backward's dK/dV: a group's query heads, `for g in tile(each(group))`).
    pub outer_each: Vec<DimId>,
    /// Position, in the key loop, of the statement holding `q·kᵀ`, and of `acc = addmm(…, p, v)`.
    pub scores: usize,
    pub update: usize,
    /// Further products of the scores' form between the two, each of a row
    /// operand indexed as `q` and a key operand indexed as `k` (the
    /// backward's `dP = dO·Vᵀ` beside `S = Q·Kᵀ`); the update's `v` may be
    /// any key operand (the backward's `dQ += dS·K`).
    pub more_scores: Vec<MoreScores>,
    /// Updates of further accumulators (the backward's dK beside dV).
    pub more_updates: Vec<MoreUpdate>,
    /// Products over the step's keys and the head dimension added atomically
    /// into a tensor (the one-pass backward's dQ: `dS·K`, `dS` transposed
    /// against the scores).
    pub atomics: Vec<AtomicProduct>,
    /// The output accumulator (over `[tm, td]`).
    pub acc: VarId,
    /// Per batch tile (as [`AttentionShape::batch`]), the divisor of its index
    /// into `k` and `v` (a scalar expression: `group` in `k[(tb, th / group,
    /// tn, td)]`), `None` where they take the query's index.
    pub kv_group: Vec<Option<Expr>>,
    /// Per batch tile, where [`AttentionShape::kv_group`] is `None`: the key
    /// operands' own index, an expression of the program's tiles and
    /// scalars (`th * group + g`), or `None`, the query's.
    pub kv_exprs: Vec<Option<Expr>>,
    /// Packed sequences: the rows are a loop inside the program; `None`, a grid tile.
    pub packed: Option<Packed>,
}

/// A product of the scores' form after the first (see [`AttentionShape::more_scores`]).
#[derive(Clone, Debug, PartialEq)]
pub struct MoreScores {
    /// Its position in the key loop's body.
    pub at: usize,
    /// The row operand (loaded once, as `q`) and the key operand (streamed, as `k`).
    pub rows: TensorId,
    pub keys: TensorId,
}

/// An update after the first (see [`AttentionShape::more_updates`]).
#[derive(Clone, Debug, PartialEq)]
pub struct MoreUpdate {
    /// Its position in the key loop's body.
    pub at: usize,
    /// The accumulator it assigns, and its key operand (`v` in the forward's).
    pub acc: VarId,
    pub keys: TensorId,
}

/// `atomic_add(t[i], addmm(zeros, a, r[…]) [* s])` in the key loop (see
/// [`AttentionShape::atomics`]): `i` the key operands' index (the step's keys
/// and the head dimension), `a` a value over the rows and keys, `r` a row
/// operand (its tile in shared memory), contracted over the rows; `s` a
/// uniform scale.
#[derive(Clone, Debug, PartialEq)]
pub struct AtomicProduct {
    /// Its position in the key loop's body.
    pub at: usize,
    /// The tensor added into, and the row operand multiplied.
    pub tensor: TensorId,
    pub rows: TensorId,
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

    /// Whether the key loop takes the forward's two products a step (`q·kᵀ`
    /// and `p·v`) and no more (the backward's kernels take more).
    pub fn is_forward(&self) -> bool {
        self.more_scores.is_empty() && self.more_updates.is_empty() && self.atomics.is_empty()
    }

    /// The tile whose block is the rows a program takes (the config's
    /// choice): the rows, or a packed kernel's grid tile over them.
    pub fn row_tile(&self) -> DimId {
        self.packed.as_ref().map_or(self.m, |p| p.rows)
    }

    /// The operands of the rows, loaded once a program: `q`, then each
    /// further product's (without repeats).
    pub fn row_operands(&self) -> Vec<TensorId> {
        let mut out = vec![self.q];
        let more = self.more_scores.iter().map(|m| m.rows);
        for t in more.chain(self.atomics.iter().map(|a| a.rows)) {
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
    }

    /// The operands streamed a key tile at a time, in the order the loop's
    /// products first read them: `k`, then the further products' and the
    /// update's (without repeats; the forward's: `k`, `v`).
    pub fn key_operands(&self) -> Vec<TensorId> {
        let mut uses: Vec<(usize, TensorId)> = vec![(self.scores, self.k)];
        uses.extend(self.more_scores.iter().map(|m| (m.at, m.keys)));
        uses.push((self.update, self.v));
        uses.extend(self.more_updates.iter().map(|u| (u.at, u.keys)));
        uses.sort_by_key(|u| u.0);
        let mut out = Vec::new();
        for (_, t) in uses {
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
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
    // Loops (`each` tiles around the keys', computed bounds on the keys')
    // and loads are checked against the form found; atomics must all be its
    // atomic products.
    if !fast_statements_but(k, true) {
        return None;
    }
    let a = attention(k, &k.body)?;
    let mut atomics = 0;
    k.walk_stmts(&mut |s| atomics += usize::from(matches!(s, Stmt::Atomic { .. })));
    if atomics != a.atomics.len() {
        return None;
    }
    // Only the key loop may have bounds the program computes (dK/dV's
    // causal `tile(tn.begin()..s)`).
    let mut ranges_ok = k
        .dims
        .iter()
        .enumerate()
        .all(|(i, d)| d.extent.is_some() || i == a.n);
    k.walk_stmts(&mut |s| {
        if let Stmt::Loop {
            dim,
            range: Some(_),
            ..
        } = s
        {
            ranges_ok &= *dim == a.n;
        }
    });
    if !ranges_ok {
        return None;
    }
    // Rows and head dimension on the grid, with one index of every other
    // operand tile a program; `each` tiles only in loops around the keys'.
    let mut grid: Vec<DimId> = k.grid.clone();
    grid.retain(|x| *x != a.m && *x != a.d);
    let mut want = a.batch.clone();
    want.sort_unstable();
    grid.sort_unstable();
    let each_ok = k
        .dims
        .iter()
        .enumerate()
        .all(|(i, d)| !d.each || a.outer_each.contains(&i));
    (k.grid.contains(&a.m) && grid == want && each_ok && loads_taken(&k.body, &a)).then_some(a)
}

/// Whether `e` is one value for a whole program (or step of a loop over
/// `each` tiles): integer arithmetic on literals, scalars and the indices of
/// the batch tiles `batch` and the `each` tiles `each`.
fn program_uniform(e: &Expr, batch: &[DimId], each: &[DimId]) -> bool {
    let mut ok = true;
    e.walk(&mut |x| match x {
        Expr::TileIndex(t) => ok &= batch.contains(t) || each.contains(t),
        Expr::Int(_) | Expr::Scalar(_) | Expr::Const(_) => {}
        Expr::Binary {
            op: BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div,
            ..
        } => {}
        _ => ok = false,
    });
    ok
}

/// The loads of `stmts` the form takes: the products' operands as
/// [`attention`] found them (the key operands' batch index a group's head or
/// an expression of the program's tiles), any other with each index
/// component a tile's own indices or such an expression (the backward's
/// `lse[(tb, th * group + g, tm)]`).
fn loads_taken(stmts: &[Stmt], a: &AttentionShape) -> bool {
    let keys = a.key_operands();
    let uniform = |e: &Expr| program_uniform(e, &a.batch, &a.outer_each);
    let mut ok = true;
    walk_stmts(stmts, &mut |s| {
        for e in s.exprs() {
            e.walk(&mut |x| {
                if let Expr::Load { tensor, index, .. } = x {
                    ok &= keys.contains(tensor)
                        || index
                            .iter()
                            .all(|c| matches!(c, Expr::TileIndex(_)) || uniform(c));
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
    let ok = fast_statements(k);
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
    if !(ok && grid_ok && loads_taken(inner, &a)) {
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
/// `stmts`, if the first one with an `addmm` is a key loop that has it
/// (perhaps inside loops over `each` tiles, one statement each) and no other
/// is a loop. The caller checks the grid.
fn attention(k: &Kernel, stmts: &[Stmt]) -> Option<AttentionShape> {
    let i = (0..stmts.len()).find(|&j| stmt_addmm(&stmts[j]))?;
    let loops = stmts
        .iter()
        .filter(|s| matches!(s, Stmt::Loop { .. }))
        .count();
    if loops != 1 {
        return None;
    }
    let mut outer_each = Vec::new();
    let mut s = &stmts[i];
    while let Stmt::Loop {
        dim,
        body,
        until: None,
        range: None,
    } = s
    {
        match body.as_slice() {
            [inner @ Stmt::Loop { .. }] if k.dims[*dim].each => {
                outer_each.push(*dim);
                s = inner;
            }
            _ => break,
        }
    }
    let Stmt::Loop { dim: n, body, .. } = s else {
        return None;
    };
    let n = *n;
    let sites: Vec<usize> = (0..body.len()).filter(|&j| stmt_addmm(&body[j])).collect();
    let count: usize = body
        .iter()
        .map(|s| match s {
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Atomic { value, .. } => {
                addmms(value)
            }
            _ => 0,
        })
        .sum();
    // One `addmm` a statement: the scores first, then further score-like
    // products (the backward's `dO·Vᵀ`) and updates of accumulators over
    // the rows and head dimension, in any order.
    if count != sites.len() || sites.len() < 2 {
        return None;
    }
    for s in body {
        if let Stmt::Loop { .. } | Stmt::Store { .. } | Stmt::Wait { .. } | Stmt::Signal { .. } = s
        {
            return None;
        }
    }
    let loads = |e: &Expr| -> Option<(Operand, Operand)> {
        match e {
            Expr::Addmm { a, b, .. } => match (a.as_ref(), b.as_ref()) {
                (
                    Expr::Load {
                        tensor: x,
                        index: ix,
                        ..
                    },
                    Expr::Load {
                        tensor: y,
                        index: iy,
                        ..
                    },
                ) => Some(((*x, ix.clone()), (*y, iy.clone()))),
                _ => None,
            },
            _ => None,
        }
    };
    let (Stmt::Let { value: sv, .. } | Stmt::Assign { value: sv, .. }) = &body[sites[0]] else {
        return None;
    };
    let (x, y) = loads(find_addmm(sv)?)?;
    let tile = |e: &Expr, t: DimId| matches!(e, Expr::TileIndex(x) if *x == t);
    // The row operand is the one whose rows are a tile other than the keys';
    // the key operand has the keys at that axis (`q·kᵀ`, or the backward's
    // transposed `q·kᵀ` against a grid of keys).
    let split = |(r, ri): &(TensorId, Vec<Expr>), (kt, ki): &(TensorId, Vec<Expr>)| {
        let rank = ri.len();
        let d = match ri.last()? {
            Expr::TileIndex(d) => *d,
            _ => return None,
        };
        if ki.len() != rank || !tile(ki.last()?, d) || rank < 2 {
            return None;
        }
        let row_axis = (0..rank - 1).find(|&a| tile(&ki[a], n))?;
        let Expr::TileIndex(m) = ri[row_axis] else {
            return None;
        };
        (m != n && m != d).then_some((*r, ri.clone(), *kt, ki.clone(), row_axis, m, d))
    };
    let (q, qraw, kt, ki, row_axis, m, d) = split(&x, &y).or_else(|| split(&y, &x))?;
    let qi = plain_index(&qraw)?;
    let rank = qi.len();
    let mut more_scores = Vec::new();
    let mut updates: Vec<MoreUpdate> = Vec::new();
    let mut atomics = Vec::new();
    for &j in &sites[1..] {
        match &body[j] {
            Stmt::Atomic {
                op: AtomicOp::Add,
                tensor,
                index,
                value,
                old: None,
                ..
            } => {
                let rows = atomic_product(value, &qraw)?;
                if *index != ki {
                    return None;
                }
                atomics.push(AtomicProduct {
                    at: j,
                    tensor: *tensor,
                    rows,
                });
            }
            Stmt::Assign {
                var,
                value: Expr::Addmm { acc, b: z, .. },
                ..
            } if reads_acc(acc, *var) => {
                let Expr::Load {
                    tensor: zt,
                    index: zi,
                    ..
                } = z.as_ref()
                else {
                    return None;
                };
                if *zi != ki {
                    return None;
                }
                updates.push(MoreUpdate {
                    at: j,
                    acc: *var,
                    keys: *zt,
                });
            }
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => {
                let ((xt, xi), (yt, yi)) = loads(find_addmm(value)?)?;
                let (rows, keys) = if xi == ki && yi == qraw {
                    (yt, xt)
                } else if yi == ki && xi == qraw {
                    (xt, yt)
                } else {
                    return None;
                };
                more_scores.push(MoreScores { at: j, rows, keys });
            }
            _ => return None,
        }
    }
    if updates.is_empty() {
        return None;
    }
    let first = updates.remove(0);
    let (update, acc, v) = (first.at, first.acc, first.keys);
    let qb: Vec<DimId> = (0..rank - 1)
        .filter(|&r| r != row_axis)
        .map(|r| qi[r])
        .collect();
    // The key operands' batch index: the rows', a group's shared head, or
    // another expression of the program's tiles (the backward's `th * group + g`).
    let kbatch: Vec<Expr> = (0..rank - 1)
        .filter(|&r| r != row_axis)
        .map(|r| ki[r].clone())
        .collect();
    let uniform = |e: &Expr| program_uniform(e, &qb, &outer_each);
    let mut kv_group = Vec::new();
    let mut kv_exprs = Vec::new();
    for (e, &b) in kbatch.iter().zip(&qb) {
        match kv_batch_index(e, b) {
            Some(g) => {
                kv_group.push(g);
                kv_exprs.push(None);
            }
            None if uniform(e) => {
                kv_group.push(None);
                kv_exprs.push(Some(e.clone()));
            }
            None => return None,
        }
    }
    if !k.dims[d].whole || !k.grid.contains(&d) || qb.contains(&m) {
        return None;
    }
    Some(AttentionShape {
        batch: qb,
        m,
        n,
        d,
        q,
        k: kt,
        v,
        row_axis,
        kv_loop: i,
        outer_each,
        scores: sites[0],
        update,
        more_scores,
        more_updates: updates,
        atomics,
        acc,
        kv_group,
        kv_exprs,
        packed: None,
    })
}

/// A product's operand: the tensor and its load's index.
type Operand = (TensorId, Vec<Expr>);

/// The row operand of an atomic product's value `addmm(zeros, a, r[…])`,
/// optionally times a uniform scale (see [`AtomicProduct`]), `r` indexed as
/// the rows' operand (`rows_index`).
fn atomic_product(value: &Expr, rows_index: &[Expr]) -> Option<TensorId> {
    let mm = match value {
        Expr::Binary {
            op: BinOp::Mul,
            lhs,
            rhs,
            ..
        } => match (lhs.as_ref(), rhs.as_ref()) {
            (m @ Expr::Addmm { .. }, s) | (s, m @ Expr::Addmm { .. }) if uniform(s) => m,
            _ => return None,
        },
        m => m,
    };
    let Expr::Addmm { acc, b, .. } = mm else {
        return None;
    };
    let (Expr::Full { value: 0.0, .. }, Expr::Load { tensor, index, .. }) =
        (acc.as_ref(), b.as_ref())
    else {
        return None;
    };
    (index.as_slice() == rows_index).then_some(*tensor)
}

/// Whether `acc` (an update's first argument) reads the variable it assigns.
fn reads_acc(acc: &Expr, var: VarId) -> bool {
    let mut found = false;
    acc.walk(&mut |x| found |= matches!(x, Expr::Var(v) if *v == var));
    found
}

/// Whether `x` is the same for every program and step: scalars, constants
/// and arithmetic of them (a uniform scale, a key loop's bound).
pub(super) fn uniform(x: &Expr) -> bool {
    let mut ok = true;
    x.walk(&mut |y| {
        ok &= matches!(
            y,
            Expr::Int(_)
                | Expr::Float(_)
                | Expr::Scalar(_)
                | Expr::Const(_)
                | Expr::Binary { .. }
                | Expr::Unary { .. }
                | Expr::Cast { .. }
        )
    });
    ok
}
