//! The split tail of the persistent forward's walk (`Config::stream_k` on an
//! attention kernel), as stream-K does for GEMMs and Lean Attention for
//! attention: the tiles after the last whole wave share their key steps
//! evenly among one wave of blocks, a block crossing from one tile into the
//! next, so no SM idles through a last, partial wave (4096 tiles on 132 SMs
//! take 32 tile times where 31.03 would do: 3%).
//!
//! A block's share of the split tiles is at least a tile's steps, so a tile
//! is split at most once: its two parts (from step 0, and up to its last)
//! each write their online-softmax state (`m`, `l`, `acc`) to scratch, and
//! the second to arrive combines the two and runs the program's epilogue.
//! That takes knowing the state's meaning: the key loop must be exactly the
//! online softmax (see [`online_softmax`]).

use super::frag::Geo;
use super::shape::{uniform, AttentionShape};
use crate::emit::{config_err, Emitter};
use crate::error::CodegenError;
use crate::ir::*;
use crate::prims::binary::BinOp;
use crate::prims::reduce::ReduceOp;
use crate::prims::unary::UnOp;

/// The online softmax's state carried across the key loop: each row's
/// maximum score `m`, its sum of `exp(x - m)` `l`, and the output
/// accumulator `acc = Σ exp(x - m)·v`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Carried {
    pub m: VarId,
    pub l: VarId,
    pub acc: VarId,
}

/// The carried state when the key loop `body` (over tile `n`) updates
/// exactly `m`, `l` and `acc` (the shape's output accumulator) as the online
/// softmax does, from `-inf`, 0 and 0 set before it (in `before`), and does
/// nothing else that outlives a step (no stores, atomics, waits or signals):
///
/// ```text
/// let mn = max(m, x.max(tn));          // either order
/// let p = exp(x - mn);
/// let alpha = exp(m - mn);
/// l = l * alpha + p.sum(tn);           // either order of each
/// acc = addmm(acc * alpha, p[.cast()], v);
/// m = mn;                              // after the other reads of m
/// ```
///
/// Two such states over disjoint keys then combine exactly: `m = max(m1,
/// m2)`, each part's `l` and `acc` scaled by `exp(mi - m)`.
pub(super) fn online_softmax(
    before: &[Stmt],
    body: &[Stmt],
    n: DimId,
    acc: VarId,
) -> Option<Carried> {
    let var = |x: &Expr| match x {
        Expr::Var(v) => Some(*v),
        _ => None,
    };
    fn bin(x: &Expr, want: BinOp) -> Option<(&Expr, &Expr)> {
        match x {
            Expr::Binary { op, lhs, rhs, .. } if *op == want => Some((&**lhs, &**rhs)),
            _ => None,
        }
    }
    let exp_of_difference = |x: &Expr| match x {
        Expr::Unary { op: UnOp::Exp, arg } => {
            bin(arg, BinOp::Sub).and_then(|(a, b)| Some((var(a)?, var(b)?)))
        }
        _ => None,
    };
    let reduced = |x: &Expr, want: ReduceOp| match x {
        Expr::Reduce { op, arg, dim, .. } if *op == want && *dim == n => var(arg),
        _ => None,
    };
    // `a * b` with `b` the variable `k`: the other factor's variable.
    let times = |x: &Expr, k: VarId| {
        let (a, b) = bin(x, BinOp::Mul)?;
        match (var(a), var(b)) {
            (Some(a), Some(b)) if b == k => Some(a),
            (Some(a), Some(b)) if a == k => Some(b),
            _ => None,
        }
    };
    let mut lets: Vec<(VarId, &Expr, usize)> = Vec::new();
    let mut assigns: Vec<(VarId, &Expr, usize)> = Vec::new();
    for (i, s) in body.iter().enumerate() {
        match s {
            Stmt::Let { var, value, .. } => lets.push((*var, value, i)),
            Stmt::Assign { var, value, .. } => assigns.push((*var, value, i)),
            _ => return None,
        }
    }
    let find = |v: VarId| lets.iter().find(|(x, ..)| *x == v).copied();
    if assigns.len() != 3 {
        return None;
    }
    // acc = addmm(acc * alpha, p, v)
    let (_, update, _) = *assigns.iter().find(|(v, ..)| *v == acc)?;
    let Expr::Addmm { acc: scaled, a, .. } = update else {
        return None;
    };
    let alpha = times(scaled, acc)?;
    let p = match &**a {
        Expr::Cast { arg, .. } => var(arg)?,
        other => var(other)?,
    };
    // alpha = exp(m - mn); p = exp(x - mn); mn = max(m, x.max(tn))
    let (_, alpha_value, alpha_at) = find(alpha)?;
    let (m, mn) = exp_of_difference(alpha_value)?;
    let (_, p_value, _) = find(p)?;
    let (x, mn_p) = exp_of_difference(p_value)?;
    let (_, mn_value, mn_at) = find(mn)?;
    let (one, other) = bin(mn_value, BinOp::Max)?;
    let max_of = |a: &Expr, b: &Expr| var(a) == Some(m) && reduced(b, ReduceOp::Max) == Some(x);
    if mn_p != mn || !(max_of(one, other) || max_of(other, one)) {
        return None;
    }
    // m = mn, after its other reads
    let (_, m_value, m_at) = *assigns.iter().find(|(v, ..)| *v == m)?;
    if var(m_value) != Some(mn) || m_at < alpha_at || m_at < mn_at {
        return None;
    }
    // l = l * alpha + p.sum(tn)
    let (l, l_value, _) = *assigns.iter().find(|(v, ..)| *v != m && *v != acc)?;
    let (one, other) = bin(l_value, BinOp::Add)?;
    let sum_of =
        |a: &Expr, b: &Expr| times(a, alpha) == Some(l) && reduced(b, ReduceOp::Sum) == Some(p);
    if !(sum_of(one, other) || sum_of(other, one)) {
        return None;
    }
    // From -inf, 0 and 0: the identity of the combination.
    let start = |v: VarId| {
        before.iter().rev().find_map(|s| match s {
            Stmt::Let { var, value, .. } | Stmt::Assign { var, value, .. } if *var == v => {
                Some(value)
            }
            _ => None,
        })
    };
    let full =
        |v: VarId, want: f64| matches!(start(v), Some(Expr::Full { value, .. }) if *value == want);
    (full(m, f64::NEG_INFINITY) && full(l, 0.0) && full(acc, 0.0)).then_some(Carried { m, l, acc })
}

/// The carried state of `e`'s key loop where the split tail applies to it,
/// else an error that says what it takes. `walks`: the kernel runs the
/// persistent forward's walk without a causal order (its blocks' tiles from
/// their index, its `p·v` deferred).
pub(super) fn split_tail(
    e: &Emitter,
    a: &AttentionShape,
    body: &[Stmt],
    key_loop: &Stmt,
    walks: bool,
) -> Result<Carried, CodegenError> {
    let refuse = || {
        config_err(
            e.k,
            e.cfg,
            "`stream_k` on an attention kernel shares the last tiles' key steps among one wave of \
             persistent blocks: it takes a forward kernel on the Hopper program with `persistent` and \
             no causal order of tiles, a key loop over the same keys for every tile (no range; an \
             `until` of scalars) that is exactly the online softmax (`m`, `l` and `acc` from -inf, 0 \
             and 0, nothing stored in it), and no `wait`, `signal` or atomic after it; drop `stream_k`",
        )
    };
    let simple = walks && a.is_forward() && a.packed.is_none() && a.outer_each.is_empty();
    let Stmt::Loop {
        body: steps,
        range: None,
        until,
        dim,
    } = key_loop
    else {
        return Err(refuse());
    };
    if !simple || *dim != a.n || until.as_ref().is_some_and(|u| !uniform(u)) {
        return Err(refuse());
    }
    let mut effects = false;
    walk_stmts(&body[a.kv_loop + 1..], &mut |s| {
        effects |= matches!(
            s,
            Stmt::Wait { .. } | Stmt::Signal { .. } | Stmt::Atomic { .. }
        );
    });
    if effects {
        return Err(refuse());
    }
    online_softmax(&body[..a.kv_loop], steps, a.n, a.acc).ok_or_else(refuse)
}

/// After a tile's last `p·v`, before the program's statements after the key
/// loop: a part of a split tile writes its state to scratch (its own slot of
/// the tile's two, `consumers` warpgroups' threads each their registers),
/// then the block's first consumer thread counts it in at the tile's
/// counter; the second part to arrive reads the first's state and combines
/// it into its own, and it alone runs the statements after the loop (opened
/// here as `if (tf_keep) {`, closed by the caller).
pub(super) fn split_meet(g: &Geo, c: Carried, consumers: usize) -> String {
    let threads = 128 * consumers;
    // Per thread: each row's m and l (two rows a 16-row block), then acc.
    let rows = 2 * g.mi;
    let floats = 2 * rows + 4 * g.mi * g.di;
    let (m, l, acc) = (c.m, c.l, c.acc);
    let bar = 2 + consumers;
    // The output accumulator's registers are the `wgmma`s': written in a
    // branch, ptxas serializes every `wgmma` of the kernel (C7520). So the
    // branches load and count, and the combination itself runs on every
    // tile, a whole one's as `acc * 1 + 0 * 0`.
    format!(
        "    // A part of a split tile: the second to arrive combines the two and stores.\n\
         \x20   bool tf_keep = true;\n\
         \x20   float tf_sa[{rows}], tf_sb[{rows}], tf_theirs[{n}];\n\
         \x20   float* tf_acc = &v{acc}[0][0][0];  // [16-row block][8 columns][4], flat\n\
         \x20   #pragma unroll\n\
         \x20   for (int tf_r = 0; tf_r < {rows}; ++tf_r) {{ tf_sa[tf_r] = 1.0f; tf_sb[tf_r] = 0.0f; }}\n\
         \x20   #pragma unroll\n\
         \x20   for (int tf_k = 0; tf_k < {n}; ++tf_k) tf_theirs[tf_k] = 0.0f;\n\
         \x20   if (tf_j1 - tf_j0 < tf_nt) {{\n\
         \x20     const int tf_ct = tid - 128;\n\
         \x20     const long long tf_slot = (tf_tile - tf_dp) * 2;\n\
         \x20     float* tf_mine = tf_partials + (tf_slot + (tf_j0 == 0 ? 0 : 1)) * {part}ll + tf_ct;\n\
         \x20     const float* tf_other = tf_partials + (tf_slot + (tf_j0 == 0 ? 1 : 0)) * {part}ll + tf_ct;\n\
         \x20     #pragma unroll\n\
         \x20     for (int tf_r = 0; tf_r < {rows}; ++tf_r) {{\n\
         \x20       tf_st_cg(tf_mine + (2 * tf_r) * {threads}, v{m}[tf_r >> 1][tf_r & 1]);\n\
         \x20       tf_st_cg(tf_mine + (2 * tf_r + 1) * {threads}, v{l}[tf_r >> 1][tf_r & 1]);\n\
         \x20     }}\n\
         \x20     #pragma unroll\n\
         \x20     for (int tf_k = 0; tf_k < {n}; ++tf_k) tf_st_cg(tf_mine + ({acc0} + tf_k) * {threads}, tf_acc[tf_k]);\n\
         \x20     __threadfence();\n\
         \x20     asm volatile(\"bar.sync {bar}, {threads};\" ::: \"memory\");  // every thread's state written\n\
         \x20     int tf_second = 0;\n\
         \x20     if (tf_ct == 0) {{\n\
         \x20       tf_second = tf_arrive_last(tf_counters + (tf_tile - tf_dp), 2u);\n\
         \x20       __threadfence();\n\
         \x20     }}\n\
         \x20     asm volatile(\"{{ .reg .pred p, q; setp.ne.s32 q, %1, 0; bar.red.or.pred p, {bar}, {threads}, q; selp.s32 %0, 1, 0, p; }}\"\n\
         \x20                  : \"=r\"(tf_second) : \"r\"(tf_second) : \"memory\");\n\
         \x20     // The same in every thread; from lane 0 so ptxas sees it so (else the\n\
         \x20     // first thread's count taints it, and every `wgmma` is serialized).\n\
         \x20     tf_keep = __shfl_sync(0xffffffffu, tf_second, 0) != 0;\n\
         \x20     if (tf_keep) {{  // the first part's state, each row's scales\n\
         \x20       #pragma unroll\n\
         \x20       for (int tf_r = 0; tf_r < {rows}; ++tf_r) {{\n\
         \x20         const float tf_m = v{m}[tf_r >> 1][tf_r & 1], tf_mo = tf_ld_cg(tf_other + (2 * tf_r) * {threads});\n\
         \x20         const float tf_mn = fmaxf(tf_m, tf_mo), tf_inf = __int_as_float(0xff800000);\n\
         \x20         tf_sa[tf_r] = tf_m == tf_inf ? 0.0f : tf_exp_diff(tf_m, tf_mn);\n\
         \x20         tf_sb[tf_r] = tf_mo == tf_inf ? 0.0f : tf_exp_diff(tf_mo, tf_mn);\n\
         \x20         v{l}[tf_r >> 1][tf_r & 1] = v{l}[tf_r >> 1][tf_r & 1] * tf_sa[tf_r] + tf_ld_cg(tf_other + (2 * tf_r + 1) * {threads}) * tf_sb[tf_r];\n\
         \x20         v{m}[tf_r >> 1][tf_r & 1] = tf_mn;\n\
         \x20       }}\n\
         \x20       #pragma unroll\n\
         \x20       for (int tf_k = 0; tf_k < {n}; ++tf_k) tf_theirs[tf_k] = tf_ld_cg(tf_other + ({acc0} + tf_k) * {threads});\n\
         \x20     }}\n\
         \x20   }}\n\
         \x20   #pragma unroll\n\
         \x20   for (int tf_k = 0; tf_k < {n}; ++tf_k) {{  // 16-row block k / {per_block}, its row k & 2 ? 1 : 0\n\
         \x20     const int tf_r = tf_k / {per_block} * 2 + ((tf_k & 3) >> 1);\n\
         \x20     tf_acc[tf_k] = tf_acc[tf_k] * tf_sa[tf_r] + tf_theirs[tf_k] * tf_sb[tf_r];\n\
         \x20   }}\n\
         \x20   if (tf_keep) {{\n",
        part = threads * floats,
        n = 4 * g.mi * g.di,
        per_block = 4 * g.di,
        acc0 = 2 * rows,
    )
}

/// Floats of scratch a split tile takes: two parts, each `consumers`
/// warpgroups' threads' state (see [`split_meet`]).
pub(super) fn floats_per_tile(g: &Geo, consumers: usize) -> usize {
    2 * 128 * consumers * (4 * g.mi + 4 * g.mi * g.di)
}
