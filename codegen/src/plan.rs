//! Decides which lowering a kernel takes, from the shape of its body.
//!
//! - GEMM: a 2-D grid `(tm, tn)`, an f32 accumulator, exactly one inner loop whose
//!   only statement is `acc = addmm(acc, a[(tm, tk)], b[(tk, tn)])`, and elementwise
//!   statements (the fused epilogue) around it.
//! - Pointwise: no `addmm`; stores of elementwise expressions, possibly inside
//!   nested sequential `tile()` loops.

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

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    Gemm(GemmShape),
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
    if loops.len() > 1 {
        return Err(unsupported(
            k,
            stmt_addmm(&k.body[loops[1]]).unwrap_or("addmm"),
            "a kernel may have one matmul loop for now; fuse the rest into its epilogue",
        ));
    }
    let Stmt::Loop { dim: kd, body } = &k.body[i] else {
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
