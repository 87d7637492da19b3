//! Turns the body of the outermost `tile()` loop (the device code) into tile IR.
//! Every construct the DSL does not have is an error spanned on the code that used it.

use proc_macro2::TokenStream;
use quote::ToTokens;
use std::collections::HashMap;
use syn::{BinOp as SynBin, Expr as SynExpr, Lit, Pat, Stmt as SynStmt, UnOp as SynUn};
use tilefuse_codegen::dtype::DType;
use tilefuse_codegen::ir::*;

const STATEMENTS: &str = "device code supports `let`, assignment (`=`, `+=`, …), tile stores `t[(tm, tn)] = …`, \
                          `wait(flags, index, value);`, `signal(counters, index, value);`, nested `for t in tile(extent) { … }` loops and \
                          `if` on `#[constexpr]` parameters";
const FUNCTIONS: &str =
    "addmm, zeros, full, select, wait, signal, min, max, exp, log, sqrt, rsqrt, abs, relu, relu_grad, gelu, gelu_grad, \
                         gelu_tanh, silu, sigmoid, tanh (and the methods .cast::<T>(), .sum(t), .max(t), .min(t), and on tiles .begin(), .end(), .size(), .index())";

/// A name visible in device code.
#[derive(Clone, Copy, Debug)]
enum Binding {
    Tile(DimId),
    Var(VarId),
}

/// Builds a [`Kernel`] from the loop, collecting the host values it captures.
pub struct Builder {
    pub kernel: Kernel,
    /// Host expression of each scalar, in `ScalarId` order.
    pub scalar_exprs: Vec<TokenStream>,
    /// Host expression of each tensor argument (its name), in `TensorId` order.
    pub tensor_idents: Vec<syn::Ident>,
    scopes: Vec<HashMap<String, Binding>>,
    /// Constexpr parameter names.
    consts: Vec<String>,
    /// Declared dtypes of tensors known from the signature and host `let`s.
    declared: HashMap<String, DType>,
}

fn err(tokens: impl ToTokens, msg: impl std::fmt::Display) -> syn::Error {
    syn::Error::new_spanned(tokens, msg)
}

/// The source text of a piece of syntax, for messages in the IR.
fn src(tokens: impl ToTokens) -> String {
    // The token printer breaks long streams over lines: one line, for messages
    // and for the `// ...` comments of the generated source.
    let s = tokens
        .to_token_stream()
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    // `a [(tm , tk)]` -> `a[(tm, tk)]`: undo the token printer's spacing a little.
    s.replace(" ,", ",")
        .replace(" [", "[")
        .replace("( ", "(")
        .replace(" )", ")")
        .replace(" . ", ".")
        .replace(" (", "(")
        .replace(" ;", ";")
        .replace(",)", ")")
}

impl Builder {
    pub fn new(name: &str, consts: Vec<String>, declared: HashMap<String, DType>) -> Builder {
        Builder {
            kernel: Kernel {
                name: name.to_string(),
                tensors: Vec::new(),
                scalars: Vec::new(),
                constexprs: consts
                    .iter()
                    .map(|c| ConstParam { name: c.clone() })
                    .collect(),
                dims: Vec::new(),
                grid: Vec::new(),
                grid_start: Vec::new(),
                vars: Vec::new(),
                body: Vec::new(),
            },
            scalar_exprs: Vec::new(),
            tensor_idents: Vec::new(),
            scopes: vec![HashMap::new()],
            consts,
            declared,
        }
    }

    /// Builds the grid loop `for pat in tile(extents) { body }`.
    pub fn grid_loop(&mut self, fl: &syn::ExprForLoop) -> syn::Result<()> {
        // `tile([...]).starting_at([...])`: the grid's first tiles (grid loop only).
        let (iter, start) = match fl.expr.as_ref() {
            SynExpr::MethodCall(m) => {
                if m.method != "starting_at" || m.args.len() != 1 {
                    return Err(err(
                        &m.method,
                        "the grid loop takes `tile([...])` or `tile([...]).starting_at([...])` (one start index per tile dimension)",
                    ));
                }
                (m.receiver.as_ref(), Some(&m.args[0]))
            }
            other => (other, None),
        };
        let dims = self.tile_loop_dims(&fl.pat, iter)?;
        if let Some(start) = start {
            let starts: Vec<&SynExpr> = match start {
                SynExpr::Array(a) => a.elems.iter().collect(),
                SynExpr::Tuple(t) => t.elems.iter().collect(),
                other => vec![other],
            };
            if starts.len() != dims.len() {
                return Err(err(
                    start,
                    format!(
                        "`starting_at` needs one index per tile dimension: the grid has {}, this gives {}",
                        dims.len(),
                        starts.len()
                    ),
                ));
            }
            self.kernel.grid_start = starts.into_iter().map(|e| self.host_scalar(e)).collect();
        }
        self.kernel.grid = dims;
        self.kernel.body = self.block(&fl.body.stmts)?;
        Ok(())
    }

    /// `tile(x)` / `tile([x, y])` bound to `t` / `(t, u)`: new dimensions, in scope.
    fn tile_loop_dims(&mut self, pat: &Pat, iter: &SynExpr) -> syn::Result<Vec<DimId>> {
        let SynExpr::Call(call) = iter else {
            return Err(err(
                iter,
                "tile loops iterate over `tile(extent)` or `tile([extent0, extent1])`",
            ));
        };
        if !is_fn(&call.func, "tile") || call.args.len() != 1 {
            return Err(err(
                iter,
                "tile loops iterate over `tile(extent)` or `tile([extent0, extent1])`",
            ));
        }
        let arg = &call.args[0];
        let extents: Vec<&SynExpr> = match arg {
            SynExpr::Array(a) => a.elems.iter().collect(),
            SynExpr::Tuple(t) => t.elems.iter().collect(),
            other => vec![other],
        };
        let names: Vec<&syn::Ident> = match pat {
            Pat::Ident(p) => vec![&p.ident],
            Pat::Tuple(t) => t
                .elems
                .iter()
                .map(|p| match p {
                    Pat::Ident(i) => Ok(&i.ident),
                    other => Err(err(
                        other,
                        "bind each tile to a name, e.g. `for (tm, tn) in tile([m, n])`",
                    )),
                })
                .collect::<syn::Result<_>>()?,
            Pat::Slice(s) => s
                .elems
                .iter()
                .map(|p| match p {
                    Pat::Ident(i) => Ok(&i.ident),
                    other => Err(err(
                        other,
                        "bind each tile to a name, e.g. `for [tm, tn] in tile([m, n])`",
                    )),
                })
                .collect::<syn::Result<_>>()?,
            other => {
                return Err(err(
                    other,
                    "bind each tile to a name, e.g. `for (tm, tn) in tile([m, n])`",
                ))
            }
        };
        if names.len() != extents.len() {
            return Err(err(
                pat,
                format!(
                    "`tile` is given {} extent(s) but the loop binds {} tile(s)",
                    extents.len(),
                    names.len()
                ),
            ));
        }
        let mut dims = Vec::new();
        for (name, ext) in names.into_iter().zip(extents) {
            // `whole(d)`: one tile covering the extent (a head dimension).
            let (ext, whole) = match ext {
                SynExpr::Call(c) if is_fn(&c.func, "whole") => {
                    if c.args.len() != 1 {
                        return Err(err(c, "`whole(extent)` takes one extent"));
                    }
                    (&c.args[0], true)
                }
                other => (other, false),
            };
            let extent = self.host_scalar(ext);
            let d = self.kernel.dims.len();
            self.kernel.dims.push(TileDim {
                name: name.to_string(),
                extent,
                whole,
            });
            self.scopes
                .last_mut()
                .map(|s| s.insert(name.to_string(), Binding::Tile(d)));
            dims.push(d);
        }
        Ok(dims)
    }

    /// A host expression passed to the kernel by value, deduplicated by its text.
    fn host_scalar(&mut self, e: &SynExpr) -> ScalarId {
        let text = src(e);
        if let Some(i) = self.kernel.scalars.iter().position(|s| s.name == text) {
            return i;
        }
        self.kernel.scalars.push(ScalarParam { name: text });
        self.scalar_exprs.push(e.to_token_stream());
        self.kernel.scalars.len() - 1
    }

    fn lookup(&self, name: &str) -> Option<Binding> {
        self.scopes.iter().rev().find_map(|s| s.get(name).copied())
    }

    fn tensor(
        &mut self,
        ident: &syn::Ident,
        rank: usize,
        at: impl ToTokens,
    ) -> syn::Result<TensorId> {
        let name = ident.to_string();
        if let Some(b) = self.lookup(&name) {
            return Err(err(
                at,
                format!(
                    "`{name}` is a {} of the device code, not a tensor; only tensors from the host code can be indexed",
                    if matches!(b, Binding::Tile(_)) { "tile" } else { "local value" }
                ),
            ));
        }
        if let Some(i) = self.kernel.tensors.iter().position(|t| t.name == name) {
            let have = self.kernel.tensors[i].rank;
            if have != rank {
                return Err(err(
                    at,
                    format!("`{name}` was indexed with {have} tile(s) before and with {rank} here"),
                ));
            }
            return Ok(i);
        }
        self.kernel.tensors.push(TensorParam {
            name: name.clone(),
            rank,
            declared: self.declared.get(&name).copied(),
        });
        self.tensor_idents.push(ident.clone());
        Ok(self.kernel.tensors.len() - 1)
    }

    fn block(&mut self, stmts: &[SynStmt]) -> syn::Result<Vec<Stmt>> {
        self.scopes.push(HashMap::new());
        let mut out = Vec::new();
        for s in stmts {
            self.stmt(s, &mut out)?;
        }
        self.scopes.pop();
        Ok(out)
    }

    fn stmt(&mut self, s: &SynStmt, out: &mut Vec<Stmt>) -> syn::Result<()> {
        match s {
            SynStmt::Local(local) => {
                let (ident, mutable) = match &local.pat {
                    Pat::Ident(p) => (&p.ident, p.mutability.is_some()),
                    Pat::Type(t) => match t.pat.as_ref() {
                        Pat::Ident(p) => (&p.ident, p.mutability.is_some()),
                        other => return Err(err(other, "device `let` binds a single name")),
                    },
                    other => return Err(err(other, "device `let` binds a single name")),
                };
                let Some(init) = &local.init else {
                    return Err(err(local, "device `let` needs a value: `let x = …;`"));
                };
                if let Some((_, e)) = &init.diverge {
                    return Err(err(e, "`let … else` is not supported in device code"));
                }
                let value = self.expr(&init.expr)?;
                let var = self.kernel.vars.len();
                self.kernel.vars.push(Var {
                    name: ident.to_string(),
                    mutable,
                });
                out.push(Stmt::Let {
                    var,
                    value,
                    at: src(local),
                });
                self.scopes
                    .last_mut()
                    .map(|sc| sc.insert(ident.to_string(), Binding::Var(var)));
                Ok(())
            }
            SynStmt::Expr(e, _) => self.expr_stmt(e, out),
            SynStmt::Item(i) => Err(err(
                i,
                "items cannot be declared inside device code; move them out of the kernel",
            )),
            SynStmt::Macro(m) => Err(err(
                m,
                format!("macros cannot be used in device code; {STATEMENTS}"),
            )),
        }
    }

    fn expr_stmt(&mut self, e: &SynExpr, out: &mut Vec<Stmt>) -> syn::Result<()> {
        match e {
            SynExpr::Assign(a) => {
                let value = self.expr(&a.right)?;
                self.assign(&a.left, value, e, out)
            }
            SynExpr::Binary(b) if compound_op(&b.op).is_some() => {
                let op = compound_op(&b.op).unwrap_or(BinOp::Add);
                let lhs = self.expr(&b.left)?;
                let rhs = self.expr(&b.right)?;
                let value = Expr::Binary {
                    op,
                    lhs: Box::new(lhs),
                    rhs: Box::new(rhs),
                    at: src(e),
                };
                self.assign(&b.left, value, e, out)
            }
            SynExpr::Call(c) if is_fn(&c.func, "wait") => {
                if c.args.len() != 3 {
                    return Err(err(
                        c,
                        "`wait` takes three arguments: `wait(flags, index, value)`",
                    ));
                }
                let SynExpr::Path(p) = &c.args[0] else {
                    return Err(err(
                        &c.args[0],
                        "the first argument of `wait` is a flag tensor, by name",
                    ));
                };
                let Some(ident) = p.path.get_ident() else {
                    return Err(err(
                        &c.args[0],
                        "the first argument of `wait` is a flag tensor, by name",
                    ));
                };
                let tensor = self.tensor(ident, 1, &c.args[0])?;
                let (index, end) = self.wait_index(&c.args[1])?;
                let value = self.expr(&c.args[2])?;
                out.push(Stmt::Wait {
                    tensor,
                    index,
                    end,
                    value,
                    at: src(c),
                });
                Ok(())
            }
            SynExpr::Call(c) if is_fn(&c.func, "signal") => {
                if c.args.len() != 3 {
                    return Err(err(
                        c,
                        "`signal` takes three arguments: `signal(counters, index, value)`",
                    ));
                }
                let tensor = match &c.args[0] {
                    SynExpr::Path(p) => p.path.get_ident(),
                    _ => None,
                }
                .ok_or_else(|| {
                    err(
                        &c.args[0],
                        "the first argument of `signal` is a counter tensor, by name",
                    )
                })?;
                let tensor = self.tensor(tensor, 1, &c.args[0])?;
                let index = self.expr(&c.args[1])?;
                let value = self.expr(&c.args[2])?;
                out.push(Stmt::Signal {
                    tensor,
                    index,
                    value,
                    at: src(c),
                });
                Ok(())
            }
            SynExpr::ForLoop(fl) => {
                // `tile(n).until(bound)`: the tiles that begin before `bound`.
                let (iter, until) = match fl.expr.as_ref() {
                    SynExpr::MethodCall(m) if m.method == "until" => {
                        if m.args.len() != 1 {
                            return Err(err(
                                &m.method,
                                "`tile(extent).until(bound)` takes one bound, e.g. `.until(tm.end())`",
                            ));
                        }
                        (m.receiver.as_ref(), Some(self.expr(&m.args[0])?))
                    }
                    SynExpr::MethodCall(m) => {
                        return Err(err(
                            &m.method,
                            "an inner tile loop iterates over `tile(extent)` or `tile(extent).until(bound)`",
                        ))
                    }
                    other => (other, None),
                };
                self.scopes.push(HashMap::new());
                let dims = self.tile_loop_dims(&fl.pat, iter)?;
                if until.is_some() && dims.len() != 1 {
                    return Err(err(
                        &fl.pat,
                        "`.until(bound)` bounds a loop over one tile: `for tn in tile(n).until(bound)`",
                    ));
                }
                let mut body = self.block(&fl.body.stmts)?;
                self.scopes.pop();
                let mut until = until;
                for &d in dims.iter().rev() {
                    body = vec![Stmt::Loop {
                        dim: d,
                        body,
                        until: until.take(),
                    }];
                }
                out.extend(body);
                Ok(())
            }
            SynExpr::Block(b) => {
                let inner = self.block(&b.block.stmts)?;
                out.extend(inner);
                Ok(())
            }
            SynExpr::While(_) | SynExpr::Loop(_) => Err(err(
                e,
                "device code loops only over tiles: write `for t in tile(extent) { … }`",
            )),
            SynExpr::If(i) => {
                let stmt = self.if_stmt(i)?;
                out.push(stmt);
                Ok(())
            }
            SynExpr::Match(_) => Err(err(
                e,
                "device code has no `match`; branch on `#[constexpr]` parameters with `if`, and \
                 make per-element choices with `min`/`max`/`relu`",
            )),
            other => Err(err(
                other,
                format!("this expression does nothing here; {STATEMENTS}"),
            )),
        }
    }

    /// `if cond { … } else if … { … } else { … }` as a statement.
    fn if_stmt(&mut self, i: &syn::ExprIf) -> syn::Result<Stmt> {
        let cond = self.cond(&i.cond)?;
        let then = self.block(&i.then_branch.stmts)?;
        let otherwise = match &i.else_branch {
            None => Vec::new(),
            Some((_, e)) => match e.as_ref() {
                SynExpr::If(inner) => vec![self.if_stmt(inner)?],
                SynExpr::Block(b) => self.block(&b.block.stmts)?,
                other => return Err(err(other, "expected a block or `else if` here")),
            },
        };
        Ok(Stmt::If {
            cond,
            then,
            otherwise,
            at: src(&i.cond),
        })
    }

    /// `if cond { a } else { b }` as a value: both branches are one expression.
    fn if_expr(&mut self, i: &syn::ExprIf) -> syn::Result<Expr> {
        let cond = self.cond(&i.cond)?;
        let then = self.branch_value(&i.then_branch, i)?;
        let Some((_, e)) = &i.else_branch else {
            return Err(err(
                i,
                "an `if` used as a value needs an `else` branch: `if C { a } else { b }`",
            ));
        };
        let otherwise = match e.as_ref() {
            SynExpr::If(inner) => self.if_expr(inner)?,
            SynExpr::Block(b) => self.branch_value(&b.block, i)?,
            other => return Err(err(other, "expected a block or `else if` here")),
        };
        Ok(Expr::IfConst {
            cond: Box::new(cond),
            then: Box::new(then),
            otherwise: Box::new(otherwise),
            at: src(&i.cond),
        })
    }

    fn branch_value(&mut self, b: &syn::Block, whole: &syn::ExprIf) -> syn::Result<Expr> {
        match b.stmts.as_slice() {
            [SynStmt::Expr(e, None)] => self.expr(e),
            _ => Err(err(
                whole,
                "each branch of an `if` used as a value is one expression, e.g. `if ACT == 1 { relu(y) } else { y }`",
            )),
        }
    }

    /// The condition of a device `if`: decided when the kernel is specialized,
    /// so it may use only `#[constexpr]` parameters and integer literals.
    fn cond(&mut self, e: &SynExpr) -> syn::Result<Cond> {
        Ok(match e {
            SynExpr::Paren(p) => self.cond(&p.expr)?,
            SynExpr::Group(g) => self.cond(&g.expr)?,
            SynExpr::Unary(u) if matches!(u.op, SynUn::Not(_)) => {
                Cond::Not(Box::new(self.cond(&u.expr)?))
            }
            SynExpr::Binary(b) => {
                let cmp = match b.op {
                    SynBin::Eq(_) => Some(CmpOp::Eq),
                    SynBin::Ne(_) => Some(CmpOp::Ne),
                    SynBin::Lt(_) => Some(CmpOp::Lt),
                    SynBin::Le(_) => Some(CmpOp::Le),
                    SynBin::Gt(_) => Some(CmpOp::Gt),
                    SynBin::Ge(_) => Some(CmpOp::Ge),
                    _ => None,
                };
                match (cmp, &b.op) {
                    (Some(op), _) => Cond::Cmp {
                        op,
                        lhs: self.const_value(&b.left)?,
                        rhs: self.const_value(&b.right)?,
                    },
                    (None, SynBin::And(_)) => Cond::And(
                        Box::new(self.cond(&b.left)?),
                        Box::new(self.cond(&b.right)?),
                    ),
                    (None, SynBin::Or(_)) => Cond::Or(
                        Box::new(self.cond(&b.left)?),
                        Box::new(self.cond(&b.right)?),
                    ),
                    _ => Cond::NonZero(self.const_value(e)?),
                }
            }
            other => Cond::NonZero(self.const_value(other)?),
        })
    }

    /// An integer expression of `#[constexpr]` parameters and literals.
    fn const_value(&self, e: &SynExpr) -> syn::Result<Expr> {
        const ONLY: &str =
            "device `if`s are decided when the kernel is compiled: their conditions \
                            use `#[constexpr]` parameters and integer literals only \
                            (per-element choices use `min`/`max`/`relu`)";
        Ok(match e {
            SynExpr::Paren(p) => self.const_value(&p.expr)?,
            SynExpr::Group(g) => self.const_value(&g.expr)?,
            SynExpr::Lit(l) => match &l.lit {
                Lit::Int(i) => Expr::Int(i.base10_parse()?),
                Lit::Bool(b) => Expr::Int(i64::from(b.value)),
                other => return Err(err(other, ONLY)),
            },
            SynExpr::Path(p) => {
                let name = p
                    .path
                    .get_ident()
                    .map(|i| i.to_string())
                    .unwrap_or_default();
                match self.consts.iter().position(|c| *c == name) {
                    Some(c) => Expr::Const(c),
                    None => {
                        return Err(err(
                            p,
                            format!("`{name}` is not a `#[constexpr]` parameter; {ONLY}"),
                        ))
                    }
                }
            }
            SynExpr::Unary(u) if matches!(u.op, SynUn::Neg(_)) => Expr::Unary {
                op: UnOp::Neg,
                arg: Box::new(self.const_value(&u.expr)?),
            },
            SynExpr::Binary(b) => {
                let op = match b.op {
                    SynBin::Add(_) => BinOp::Add,
                    SynBin::Sub(_) => BinOp::Sub,
                    SynBin::Mul(_) => BinOp::Mul,
                    SynBin::Div(_) => BinOp::Div,
                    SynBin::Rem(_) => BinOp::Rem,
                    _ => return Err(err(b, ONLY)),
                };
                Expr::Binary {
                    op,
                    lhs: Box::new(self.const_value(&b.left)?),
                    rhs: Box::new(self.const_value(&b.right)?),
                    at: src(b),
                }
            }
            other => return Err(err(other, ONLY)),
        })
    }

    fn assign(
        &mut self,
        lhs: &SynExpr,
        value: Expr,
        whole: &SynExpr,
        out: &mut Vec<Stmt>,
    ) -> syn::Result<()> {
        match lhs {
            SynExpr::Index(ix) => {
                let (tensor, index) = self.index(ix)?;
                out.push(Stmt::Store {
                    tensor,
                    index,
                    value,
                    at: src(whole),
                });
                Ok(())
            }
            SynExpr::Path(p) => {
                let name = p
                    .path
                    .get_ident()
                    .map(|i| i.to_string())
                    .unwrap_or_default();
                match self.lookup(&name) {
                    Some(Binding::Var(var)) => {
                        if !self.kernel.vars[var].mutable {
                            return Err(err(lhs, format!("cannot assign twice to `{name}`: declare it `let mut {name}`")));
                        }
                        out.push(Stmt::Assign {
                            var,
                            value,
                            at: src(whole),
                        });
                        Ok(())
                    }
                    _ => Err(err(
                        lhs,
                        format!("`{name}` is not a local of the device code; assign to a `let mut` value or store into a tensor tile"),
                    )),
                }
            }
            other => Err(err(
                other,
                "assign to a `let mut` name or to a tensor tile like `out[(tm, tn)]`",
            )),
        }
    }

    /// `t[(a, b)]`, `t[[a, b]]` or `t[a]` with tiles `a`, `b`.
    fn index(&mut self, ix: &syn::ExprIndex) -> syn::Result<(TensorId, Vec<DimId>)> {
        let SynExpr::Path(p) = ix.expr.as_ref() else {
            return Err(err(
                &ix.expr,
                "only tensors passed from the host code can be indexed, by name",
            ));
        };
        let Some(ident) = p.path.get_ident() else {
            return Err(err(
                &ix.expr,
                "only tensors passed from the host code can be indexed, by name",
            ));
        };
        let parts: Vec<&SynExpr> = match ix.index.as_ref() {
            SynExpr::Tuple(t) => t.elems.iter().collect(),
            SynExpr::Array(a) => a.elems.iter().collect(),
            SynExpr::Paren(p) => vec![p.expr.as_ref()],
            other => vec![other],
        };
        let mut dims = Vec::new();
        for part in &parts {
            dims.push(self.tile_ref(part)?);
        }
        let tensor = self.tensor(ident, dims.len(), ix)?;
        Ok((tensor, dims))
    }

    fn tile_ref(&self, e: &SynExpr) -> syn::Result<DimId> {
        if let SynExpr::Path(p) = e {
            if let Some(i) = p.path.get_ident() {
                if let Some(Binding::Tile(d)) = self.lookup(&i.to_string()) {
                    return Ok(d);
                }
            }
        }
        Err(err(e, "tensors are indexed by tiles of enclosing `tile()` loops, e.g. `a[(tm, tk)]` or `bias[tn]`"))
    }

    fn tile_list(&self, e: &SynExpr) -> syn::Result<Vec<DimId>> {
        let parts: Vec<&SynExpr> = match e {
            SynExpr::Tuple(t) => t.elems.iter().collect(),
            SynExpr::Array(a) => a.elems.iter().collect(),
            SynExpr::Paren(p) => vec![p.expr.as_ref()],
            other => vec![other],
        };
        parts.into_iter().map(|p| self.tile_ref(p)).collect()
    }

    /// The index of `wait`: one flag, or a bounded range `lo..hi` / `lo..=hi` of them
    /// (returned as `lo` and the exclusive end).
    fn wait_index(&mut self, e: &SynExpr) -> syn::Result<(Expr, Option<Expr>)> {
        let SynExpr::Range(r) = e else {
            return Ok((self.expr(e)?, None));
        };
        let (Some(lo), Some(hi)) = (&r.start, &r.end) else {
            return Err(err(
                r,
                "a range of flags in `wait` needs both ends, e.g. `lo..hi` or `lo..=hi`",
            ));
        };
        let lo = self.expr(lo)?;
        let hi = self.expr(hi)?;
        let end = match r.limits {
            syn::RangeLimits::HalfOpen(_) => hi,
            syn::RangeLimits::Closed(_) => Expr::Binary {
                op: BinOp::Add,
                lhs: Box::new(hi),
                rhs: Box::new(Expr::Int(1)),
                at: src(r),
            },
        };
        Ok((lo, Some(end)))
    }

    fn expr(&mut self, e: &SynExpr) -> syn::Result<Expr> {
        Ok(match e {
            SynExpr::Lit(l) => match &l.lit {
                Lit::Int(i) => Expr::Int(i.base10_parse()?),
                Lit::Float(f) => Expr::Float(f.base10_parse()?),
                other => return Err(err(other, "device code takes integer and float literals only")),
            },
            SynExpr::Paren(p) => self.expr(&p.expr)?,
            SynExpr::Group(g) => self.expr(&g.expr)?,
            SynExpr::Path(p) => {
                let Some(ident) = p.path.get_ident() else {
                    // `f32::INFINITY`, `f32::NEG_INFINITY` (a masked score).
                    if let Some(v) = literal(e) {
                        return Ok(Expr::Float(v));
                    }
                    return Err(err(p, "device code refers to values by plain names"));
                };
                let name = ident.to_string();
                match self.lookup(&name) {
                    Some(Binding::Var(v)) => Expr::Var(v),
                    Some(Binding::Tile(_)) => {
                        return Err(err(
                            p,
                            format!("tile `{name}` is not a value; use `{name}.begin()`, `{name}.end()`, `{name}.size()` or `{name}.index()` (each element's index)"),
                        ))
                    }
                    None => {
                        if let Some(c) = self.consts.iter().position(|c| *c == name) {
                            Expr::Const(c)
                        } else {
                            Expr::Scalar(self.host_scalar(e))
                        }
                    }
                }
            }
            SynExpr::Index(ix) => {
                let (tensor, index) = self.index(ix)?;
                Expr::Load {
                    tensor,
                    index,
                    at: src(ix),
                }
            }
            SynExpr::Unary(u) => match u.op {
                SynUn::Neg(_) => Expr::Unary {
                    op: UnOp::Neg,
                    arg: Box::new(self.expr(&u.expr)?),
                },
                _ => return Err(err(u, "device code supports unary `-` only")),
            },
            SynExpr::Binary(b) => {
                let op = match b.op {
                    SynBin::Add(_) => BinOp::Add,
                    SynBin::Sub(_) => BinOp::Sub,
                    SynBin::Mul(_) => BinOp::Mul,
                    SynBin::Div(_) => BinOp::Div,
                    SynBin::Rem(_) => BinOp::Rem,
                    other => {
                        let cmp = match other {
                            SynBin::Eq(_) => CmpOp::Eq,
                            SynBin::Ne(_) => CmpOp::Ne,
                            SynBin::Lt(_) => CmpOp::Lt,
                            SynBin::Le(_) => CmpOp::Le,
                            SynBin::Gt(_) => CmpOp::Gt,
                            SynBin::Ge(_) => CmpOp::Ge,
                            _ => {
                                return Err(err(
                                    b,
                                    "device code supports `+ - * / %` and comparisons (`==`, `<`, …, giving a mask for `select`); combine masks with `*` (and) or `select`",
                                ))
                            }
                        };
                        return Ok(Expr::Compare {
                            op: cmp,
                            lhs: Box::new(self.expr(&b.left)?),
                            rhs: Box::new(self.expr(&b.right)?),
                            at: src(b),
                        });
                    }
                };
                Expr::Binary {
                    op,
                    lhs: Box::new(self.expr(&b.left)?),
                    rhs: Box::new(self.expr(&b.right)?),
                    at: src(b),
                }
            }
            SynExpr::Cast(c) => Expr::Cast {
                arg: Box::new(self.expr(&c.expr)?),
                dtype: Some(dtype_of(&c.ty)?),
            },
            SynExpr::Call(c) => self.call(c)?,
            SynExpr::MethodCall(m) => self.method(m)?,
            SynExpr::If(i) => self.if_expr(i)?,
            SynExpr::Block(b) if b.block.stmts.len() == 1 => match &b.block.stmts[0] {
                SynStmt::Expr(inner, None) => self.expr(inner)?,
                other => return Err(err(other, "a block used as a value holds one expression")),
            },
            other => {
                return Err(err(
                    other,
                    format!("this expression is not supported in device code; device code has literals, names, tile loads, arithmetic and the functions {FUNCTIONS}"),
                ))
            }
        })
    }

    fn call(&mut self, c: &syn::ExprCall) -> syn::Result<Expr> {
        let SynExpr::Path(p) = c.func.as_ref() else {
            return Err(err(
                &c.func,
                format!("device code calls only the DSL's functions: {FUNCTIONS}"),
            ));
        };
        let Some(seg) = p.path.segments.last() else {
            return Err(err(p, "empty path"));
        };
        let name = seg.ident.to_string();
        let args: Vec<&SynExpr> = c.args.iter().collect();
        let arity = |n: usize| -> syn::Result<()> {
            if args.len() != n {
                Err(err(c, format!("`{name}` takes {n} argument(s)")))
            } else {
                Ok(())
            }
        };
        let turbofish = match &seg.arguments {
            syn::PathArguments::AngleBracketed(a) => match a.args.first() {
                Some(syn::GenericArgument::Type(t)) => Some(dtype_of(t)?),
                _ => None,
            },
            _ => None,
        };
        Ok(match name.as_str() {
            "addmm" => {
                arity(3)?;
                Expr::Addmm {
                    acc: Box::new(self.expr(args[0])?),
                    a: Box::new(self.expr(args[1])?),
                    b: Box::new(self.expr(args[2])?),
                    at: src(c),
                }
            }
            "zeros" | "full" => {
                arity(if name == "zeros" { 1 } else { 2 })?;
                let dims = self.tile_list(args[0])?;
                let value = if name == "full" {
                    literal(args[1])
                        .ok_or_else(|| err(args[1], "the value of `full` is a number literal"))?
                } else {
                    0.0
                };
                Expr::Full {
                    dims,
                    dtype: turbofish.unwrap_or(DType::F32),
                    value,
                }
            }
            "min" | "max" => {
                arity(2)?;
                Expr::Binary {
                    op: if name == "min" {
                        BinOp::Min
                    } else {
                        BinOp::Max
                    },
                    lhs: Box::new(self.expr(args[0])?),
                    rhs: Box::new(self.expr(args[1])?),
                    at: src(c),
                }
            }
            "select" => {
                arity(3)?;
                Expr::Select {
                    mask: Box::new(self.expr(args[0])?),
                    then: Box::new(self.expr(args[1])?),
                    otherwise: Box::new(self.expr(args[2])?),
                    at: src(c),
                }
            }
            "wait" | "signal" => {
                return Err(err(
                    c,
                    format!("`{name}(…, index, value)` is a statement: end it with `;`"),
                ))
            }
            "tile" => {
                return Err(err(
                    c,
                    "`tile(...)` is used as the iterator of a `for` loop",
                ))
            }
            _ => match UnOp::from_name(&name) {
                Some(op) => {
                    arity(1)?;
                    Expr::Unary {
                        op,
                        arg: Box::new(self.expr(args[0])?),
                    }
                }
                None => {
                    return Err(err(
                        &c.func,
                        format!(
                            "unknown function `{name}` in device code; the DSL has {FUNCTIONS}"
                        ),
                    ))
                }
            },
        })
    }

    fn method(&mut self, m: &syn::ExprMethodCall) -> syn::Result<Expr> {
        let name = m.method.to_string();
        // Tile methods: begin/end/size on a tile name.
        if matches!(name.as_str(), "begin" | "end" | "size" | "index") {
            let d = self.tile_ref(&m.receiver).map_err(|_| {
                err(
                    &m.receiver,
                    format!("`.{name}()` is a method of tiles (the names bound by `tile()` loops)"),
                )
            })?;
            return Ok(match name.as_str() {
                "begin" => Expr::TileBegin(d),
                "end" => Expr::TileEnd(d),
                "index" => Expr::TileIndex(d),
                _ => Expr::TileSize(d),
            });
        }
        let recv = self.expr(&m.receiver)?;
        let turbofish = match &m.turbofish {
            Some(t) => match t.args.first() {
                Some(syn::GenericArgument::Type(ty)) => Some(dtype_of(ty)?),
                _ => None,
            },
            None => None,
        };
        let args: Vec<&SynExpr> = m.args.iter().collect();
        // `.sum(t)`, `.max(t)`, `.min(t)` with a tile: a reduction along it
        // (`.max(x)` with a value is the elementwise maximum).
        let reduce = match name.as_str() {
            "sum" => Some(ReduceOp::Sum),
            "max" => Some(ReduceOp::Max),
            "min" => Some(ReduceOp::Min),
            _ => None,
        };
        if let (Some(op), [arg]) = (reduce, args.as_slice()) {
            if let Ok(dim) = self.tile_ref(arg) {
                return Ok(Expr::Reduce {
                    op,
                    arg: Box::new(recv),
                    dim,
                    at: src(m),
                });
            }
        }
        if name == "sum" {
            return Err(err(
                m,
                "`.sum(t)` reduces along a tile `t` of an enclosing `tile()` loop, e.g. `x.sum(tn)`",
            ));
        }
        Ok(match name.as_str() {
            "cast" | "to" => {
                if !args.is_empty() {
                    return Err(err(m, "`.cast::<T>()` takes no arguments"));
                }
                Expr::Cast {
                    arg: Box::new(recv),
                    dtype: turbofish,
                }
            }
            "min" | "max" => {
                if args.len() != 1 {
                    return Err(err(m, format!("`.{name}(other)` takes one argument")));
                }
                Expr::Binary {
                    op: if name == "min" {
                        BinOp::Min
                    } else {
                        BinOp::Max
                    },
                    lhs: Box::new(recv),
                    rhs: Box::new(self.expr(args[0])?),
                    at: src(m),
                }
            }
            _ => match UnOp::from_name(&name) {
                Some(op) if args.is_empty() => Expr::Unary {
                    op,
                    arg: Box::new(recv),
                },
                _ => {
                    return Err(err(
                        &m.method,
                        format!(
                            "unknown method `.{name}()` in device code; the DSL has {FUNCTIONS}"
                        ),
                    ))
                }
            },
        })
    }
}

fn compound_op(op: &SynBin) -> Option<BinOp> {
    Some(match op {
        SynBin::AddAssign(_) => BinOp::Add,
        SynBin::SubAssign(_) => BinOp::Sub,
        SynBin::MulAssign(_) => BinOp::Mul,
        SynBin::DivAssign(_) => BinOp::Div,
        _ => return None,
    })
}

fn is_fn(f: &SynExpr, name: &str) -> bool {
    matches!(f, SynExpr::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == name))
}

fn literal(e: &SynExpr) -> Option<f64> {
    match e {
        SynExpr::Lit(l) => match &l.lit {
            Lit::Int(i) => i.base10_parse::<i64>().ok().map(|v| v as f64),
            Lit::Float(f) => f.base10_parse().ok(),
            _ => None,
        },
        SynExpr::Unary(u) if matches!(u.op, SynUn::Neg(_)) => literal(&u.expr).map(|v| -v),
        // `f32::INFINITY`, `f32::NEG_INFINITY` (a max's starting value).
        SynExpr::Path(p) => match p.path.segments.last()?.ident.to_string().as_str() {
            "INFINITY" => Some(f64::INFINITY),
            "NEG_INFINITY" => Some(f64::NEG_INFINITY),
            _ => None,
        },
        _ => None,
    }
}

/// `bf16`, `half::bf16`, `f32`, … as a [`DType`].
pub fn dtype_of(ty: &syn::Type) -> syn::Result<DType> {
    if let syn::Type::Path(p) = ty {
        if let Some(seg) = p.path.segments.last() {
            if let Some(d) = DType::from_rust_name(&seg.ident.to_string()) {
                return Ok(d);
            }
        }
    }
    Err(err(
        ty,
        "element types are bf16, f16, f32, i32, u32 and i64",
    ))
}
