//! Specialization on `#[constexpr]` values: every compile-time `if` (statement
//! or value) is decided and replaced by the branch taken, so the checks and the
//! lowering see straight-line code, and a tensor used only in a branch not taken
//! is neither checked nor touched.

use crate::error::CodegenError;
use crate::ir::*;
use std::borrow::Cow;

impl Kernel {
    /// Whether the body has compile-time `if`s.
    pub fn has_branches(&self) -> bool {
        let mut found = false;
        self.walk_stmts(&mut |s| {
            let values: Vec<&Expr> = match s {
                Stmt::If { .. } => {
                    found = true;
                    vec![]
                }
                Stmt::Let { value, .. }
                | Stmt::Assign { value, .. }
                | Stmt::Store { value, .. } => {
                    vec![value]
                }
                Stmt::Wait {
                    index, end, value, ..
                } => [index, value].into_iter().chain(end).collect(),
                Stmt::Signal { index, value, .. } => vec![index, value],
                Stmt::Loop { .. } => vec![],
            };
            for v in values {
                v.walk(&mut |e| found |= matches!(e, Expr::IfConst { .. }));
            }
        });
        found
    }

    /// The kernel with every compile-time `if` decided for these constexpr values
    /// (borrowed when there is nothing to decide).
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
            match s {
                Stmt::If {
                    cond,
                    then,
                    otherwise,
                    at,
                } => {
                    let taken = if self.cond(cond, at)? {
                        then
                    } else {
                        otherwise
                    };
                    out.extend(self.stmts(taken)?);
                }
                Stmt::Loop { dim, body, until } => out.push(Stmt::Loop {
                    dim: *dim,
                    body: self.stmts(body)?,
                    until: until.as_ref().map(|u| self.expr(u)).transpose()?,
                }),
                Stmt::Let { var, value, at } => out.push(Stmt::Let {
                    var: *var,
                    value: self.expr(value)?,
                    at: at.clone(),
                }),
                Stmt::Assign { var, value, at } => out.push(Stmt::Assign {
                    var: *var,
                    value: self.expr(value)?,
                    at: at.clone(),
                }),
                Stmt::Store {
                    tensor,
                    index,
                    value,
                    at,
                } => out.push(Stmt::Store {
                    tensor: *tensor,
                    index: index.clone(),
                    value: self.expr(value)?,
                    at: at.clone(),
                }),
                Stmt::Wait {
                    tensor,
                    index,
                    end,
                    value,
                    at,
                } => out.push(Stmt::Wait {
                    tensor: *tensor,
                    index: self.expr(index)?,
                    end: end.as_ref().map(|e| self.expr(e)).transpose()?,
                    value: self.expr(value)?,
                    at: at.clone(),
                }),
                Stmt::Signal {
                    tensor,
                    index,
                    value,
                    at,
                } => out.push(Stmt::Signal {
                    tensor: *tensor,
                    index: self.expr(index)?,
                    value: self.expr(value)?,
                    at: at.clone(),
                }),
            }
        }
        Ok(out)
    }

    fn expr(&self, e: &Expr) -> Result<Expr, CodegenError> {
        let boxed = |x: &Expr| self.expr(x).map(Box::new);
        Ok(match e {
            Expr::IfConst {
                cond,
                then,
                otherwise,
                at,
            } => {
                let taken = if self.cond(cond, at)? {
                    then
                } else {
                    otherwise
                };
                self.expr(taken)?
            }
            Expr::Addmm { acc, a, b, at } => Expr::Addmm {
                acc: boxed(acc)?,
                a: boxed(a)?,
                b: boxed(b)?,
                at: at.clone(),
            },
            Expr::Binary { op, lhs, rhs, at } => Expr::Binary {
                op: *op,
                lhs: boxed(lhs)?,
                rhs: boxed(rhs)?,
                at: at.clone(),
            },
            Expr::Compare { op, lhs, rhs, at } => Expr::Compare {
                op: *op,
                lhs: boxed(lhs)?,
                rhs: boxed(rhs)?,
                at: at.clone(),
            },
            Expr::Select {
                mask,
                then,
                otherwise,
                at,
            } => Expr::Select {
                mask: boxed(mask)?,
                then: boxed(then)?,
                otherwise: boxed(otherwise)?,
                at: at.clone(),
            },
            Expr::Unary { op, arg } => Expr::Unary {
                op: *op,
                arg: boxed(arg)?,
            },
            Expr::Cast { arg, dtype } => Expr::Cast {
                arg: boxed(arg)?,
                dtype: *dtype,
            },
            Expr::Reduce { op, arg, dim, at } => Expr::Reduce {
                op: *op,
                arg: boxed(arg)?,
                dim: *dim,
                at: at.clone(),
            },
            other => other.clone(),
        })
    }

    fn cond(&self, c: &Cond, at: &str) -> Result<bool, CodegenError> {
        Ok(match c {
            Cond::Cmp { op, lhs, rhs } => {
                let (l, r) = (self.value(lhs, at)?, self.value(rhs, at)?);
                match op {
                    CmpOp::Eq => l == r,
                    CmpOp::Ne => l != r,
                    CmpOp::Lt => l < r,
                    CmpOp::Le => l <= r,
                    CmpOp::Gt => l > r,
                    CmpOp::Ge => l >= r,
                }
            }
            Cond::Not(c) => !self.cond(c, at)?,
            Cond::And(a, b) => self.cond(a, at)? && self.cond(b, at)?,
            Cond::Or(a, b) => self.cond(a, at)? || self.cond(b, at)?,
            Cond::NonZero(e) => self.value(e, at)? != 0,
        })
    }

    /// The integer value of a condition's operand.
    fn value(&self, e: &Expr, at: &str) -> Result<i64, CodegenError> {
        const ONLY: &str = "the condition of a device `if` is decided at compile time: it may use \
                            `#[constexpr]` parameters, integer literals and `+ - * / % min max` only";
        Ok(match e {
            Expr::Int(v) => *v,
            Expr::Const(c) => *self.consts.get(*c).ok_or_else(|| {
                self.err(
                    at,
                    format!(
                        "the launch passed {} constexprs; the kernel has {}",
                        self.consts.len(),
                        self.k.constexprs.len()
                    ),
                )
            })?,
            Expr::Unary { op: UnOp::Neg, arg } => self.value(arg, at)?.wrapping_neg(),
            Expr::Binary { op, lhs, rhs, .. } => {
                let (l, r) = (self.value(lhs, at)?, self.value(rhs, at)?);
                match op {
                    BinOp::Add => l.wrapping_add(r),
                    BinOp::Sub => l.wrapping_sub(r),
                    BinOp::Mul => l.wrapping_mul(r),
                    BinOp::Div | BinOp::Rem if r == 0 => {
                        return Err(self.err(at, "the condition divides by zero"))
                    }
                    BinOp::Div => l.wrapping_div(r),
                    BinOp::Rem => l.wrapping_rem(r),
                    BinOp::Min => l.min(r),
                    BinOp::Max => l.max(r),
                }
            }
            _ => return Err(self.err(at, ONLY)),
        })
    }
}
