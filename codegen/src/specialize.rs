//! Specialization on `#[constexpr]` values: every `if` (statement or value)
//! whose condition is known at compile time is decided and replaced by the
//! branch taken, so the checks and the lowering see straight-line code, and a
//! tensor used only in a branch not taken is neither checked nor touched.

use crate::error::CodegenError;
use crate::ir::*;
use std::borrow::Cow;

impl Kernel {
    /// Whether the body has `if`s (statements or values) that specialization
    /// may decide.
    pub fn has_branches(&self) -> bool {
        let mut found = false;
        self.walk_stmts(&mut |s| found |= matches!(s, Stmt::If { .. }));
        self.walk_exprs(&mut |e| found |= matches!(e, Expr::IfConst { .. }));
        found
    }

    /// The kernel with every `if` whose condition uses only `#[constexpr]`
    /// values and literals decided for these values (borrowed when there is
    /// nothing to decide). An `if` on runtime scalars stays, for the program
    /// to take at run time.
    pub fn specialize(&self, consts: &[i64]) -> Result<Cow<'_, Kernel>, CodegenError> {
        if !self.has_branches() {
            return Ok(Cow::Borrowed(self));
        }
        let s = Specializer { k: self, consts };
        let body = s.stmts(&self.body)?;
        Ok(Cow::Owned(Kernel {
            body,
            ..self.clone()
        }))
    }
}

struct Specializer<'a> {
    k: &'a Kernel,
    consts: &'a [i64],
}

impl Specializer<'_> {
    fn err(&self, at: &str, message: impl Into<String>) -> CodegenError {
        CodegenError::Type {
            kernel: self.k.name.clone(),
            at: at.to_string(),
            message: message.into(),
        }
    }

    fn stmts(&self, stmts: &[Stmt]) -> Result<Vec<Stmt>, CodegenError> {
        let mut out = Vec::with_capacity(stmts.len());
        for s in stmts {
            if let Stmt::If {
                cond,
                then,
                otherwise,
                at,
            } = s
            {
                if let Some(taken) = self.cond(cond, at)? {
                    out.extend(self.stmts(if taken { then } else { otherwise })?);
                    continue;
                }
            }
            out.push(s.try_map(&mut |e| self.expr(e), &mut |b| self.stmts(b))?);
        }
        Ok(out)
    }

    fn expr(&self, e: &Expr) -> Result<Expr, CodegenError> {
        if let Expr::IfConst {
            cond,
            then,
            otherwise,
            at,
        } = e
        {
            if let Some(taken) = self.cond(cond, at)? {
                return self.expr(if taken { then } else { otherwise });
            }
        }
        e.try_map_children(&mut |x| self.expr(x))
    }

    /// The condition's value, or `None` when it reads runtime values.
    fn cond(&self, c: &Cond, at: &str) -> Result<Option<bool>, CodegenError> {
        Ok(match c {
            Cond::Cmp { op, lhs, rhs } => match (self.value(lhs, at)?, self.value(rhs, at)?) {
                (Some(l), Some(r)) => Some(op.eval(l, r)),
                _ => None,
            },
            Cond::Not(c) => self.cond(c, at)?.map(|v| !v),
            Cond::And(a, b) => match (self.cond(a, at)?, self.cond(b, at)?) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            },
            Cond::Or(a, b) => match (self.cond(a, at)?, self.cond(b, at)?) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            },
            Cond::NonZero(e) => self.value(e, at)?.map(|v| v != 0),
        })
    }

    /// The integer value of a condition's operand when it is made of
    /// `#[constexpr]` values and literals; `None` when it reads anything else.
    fn value(&self, e: &Expr, at: &str) -> Result<Option<i64>, CodegenError> {
        Ok(match e {
            Expr::Int(v) => Some(*v),
            Expr::Const(c) => Some(*self.consts.get(*c).ok_or_else(|| {
                self.err(
                    at,
                    format!(
                        "the launch passed {} constexprs; the kernel has {}",
                        self.consts.len(),
                        self.k.constexprs.len()
                    ),
                )
            })?),
            Expr::Unary { op: UnOp::Neg, arg } => self.value(arg, at)?.map(i64::wrapping_neg),
            Expr::Binary { op, lhs, rhs, .. } => {
                let (Some(l), Some(r)) = (self.value(lhs, at)?, self.value(rhs, at)?) else {
                    return Ok(None);
                };
                if matches!(op, BinOp::Div | BinOp::Rem) && r == 0 {
                    return Err(self.err(at, "the condition divides by zero"));
                }
                match (op.entry().cpu_int)(l, r, crate::dtype::DType::I64) {
                    Some(v) => Some(crate::prims::wrap_int(crate::dtype::DType::I64, v)),
                    None => return Ok(None),
                }
            }
            _ => None,
        })
    }
}
