//! Decides which lowering a kernel takes, from the shape of its body.
//!
//! - GEMM: a 2-D grid `(tm, tn)`, an f32 accumulator, exactly one inner loop whose
//!   only statement is `acc = addmm(acc, a[(tm, tk)], b[(tk, tn)])`, and elementwise
//!   statements (the fused epilogue) around it.
//! - Pointwise: no `addmm`; stores of elementwise expressions, possibly inside
//!   nested sequential `tile()` loops.
//! - Attention: a grid over rows (plus batch tiles and a whole head dimension),
//!   one inner loop over key tiles holding two `addmm`s: scores `q·kᵀ` from
//!   tile loads, then `acc = addmm(…, p, v[…])` with `p` computed from the
//!   scores (see [`AttentionShape`]).

use crate::error::CodegenError;
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    Gemm(GemmShape),
    Attention(AttentionShape),
    Pointwise,
    /// No matmul, and tiles reduced along a dimension (`x.sum(tn)`): rows of the
    /// grid dimension, columns walked in `tile()` loops.
    Rows,
}

fn unsupported(k: &Kernel, at: &str, message: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported {
        kernel: k.name.clone(),
        at: at.to_string(),
        message: message.into(),
    }
}

fn has_addmm(e: &Expr) -> Option<&str> {
    let mut found = None;
    e.walk(&mut |x| {
        if let Expr::Addmm { at, .. } = x {
            found.get_or_insert(at.as_str());
        }
    });
    found
}

fn stmt_addmm(s: &Stmt) -> Option<&str> {
    match s {
        Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Store { value, .. } => {
            has_addmm(value)
        }
        Stmt::Wait {
            index, end, value, ..
        } => has_addmm(index)
            .or_else(|| has_addmm(value))
            .or_else(|| end.as_ref().and_then(has_addmm)),
        Stmt::Signal { index, value, .. } => has_addmm(index).or_else(|| has_addmm(value)),
        Stmt::Loop { body, .. } => body.iter().find_map(stmt_addmm),
        Stmt::If {
            then, otherwise, ..
        } => then.iter().chain(otherwise).find_map(stmt_addmm),
    }
}

/// Classifies `k`; an `addmm` outside the supported form is an error naming it.
pub fn classify(k: &Kernel) -> Result<Shape, CodegenError> {
    let loops: Vec<usize> = k
        .body
        .iter()
        .enumerate()
        .filter(|(_, s)| stmt_addmm(s).is_some())
        .map(|(i, _)| i)
        .collect();
    if loops.is_empty() {
        let mut reduces = false;
        k.walk_stmts(&mut |s| {
            if let Stmt::Let { value, .. }
            | Stmt::Assign { value, .. }
            | Stmt::Store { value, .. } = s
            {
                value.walk(&mut |x| reduces |= matches!(x, Expr::Reduce { .. }));
            }
        });
        return Ok(if reduces {
            Shape::Rows
        } else {
            Shape::Pointwise
        });
    }
    const FORM: &str =
        "write the matmul as `acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);`, the only statement \
                        of a `for tk in tile(k)` loop directly inside the grid loop";
    let i = loops[0];
    let first_at = stmt_addmm(&k.body[i]).unwrap_or("addmm").to_string();
    if let Some(att) = attention(k, i)? {
        return Ok(Shape::Attention(att));
    }
    if loops.len() > 1 {
        return Err(unsupported(
            k,
            stmt_addmm(&k.body[loops[1]]).unwrap_or("addmm"),
            "a kernel may have one matmul loop for now; fuse the rest into its epilogue",
        ));
    }
    let Stmt::Loop {
        dim: kd,
        body,
        until: None,
    } = &k.body[i]
    else {
        return Err(unsupported(k, &first_at, FORM));
    };
    let [Stmt::Assign { var, value, at }] = body.as_slice() else {
        return Err(unsupported(k, &first_at, FORM));
    };
    let Expr::Addmm { acc, a, b, .. } = value else {
        return Err(unsupported(k, at, FORM));
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
        return Err(unsupported(k, at, FORM));
    };
    if ia.len() == 2 && ib.len() == 2 && ia[1] == *kd && ib[1] == *kd {
        return Err(unsupported(
            k,
            at,
            format!(
                "the matmul lowering reads B as `{b}[(tk, tn)]` (K rows); a K-major B (`{b}[(tn, tk)]`, \
                 i.e. `a·bᵀ`) is not supported by it yet: pass the operand stored as `[k, n]`",
                b = k.tensors[*tb].name
            ),
        ));
    }
    if acc_var != var || ia.len() != 2 || ib.len() != 2 || ia[1] != *kd || ib[0] != *kd {
        return Err(unsupported(k, at, FORM));
    }
    let (m, n) = (ia[0], ib[1]);
    let mut grid = k.grid.clone();
    grid.sort_unstable();
    let mut mn = vec![m, n];
    mn.sort_unstable();
    if grid != mn {
        return Err(unsupported(
            k,
            at,
            format!(
                "the grid loop must tile exactly the matmul's output dimensions (`{}`, `{}`)",
                k.dims[m].name, k.dims[n].name
            ),
        ));
    }
    for s in &k.body {
        match s {
            Stmt::Loop { .. } if !std::ptr::eq(s, &k.body[i]) => {
                return Err(unsupported(
                    k,
                    &first_at,
                    "a matmul kernel may contain only its K loop; other inner loops are not supported yet",
                ));
            }
            Stmt::Store { index, at, .. } => {
                let mut ix = index.clone();
                ix.sort_unstable();
                if ix != mn {
                    return Err(unsupported(
                        k,
                        at,
                        format!(
                            "in a matmul kernel, stores write the output tile: index them by `{}` and `{}`",
                            k.dims[m].name, k.dims[n].name
                        ),
                    ));
                }
            }
            _ => {}
        }
    }
    Ok(Shape::Gemm(GemmShape {
        m,
        n,
        k: *kd,
        acc: *var,
        a: *ta,
        b: *tb,
        k_loop: i,
    }))
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

/// The attention form (see [`AttentionShape`]) when the loop at `body[i]` holds two
/// `addmm`s; `None` when it holds one (a plain matmul, or an error there); an error
/// naming the part that breaks the form otherwise.
fn attention(k: &Kernel, i: usize) -> Result<Option<AttentionShape>, CodegenError> {
    let Stmt::Loop { dim: n, body, .. } = &k.body[i] else {
        return Ok(None);
    };
    let sites: Vec<usize> = (0..body.len())
        .filter(|&j| stmt_addmm(&body[j]).is_some())
        .collect();
    let count: usize = body
        .iter()
        .map(|s| match s {
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => addmms(value),
            _ => 0,
        })
        .sum();
    if count < 2 {
        return Ok(None);
    }
    let first_at = stmt_addmm(&body[sites[0]]).unwrap_or("addmm");
    const FORM: &str = "a loop with two matmuls is lowered as attention: `let s = addmm(zeros([.., tm, tn]), \
        q[(.., tm, td)], k[(.., tn, td)])` (scaled, masked and reduced as you like), then \
        `acc = addmm(acc * alpha, p.cast::<bf16>(), v[(.., tn, td)])`, inside `for tn in tile(n)`, with \
        `td` a `whole(d)` tile of the grid";
    if count != 2 || sites.len() != 2 {
        return Err(unsupported(k, first_at, FORM));
    }
    for s in body {
        if let Stmt::Loop { .. } | Stmt::Store { .. } | Stmt::Wait { .. } | Stmt::Signal { .. } = s
        {
            return Err(unsupported(
                k,
                first_at,
                "the key loop of an attention kernel holds `let`s and assignments only: no nested loops, stores, waits or signals",
            ));
        }
    }
    let (Stmt::Let { value: sv, .. } | Stmt::Assign { value: sv, .. }) = &body[sites[0]] else {
        return Err(unsupported(k, first_at, FORM));
    };
    let Some(Expr::Addmm {
        a: qa,
        b: kb,
        at: s_at,
        ..
    }) = find_addmm(sv)
    else {
        return Err(unsupported(k, first_at, FORM));
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
        return Err(unsupported(
            k,
            s_at,
            "the scores of an attention kernel are `addmm(…, q[(.., tm, td)], k[(.., tn, td)])`: both operands tile loads",
        ));
    };
    let Stmt::Assign {
        var: acc,
        value: Expr::Addmm {
            b: vb, at: o_at, ..
        },
        ..
    } = &body[sites[1]]
    else {
        return Err(unsupported(
            k,
            stmt_addmm(&body[sites[1]]).unwrap_or(first_at),
            "the second matmul of an attention kernel updates its accumulator: `acc = addmm(acc * alpha, p, v[(.., tn, td)])`",
        ));
    };
    let Expr::Load {
        tensor: v,
        index: vi,
        ..
    } = vb.as_ref()
    else {
        return Err(unsupported(
            k,
            o_at,
            "the third operand of `acc = addmm(…, p, v[(.., tn, td)])` is a tile load",
        ));
    };
    let (Some((&d, qb)), Some((&kd, kbatch)), Some((&vd, vbatch))) =
        (qi.split_last(), ki.split_last(), vi.split_last())
    else {
        return Err(unsupported(k, s_at, FORM));
    };
    let (Some((&m, qb)), Some((&kn, kbatch)), Some((&vn, vbatch))) =
        (qb.split_last(), kbatch.split_last(), vbatch.split_last())
    else {
        return Err(unsupported(k, s_at, FORM));
    };
    if kd != d || vd != d || kn != *n || vn != *n || kbatch != qb || vbatch != qb {
        return Err(unsupported(
            k,
            s_at,
            format!(
                "index the operands as `q[(.., tm, td)]`, `k[(.., tn, td)]` and `v[(.., tn, td)]`, the same batch \
                 tiles first and the head dimension last (its elements are contiguous); got `{}`, `{}` and `{}`",
                k.tensors[*q].name, k.tensors[*kt].name, k.tensors[*v].name
            ),
        ));
    }
    if !k.dims[d].whole || !k.grid.contains(&d) || !k.grid.contains(&m) {
        return Err(unsupported(
            k,
            s_at,
            format!(
                "the head dimension `{}` must be a `whole(…)` tile of the grid loop, e.g. \
                 `for (tb, tm, td) in tile([b, m, whole(d)])`, so a program holds whole rows of `q`",
                k.dims[d].name
            ),
        ));
    }
    let mut grid: Vec<DimId> = k.grid.clone();
    grid.retain(|x| *x != m && *x != d);
    let mut want = qb.to_vec();
    want.sort_unstable();
    grid.sort_unstable();
    if grid != want {
        return Err(unsupported(
            k,
            s_at,
            "the grid of an attention kernel tiles the batch tiles, the rows and the whole head dimension, nothing else",
        ));
    }
    Ok(Some(AttentionShape {
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
    }))
}
