//! Turns the body of the outermost `tile()` loop (the device code) into tile IR.
//! Every construct the DSL does not have is an error spanned on the code that
//! used it, saying what to write instead.
//!
//! Names in device code:
//! - a tile (`for tn in tile(n)`) is not a value by itself: `tn.index()`,
//!   `tn.begin()`, … are; inside a tensor index a bare `tn` stands for its
//!   indices (`x[(tm, tn + 1)]`);
//! - an index walked one at a time (`for i in a..b`, `tile(each(n))`) is an
//!   integer scalar wherever it is used (`offsets[b + 1]`);
//! - `let` names are locals, `#[constexpr]` parameters constants, and every other
//!   name a value computed on the host and passed at launch.

use proc_macro2::{TokenStream, TokenTree};
use quote::{quote, ToTokens};
use std::collections::HashMap;
use syn::{BinOp as SynBin, Expr as SynExpr, Lit, Pat, Stmt as SynStmt, UnOp as SynUn};
use tilefuse_codegen::dtype::DType;
use tilefuse_codegen::ir::*;
use tilefuse_codegen::prims;
use tilefuse_codegen::spec::ScalarKind;

const STATEMENTS: &str = "device code supports `let`, assignment (`=`, `+=`, `-=`, `*=`, `/=`, `%=`, `&=`, `|=`, `^=`, \
     `<<=`, `>>=`), tensor stores `t[(tm, tn)] = …`, `atomic_add(t[index], value);` (and `atomic_max`, \
     `atomic_min`; `let old = atomic_add(…);` keeps the old values), `wait(flags, index, value);`, `signal(counters, index, value);`, loops \
     `for t in tile(extent) { … }`, `for t in tile(a..b) { … }` and `for i in a..b { … }`, and `if`";

const LOOPS: &str = "device loops iterate over tiles, `for t in tile(extent)` (or `tile([e0, e1])`, \
     `tile(each(n))`, `tile(begin..end)`, `tile(extent).until(bound)`), or over indices one at a time, \
     `for i in begin..end`";

/// The device functions and methods, for messages.
fn functions() -> String {
    format!(
        "{} (as functions or methods: `exp(x)` or `x.exp()`, `max(a, b)` or `a.max(b)`; and the methods \
         .cast::<T>(), .sum(t), .prod(t), .max(t), .min(t) reducing along a tile `t`, .cumsum(t), .cumprod(t), \
         .cummax(t), .cummin(t) scanning along it, .argmax(t), .argmin(t) the index they pick, and on tiles \
         .begin(), .end(), .size(), .index())",
        prims::function_names()
    )
}

/// A name visible in device code.
#[derive(Clone, Copy, Debug)]
enum Binding {
    /// A tile dimension: a `tile()` loop's tile, or an index walked one at a time (`each`).
    Tile(DimId),
    Var(VarId),
}

/// How one dimension of a loop is bounded, as written.
enum Bound {
    /// `tile(n)`, `whole(n)`, `each(n)`: an extent computed on the host.
    Host(ScalarId),
    /// `tile(a..b)`, `for i in a..b`: bounds computed in the program.
    Range(LoopRange),
}

/// Builds a [`Kernel`] from the loop, collecting the host values it captures.
pub struct Builder {
    pub kernel: Kernel,
    /// Host expression of each scalar, in `ScalarId` order.
    pub scalar_exprs: Vec<TokenStream>,
    /// Host expression of each tensor argument (its name), in `TensorId` order.
    pub tensor_idents: Vec<syn::Ident>,
    /// The code each place named in the IR (`at`) came from, first one first:
    /// errors of the checker and the lowerings are spanned on it.
    pub spans: Vec<(String, TokenStream)>,
    scopes: Vec<HashMap<String, Binding>>,
    /// Constexpr parameter names.
    consts: Vec<String>,
    /// Declared dtypes of tensors known from the signature and host `let`s.
    declared: HashMap<String, DType>,
    /// The signature's scalar parameters' kinds, by name.
    scalar_kinds: HashMap<String, ScalarKind>,
    /// Inside a tensor index: a bare tile name stands for its indices.
    in_index: usize,
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

/// `e` without parentheses and invisible groups around it.
fn bare(e: &SynExpr) -> &SynExpr {
    match e {
        SynExpr::Paren(p) => bare(&p.expr),
        SynExpr::Group(g) => bare(&g.expr),
        other => other,
    }
}

/// The parts of a list written `[a, b]`, `(a, b)` or as one item `a`.
fn list(e: &SynExpr) -> Vec<&SynExpr> {
    match e {
        SynExpr::Tuple(t) => t.elems.iter().collect(),
        SynExpr::Array(a) => a.elems.iter().collect(),
        SynExpr::Paren(p) => vec![p.expr.as_ref()],
        other => vec![other],
    }
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
            spans: Vec::new(),
            scopes: vec![HashMap::new()],
            consts,
            declared,
            scalar_kinds: HashMap::new(),
            in_index: 0,
        }
    }

    /// The kinds of the scalar parameters the signature types (`alpha: f32`),
    /// recorded on the kernel's scalars that are those parameters.
    pub fn with_scalar_kinds(mut self, kinds: HashMap<String, ScalarKind>) -> Builder {
        self.scalar_kinds = kinds;
        self
    }

    /// The `at` of an IR node made from `tokens`: its text, remembered with
    /// the tokens so an error about it points at them.
    fn at(&mut self, tokens: impl ToTokens) -> Src {
        let ts = tokens.to_token_stream();
        let text = src(&ts);
        self.remember(text.clone(), ts);
        text
    }

    fn remember(&mut self, text: String, tokens: TokenStream) {
        if !self.spans.iter().any(|(t, _)| *t == text) {
            self.spans.push((text, tokens));
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
        let dims: Vec<DimId> = self
            .tile_loop(&fl.pat, iter, true)?
            .into_iter()
            .map(|(d, _)| d)
            .collect();
        self.remember_loop(fl, &dims);
        if let Some(start) = start {
            let starts = list(start);
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
            self.kernel.grid_start = starts
                .into_iter()
                .map(|e| self.host_scalar(e, "a start index of `starting_at`"))
                .collect::<syn::Result<_>>()?;
        }
        self.kernel.grid = dims;
        self.kernel.body = self.block(&fl.body.stmts)?;
        Ok(())
    }

    /// Remembers the header of loop `fl` as the place of errors about its dimensions.
    fn remember_loop(&mut self, fl: &syn::ExprForLoop, dims: &[DimId]) {
        let (f, pat, i, expr) = (&fl.for_token, &fl.pat, &fl.in_token, &fl.expr);
        let header = quote!(#f #pat #i #expr);
        for &d in dims {
            let name = self.kernel.dims[d].name.clone();
            self.remember(format!("for {name} in …"), header.clone());
            self.remember(format!("for {name} in tile(…).until(…)"), header.clone());
            self.remember(name, header.clone());
        }
    }

    /// The dimensions a loop `for pat in iter` binds, each with the bounds the
    /// program computes for it (if it has them), in scope from here on:
    /// `tile(x)` / `tile([x, each(y), whole(z)])` / `tile(a..b)` bound to `t`
    /// / `(t, u, v)`, or an index range `a..b` bound to `i`.
    fn tile_loop(
        &mut self,
        pat: &Pat,
        iter: &SynExpr,
        grid: bool,
    ) -> syn::Result<Vec<(DimId, Option<LoopRange>)>> {
        let iter = bare(iter);
        // `for i in a..b`: one index at a time.
        if let SynExpr::Range(r) = iter {
            if grid {
                return Err(err(
                    r,
                    "the grid loop is `for … in tile([extents])`, with extents computed on the host",
                ));
            }
            let Pat::Ident(p) = pat else {
                return Err(err(
                    pat,
                    "bind the index to a name, e.g. `for i in begin..end`",
                ));
            };
            let range = self.range(r, "an index loop")?;
            let d = self.new_dim(&p.ident, None, false, true);
            return Ok(vec![(d, Some(range))]);
        }
        let call = match iter {
            SynExpr::Call(c) if is_fn(&c.func, "tile") && c.args.len() == 1 => c,
            _ => return Err(err(iter, LOOPS)),
        };
        let extents = list(&call.args[0]);
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
        // Every bound first, then the names: a bound cannot use the loop's own tiles.
        let mut bounds = Vec::new();
        for ext in extents {
            let ext = bare(ext);
            bounds.push(match ext {
                // `whole(d)`: one tile covering the extent (a head dimension).
                // `each(n)`: one index at a time, an integer scalar in the body.
                SynExpr::Call(c) if is_fn(&c.func, "whole") || is_fn(&c.func, "each") => {
                    let each = is_fn(&c.func, "each");
                    let f = if each { "each" } else { "whole" };
                    if c.args.len() != 1 {
                        return Err(err(c, format!("`{f}(extent)` takes one extent")));
                    }
                    let e = self.host_scalar(&c.args[0], &format!("the extent of `{f}(…)`"))?;
                    (Bound::Host(e), !each, each)
                }
                SynExpr::Range(r) if grid => {
                    return Err(err(
                        r,
                        "the grid's tiles need extents computed on the host, e.g. `tile([m, n])`; \
                         bounds computed in the program (`tile(begin..end)`) are for inner loops",
                    ))
                }
                SynExpr::Range(r) => (
                    Bound::Range(self.range(r, "a `tile()` range")?),
                    false,
                    false,
                ),
                other => (
                    Bound::Host(self.host_scalar(other, "the extent of `tile(…)`")?),
                    false,
                    false,
                ),
            });
        }
        let mut dims = Vec::new();
        for (name, (bound, whole, each)) in names.into_iter().zip(bounds) {
            let (extent, range) = match bound {
                Bound::Host(s) => (Some(s), None),
                Bound::Range(r) => (None, Some(r)),
            };
            dims.push((self.new_dim(name, extent, whole, each), range));
        }
        Ok(dims)
    }

    /// A new tile dimension, bound to `name` in the innermost scope.
    fn new_dim(
        &mut self,
        name: &syn::Ident,
        extent: Option<ScalarId>,
        whole: bool,
        each: bool,
    ) -> DimId {
        let d = self.kernel.dims.len();
        self.kernel.dims.push(TileDim {
            name: name.to_string(),
            extent,
            whole,
            each,
        });
        if let Some(s) = self.scopes.last_mut() {
            s.insert(name.to_string(), Binding::Tile(d));
        }
        d
    }

    /// The bounds `begin..end` (or `begin..=end`) of a loop, computed in the program.
    fn range(&mut self, r: &syn::ExprRange, what: &str) -> syn::Result<LoopRange> {
        let (Some(lo), Some(hi)) = (&r.start, &r.end) else {
            return Err(err(
                r,
                format!("{what} needs both ends, e.g. `begin..end` or `begin..=last`"),
            ));
        };
        let begin = self.expr(lo)?;
        let hi_e = self.expr(hi)?;
        let end = match r.limits {
            syn::RangeLimits::HalfOpen(_) => hi_e,
            syn::RangeLimits::Closed(_) => Expr::Binary {
                op: BinOp::Add,
                lhs: Box::new(hi_e),
                rhs: Box::new(Expr::Int(1)),
                at: self.at(r),
            },
        };
        Ok(LoopRange { begin, end })
    }

    /// A host expression passed to the kernel by value, deduplicated by its
    /// text: `what` (an extent, a start index) may not use device names.
    fn host_scalar(&mut self, e: &SynExpr, what: &str) -> syn::Result<ScalarId> {
        if let Some(name) = self.device_name_in(e) {
            return Err(err(
                e,
                format!(
                    "{what} is computed on the host, before the kernel runs, but this uses `{name}` of the \
                     device code{}",
                    if what.contains("extent") {
                        "; for bounds computed in the program loop over `tile(begin..end)` or `begin..end`"
                    } else {
                        ""
                    }
                ),
            ));
        }
        Ok(self.scalar(e))
    }

    fn scalar(&mut self, e: &SynExpr) -> ScalarId {
        let text = src(e);
        if let Some(i) = self.kernel.scalars.iter().position(|s| s.name == text) {
            return i;
        }
        let declared = self.scalar_kinds.get(&text).copied();
        self.kernel.scalars.push(ScalarParam {
            name: text,
            declared,
        });
        self.scalar_exprs.push(e.to_token_stream());
        self.kernel.scalars.len() - 1
    }

    /// A name of the device code (a tile, a local) that `e` uses, if any.
    fn device_name_in(&self, e: &SynExpr) -> Option<String> {
        fn walk(b: &Builder, ts: TokenStream) -> Option<String> {
            let mut after_dot = false;
            for tt in ts {
                match tt {
                    TokenTree::Group(g) => {
                        if let Some(n) = walk(b, g.stream()) {
                            return Some(n);
                        }
                        after_dot = false;
                    }
                    TokenTree::Ident(i) => {
                        let name = i.to_string();
                        // `a.size(0)`: a method, not a name.
                        if !after_dot && b.lookup(&name).is_some() {
                            return Some(name);
                        }
                        after_dot = false;
                    }
                    TokenTree::Punct(p) => after_dot = p.as_char() == '.',
                    TokenTree::Literal(_) => after_dot = false,
                }
            }
            None
        }
        walk(self, e.to_token_stream())
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
                    format!(
                        "`{name}` was indexed with {have} component(s) before and with {rank} here; \
                         index a tensor with one component per dimension everywhere"
                    ),
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
            SynStmt::Local(local) if matches!(local.pat, Pat::Tuple(_)) => {
                self.let_tuple(local, out)
            }
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
                // `let old = atomic_add(…);`: the old values (the place and
                // the value read before the name is bound).
                let mut s = match bare(&init.expr) {
                    SynExpr::Call(c) if atomic_of(&c.func).is_some() => self.atomic(c)?,
                    e => Stmt::Let {
                        var: 0,
                        value: self.expr(e)?,
                        at: self.at(local),
                    },
                };
                let var = self.kernel.vars.len();
                self.kernel.vars.push(Var {
                    name: ident.to_string(),
                    mutable,
                });
                match &mut s {
                    Stmt::Atomic { old, at, .. } => {
                        *old = Some(var);
                        *at = self.at(local);
                    }
                    Stmt::Let { var: v, .. } => *v = var,
                    _ => {}
                }
                out.push(s);
                if let Some(sc) = self.scopes.last_mut() {
                    sc.insert(ident.to_string(), Binding::Var(var));
                }
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

    /// `atomic_add(t[index], value)` (and max, min), without the variable
    /// its old values may go to (see [`Stmt::Atomic`]).
    fn atomic(&mut self, c: &syn::ExprCall) -> syn::Result<Stmt> {
        let op = atomic_of(&c.func).unwrap_or(AtomicOp::Add);
        let name = op.name();
        if c.args.len() != 2 {
            return Err(err(
                c,
                format!("`{name}` takes two arguments: `{name}(t[index], value)`"),
            ));
        }
        let place = match bare(&c.args[0]) {
            SynExpr::Reference(r) => bare(&r.expr),
            other => other,
        };
        let SynExpr::Index(ix) = place else {
            return Err(err(
                &c.args[0],
                format!(
                    "the first argument of `{name}` is the place to update, a tensor index such as \
                     `out[(tm, tn)]` or `hist[ids[ti]]`"
                ),
            ));
        };
        let (tensor, index) = self.index(ix)?;
        let value = self.expr(&c.args[1])?;
        Ok(Stmt::Atomic {
            op,
            tensor,
            index,
            value,
            old: None,
            at: self.at(c),
        })
    }

    /// `let (a, mut b) = (x, y);`: every value first (so `(b, a)` swaps), then
    /// one `let` per name.
    fn let_tuple(&mut self, local: &syn::Local, out: &mut Vec<Stmt>) -> syn::Result<()> {
        let Pat::Tuple(pats) = &local.pat else {
            return Err(err(&local.pat, "expected a tuple pattern"));
        };
        let values = match local.init.as_ref().map(|i| (i.expr.as_ref(), &i.diverge)) {
            Some((SynExpr::Tuple(t), None)) if t.elems.len() == pats.elems.len() => &t.elems,
            _ => {
                return Err(err(
                    local,
                    format!(
                        "a device `let` of a tuple pattern takes a tuple of {} values: `let (a, b) = (x, y);`",
                        pats.elems.len()
                    ),
                ))
            }
        };
        let mut names = Vec::new();
        for p in &pats.elems {
            match p {
                Pat::Ident(i) if i.subpat.is_none() && i.by_ref.is_none() => {
                    names.push((i.ident.to_string(), i.mutability.is_some()))
                }
                other => {
                    return Err(err(
                        other,
                        "each name of a device `let (…)` is a plain name",
                    ))
                }
            }
        }
        let values = values
            .iter()
            .map(|v| self.expr(v))
            .collect::<syn::Result<Vec<_>>>()?;
        let at = self.at(local);
        for ((name, mutable), value) in names.into_iter().zip(values) {
            let var = self.kernel.vars.len();
            self.kernel.vars.push(Var {
                name: name.clone(),
                mutable,
            });
            out.push(Stmt::Let {
                var,
                value,
                at: at.clone(),
            });
            if let Some(sc) = self.scopes.last_mut() {
                sc.insert(name, Binding::Var(var));
            }
        }
        Ok(())
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
                    at: self.at(e),
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
                let ident = match &c.args[0] {
                    SynExpr::Path(p) => p.path.get_ident(),
                    _ => None,
                }
                .ok_or_else(|| {
                    err(
                        &c.args[0],
                        "the first argument of `wait` is a flag tensor, by name",
                    )
                })?;
                let tensor = self.tensor(ident, 1, &c.args[0])?;
                let (index, end) = self.wait_index(&c.args[1])?;
                let value = self.expr(&c.args[2])?;
                let at = self.at(c);
                out.push(Stmt::Wait {
                    tensor,
                    index,
                    end,
                    value,
                    at,
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
                let ident = match &c.args[0] {
                    SynExpr::Path(p) => p.path.get_ident(),
                    _ => None,
                }
                .ok_or_else(|| {
                    err(
                        &c.args[0],
                        "the first argument of `signal` is a counter tensor, by name",
                    )
                })?;
                let tensor = self.tensor(ident, 1, &c.args[0])?;
                let index = self.expr(&c.args[1])?;
                let value = self.expr(&c.args[2])?;
                let at = self.at(c);
                out.push(Stmt::Signal {
                    tensor,
                    index,
                    value,
                    at,
                });
                Ok(())
            }
            SynExpr::Call(c) if atomic_of(&c.func).is_some() => {
                let s = self.atomic(c)?;
                out.push(s);
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
                            format!(
                            "{LOOPS}; `.until(bound)` is the only method a loop's iterator takes"
                        ),
                        ))
                    }
                    other => (other, None),
                };
                self.scopes.push(HashMap::new());
                let dims = self.tile_loop(&fl.pat, iter, false)?;
                if until.is_some() && dims.len() != 1 {
                    return Err(err(
                        &fl.pat,
                        "`.until(bound)` bounds a loop over one tile: `for tn in tile(n).until(bound)`",
                    ));
                }
                let ids: Vec<DimId> = dims.iter().map(|(d, _)| *d).collect();
                self.remember_loop(fl, &ids);
                let mut body = self.block(&fl.body.stmts)?;
                self.scopes.pop();
                let mut until = until;
                for (d, range) in dims.into_iter().rev() {
                    body = vec![Stmt::Loop {
                        dim: d,
                        body,
                        until: until.take(),
                        range: range.map(Box::new),
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
                format!("device code has no `while` or `loop`: {LOOPS}"),
            )),
            SynExpr::If(i) => {
                let stmt = self.if_stmt(i)?;
                out.push(stmt);
                Ok(())
            }
            SynExpr::Match(_) => Err(err(
                e,
                "device code has no `match`; branch with `if`, and make per-element choices with \
                 `select(mask, a, b)`",
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
            at: self.at(&i.cond),
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
            at: self.at(&i.cond),
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

    /// The condition of a device `if`: comparisons of device values combined
    /// with `!`, `&&`, `||`, or a value (true when not zero). One over
    /// `#[constexpr]` parameters and literals is decided when the kernel is
    /// specialized; any other is a branch the whole program takes.
    fn cond(&mut self, e: &SynExpr) -> syn::Result<Cond> {
        Ok(match e {
            SynExpr::Paren(p) => self.cond(&p.expr)?,
            SynExpr::Group(g) => self.cond(&g.expr)?,
            SynExpr::Unary(u) if matches!(u.op, SynUn::Not(_)) => {
                Cond::Not(Box::new(self.cond(&u.expr)?))
            }
            SynExpr::Binary(b) => match (cmp_op(&b.op), &b.op) {
                (Some(op), _) => Cond::Cmp {
                    op,
                    lhs: self.expr(&b.left)?,
                    rhs: self.expr(&b.right)?,
                },
                (None, SynBin::And(_)) => Cond::And(
                    Box::new(self.cond(&b.left)?),
                    Box::new(self.cond(&b.right)?),
                ),
                (None, SynBin::Or(_)) => Cond::Or(
                    Box::new(self.cond(&b.left)?),
                    Box::new(self.cond(&b.right)?),
                ),
                _ => Cond::NonZero(self.expr(e)?),
            },
            SynExpr::Let(l) => {
                return Err(err(
                    l,
                    "device code has no `if let`; branch on a comparison, e.g. `if n > 0 { … }`",
                ))
            }
            other => Cond::NonZero(self.expr(other)?),
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
                let at = self.at(whole);
                out.push(Stmt::Store {
                    tensor,
                    index,
                    value,
                    at,
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
                        let at = self.at(whole);
                        out.push(Stmt::Assign { var, value, at });
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

    /// `t[(a, b)]`, `t[[a, b]]` or `t[a]`: one integer expression per
    /// dimension, where a bare tile name stands for its indices.
    fn index(&mut self, ix: &syn::ExprIndex) -> syn::Result<(TensorId, Vec<Expr>)> {
        let ident = match ix.expr.as_ref() {
            SynExpr::Path(p) => p.path.get_ident(),
            _ => None,
        }
        .ok_or_else(|| {
            err(
                &ix.expr,
                "only tensors passed from the host code can be indexed, by name",
            )
        })?;
        self.in_index += 1;
        let index: syn::Result<Vec<Expr>> = list(&ix.index)
            .into_iter()
            .map(|part| self.index_component(part))
            .collect();
        self.in_index -= 1;
        let index = index?;
        let tensor = self.tensor(ident, index.len(), ix)?;
        Ok((tensor, index))
    }

    fn index_component(&mut self, e: &SynExpr) -> syn::Result<Expr> {
        match bare(e) {
            SynExpr::Lit(l) if matches!(l.lit, Lit::Float(_)) => Err(err(
                e,
                "index components are integers: a tile (`tn`), an offset tile (`tn + 1`), a gathered \
                 index (`ids[tt]`) or an integer scalar (`0`, `b`); convert a float with `.cast::<i64>()`",
            )),
            SynExpr::Range(r) => Err(err(
                r,
                "a tensor is indexed element by element, not sliced: loop over the range with \
                 `for t in tile(begin..end)` and index with the tile, `x[t]`",
            )),
            _ => self.expr(e),
        }
    }

    /// A tile named by `e`: a bare name bound by an enclosing loop.
    fn tile_ref(&self, e: &SynExpr) -> Option<DimId> {
        if let SynExpr::Path(p) = bare(e) {
            if let Some(i) = p.path.get_ident() {
                if let Some(Binding::Tile(d)) = self.lookup(&i.to_string()) {
                    return Some(d);
                }
            }
        }
        None
    }

    fn tile_list(&self, e: &SynExpr) -> syn::Result<Vec<DimId>> {
        list(e)
            .into_iter()
            .map(|p| {
                self.tile_ref(p).ok_or_else(|| {
                    err(
                        p,
                        "the tiles of a value are names bound by enclosing `tile()` loops, e.g. `zeros::<f32>([tm, tn])`",
                    )
                })
            })
            .collect()
    }

    /// The index of `wait`: one flag, or a bounded range `lo..hi` / `lo..=hi` of them
    /// (returned as `lo` and the exclusive end).
    fn wait_index(&mut self, e: &SynExpr) -> syn::Result<(Expr, Option<Expr>)> {
        let SynExpr::Range(r) = e else {
            return Ok((self.expr(e)?, None));
        };
        if r.start.is_none() || r.end.is_none() {
            return Err(err(
                r,
                "a range of flags in `wait` needs both ends, e.g. `lo..hi` or `lo..=hi`",
            ));
        }
        let r = self.range(r, "a range of flags")?;
        Ok((r.begin, Some(r.end)))
    }

    fn expr(&mut self, e: &SynExpr) -> syn::Result<Expr> {
        Ok(match e {
            SynExpr::Lit(l) => match &l.lit {
                Lit::Int(i) => Expr::Int(i.base10_parse()?),
                Lit::Float(f) => Expr::Float(f.base10_parse()?),
                Lit::Bool(b) => Expr::Int(i64::from(b.value)),
                other => {
                    return Err(err(
                        other,
                        "device code takes integer, float and `true`/`false` literals only",
                    ))
                }
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
                    // An index walked one at a time is an integer scalar; a
                    // tile inside a tensor index stands for its indices.
                    Some(Binding::Tile(d)) if self.kernel.dims[d].each || self.in_index > 0 => {
                        Expr::TileIndex(d)
                    }
                    Some(Binding::Tile(_)) => {
                        return Err(err(
                            p,
                            format!(
                                "tile `{name}` is not a value; use `{name}.index()` (each element's index), \
                                 `{name}.begin()`, `{name}.end()` or `{name}.size()` (inside a tensor index, \
                                 a bare `{name}` is its indices: `x[{name}]`, `x[{name} + 1]`)"
                            ),
                        ))
                    }
                    None => {
                        if let Some(c) = self.consts.iter().position(|c| *c == name) {
                            Expr::Const(c)
                        } else {
                            Expr::Scalar(self.scalar(e))
                        }
                    }
                }
            }
            SynExpr::Index(ix) => {
                let (tensor, index) = self.index(ix)?;
                Expr::Load {
                    tensor,
                    index,
                    at: self.at(ix),
                }
            }
            SynExpr::Unary(u) => match u.op {
                SynUn::Neg(_) => Expr::Unary {
                    op: UnOp::Neg,
                    arg: Box::new(self.expr(&u.expr)?),
                },
                SynUn::Not(_) => Expr::Unary {
                    op: UnOp::Not,
                    arg: Box::new(self.expr(&u.expr)?),
                },
                _ => return Err(err(
                    u,
                    "device code has the unary operators `-` and `!` (bitwise not of an integer, \
                         logical not of a mask); values are not references",
                )),
            },
            SynExpr::Binary(b) => {
                if let Some(op) = cmp_op(&b.op) {
                    let lhs = Box::new(self.expr(&b.left)?);
                    let rhs = Box::new(self.expr(&b.right)?);
                    return Ok(Expr::Compare {
                        op,
                        lhs,
                        rhs,
                        at: self.at(b),
                    });
                }
                let Some(op) = bin_op(&b.op) else {
                    return Err(err(
                        b,
                        "this is a statement, not a value (write it on its own line, ending with `;`); \
                         device values use `+ - * / %`, `& | ^ << >>`, `&& ||` on masks, and \
                         comparisons (`==`, `<`, …)",
                    ));
                };
                let lhs = Box::new(self.expr(&b.left)?);
                let rhs = Box::new(self.expr(&b.right)?);
                Expr::Binary {
                    op,
                    lhs,
                    rhs,
                    at: self.at(b),
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
            SynExpr::Range(r) => return Err(err(
                r,
                "a range is not a value; loop over it (`for i in a..b`, `for t in tile(a..b)`) or \
                     wait on it (`wait(flags, lo..hi, value)`)",
            )),
            other => {
                return Err(err(
                    other,
                    format!(
                    "this expression is not supported in device code; device code has literals, \
                         names, tensor loads, arithmetic and the functions {}",
                    functions()
                ),
                ))
            }
        })
    }

    fn call(&mut self, c: &syn::ExprCall) -> syn::Result<Expr> {
        let SynExpr::Path(p) = c.func.as_ref() else {
            return Err(err(
                &c.func,
                format!(
                    "device code calls only the DSL's functions: {}",
                    functions()
                ),
            ));
        };
        let Some(seg) = p.path.segments.last() else {
            return Err(err(p, "empty path"));
        };
        let name = seg.ident.to_string();
        let args: Vec<&SynExpr> = c.args.iter().collect();
        let arity = |n: usize, form: &str| -> syn::Result<()> {
            if args.len() != n {
                Err(err(
                    c,
                    format!(
                        "`{name}` takes {n} argument{}: `{form}`",
                        if n == 1 { "" } else { "s" }
                    ),
                ))
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
                arity(3, "addmm(acc, a, b)")?;
                let acc = Box::new(self.expr(args[0])?);
                let a = Box::new(self.expr(args[1])?);
                let b = Box::new(self.expr(args[2])?);
                Expr::Addmm {
                    acc,
                    a,
                    b,
                    at: self.at(c),
                }
            }
            "zeros" => {
                arity(1, "zeros::<f32>([tm, tn])")?;
                Expr::Full {
                    dims: self.tile_list(args[0])?,
                    dtype: turbofish.unwrap_or(DType::F32),
                    value: 0.0,
                }
            }
            "full" => {
                arity(2, "full::<f32>([tm, tn], value)")?;
                let value = literal(args[1]).ok_or_else(|| {
                    err(
                        args[1],
                        "the value of `full` is a number literal or a type's bound that a double holds exactly (`i32::MIN`, `u32::MAX`, `f32::NEG_INFINITY`; not `i64::MAX`)",
                    )
                })?;
                Expr::Full {
                    dims: self.tile_list(args[0])?,
                    dtype: turbofish.unwrap_or(DType::F32),
                    value,
                }
            }
            "select" => {
                arity(3, "select(mask, a, b)")?;
                let mask = Box::new(self.expr(args[0])?);
                let then = Box::new(self.expr(args[1])?);
                let otherwise = Box::new(self.expr(args[2])?);
                Expr::Select {
                    mask,
                    then,
                    otherwise,
                    at: self.at(c),
                }
            }
            "clamp" => {
                arity(3, "clamp(x, lo, hi)")?;
                let at = self.at(c);
                self.clamp(args[0], args[1], args[2], at)?
            }
            "wait" | "signal" => {
                return Err(err(
                    c,
                    format!("`{name}(…, index, value)` is a statement: end it with `;`"),
                ))
            }
            _ if AtomicOp::from_name(&name).is_some() => {
                return Err(err(
                    c,
                    format!(
                        "`{name}(t[index], value)` is a statement: write it on its own, ending with `;`, \
                         or keep the places' old values with `let old = {name}(t[index], value);`"
                    ),
                ))
            }
            "tile" | "each" | "whole" => {
                return Err(err(
                    c,
                    format!("`{name}(…)` describes the iterator of a `for` loop: `for t in tile(…)`"),
                ))
            }
            _ => {
                if let Some(kind) = RandKind::from_name(&name) {
                    arity(2, &format!("{name}(seed, offset)"))?;
                    let seed = Box::new(self.expr(args[0])?);
                    let offset = Box::new(self.expr(args[1])?);
                    Expr::Rand {
                        kind,
                        seed,
                        offset,
                        at: self.at(c),
                    }
                } else if let Some(op) = BinOp::from_function(&name) {
                    arity(2, &format!("{name}(a, b)"))?;
                    let lhs = Box::new(self.expr(args[0])?);
                    let rhs = Box::new(self.expr(args[1])?);
                    Expr::Binary {
                        op,
                        lhs,
                        rhs,
                        at: self.at(c),
                    }
                } else if let Some(op) = UnOp::from_name(&name) {
                    arity(1, &format!("{name}(x)"))?;
                    Expr::Unary {
                        op,
                        arg: Box::new(self.expr(args[0])?),
                    }
                } else {
                    let help = match prims::nearest_function(&name) {
                        Some(f) => format!("did you mean `{f}`?"),
                        None => format!("the DSL has {}", functions()),
                    };
                    return Err(err(
                        &c.func,
                        format!("unknown function `{name}` in device code; {help}"),
                    ));
                }
            }
        })
    }

    /// `clamp(x, lo, hi)` or `x.clamp(lo, hi)`: `min(max(x, lo), hi)` (a NaN
    /// `x` gives `lo`, as `max` and `min` let NaNs lose; no panic for
    /// `lo > hi`, unlike Rust's: the result is then `hi`).
    fn clamp(&mut self, x: &SynExpr, lo: &SynExpr, hi: &SynExpr, at: String) -> syn::Result<Expr> {
        let low = Expr::Binary {
            op: BinOp::Max,
            lhs: Box::new(self.expr(x)?),
            rhs: Box::new(self.expr(lo)?),
            at: at.clone(),
        };
        Ok(Expr::Binary {
            op: BinOp::Min,
            lhs: Box::new(low),
            rhs: Box::new(self.expr(hi)?),
            at,
        })
    }

    fn method(&mut self, m: &syn::ExprMethodCall) -> syn::Result<Expr> {
        let name = m.method.to_string();
        let args: Vec<&SynExpr> = m.args.iter().collect();
        // Tile methods: begin/end/size/index on a tile name.
        if matches!(name.as_str(), "begin" | "end" | "size" | "index") {
            let d = self.tile_ref(&m.receiver).ok_or_else(|| {
                err(
                    &m.receiver,
                    format!("`.{name}()` is a method of tiles (the names bound by `tile()` loops)"),
                )
            })?;
            if !args.is_empty() {
                return Err(err(m, format!("`.{name}()` takes no arguments")));
            }
            return Ok(match name.as_str() {
                "begin" => Expr::TileBegin(d),
                "end" => Expr::TileEnd(d),
                "index" => Expr::TileIndex(d),
                _ => Expr::TileSize(d),
            });
        }
        // `.sum(t)`, `.prod(t)`, `.max(t)`, `.min(t)` with a tile: a reduction
        // along it (`.max(x)` with a value is the elementwise maximum).
        if let (Some(op), [arg]) = (ReduceOp::from_name(&name), args.as_slice()) {
            if let Some(dim) = self.tile_ref(arg) {
                if self.kernel.dims[dim].each {
                    let dn = &self.kernel.dims[dim].name;
                    let entry = op.entry();
                    let bin = entry.binary;
                    let step = match bin.function() {
                        Some(f) => format!("acc = {f}(acc, x)"),
                        None => format!("acc = acc {} x", bin.symbol()),
                    };
                    let how = match entry.atomic {
                        Some(a) if self.kernel.grid.contains(&dim) => format!(
                            "each program takes one `{dn}`: combine the programs' values into the output with \
                             `{}(out[…], x);`",
                            a.name()
                        ),
                        _ => format!(
                            "accumulate across its loop instead (`let mut acc = …` before it, `{step}` in it)"
                        ),
                    };
                    // `.max(x)` with a value is the elementwise function.
                    let elementwise = match bin.function() {
                        Some(f) => format!(
                            "; `{f}(x, {dn})` is the elementwise `{f}` of `x` and the index"
                        ),
                        None => String::new(),
                    };
                    return Err(err(
                        m,
                        format!(
                            "`{dn}` takes one index at a time (`each(…)` or `for {dn} in begin..end`), so there is \
                             nothing to reduce along it; {how}{elementwise}"
                        ),
                    ));
                }
                let arg = Box::new(self.expr(&m.receiver)?);
                return Ok(Expr::Reduce {
                    op,
                    arg,
                    dim,
                    at: self.at(m),
                });
            }
        }
        if name == "clamp" {
            let [lo, hi] = args.as_slice() else {
                return Err(err(
                    m,
                    "`.clamp(lo, hi)` takes two arguments: `x.clamp(lo, hi)`",
                ));
            };
            let at = self.at(m);
            return self.clamp(&m.receiver, lo, hi, at);
        }
        // `.argmax(t)`, `.argmin(t)`: the index a reduction picks along the tile.
        if let Some(op) = ReduceOp::from_arg_name(&name) {
            let [arg] = args.as_slice() else {
                return Err(err(
                    m,
                    format!("`.{name}(t)` takes one tile to pick along: `x.{name}(tn)`"),
                ));
            };
            let Some(dim) = self.tile_ref(arg) else {
                return Err(err(
                    arg,
                    format!(
                        "`.{name}(t)` picks along a tile `t` of an enclosing `tile()` loop, e.g. `x.{name}(tn)`"
                    ),
                ));
            };
            let arg = Box::new(self.expr(&m.receiver)?);
            return Ok(Expr::ArgReduce {
                op,
                arg,
                dim,
                at: self.at(m),
            });
        }
        // `.cumsum(t)`, `.cummax(t)`, …: an inclusive scan along the tile.
        if let Some(op) = ReduceOp::from_scan_name(&name) {
            let [arg] = args.as_slice() else {
                return Err(err(
                    m,
                    format!("`.{name}(t)` takes one tile to scan along: `x.{name}(tn)`"),
                ));
            };
            let Some(dim) = self.tile_ref(arg) else {
                return Err(err(
                    arg,
                    format!(
                        "`.{name}(t)` scans along a tile `t` of an enclosing `tile()` loop, e.g. `x.{name}(tn)`"
                    ),
                ));
            };
            let arg = Box::new(self.expr(&m.receiver)?);
            return Ok(Expr::Scan {
                op,
                arg,
                dim,
                at: self.at(m),
            });
        }
        let turbofish = match &m.turbofish {
            Some(t) => match t.args.first() {
                Some(syn::GenericArgument::Type(ty)) => Some(dtype_of(ty)?),
                _ => None,
            },
            None => None,
        };
        if matches!(name.as_str(), "sum" | "prod") {
            return Err(err(
                m,
                format!(
                    "`.{name}(t)` reduces along a tile `t` of an enclosing `tile()` loop, e.g. `x.{name}(tn)`"
                ),
            ));
        }
        let recv = Box::new(self.expr(&m.receiver)?);
        Ok(match name.as_str() {
            "cast" | "to" => {
                if !args.is_empty() {
                    return Err(err(m, "`.cast::<T>()` takes no arguments"));
                }
                Expr::Cast {
                    arg: recv,
                    dtype: turbofish,
                }
            }
            _ => {
                if let Some(op) = BinOp::from_function(&name) {
                    let [arg] = args.as_slice() else {
                        return Err(err(
                            m,
                            format!("`.{name}(other)` takes one argument: `a.{name}(b)`"),
                        ));
                    };
                    Expr::Binary {
                        op,
                        lhs: recv,
                        rhs: Box::new(self.expr(arg)?),
                        at: self.at(m),
                    }
                } else if let Some(op) = UnOp::from_name(&name) {
                    if !args.is_empty() {
                        return Err(err(
                            m,
                            format!("`.{name}()` takes no arguments: `x.{name}()` or `{name}(x)`"),
                        ));
                    }
                    Expr::Unary { op, arg: recv }
                } else {
                    let help = match prims::nearest_method(&name) {
                        Some(f) => format!("did you mean `.{f}()`?"),
                        None => format!("the DSL has {}", functions()),
                    };
                    return Err(err(
                        &m.method,
                        format!("unknown method `.{name}()` in device code; {help}"),
                    ));
                }
            }
        })
    }
}

fn bin_op(op: &SynBin) -> Option<BinOp> {
    Some(match op {
        SynBin::Add(_) => BinOp::Add,
        SynBin::Sub(_) => BinOp::Sub,
        SynBin::Mul(_) => BinOp::Mul,
        SynBin::Div(_) => BinOp::Div,
        SynBin::Rem(_) => BinOp::Rem,
        SynBin::BitAnd(_) => BinOp::BitAnd,
        SynBin::BitOr(_) => BinOp::BitOr,
        SynBin::BitXor(_) => BinOp::BitXor,
        SynBin::Shl(_) => BinOp::Shl,
        SynBin::Shr(_) => BinOp::Shr,
        // On masks (comparisons) `&&` and `||` are `&` and `|`: both sides
        // are computed, there is no short circuit.
        SynBin::And(_) => BinOp::BitAnd,
        SynBin::Or(_) => BinOp::BitOr,
        _ => return None,
    })
}

fn cmp_op(op: &SynBin) -> Option<CmpOp> {
    Some(match op {
        SynBin::Eq(_) => CmpOp::Eq,
        SynBin::Ne(_) => CmpOp::Ne,
        SynBin::Lt(_) => CmpOp::Lt,
        SynBin::Le(_) => CmpOp::Le,
        SynBin::Gt(_) => CmpOp::Gt,
        SynBin::Ge(_) => CmpOp::Ge,
        _ => return None,
    })
}

fn compound_op(op: &SynBin) -> Option<BinOp> {
    Some(match op {
        SynBin::AddAssign(_) => BinOp::Add,
        SynBin::SubAssign(_) => BinOp::Sub,
        SynBin::MulAssign(_) => BinOp::Mul,
        SynBin::DivAssign(_) => BinOp::Div,
        SynBin::RemAssign(_) => BinOp::Rem,
        SynBin::BitAndAssign(_) => BinOp::BitAnd,
        SynBin::BitOrAssign(_) => BinOp::BitOr,
        SynBin::BitXorAssign(_) => BinOp::BitXor,
        SynBin::ShlAssign(_) => BinOp::Shl,
        SynBin::ShrAssign(_) => BinOp::Shr,
        _ => return None,
    })
}

fn is_fn(f: &SynExpr, name: &str) -> bool {
    matches!(f, SynExpr::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == name))
}

/// The atomic operation a called function names (`atomic_add`), if it does.
fn atomic_of(f: &SynExpr) -> Option<AtomicOp> {
    match f {
        SynExpr::Path(p) => AtomicOp::from_name(&p.path.segments.last()?.ident.to_string()),
        _ => None,
    }
}

fn literal(e: &SynExpr) -> Option<f64> {
    match e {
        SynExpr::Lit(l) => match &l.lit {
            Lit::Int(i) => i.base10_parse::<i64>().ok().map(|v| v as f64),
            Lit::Float(f) => f.base10_parse().ok(),
            _ => None,
        },
        SynExpr::Unary(u) if matches!(u.op, SynUn::Neg(_)) => literal(&u.expr).map(|v| -v),
        // `f32::INFINITY`, `f32::NEG_INFINITY` (a max's starting value), and the
        // bounds of the types whose bounds a value holds exactly (`i32::MIN`, …).
        SynExpr::Path(p) => {
            let segs: Vec<String> = p
                .path
                .segments
                .iter()
                .map(|s| s.ident.to_string())
                .collect();
            match segs
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .as_slice()
            {
                [.., "INFINITY"] => Some(f64::INFINITY),
                [.., "NEG_INFINITY"] => Some(f64::NEG_INFINITY),
                [ty, bound @ ("MIN" | "MAX")] => type_bound(ty, bound == &"MAX"),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `ty::MAX` (or `MIN`) where a number holds it exactly: not `i64::MAX`
/// (2^63 − 1 has no exact double; write the value a kernel needs instead).
fn type_bound(ty: &str, max: bool) -> Option<f64> {
    let (lo, hi) = match ty {
        "i8" => (i8::MIN as f64, i8::MAX as f64),
        "i16" => (i16::MIN as f64, i16::MAX as f64),
        "i32" => (i32::MIN as f64, i32::MAX as f64),
        "u8" => (0.0, u8::MAX as f64),
        "u16" => (0.0, u16::MAX as f64),
        "u32" => (0.0, u32::MAX as f64),
        "i64" if !max => (i64::MIN as f64, 0.0),
        "f32" => (f32::MIN as f64, f32::MAX as f64),
        _ => return None,
    };
    Some(if max { hi } else { lo })
}

/// `bf16`, `half::bf16`, `f32`, `u8`, … as a [`DType`].
pub fn dtype_of(ty: &syn::Type) -> syn::Result<DType> {
    if let syn::Type::Path(p) = ty {
        if let Some(seg) = p.path.segments.last() {
            if let Some(d) = DType::from_rust_name(&seg.ident.to_string()) {
                return Ok(d);
            }
        }
    }
    let names: Vec<&str> = DType::ALL.iter().map(|d| d.rust_name()).collect();
    Err(err(
        ty,
        format!(
            "element types are {}; for an index use `i64`",
            names.join(", ")
        ),
    ))
}
