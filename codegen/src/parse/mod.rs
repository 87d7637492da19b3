//! Reads the textual form of the tile IR back into a [`Kernel`]: the inverse
//! of the printer (`print.rs`), so that codegen tests can be written as short
//! text, and so that every printed kernel parses back to itself (`at` aside).
//!
//! The text is read the way the `#[fused_kernel]` macro reads the Rust it
//! stands for:
//!
//! - Numbering: a new variable per `let`, and a new tile dimension per grid
//!   dimension, then per loop dimension, in source order.
//! - Names resolve by lexical scope, innermost first: `let`s (a later one
//!   shadows an earlier one of the same name) and tiles (a loop's tile is in
//!   scope in its body), then `const` parameters, then scalars. A bare tile
//!   stands for its indices inside a tensor index (`x[(tm, tn + 1)]`) and
//!   anywhere for an `each` tile; elsewhere it is `tm.index()`.
//! - `-1` is the negation of `1` (`Unary { Neg, Int(1) }`), as Rust and the
//!   macro read it. A negative literal (`Int(-1)`, or `Float(-inf)`, which the
//!   macro builds from `f32::NEG_INFINITY`) is written in parentheses, `(-1)`,
//!   and read back as one literal.
//! - A condition drops its parentheses; `!` is [`Cond::Not`], a comparison
//!   [`Cond::Cmp`], `&&` and `||` [`Cond::And`] and [`Cond::Or`]; any other
//!   value is [`Cond::NonZero`]. A block `{ e }` is the value `e` even where
//!   `e` would read as a condition: `if { !flag }` branches on the bits of
//!   `!flag` (what `Cond::NonZero` of a `!` means), `if !flag` on `flag == 0`.
//! - `at`: the statement's or expression's own text, trimmed (without its
//!   `;`; for an `if`, its condition).
//!
//! It also takes what a user writes that the printer does not: Rust's
//! operator precedence without the printer's parentheses, `zeros::<T>([…])`,
//! `x as T`, method forms (`x.exp()`, `a.max(b)`), `a..=b`, `else if`,
//! compound assignments (`acc += x`), `f32::NEG_INFINITY`, `//` comments.
//!
//! Names are all the printer writes, so a kernel whose names clash prints a
//! text that means another kernel: a local named `inf` or `NaN` hides the
//! float, a `let` hides the scalar of its name, two scalars whose names are
//! `n` and `n * 2` read `n * 2` as the second. The macro builds none of these
//! but the first.

use crate::dtype::DType;
use crate::ir::*;
use crate::spec::ScalarKind;
use thiserror::Error;

/// Why a text is not a kernel: where (1-based line and column, in
/// characters), what was expected there and what was found.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("line {line}, column {column}: {message}")]
pub struct ParseError {
    /// The line, from 1.
    pub line: usize,
    /// The column in characters, from 1.
    pub column: usize,
    /// What was expected and what was found, or what is wrong.
    pub message: String,
}

type Result<T> = std::result::Result<T, ParseError>;

/// Nesting (parentheses, operands, blocks) deeper than this is refused, so
/// that a hostile text cannot overflow the stack.
const MAX_DEPTH: usize = 128;

impl Kernel {
    /// Reads a kernel from its textual form (what `Display` writes).
    ///
    /// ```
    /// # use tilefuse_codegen::ir::*;
    /// let k = Kernel::parse(
    ///     "kernel double(x: Tensor<f32, 1>, out: Tensor<_, 1>; n) {
    ///        for t in tile(n) {
    ///          out[t] = x[t] * 2.0;
    ///        }
    ///      }",
    /// )
    /// .unwrap();
    /// assert_eq!(k.dims[0].name, "t");
    /// assert!(matches!(&k.body[0], Stmt::Store { tensor: 1, at, .. } if at == "out[t] = x[t] * 2.0"));
    /// // Printing and parsing again gives the same kernel.
    /// assert_eq!(Kernel::parse(&k.to_string()).unwrap().to_string(), k.to_string());
    /// ```
    pub fn parse(text: &str) -> std::result::Result<Kernel, ParseError> {
        let toks = lex(text)?;
        let mut p = Parser {
            src: text,
            toks,
            pos: 0,
            k: Kernel::empty(""),
            scalar_toks: Vec::new(),
            scopes: Vec::new(),
            depth: 0,
            stop_at_until: false,
        };
        p.kernel()?;
        Ok(p.k)
    }
}

mod syntax;
mod tokens;

use syntax::*;
use tokens::*;

#[derive(Clone, Copy)]
enum Binding {
    Var(VarId),
    Tile(DimId),
}

struct Parser<'a> {
    src: &'a str,
    toks: Vec<Tok>,
    pos: usize,
    k: Kernel,
    /// The token texts of each scalar's name, to find names of several tokens.
    scalar_toks: Vec<Vec<&'a str>>,
    /// Innermost last.
    scopes: Vec<Vec<(String, Binding)>>,
    depth: usize,
    /// While reading the end of `for i in a..b.until(e)`: `.until` ends it.
    stop_at_until: bool,
}

/// A loop's iterator, read before its tiles are in scope.
enum Iter {
    /// `tile(x)`, `tile([x, each(y)])`: per tile, its host extent, `whole`, `each`.
    Extents(Vec<(ScalarId, bool, bool)>),
    /// `tile(a..b)` (`each: false`) or `a..b` (`each: true`).
    Range(Box<LoopRange>, bool),
}

impl<'a> Parser<'a> {
    // ------------------------------------------------------------ tokens

    fn tok(&self) -> Tok {
        self.toks.get(self.pos).copied().unwrap_or(Tok {
            kind: Kind::Eof,
            start: self.src.len(),
            end: self.src.len(),
        })
    }

    fn peek(&self, ahead: usize) -> Kind {
        self.toks
            .get(self.pos + ahead)
            .map_or(Kind::Eof, |t| t.kind)
    }

    fn text(&self, t: Tok) -> &'a str {
        self.src.get(t.start..t.end).unwrap_or("")
    }

    fn bump(&mut self) -> Tok {
        let t = self.tok();
        if self.pos < self.toks.len() {
            self.pos += 1;
        }
        t
    }

    /// End of the last token taken.
    fn last_end(&self) -> usize {
        self.pos
            .checked_sub(1)
            .and_then(|j| self.toks.get(j))
            .map_or(0, |t| t.end)
    }

    fn is(&self, p: &str) -> bool {
        matches!(self.tok().kind, Kind::Punct(q) if q == p)
    }

    fn is_ident(&self, name: &str) -> bool {
        let t = self.tok();
        t.kind == Kind::Ident && self.text(t) == name
    }

    fn eat(&mut self, p: &str) -> bool {
        let yes = self.is(p);
        if yes {
            self.bump();
        }
        yes
    }

    /// What the current token is, for messages.
    fn found(&self) -> String {
        let t = self.tok();
        match t.kind {
            Kind::Eof => "the end of the text".into(),
            _ => format!("`{}`", self.text(t)),
        }
    }

    fn err_at(&self, at: usize, message: impl Into<String>) -> ParseError {
        error_at(self.src, at, message.into())
    }

    /// An error at the current token: expected `what`, found it.
    fn expected(&self, what: &str) -> ParseError {
        self.err_at(
            self.tok().start,
            format!("expected {what}, found {}", self.found()),
        )
    }

    fn expect(&mut self, p: &str, context: &str) -> Result<Tok> {
        if self.is(p) {
            Ok(self.bump())
        } else {
            Err(self.expected(&format!("`{p}` {context}")))
        }
    }

    fn ident(&mut self, what: &str) -> Result<(String, usize)> {
        let t = self.tok();
        if t.kind == Kind::Ident {
            self.bump();
            Ok((self.text(t).to_string(), t.start))
        } else {
            Err(self.expected(what))
        }
    }

    fn keyword(&mut self, word: &str, context: &str) -> Result<()> {
        if self.is_ident(word) {
            self.bump();
            Ok(())
        } else {
            Err(self.expected(&format!("`{word}` {context}")))
        }
    }

    fn slice(&self, start: usize, end: usize) -> String {
        self.src.get(start..end).unwrap_or("").trim().to_string()
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err_at(
                self.tok().start,
                format!("the text nests deeper than {MAX_DEPTH} levels here"),
            ));
        }
        Ok(())
    }

    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.enter()?;
        let r = f(self);
        self.depth -= 1;
        r
    }

    // ------------------------------------------------------------ header

    fn kernel(&mut self) -> Result<()> {
        self.keyword("kernel", "at the start of the text")?;
        self.k.name = self.ident("the kernel's name after `kernel`")?.0;
        self.expect("(", "after the kernel's name")?;
        while !self.is(";") {
            if !self.k.tensors.is_empty() {
                self.expect(",", "between tensor parameters, or `;` before the scalars")?;
            }
            self.tensor_param()?;
        }
        self.bump();
        self.scalar_params()?;
        if self.eat(";") {
            self.keyword("const", "before the constant parameters")?;
            loop {
                let (name, _) = self.ident("a constant parameter's name")?;
                self.k.constexprs.push(ConstParam { name });
                if !self.eat(",") {
                    break;
                }
            }
        }
        self.expect(")", "closing the kernel's parameters")?;
        self.expect("{", "opening the kernel's body")?;
        self.grid()?;
        self.expect("}", "closing the kernel after its grid loop")?;
        if self.tok().kind != Kind::Eof {
            return Err(self.expected("the end of the text after the kernel's closing `}`"));
        }
        Ok(())
    }

    /// `x: Tensor<f32, 2>` or `out: Tensor<_, 1>`.
    fn tensor_param(&mut self) -> Result<()> {
        let (name, at) = self.ident("a tensor parameter's name, or `;` before the scalars")?;
        if self.k.tensors.iter().any(|t| t.name == name) {
            return Err(self.err_at(at, format!("tensor `{name}` is declared twice")));
        }
        self.expect(":", &format!("after tensor `{name}`"))?;
        self.keyword("Tensor", &format!("as the type of `{name}`"))?;
        self.expect("<", "after `Tensor`")?;
        let declared = if self.is_ident("_") {
            self.bump();
            None
        } else {
            Some(self.dtype()?)
        };
        self.expect(",", "between a tensor's element type and its rank")?;
        let t = self.tok();
        let rank = match t.kind {
            Kind::Int(r) => usize::try_from(r).map_err(|_| self.expected("a rank"))?,
            _ => return Err(self.expected(&format!("the rank of `{name}`"))),
        };
        self.bump();
        self.expect(">", "after a tensor's rank")?;
        self.k.tensors.push(TensorParam {
            name,
            rank,
            declared,
        });
        Ok(())
    }

    /// An element type: `f32`, or a path whose last segment is one (`half::bf16`).
    fn dtype(&mut self) -> Result<DType> {
        let (mut name, mut at) = self.ident("an element type")?;
        while self.eat("::") {
            (name, at) = self.ident("an element type")?;
        }
        DType::from_rust_name(&name).ok_or_else(|| {
            let names: Vec<&str> = DType::ALL.iter().map(|d| d.rust_name()).collect();
            self.err_at(
                at,
                format!(
                    "unknown element type `{name}`; the types are {}",
                    names.join(", ")
                ),
            )
        })
    }

    /// The tokens of one host expression, up to a `,`, `;`, `)` or `]` outside
    /// brackets: `(first token, past the last)`.
    fn host_tokens(&mut self) -> Result<(usize, usize)> {
        let first = self.pos;
        let mut depth = 0usize;
        loop {
            match self.tok().kind {
                Kind::Eof => return Err(self.expected("`)` closing a host expression")),
                Kind::Punct("(" | "[" | "{") => depth += 1,
                Kind::Punct(")" | "]" | "}") if depth > 0 => depth -= 1,
                Kind::Punct(",") | Kind::Punct(";") | Kind::Punct(")") | Kind::Punct("]")
                    if depth == 0 =>
                {
                    break
                }
                Kind::Punct("}") => break,
                _ => {}
            }
            self.bump();
        }
        Ok((first, self.pos))
    }

    fn token_texts(&self, from: usize, to: usize) -> Vec<&'a str> {
        self.toks
            .get(from..to)
            .unwrap_or(&[])
            .iter()
            .map(|t| self.text(*t))
            .collect()
    }

    /// The scalars: host expressions (`n`, `a.size(0)`), up to `;` or `)`.
    fn scalar_params(&mut self) -> Result<()> {
        if self.is(")") || self.is(";") {
            return Ok(());
        }
        loop {
            let start = self.tok().start;
            // `alpha: f32`: a scalar whose kind the source declares.
            let (name, toks, declared) = if self.tok().kind == Kind::Ident
                && self.peek(1) == Kind::Punct(":")
            {
                let name = self.text(self.tok()).to_string();
                let toks = vec![self.text(self.tok())];
                self.bump();
                self.bump();
                let kind = ScalarKind::of_type_name(self.text(self.tok()))
                    .ok_or_else(|| self.expected("a scalar type (`f32`, `i32`, `u32` or `i64`)"))?;
                self.bump();
                (name, toks, Some(kind))
            } else {
                let (from, to) = self.host_tokens()?;
                if from == to {
                    return Err(self.expected("a scalar parameter"));
                }
                let name = self.slice(start, self.last_end());
                (name, self.token_texts(from, to), None)
            };
            if self.scalar_toks.contains(&toks) {
                return Err(self.err_at(start, format!("scalar `{name}` is declared twice")));
            }
            self.k.scalars.push(ScalarParam { name, declared });
            self.scalar_toks.push(toks);
            if !self.eat(",") {
                break;
            }
        }
        if self.is(";") || self.is(")") {
            Ok(())
        } else {
            Err(self.expected("`,`, `;` or `)` after a scalar parameter"))
        }
    }

    /// A host scalar named where an extent or a start index goes.
    fn host_scalar(&mut self, what: &str) -> Result<ScalarId> {
        let at = self.tok().start;
        let (from, to) = self.host_tokens()?;
        if from == to {
            return Err(self.expected(what));
        }
        let toks = self.token_texts(from, to);
        let end = self.last_end();
        self.scalar_toks
            .iter()
            .position(|s| *s == toks)
            .ok_or_else(|| {
                self.err_at(
                    at,
                    format!(
                        "{what} `{}` is not one of the kernel's scalars ({})",
                        self.slice(at, end),
                        self.scalar_list()
                    ),
                )
            })
    }

    fn scalar_list(&self) -> String {
        name_list(
            self.k.scalars.iter().map(|s| s.name.as_str()),
            "it has none",
        )
    }

    /// One extent of `tile(…)`: `n`, `whole(n)` or `each(n)`.
    fn extent(&mut self) -> Result<(ScalarId, bool, bool)> {
        let whole = self.is_ident("whole") && self.peek(1) == Kind::Punct("(");
        let each = self.is_ident("each") && self.peek(1) == Kind::Punct("(");
        if whole || each {
            self.bump();
            self.bump();
            let s = self.host_scalar("an extent")?;
            self.expect(")", "closing the extent")?;
            Ok((s, whole, each))
        } else {
            Ok((self.host_scalar("an extent")?, false, false))
        }
    }

    /// `tm`, `(tm, tn)` or `[tm, tn]`: the names a loop binds.
    fn loop_names(&mut self) -> Result<Vec<(String, usize)>> {
        let close = if self.eat("(") {
            ")"
        } else if self.eat("[") {
            "]"
        } else {
            return Ok(vec![self.ident("a tile's name after `for`")?]);
        };
        let mut names = Vec::new();
        while !self.is(close) {
            if !names.is_empty() {
                self.expect(",", "between the names a loop binds")?;
            }
            names.push(self.ident("a tile's name")?);
        }
        self.bump();
        Ok(names)
    }

    /// `tile(` was taken: the extents up to its `)`.
    fn extents(&mut self) -> Result<Vec<(ScalarId, bool, bool)>> {
        let mut out = Vec::new();
        if self.eat("[") {
            while !self.is("]") {
                if !out.is_empty() {
                    self.expect(",", "between extents")?;
                }
                out.push(self.extent()?);
            }
            self.bump();
        } else {
            out.push(self.extent()?);
        }
        self.expect(")", "closing `tile(…)`")?;
        Ok(out)
    }

    /// `for (tm, tn) in tile([m, n]).starting_at([s, t]) { … }`: the grid.
    fn grid(&mut self) -> Result<()> {
        let for_at = self.tok().start;
        self.keyword("for", "starting the grid loop")?;
        let names = self.loop_names()?;
        self.keyword("in", "after the grid's tiles")?;
        self.keyword("tile", "as the grid's iterator")?;
        self.expect("(", "after `tile`")?;
        let extents = self.extents()?;
        if extents.len() != names.len() {
            return Err(self.err_at(
                for_at,
                format!(
                    "the grid loop binds {} tile(s) but `tile` is given {} extent(s)",
                    names.len(),
                    extents.len()
                ),
            ));
        }
        if self.is(".") && self.peek(1) == Kind::Ident {
            self.bump();
            self.keyword("starting_at", "(the grid's one method)")?;
            self.expect("(", "after `starting_at`")?;
            self.expect("[", "opening the start indices")?;
            while !self.is("]") {
                if !self.k.grid_start.is_empty() {
                    self.expect(",", "between start indices")?;
                }
                let s = self.host_scalar("a start index")?;
                self.k.grid_start.push(s);
            }
            self.bump();
            self.expect(")", "closing `starting_at`")?;
            if self.k.grid_start.len() != names.len() {
                return Err(self.err_at(
                    for_at,
                    format!(
                        "`starting_at` needs one index per tile: the grid has {}, it gives {}",
                        names.len(),
                        self.k.grid_start.len()
                    ),
                ));
            }
        }
        self.expect("{", "opening the grid loop's body")?;
        let mut scope = Vec::new();
        for ((name, _), (s, whole, each)) in names.into_iter().zip(extents) {
            let d = self.new_dim(&name, Some(s), whole, each);
            self.k.grid.push(d);
            scope.push((name, Binding::Tile(d)));
        }
        self.scopes.push(scope);
        self.k.body = self.stmts()?;
        self.scopes.pop();
        self.expect("}", "closing the grid loop")?;
        Ok(())
    }

    fn new_dim(&mut self, name: &str, extent: Option<ScalarId>, whole: bool, each: bool) -> DimId {
        self.k.dims.push(TileDim {
            name: name.to_string(),
            extent,
            whole,
            each,
        });
        self.k.dims.len() - 1
    }

    // ------------------------------------------------------------ statements

    /// Statements up to a `}` (not taken).
    fn stmts(&mut self) -> Result<Vec<Stmt>> {
        let mut out = Vec::new();
        while !self.is("}") {
            if self.tok().kind == Kind::Eof {
                return Err(self.expected("a statement or `}`"));
            }
            self.nested(|p| p.stmt(&mut out))?;
        }
        Ok(out)
    }

    /// `{ statements }` in a scope of its own (holding `scope`).
    fn block(&mut self, scope: Vec<(String, Binding)>, what: &str) -> Result<Vec<Stmt>> {
        self.expect("{", &format!("opening {what}"))?;
        self.scopes.push(scope);
        let body = self.stmts();
        self.scopes.pop();
        let body = body?;
        self.expect("}", &format!("closing {what}"))?;
        Ok(body)
    }

    fn stmt(&mut self, out: &mut Vec<Stmt>) -> Result<()> {
        let start = self.tok().start;
        if self.is_ident("let") {
            self.bump();
            let mutable = self.is_ident("mut");
            if mutable {
                self.bump();
            }
            let (name, _) = self.ident("a name after `let`")?;
            self.expect("=", &format!("after `let {name}`"))?;
            let node = self.expr_node()?;
            // `let old = atomic_add(…);` keeps the old values (see `Stmt::Atomic`).
            let fetch = matches!(&strip(&node).kind, N::Call { name, .. } if AtomicOp::from_name(name).is_some());
            let mut s = match fetch {
                true => self.call_stmt(strip(&node))?,
                false => Stmt::Let {
                    var: 0,
                    value: self.expr(&node, false)?,
                    at: String::new(),
                },
            };
            let at = self.slice(start, self.last_end());
            self.expect(";", "after the `let` statement")?;
            self.k.vars.push(Var {
                name: name.clone(),
                mutable,
            });
            let var = self.k.vars.len() - 1;
            self.bind(name, Binding::Var(var));
            match &mut s {
                Stmt::Atomic { old, at: a, .. } => (*old, *a) = (Some(var), at),
                Stmt::Let { var: v, at: a, .. } => (*v, *a) = (var, at),
                _ => {}
            }
            out.push(s);
            return Ok(());
        }
        if self.is_ident("for") {
            return self.loop_stmt(out);
        }
        if self.is_ident("if") {
            let s = self.if_stmt()?;
            out.push(s);
            return Ok(());
        }
        if self.is("{") {
            let body = self.block(Vec::new(), "a block")?;
            out.extend(body);
            return Ok(());
        }
        let lhs = self.expr_node()?;
        if self.is("=") {
            self.bump();
            let value = self.expr_node()?;
            let value = self.expr(&value, false)?;
            let at = self.slice(start, self.last_end());
            self.expect(";", "after the assignment")?;
            out.push(self.assign(&lhs, value, at)?);
            return Ok(());
        }
        if let Kind::Punct(p) = self.tok().kind {
            if let Some(op) = compound_op(p) {
                self.bump();
                let rhs = self.expr_node()?;
                let rhs = self.expr(&rhs, false)?;
                let at = self.slice(start, self.last_end());
                self.expect(";", &format!("after the `{p}` statement"))?;
                let value = Expr::Binary {
                    op,
                    lhs: Box::new(self.expr(&lhs, false)?),
                    rhs: Box::new(rhs),
                    at: at.clone(),
                };
                out.push(self.assign(&lhs, value, at)?);
                return Ok(());
            }
        }
        let s = self.call_stmt(&lhs)?;
        if !self.is(";") {
            return Err(self.expected("`;` after the statement"));
        }
        self.bump();
        out.push(s);
        Ok(())
    }

    fn bind(&mut self, name: String, b: Binding) {
        if let Some(s) = self.scopes.last_mut() {
            s.push((name, b));
        }
    }

    fn lookup(&self, name: &str) -> Option<Binding> {
        self.scopes
            .iter()
            .rev()
            .find_map(|s| s.iter().rev().find(|(n, _)| n == name).map(|(_, b)| *b))
    }

    /// `var = value` or `t[index] = value`.
    fn assign(&self, lhs: &Node, value: Expr, at: Src) -> Result<Stmt> {
        match &lhs.kind {
            N::Name(name) => match self.lookup(name) {
                Some(Binding::Var(var)) => {
                    if !self.k.vars.get(var).is_some_and(|v| v.mutable) {
                        return Err(self.err_at(
                            lhs.start,
                            format!("cannot assign twice to `{name}`: declare it `let mut {name}`"),
                        ));
                    }
                    Ok(Stmt::Assign { var, value, at })
                }
                _ => Err(self.err_at(
                    lhs.start,
                    format!(
                        "`{name}` is not a local value; assign to a `let mut` name or store into a tensor, `out[(tm, tn)] = …`"
                    ),
                )),
            },
            N::Index(base, arg) => {
                let (tensor, index) = self.index(base, arg)?;
                Ok(Stmt::Store {
                    tensor,
                    index,
                    value,
                    at,
                })
            }
            _ => Err(self.err_at(
                lhs.start,
                "assign to a `let mut` name or to a tensor tile like `out[(tm, tn)]`",
            )),
        }
    }

    /// `atomic_add(t[index], v)`, `wait(t, index, v)`, `signal(t, index, v)`.
    fn call_stmt(&self, n: &Node) -> Result<Stmt> {
        let at = self.slice(n.start, n.end);
        let N::Call { name, args, .. } = &n.kind else {
            return Err(self.err_at(
                n.start,
                "this expression does nothing here; a statement is `let`, an assignment, a store \
                 `t[index] = value;`, an atomic, `wait`, `signal`, `for` or `if`",
            ));
        };
        let arity = |k: usize, form: &str| {
            if args.len() == k {
                Ok(())
            } else {
                Err(self.err_at(n.start, format!("`{name}` takes {k} arguments: `{form}`")))
            }
        };
        if let Some(op) = AtomicOp::from_name(name) {
            arity(2, &format!("{name}(t[index], value)"))?;
            let (Some(place), Some(value)) = (args.first(), args.get(1)) else {
                return Err(self.err_at(n.start, "missing arguments"));
            };
            let N::Index(base, arg) = &strip(place).kind else {
                return Err(self.err_at(
                    place.start,
                    format!("the first argument of `{name}` is the place to update, a tensor index such as `out[(tm, tn)]`"),
                ));
            };
            let (tensor, index) = self.index(base, arg)?;
            let value = self.expr(value, false)?;
            return Ok(Stmt::Atomic {
                op,
                tensor,
                index,
                value,
                old: None,
                at,
            });
        }
        let flags = name == "wait" || name == "signal";
        if !flags {
            return Err(self.err_at(
                n.start,
                format!(
                    "`{name}(…)` does nothing as a statement; the statements that call are {}, `wait` and `signal`",
                    AtomicOp::ALL.iter().map(|o| format!("`{}`", o.name())).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        arity(3, &format!("{name}(flags, index, value)"))?;
        let (Some(t), Some(ix), Some(value)) = (args.first(), args.get(1), args.get(2)) else {
            return Err(self.err_at(n.start, "missing arguments"));
        };
        let tensor = self.tensor_named(t)?;
        let value = self.expr(value, false)?;
        if name == "wait" {
            // `wait(flags, lo..hi, v)`: every flag of the range.
            let (index, end) = match &ix.kind {
                N::Range(lo, hi, closed) => {
                    let r = self.loop_range(lo, hi, *closed)?;
                    (r.begin, Some(r.end))
                }
                _ => (self.expr(ix, false)?, None),
            };
            return Ok(Stmt::Wait {
                tensor,
                index,
                end,
                value,
                at,
            });
        }
        Ok(Stmt::Signal {
            tensor,
            index: self.expr(ix, false)?,
            value,
            at,
        })
    }

    fn tensor_named(&self, n: &Node) -> Result<TensorId> {
        let N::Name(name) = &n.kind else {
            return Err(self.err_at(n.start, "expected a tensor, by name"));
        };
        self.tensor_id(name, n.start)
    }

    fn tensor_id(&self, name: &str, at: usize) -> Result<TensorId> {
        if let Some(b) = self.lookup(name) {
            let what = if matches!(b, Binding::Tile(_)) {
                "tile"
            } else {
                "local value"
            };
            return Err(self.err_at(
                at,
                format!(
                    "`{name}` is a {what}, not a tensor; only the kernel's tensors are indexed"
                ),
            ));
        }
        self.k
            .tensors
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| {
                self.err_at(
                    at,
                    format!(
                        "unknown tensor `{name}`; the kernel's tensors are {}",
                        self.tensor_list()
                    ),
                )
            })
    }

    fn tensor_list(&self) -> String {
        name_list(self.k.tensors.iter().map(|t| t.name.as_str()), "none")
    }

    /// `if cond { … } [else { … } | else if …]`.
    fn if_stmt(&mut self) -> Result<Stmt> {
        self.keyword("if", "")?;
        let c = self.expr_node()?;
        let cond = self.cond(&c, false)?;
        let at = self.slice(c.start, c.end);
        let then = self.block(Vec::new(), "the `if` branch")?;
        let otherwise = if self.is_ident("else") {
            self.bump();
            if self.is_ident("if") {
                let s = self.nested(|p| p.if_stmt())?;
                vec![s]
            } else {
                self.block(Vec::new(), "the `else` branch")?
            }
        } else {
            Vec::new()
        };
        Ok(Stmt::If {
            cond,
            then,
            otherwise,
            at,
        })
    }

    /// `for t in tile(…)[.until(e)] { … }` or `for i in a..b { … }`.
    fn loop_stmt(&mut self, out: &mut Vec<Stmt>) -> Result<()> {
        let for_at = self.tok().start;
        self.keyword("for", "")?;
        let names = self.loop_names()?;
        self.keyword("in", "after the loop's tiles")?;
        let iter = if self.is_ident("tile") && self.peek(1) == Kind::Punct("(") {
            self.bump();
            self.bump();
            if self.range_ahead() {
                let r = self.range("`)` closing `tile(…)`")?;
                self.expect(")", "closing `tile(…)`")?;
                Iter::Range(Box::new(r), false)
            } else {
                Iter::Extents(self.extents()?)
            }
        } else {
            // `(a..b).until(e)`: the parentheses Rust needs for the method.
            let paren = self.is("(") && self.range_ahead_in_paren();
            if paren {
                self.bump();
            }
            self.stop_at_until = !paren;
            let r = self.range("`..` in the loop's range (or `tile(…)`)");
            self.stop_at_until = false;
            let r = r?;
            if paren {
                self.expect(")", "closing the range")?;
            }
            Iter::Range(Box::new(r), true)
        };
        let until = if self.is(".") && self.peek(1) == Kind::Ident {
            self.bump();
            self.keyword("until", "(the one method of a loop's iterator)")?;
            self.expect("(", "after `until`")?;
            let e = self.expr_node()?;
            let e = self.expr(&e, false)?;
            self.expect(")", "closing `until(…)`")?;
            Some(e)
        } else {
            None
        };
        let count = match &iter {
            Iter::Extents(e) => e.len(),
            Iter::Range(..) => 1,
        };
        if count != names.len() {
            return Err(self.err_at(
                for_at,
                format!(
                    "the loop binds {} tile(s) but its iterator gives {count}",
                    names.len()
                ),
            ));
        }
        if until.is_some() && count != 1 {
            return Err(self.err_at(
                for_at,
                "`.until(bound)` bounds a loop over one tile: `for tn in tile(n).until(bound)`",
            ));
        }
        let mut dims = Vec::new();
        let mut scope = Vec::new();
        match iter {
            Iter::Extents(ext) => {
                for ((name, _), (s, whole, each)) in names.into_iter().zip(ext) {
                    let d = self.new_dim(&name, Some(s), whole, each);
                    dims.push((d, None));
                    scope.push((name, Binding::Tile(d)));
                }
            }
            Iter::Range(r, each) => {
                if let Some((name, _)) = names.into_iter().next() {
                    let d = self.new_dim(&name, None, false, each);
                    dims.push((d, Some(r)));
                    scope.push((name, Binding::Tile(d)));
                }
            }
        }
        let mut body = self.block(scope, "the loop's body")?;
        let mut until = until;
        for (dim, range) in dims.into_iter().rev() {
            body = vec![Stmt::Loop {
                dim,
                body,
                until: until.take(),
                range,
            }];
        }
        out.extend(body);
        Ok(())
    }

    /// Whether a `..` comes before the `)` that closes the current bracket.
    fn range_ahead(&self) -> bool {
        let mut depth = 0usize;
        for t in self.toks.get(self.pos..).unwrap_or(&[]) {
            match t.kind {
                Kind::Punct("(" | "[" | "{") => depth += 1,
                Kind::Punct(")" | "]" | "}") => {
                    if depth == 0 {
                        return false;
                    }
                    depth -= 1;
                }
                Kind::Punct(".." | "..=") if depth == 0 => return true,
                Kind::Eof => return false,
                _ => {}
            }
        }
        false
    }

    /// At `(`: whether it holds a range (`(a..b)`).
    fn range_ahead_in_paren(&mut self) -> bool {
        self.pos += 1;
        let yes = self.range_ahead();
        self.pos -= 1;
        yes
    }

    /// `a..b` or `a..=b`, both ends values of the program.
    fn range(&mut self, what: &str) -> Result<LoopRange> {
        let begin = self.expr_node()?;
        let closed = if self.is("..") {
            false
        } else if self.is("..=") {
            true
        } else {
            return Err(self.expected(what));
        };
        self.bump();
        let end = self.expr_node()?;
        self.loop_range(&begin, &end, closed)
    }

    /// The bounds `lo..hi` (`closed`: `lo..=hi`, whose end is `hi + 1`).
    fn loop_range(&self, lo: &Node, hi: &Node, closed: bool) -> Result<LoopRange> {
        let begin = self.expr(lo, false)?;
        let mut end = self.expr(hi, false)?;
        if closed {
            end = Expr::Binary {
                op: BinOp::Add,
                lhs: Box::new(end),
                rhs: Box::new(Expr::Int(1)),
                at: self.slice(lo.start, hi.end),
            };
        }
        Ok(LoopRange { begin, end })
    }

    // ------------------------------------------------------------ expressions

    fn expr_node(&mut self) -> Result<Node> {
        self.nested(|p| p.binary(1))
    }

    /// Operators of precedence `min` and above, left to right (comparisons
    /// do not chain, as in Rust).
    fn binary(&mut self, min: u8) -> Result<Node> {
        let mut lhs = self.cast_node()?;
        let mut folds = 0;
        let r = loop {
            let Kind::Punct(p) = self.tok().kind else {
                break Ok(lhs);
            };
            let Some((op, prec)) = binary_op(p) else {
                break Ok(lhs);
            };
            if prec < min {
                break Ok(lhs);
            }
            if let (Op::Cmp(_), N::Bin(Op::Cmp(_), ..)) = (op, &lhs.kind) {
                break Err(self.err_at(
                    self.tok().start,
                    "comparisons cannot be chained; add parentheses",
                ));
            }
            self.bump();
            if let Err(e) = self.enter() {
                break Err(e);
            }
            folds += 1;
            let rhs = match self.binary(prec + 1) {
                Ok(r) => r,
                Err(e) => break Err(e),
            };
            lhs = Node {
                start: lhs.start,
                end: rhs.end,
                kind: N::Bin(op, Box::new(lhs), Box::new(rhs)),
            };
        };
        self.depth -= folds;
        r
    }

    /// `x as T` (binds tighter than `*`, looser than `-x`).
    fn cast_node(&mut self) -> Result<Node> {
        let mut n = self.unary()?;
        let mut folds = 0;
        let r = loop {
            if !self.is_ident("as") {
                break Ok(n);
            }
            self.bump();
            if let Err(e) = self.enter() {
                break Err(e);
            }
            folds += 1;
            match self.dtype() {
                Ok(t) => {
                    n = Node {
                        start: n.start,
                        end: self.last_end(),
                        kind: N::As(Box::new(n), t),
                    }
                }
                Err(e) => break Err(e),
            }
        };
        self.depth -= folds;
        r
    }

    fn unary(&mut self) -> Result<Node> {
        let start = self.tok().start;
        let neg = self.is("-");
        if neg || self.is("!") {
            self.bump();
            let arg = Box::new(self.nested(|p| p.unary())?);
            let end = arg.end;
            let kind = if neg { N::Neg(arg) } else { N::Not(arg) };
            return Ok(Node { kind, start, end });
        }
        self.postfix()
    }

    /// A primary followed by methods (`.cast::<f32>()`, `.sum(tn)`) and indices.
    fn postfix(&mut self) -> Result<Node> {
        let mut n = self.primary()?;
        let mut folds = 0;
        let r = loop {
            let step = if self.is(".") && self.peek(1) == Kind::Ident {
                let name_tok = self.toks.get(self.pos + 1).copied();
                let name = name_tok.map_or("", |t| self.text(t));
                if self.stop_at_until && name == "until" {
                    break Ok(n);
                }
                self.method(n)
            } else if self.is("[") {
                self.index_node(n)
            } else {
                break Ok(n);
            };
            if let Err(e) = self.enter() {
                break Err(e);
            }
            folds += 1;
            match step {
                Ok(m) => n = m,
                Err(e) => break Err(e),
            }
        };
        self.depth -= folds;
        r
    }

    fn method(&mut self, recv: Node) -> Result<Node> {
        self.bump();
        let (name, name_at) = self.ident("a method's name after `.`")?;
        let ty = self.turbofish()?;
        self.expect("(", &format!("after `.{name}`"))?;
        let args = self.args(")")?;
        Ok(Node {
            start: recv.start,
            end: self.last_end(),
            kind: N::Method {
                recv: Box::new(recv),
                name,
                name_at,
                ty,
                args,
            },
        })
    }

    fn index_node(&mut self, base: Node) -> Result<Node> {
        self.bump();
        let arg = self.expr_node()?;
        self.expect("]", "closing the index")?;
        Ok(Node {
            start: base.start,
            end: self.last_end(),
            kind: N::Index(Box::new(base), Box::new(arg)),
        })
    }

    /// `::<T>` after a function or method name, if there.
    fn turbofish(&mut self) -> Result<Option<DType>> {
        if !self.eat("::") {
            return Ok(None);
        }
        self.expect("<", "after `::` (a type argument, `::<f32>`)")?;
        let t = self.dtype()?;
        self.expect(">", "closing the type argument")?;
        Ok(Some(t))
    }

    /// Comma-separated expressions up to `close` (taken).
    fn args(&mut self, close: &str) -> Result<Vec<Node>> {
        let mut args = Vec::new();
        while !self.is(close) {
            if !args.is_empty() {
                self.expect(",", &format!("between arguments, or `{close}`"))?;
                if self.is(close) {
                    break;
                }
            }
            let arg = self.expr_node()?;
            let closed = self.is("..=");
            if closed || self.is("..") {
                self.bump();
                let end = self.expr_node()?;
                args.push(Node {
                    start: arg.start,
                    end: end.end,
                    kind: N::Range(Box::new(arg), Box::new(end), closed),
                });
            } else {
                args.push(arg);
            }
        }
        self.bump();
        Ok(args)
    }

    fn primary(&mut self) -> Result<Node> {
        let t = self.tok();
        let start = t.start;
        if let Some(s) = self.host_scalar_here() {
            return Ok(Node {
                kind: N::HostScalar(s),
                start,
                end: self.last_end(),
            });
        }
        let kind = match t.kind {
            Kind::Int(v) => {
                self.bump();
                N::Int(v)
            }
            Kind::Float(v) => {
                self.bump();
                N::Float(v)
            }
            Kind::Ident if self.text(t) == "if" => return self.if_node(),
            Kind::Ident => {
                self.bump();
                let name = self.text(t).to_string();
                if self.is("::") && self.peek(1) == Kind::Ident {
                    let mut path = vec![name];
                    while self.is("::") && self.peek(1) == Kind::Ident {
                        self.bump();
                        path.push(self.ident("a name")?.0);
                    }
                    if self.is("(") || self.is("::") {
                        return Err(self.err_at(start, "device code calls functions by plain name"));
                    }
                    N::Path(path)
                } else {
                    let ty = self.turbofish()?;
                    if self.eat("(") {
                        N::Call {
                            name,
                            ty,
                            args: self.args(")")?,
                        }
                    } else if ty.is_some() {
                        return Err(self.expected(&format!("`(` after `{name}::<…>`")));
                    } else {
                        N::Name(name)
                    }
                }
            }
            Kind::Punct("(") => {
                self.bump();
                let mut items = Vec::new();
                let mut comma = false;
                while !self.is(")") {
                    if !items.is_empty() {
                        self.expect(",", "or `)` in parentheses")?;
                        comma = true;
                        if self.is(")") {
                            break;
                        }
                    }
                    items.push(self.expr_node()?);
                }
                self.bump();
                match (items.pop(), comma) {
                    (Some(one), false) if items.is_empty() => N::Paren(Box::new(one)),
                    (Some(last), _) => {
                        items.push(last);
                        N::Tuple(items)
                    }
                    (None, _) => N::Tuple(items),
                }
            }
            Kind::Punct("[") => {
                self.bump();
                N::Array(self.args("]")?)
            }
            Kind::Punct("{") => {
                self.bump();
                let e = self.expr_node()?;
                self.expect("}", "closing the block (a block holds one value)")?;
                N::Block(Box::new(e))
            }
            _ => return Err(self.expected("a value")),
        };
        Ok(Node {
            kind,
            start,
            end: self.last_end(),
        })
    }

    /// A scalar whose name is several tokens (`a.size(0)`) starting here:
    /// taken, the longest that matches.
    fn host_scalar_here(&mut self) -> Option<ScalarId> {
        let ahead = self.toks.get(self.pos..).unwrap_or(&[]);
        let mut best: Option<(ScalarId, usize)> = None;
        for (s, toks) in self.scalar_toks.iter().enumerate() {
            if toks.len() < 2 || toks.len() > ahead.len() {
                continue;
            }
            let same = toks
                .iter()
                .zip(ahead)
                .all(|(a, t)| *a == self.src.get(t.start..t.end).unwrap_or(""));
            if same && best.is_none_or(|(_, n)| toks.len() > n) {
                best = Some((s, toks.len()));
            }
        }
        let (s, n) = best?;
        self.pos += n;
        Some(s)
    }

    /// `if cond { a } else { b }` as a value (`else if` chains).
    fn if_node(&mut self) -> Result<Node> {
        let start = self.tok().start;
        self.bump();
        let cond = self.expr_node()?;
        self.expect("{", "opening the `if` value's first branch")?;
        let then = self.expr_node()?;
        self.expect(
            "}",
            "closing the branch (a branch of an `if` value is one value)",
        )?;
        self.keyword("else", "(an `if` used as a value needs both branches)")?;
        let otherwise = if self.is_ident("if") {
            self.nested(|p| p.if_node())?
        } else {
            self.expect("{", "opening the `else` branch")?;
            let e = self.expr_node()?;
            self.expect(
                "}",
                "closing the branch (a branch of an `if` value is one value)",
            )?;
            e
        };
        Ok(Node {
            kind: N::If(Box::new(cond), Box::new(then), Box::new(otherwise)),
            start,
            end: self.last_end(),
        })
    }

    // ------------------------------------------------------------ resolution

    fn at(&self, n: &Node) -> Src {
        self.slice(n.start, n.end)
    }

    /// The value `n` stands for; `ix`: inside a tensor index, where a bare
    /// tile is its indices.
    fn expr(&self, n: &Node, ix: bool) -> Result<Expr> {
        let b = |x: &Node| self.expr(x, ix).map(Box::new);
        Ok(match &n.kind {
            N::Name(name) => self.name(name, n.start, ix)?,
            N::HostScalar(s) => Expr::Scalar(*s),
            N::Int(v) => Expr::Int(self.int(*v, false, n)?),
            N::Float(v) => Expr::Float(*v),
            N::Path(path) => Expr::Float(self.path(path, n)?),
            N::Paren(inner) => match self.negative_literal(inner)? {
                Some(e) => e,
                None => self.expr(inner, ix)?,
            },
            N::Block(inner) => self.expr(inner, ix)?,
            N::Tuple(_) | N::Array(_) => {
                return Err(self.err_at(
                    n.start,
                    "a list is not a value; lists are a tensor's index `t[(a, b)]` and the tiles of `full::<f32>([tm, tn], 0.0)`",
                ))
            }
            N::Neg(arg) => Expr::Unary {
                op: UnOp::Neg,
                arg: b(arg)?,
            },
            N::Not(arg) => Expr::Unary {
                op: UnOp::Not,
                arg: b(arg)?,
            },
            N::Bin(op, l, r) => {
                let (lhs, rhs, at) = (b(l)?, b(r)?, self.at(n));
                match op {
                    Op::Cmp(op) => Expr::Compare {
                        op: *op,
                        lhs,
                        rhs,
                        at,
                    },
                    // On masks `&&` and `||` are `&` and `|` (both sides
                    // computed), as the macro reads them.
                    Op::And | Op::Or | Op::Bin(_) => Expr::Binary {
                        op: match op {
                            Op::Bin(o) => *o,
                            Op::And => BinOp::BitAnd,
                            _ => BinOp::BitOr,
                        },
                        lhs,
                        rhs,
                        at,
                    },
                }
            }
            N::As(arg, t) => Expr::Cast {
                arg: b(arg)?,
                dtype: Some(*t),
            },
            N::Call { name, ty, args } => self.call(n, name, *ty, args, ix)?,
            N::Method {
                recv,
                name,
                name_at,
                ty,
                args,
            } => self.method_expr(n, recv, name, *name_at, *ty, args, ix)?,
            N::Index(base, arg) => {
                let (tensor, index) = self.index(base, arg)?;
                Expr::Load {
                    tensor,
                    index,
                    at: self.at(n),
                }
            }
            N::Range(..) => {
                return Err(self.err_at(
                    n.start,
                    "a range is not a value; loop over it (`for i in a..b`, `for t in tile(a..b)`) or wait on it (`wait(flags, lo..hi, value)`)",
                ))
            }
            N::If(c, then, otherwise) => Expr::IfConst {
                cond: Box::new(self.cond(c, ix)?),
                then: b(then)?,
                otherwise: b(otherwise)?,
                at: self.at(c),
            },
        })
    }

    /// `(-1)`, `(-0.5)`, `(-inf)`: one negative literal.
    fn negative_literal(&self, inner: &Node) -> Result<Option<Expr>> {
        let N::Neg(x) = &inner.kind else {
            return Ok(None);
        };
        Ok(match &x.kind {
            N::Int(v) => Some(Expr::Int(self.int(*v, true, x)?)),
            N::Float(v) => Some(Expr::Float(-v)),
            N::Name(name) if name == "inf" && self.lookup(name).is_none() => {
                Some(Expr::Float(f64::NEG_INFINITY))
            }
            _ => None,
        })
    }

    fn int(&self, v: u128, negative: bool, n: &Node) -> Result<i64> {
        let v = i128::try_from(v)
            .ok()
            .map(|v| if negative { -v } else { v });
        v.and_then(|v| i64::try_from(v).ok()).ok_or_else(|| {
            self.err_at(
                n.start,
                format!("the integer `{}` does not fit in an i64", self.at(n)),
            )
        })
    }

    /// `f32::INFINITY`, `f32::NEG_INFINITY`, `f32::NAN`, and the bounds of
    /// the types a double holds exactly (`i32::MIN`), as the macro takes them.
    fn path(&self, path: &[String], n: &Node) -> Result<f64> {
        let p: Vec<&str> = path.iter().map(String::as_str).collect();
        let v = match p.as_slice() {
            [.., "INFINITY"] => Some(f64::INFINITY),
            [.., "NEG_INFINITY"] => Some(f64::NEG_INFINITY),
            [.., "NAN"] => Some(f64::NAN),
            [ty, bound @ ("MIN" | "MAX")] => {
                let max = *bound == "MAX";
                match *ty {
                    "i8" => Some(if max { i8::MAX as f64 } else { i8::MIN as f64 }),
                    "i16" => Some(if max {
                        i16::MAX as f64
                    } else {
                        i16::MIN as f64
                    }),
                    "i32" => Some(if max {
                        i32::MAX as f64
                    } else {
                        i32::MIN as f64
                    }),
                    "u8" => Some(if max { u8::MAX as f64 } else { 0.0 }),
                    "u16" => Some(if max { u16::MAX as f64 } else { 0.0 }),
                    "u32" => Some(if max { u32::MAX as f64 } else { 0.0 }),
                    "i64" if !max => Some(i64::MIN as f64),
                    "f32" => Some(if max {
                        f32::MAX as f64
                    } else {
                        f32::MIN as f64
                    }),
                    _ => None,
                }
            }
            _ => None,
        };
        v.ok_or_else(|| {
            self.err_at(
                n.start,
                format!(
                    "`{}` is not a value of device code (it takes `f32::INFINITY`, `f32::NEG_INFINITY`, `f32::NAN` and exact type bounds like `i32::MIN`)",
                    self.at(n)
                ),
            )
        })
    }

    fn name(&self, name: &str, at: usize, ix: bool) -> Result<Expr> {
        match self.lookup(name) {
            Some(Binding::Var(v)) => return Ok(Expr::Var(v)),
            Some(Binding::Tile(d)) => {
                if ix || self.k.is_each(d) {
                    return Ok(Expr::TileIndex(d));
                }
                return Err(self.err_at(
                    at,
                    format!(
                        "tile `{name}` is not a value; use `{name}.index()` (each element's index), \
                         `{name}.begin()`, `{name}.end()` or `{name}.size()` (inside a tensor index, \
                         a bare `{name}` is its indices: `x[{name}]`, `x[{name} + 1]`)"
                    ),
                ));
            }
            None => {}
        }
        if let Some(c) = self.k.constexprs.iter().position(|c| c.name == name) {
            return Ok(Expr::Const(c));
        }
        if let Some(s) = self.scalar_toks.iter().position(|t| t.as_slice() == [name]) {
            return Ok(Expr::Scalar(s));
        }
        match name {
            "inf" => return Ok(Expr::Float(f64::INFINITY)),
            "NaN" => return Ok(Expr::Float(f64::NAN)),
            _ => {}
        }
        if self.k.tensors.iter().any(|t| t.name == name) {
            return Err(self.err_at(
                at,
                format!("`{name}` is a tensor, not a value; load from it by index, `{name}[…]`"),
            ));
        }
        Err(self.err_at(
            at,
            format!(
                "unknown name `{name}`: not a local value or tile in scope, a constant or a scalar ({})",
                self.scalar_list()
            ),
        ))
    }

    /// `t[i]`, `t[(i, j)]`, `t[[i, j]]`: the tensor and one index expression
    /// per component, a bare tile being its indices.
    fn index(&self, base: &Node, arg: &Node) -> Result<(TensorId, Vec<Expr>)> {
        let N::Name(name) = &base.kind else {
            return Err(self.err_at(
                base.start,
                "only the kernel's tensors can be indexed, by name",
            ));
        };
        let tensor = self.tensor_id(name, base.start)?;
        let parts: Vec<&Node> = match &arg.kind {
            N::Tuple(v) | N::Array(v) => v.iter().collect(),
            _ => vec![arg],
        };
        let index = parts
            .into_iter()
            .map(|p| self.expr(p, true))
            .collect::<Result<Vec<_>>>()?;
        Ok((tensor, index))
    }

    /// The tile a node names (a bare name bound by an enclosing loop).
    fn tile_ref(&self, n: &Node) -> Option<DimId> {
        match &strip(n).kind {
            N::Name(name) => match self.lookup(name) {
                Some(Binding::Tile(d)) => Some(d),
                _ => None,
            },
            _ => None,
        }
    }

    /// `[tm, tn]`: tiles by name.
    fn tile_list(&self, n: &Node) -> Result<Vec<DimId>> {
        let items: Vec<&Node> = match &n.kind {
            N::Array(v) | N::Tuple(v) => v.iter().collect(),
            N::Paren(x) => vec![x],
            _ => vec![n],
        };
        items
            .into_iter()
            .map(|x| {
                self.tile_ref(x).ok_or_else(|| {
                    self.err_at(
                        x.start,
                        "the tiles of a value are names bound by enclosing `tile()` loops, e.g. `zeros::<f32>([tm, tn])`",
                    )
                })
            })
            .collect()
    }

    /// The number `full` fills with: a literal, negated or not, or a path.
    fn fill_value(&self, n: &Node) -> Result<f64> {
        match &n.kind {
            N::Int(v) => Ok(*v as f64),
            N::Float(v) => Ok(*v),
            N::Neg(x) => Ok(-self.fill_value(x)?),
            N::Paren(x) => self.fill_value(x),
            N::Path(p) => self.path(p, n),
            // A number goes here, whatever the names in scope.
            N::Name(name) if name == "inf" => Ok(f64::INFINITY),
            N::Name(name) if name == "NaN" => Ok(f64::NAN),
            _ => Err(self.err_at(
                n.start,
                format!(
                    "the value of `full` is a number (`0.0`, `-inf`, `f32::NEG_INFINITY`), not `{}`",
                    self.at(n)
                ),
            )),
        }
    }

    fn call(
        &self,
        n: &Node,
        name: &str,
        ty: Option<DType>,
        args: &[Node],
        ix: bool,
    ) -> Result<Expr> {
        let arity = |k: usize, form: &str| {
            if args.len() == k {
                Ok(())
            } else {
                Err(self.err_at(
                    n.start,
                    format!(
                        "`{name}` takes {k} argument{}: `{form}`; here {}",
                        if k == 1 { "" } else { "s" },
                        args.len()
                    ),
                ))
            }
        };
        let arg = |i: usize| -> Result<Box<Expr>> {
            let a = args
                .get(i)
                .ok_or_else(|| self.err_at(n.start, format!("`{name}` is missing an argument")))?;
            self.expr(a, ix).map(Box::new)
        };
        if ty.is_some() && !matches!(name, "zeros" | "full") {
            return Err(self.err_at(
                n.start,
                format!("`{name}` takes no type argument; `zeros::<T>` and `full::<T>` do"),
            ));
        }
        let at = self.at(n);
        Ok(match name {
            "addmm" => {
                arity(3, "addmm(acc, a, b)")?;
                Expr::Addmm {
                    acc: arg(0)?,
                    a: arg(1)?,
                    b: arg(2)?,
                    at,
                }
            }
            "zeros" | "full" => {
                let full = name == "full";
                if full {
                    arity(2, "full::<f32>([tm, tn], value)")?;
                } else {
                    arity(1, "zeros::<f32>([tm, tn])")?;
                }
                let (Some(tiles), value) = (args.first(), args.get(1)) else {
                    return Err(self.err_at(n.start, format!("`{name}` needs its tiles")));
                };
                Expr::Full {
                    dims: self.tile_list(tiles)?,
                    dtype: ty.unwrap_or(DType::F32),
                    value: match value {
                        Some(v) => self.fill_value(v)?,
                        None => 0.0,
                    },
                }
            }
            "select" => {
                arity(3, "select(mask, a, b)")?;
                Expr::Select {
                    mask: arg(0)?,
                    then: arg(1)?,
                    otherwise: arg(2)?,
                    at,
                }
            }
            "wait" | "signal" => {
                return Err(self.err_at(
                    n.start,
                    format!("`{name}(…, index, value)` is a statement: write it on its own, ending with `;`"),
                ))
            }
            "tile" | "each" | "whole" => {
                return Err(self.err_at(
                    n.start,
                    format!("`{name}(…)` describes the iterator of a `for` loop: `for t in tile(…)`"),
                ))
            }
            _ if AtomicOp::from_name(name).is_some() => {
                return Err(self.err_at(
                    n.start,
                    format!("`{name}(t[index], value)` is a statement: write it on its own, ending with `;`, or keep the places' old values with `let old = {name}(t[index], value);`"),
                ))
            }
            _ => {
                if let Some(kind) = RandKind::from_name(name) {
                    arity(2, &format!("{name}(seed, offset)"))?;
                    Expr::Rand {
                        kind,
                        seed: arg(0)?,
                        offset: arg(1)?,
                        at,
                    }
                } else if let Some(op) = BinOp::from_function(name) {
                    arity(2, &format!("{name}(a, b)"))?;
                    Expr::Binary {
                        op,
                        lhs: arg(0)?,
                        rhs: arg(1)?,
                        at,
                    }
                } else if let Some(op) = UnOp::from_name(name) {
                    arity(1, &format!("{name}(x)"))?;
                    Expr::Unary { op, arg: arg(0)? }
                } else {
                    let help = match crate::prims::nearest_function(name) {
                        Some(f) => format!("did you mean `{f}`?"),
                        None => format!("the DSL has {}", crate::prims::function_names()),
                    };
                    return Err(self.err_at(n.start, format!("unknown function `{name}`; {help}")));
                }
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn method_expr(
        &self,
        n: &Node,
        recv: &Node,
        name: &str,
        name_at: usize,
        ty: Option<DType>,
        args: &[Node],
        ix: bool,
    ) -> Result<Expr> {
        let no_args = || {
            if args.is_empty() {
                Ok(())
            } else {
                Err(self.err_at(name_at, format!("`.{name}()` takes no arguments")))
            }
        };
        if ty.is_some() && !matches!(name, "cast" | "to") {
            return Err(self.err_at(
                name_at,
                format!("`.{name}` takes no type argument; `.cast::<T>()` does"),
            ));
        }
        if matches!(name, "begin" | "end" | "size" | "index") {
            let d = self.tile_ref(recv).ok_or_else(|| {
                self.err_at(
                    recv.start,
                    format!("`.{name}()` is a method of tiles (the names bound by `tile()` loops)"),
                )
            })?;
            no_args()?;
            return Ok(match name {
                "begin" => Expr::TileBegin(d),
                "end" => Expr::TileEnd(d),
                "index" => Expr::TileIndex(d),
                _ => Expr::TileSize(d),
            });
        }
        // `.sum(t)`, `.max(t)` with a tile: a reduction along it (`.max(x)`
        // with a value is the elementwise maximum).
        if let (Some(op), [arg]) = (ReduceOp::from_name(name), args) {
            if let Some(dim) = self.tile_ref(arg) {
                return Ok(Expr::Reduce {
                    op,
                    arg: Box::new(self.expr(recv, ix)?),
                    dim,
                    at: self.at(n),
                });
            }
            if matches!(name, "sum" | "prod") {
                return Err(self.err_at(
                    arg.start,
                    format!("`.{name}(t)` reduces along a tile `t` of an enclosing `tile()` loop, e.g. `x.{name}(tn)`"),
                ));
            }
        }
        // `.argmax(t)`: the index a reduction picks along the tile.
        if let (Some(op), [arg]) = (ReduceOp::from_arg_name(name), args) {
            let Some(dim) = self.tile_ref(arg) else {
                return Err(self.err_at(
                    arg.start,
                    format!("`.{name}(t)` picks along a tile `t` of an enclosing `tile()` loop, e.g. `x.{name}(tn)`"),
                ));
            };
            return Ok(Expr::ArgReduce {
                op,
                arg: Box::new(self.expr(recv, ix)?),
                dim,
                at: self.at(n),
            });
        }
        // `.cumsum(t)`: a scan along the tile.
        if let (Some(op), [arg]) = (ReduceOp::from_scan_name(name), args) {
            let Some(dim) = self.tile_ref(arg) else {
                return Err(self.err_at(
                    arg.start,
                    format!("`.{name}(t)` scans along a tile `t` of an enclosing `tile()` loop, e.g. `x.{name}(tn)`"),
                ));
            };
            return Ok(Expr::Scan {
                op,
                arg: Box::new(self.expr(recv, ix)?),
                dim,
                at: self.at(n),
            });
        }
        let arg = Box::new(self.expr(recv, ix)?);
        if matches!(name, "cast" | "to") {
            no_args()?;
            return Ok(Expr::Cast { arg, dtype: ty });
        }
        if let Some(op) = BinOp::from_function(name) {
            let [other] = args else {
                return Err(self.err_at(
                    name_at,
                    format!("`.{name}(other)` takes one argument: `a.{name}(b)`"),
                ));
            };
            return Ok(Expr::Binary {
                op,
                lhs: arg,
                rhs: Box::new(self.expr(other, ix)?),
                at: self.at(n),
            });
        }
        if let Some(op) = UnOp::from_name(name) {
            no_args()?;
            return Ok(Expr::Unary { op, arg });
        }
        if name == "until" {
            return Err(self.err_at(
                name_at,
                "`.until(bound)` belongs to a loop's iterator: `for tn in tile(n).until(bound)`",
            ));
        }
        if let Some(m) = crate::prims::nearest_method(name) {
            return Err(self.err_at(
                name_at,
                format!("unknown method `.{name}()`; did you mean `.{m}()`?"),
            ));
        }
        Err(self.err_at(
            name_at,
            format!(
                "unknown method `.{name}()`; the DSL has `.cast::<T>()`, `.begin()`, `.end()`, `.size()`, `.index()`, the reductions {} and {}",
                ReduceOp::ALL.iter().map(|o| format!("`.{}(t)`", o.name())).collect::<Vec<_>>().join(", "),
                crate::prims::function_names()
            ),
        ))
    }

    /// The condition `n` stands for, read as the macro reads one.
    fn cond(&self, n: &Node, ix: bool) -> Result<Cond> {
        Ok(match &n.kind {
            N::Paren(inner) => match self.negative_literal(inner)? {
                Some(e) => Cond::NonZero(e),
                None => self.cond(inner, ix)?,
            },
            N::Not(inner) => Cond::Not(Box::new(self.cond(inner, ix)?)),
            N::Bin(Op::Cmp(op), l, r) => Cond::Cmp {
                op: *op,
                lhs: self.expr(l, ix)?,
                rhs: self.expr(r, ix)?,
            },
            N::Bin(Op::And, l, r) => {
                Cond::And(Box::new(self.cond(l, ix)?), Box::new(self.cond(r, ix)?))
            }
            N::Bin(Op::Or, l, r) => {
                Cond::Or(Box::new(self.cond(l, ix)?), Box::new(self.cond(r, ix)?))
            }
            // `{ e }`: a value, even one that reads as a condition.
            N::Block(inner) => Cond::NonZero(self.expr(inner, ix)?),
            _ => Cond::NonZero(self.expr(n, ix)?),
        })
    }
}

/// `n` without its parentheses.
fn strip(n: &Node) -> &Node {
    match &n.kind {
        N::Paren(x) => strip(x),
        _ => n,
    }
}

/// `names` joined by commas for an error message, or `none` where there are none.
fn name_list<'a>(names: impl Iterator<Item = &'a str>, none: &str) -> String {
    let names: Vec<&str> = names.collect();
    match names.is_empty() {
        true => none.into(),
        false => names.join(", "),
    }
}
