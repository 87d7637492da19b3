//! The textual form of the tile IR: a kernel printed in the DSL's own
//! notation, with every name resolved (tensors, scalars, tiles and variables
//! by name, the grid and loops as written), for golden tests and for reading
//! what the macro built (`TILEFUSE_DUMP_DIR` writes it next to the CUDA C).
//! [`Kernel::parse`] (`parse.rs`) reads it back: printing then parsing gives
//! the same kernel, but for the `at` texts. Where the DSL's Rust reading would
//! take the text for something else, the printer writes what reads back:
//! a negative literal in parentheses (`(-1)`: `-1` is the negation of `1`), a
//! method's receiver that begins with `-` or `!` in parentheses, a ranged
//! loop's `until` on `(a..b)`, and a condition's value that reads as a
//! condition in a block (`{ !flag }`). A scalar whose kind the kernel's
//! signature gives is written with it (`; n, alpha: f32`).
//!
//! ```
//! # use tilefuse_codegen::ir::*;
//! # use tilefuse_codegen::DType;
//! let k = Kernel {
//!     name: "double".into(),
//!     tensors: vec![
//!         TensorParam { name: "x".into(), rank: 1, declared: Some(DType::F32) },
//!         TensorParam { name: "out".into(), rank: 1, declared: None },
//!     ],
//!     scalars: vec![ScalarParam::named("n")],
//!     constexprs: vec![],
//!     dims: vec![TileDim { name: "t".into(), extent: Some(0), whole: false, each: false }],
//!     grid: vec![0],
//!     grid_start: vec![],
//!     vars: vec![],
//!     body: vec![Stmt::Store {
//!         tensor: 1,
//!         index: tile_index(&[0]),
//!         value: Expr::Binary {
//!             op: BinOp::Mul,
//!             lhs: Box::new(Expr::Load { tensor: 0, index: tile_index(&[0]), at: String::new() }),
//!             rhs: Box::new(Expr::Float(2.0)),
//!             at: String::new(),
//!         },
//!         at: String::new(),
//!     }],
//! };
//! assert_eq!(
//!     k.to_string(),
//!     "kernel double(x: Tensor<f32, 1>, out: Tensor<_, 1>; n) {\n  \
//!      for t in tile(n) {\n    out[t] = (x[t] * 2.0);\n  }\n}\n"
//! );
//! ```

use crate::ir::*;
use std::fmt::{self, Display, Write};

impl Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tensors: Vec<String> = self
            .tensors
            .iter()
            .map(|t| {
                format!(
                    "{}: Tensor<{}, {}>",
                    t.name,
                    t.declared.map_or("_".to_string(), |d| d.to_string()),
                    t.rank
                )
            })
            .collect();
        let scalars: Vec<String> = self
            .scalars
            .iter()
            .map(|s| match s.declared {
                Some(k) => format!("{}: {}", s.name, k.type_name()),
                None => s.name.clone(),
            })
            .collect();
        let mut head = format!(
            "kernel {}({}; {}",
            self.name,
            tensors.join(", "),
            scalars.join(", ")
        );
        if !self.constexprs.is_empty() {
            let c: Vec<&str> = self.constexprs.iter().map(|c| c.name.as_str()).collect();
            let _ = write!(head, "; const {}", c.join(", "));
        }
        writeln!(f, "{head}) {{")?;
        let p = Printer { k: self };
        let names: Vec<String> = self.grid.iter().map(|&d| p.dim_name(d)).collect();
        let extents: Vec<String> = self.grid.iter().map(|&d| p.extent(d)).collect();
        let pat = if names.len() == 1 {
            names[0].clone()
        } else {
            format!("({})", names.join(", "))
        };
        let ext = if extents.len() == 1 {
            extents[0].clone()
        } else {
            format!("[{}]", extents.join(", "))
        };
        let start = if self.grid_start.is_empty() {
            String::new()
        } else {
            let s: Vec<&str> = self
                .grid_start
                .iter()
                .map(|&s| self.scalars[s].name.as_str())
                .collect();
            format!(".starting_at([{}])", s.join(", "))
        };
        writeln!(f, "  for {pat} in tile({ext}){start} {{")?;
        let mut out = String::new();
        p.stmts(&self.body, 2, &mut out);
        f.write_str(&out)?;
        writeln!(f, "  }}")?;
        writeln!(f, "}}")
    }
}

struct Printer<'a> {
    k: &'a Kernel,
}

impl Printer<'_> {
    fn dim_name(&self, d: DimId) -> String {
        self.k
            .dims
            .get(d)
            .map_or_else(|| format!("?{d}"), |x| x.name.clone())
    }

    /// A tile's extent as `tile(…)` takes it: `n`, `whole(d)`, `each(nb)`.
    fn extent(&self, d: DimId) -> String {
        let Some(dim) = self.k.dims.get(d) else {
            return format!("?{d}");
        };
        let n = dim
            .extent
            .map_or("?".to_string(), |s| self.k.scalars[s].name.clone());
        if dim.whole {
            format!("whole({n})")
        } else if dim.each {
            format!("each({n})")
        } else {
            n
        }
    }

    fn stmts(&self, stmts: &[Stmt], depth: usize, out: &mut String) {
        for s in stmts {
            self.stmt(s, depth, out);
        }
    }

    fn index(&self, t: TensorId, index: &[Expr]) -> String {
        // In an index a tile stands for its indices (`x[(tm, tn + 1)]`).
        let parts: Vec<String> = index.iter().map(|e| self.expr_in(e, true)).collect();
        let name = &self.k.tensors[t].name;
        if parts.len() == 1 {
            format!("{name}[{}]", parts[0])
        } else {
            format!("{name}[({})]", parts.join(", "))
        }
    }

    fn stmt(&self, s: &Stmt, depth: usize, out: &mut String) {
        let ind = "  ".repeat(depth);
        let var = |v: VarId| self.k.vars[v].name.clone();
        match s {
            Stmt::Let { var: v, value, .. } => {
                let m = if self.k.vars[*v].mutable { "mut " } else { "" };
                let _ = writeln!(out, "{ind}let {m}{} = {};", var(*v), self.expr(value));
            }
            Stmt::Assign { var: v, value, .. } => {
                let _ = writeln!(out, "{ind}{} = {};", var(*v), self.expr(value));
            }
            Stmt::Store {
                tensor,
                index,
                value,
                ..
            } => {
                let _ = writeln!(
                    out,
                    "{ind}{} = {};",
                    self.index(*tensor, index),
                    self.expr(value)
                );
            }
            Stmt::Atomic {
                op,
                tensor,
                index,
                value,
                old,
                ..
            } => {
                let bind = match old {
                    Some(v) => {
                        let m = if self.k.vars[*v].mutable { "mut " } else { "" };
                        format!("let {m}{} = ", var(*v))
                    }
                    None => String::new(),
                };
                let _ = writeln!(
                    out,
                    "{ind}{bind}{}({}, {});",
                    op.name(),
                    self.index(*tensor, index),
                    self.expr(value)
                );
            }
            Stmt::Wait {
                tensor,
                index,
                end,
                value,
                ..
            } => {
                let i = match end {
                    Some(e) => format!("{}..{}", self.expr(index), self.expr(e)),
                    None => self.expr(index),
                };
                let _ = writeln!(
                    out,
                    "{ind}wait({}, {i}, {});",
                    self.k.tensors[*tensor].name,
                    self.expr(value)
                );
            }
            Stmt::Signal {
                tensor,
                index,
                value,
                ..
            } => {
                let _ = writeln!(
                    out,
                    "{ind}signal({}, {}, {});",
                    self.k.tensors[*tensor].name,
                    self.expr(index),
                    self.expr(value)
                );
            }
            Stmt::Loop {
                dim,
                body,
                until,
                range,
            } => {
                let d = &self.k.dims[*dim];
                let iter = match (range, d.each) {
                    (Some(r), true) => format!("{}..{}", self.expr(&r.begin), self.expr(&r.end)),
                    (Some(r), false) => {
                        format!("tile({}..{})", self.expr(&r.begin), self.expr(&r.end))
                    }
                    (None, _) => format!("tile({})", self.extent(*dim)),
                };
                let until = until
                    .as_ref()
                    .map_or(String::new(), |u| format!(".until({})", self.expr(u)));
                // `a..b.until(e)` would call `until` on `b`.
                let iter = if d.each && range.is_some() && !until.is_empty() {
                    format!("({iter})")
                } else {
                    iter
                };
                let _ = writeln!(out, "{ind}for {} in {iter}{until} {{", d.name);
                self.stmts(body, depth + 1, out);
                let _ = writeln!(out, "{ind}}}");
            }
            Stmt::If {
                cond,
                then,
                otherwise,
                ..
            } => {
                let _ = writeln!(out, "{ind}if {} {{", self.cond(cond));
                self.stmts(then, depth + 1, out);
                if !otherwise.is_empty() {
                    let _ = writeln!(out, "{ind}}} else {{");
                    self.stmts(otherwise, depth + 1, out);
                }
                let _ = writeln!(out, "{ind}}}");
            }
        }
    }

    fn cond(&self, c: &Cond) -> String {
        match c {
            Cond::Cmp { op, lhs, rhs } => {
                format!("{} {} {}", self.expr(lhs), op.symbol(), self.expr(rhs))
            }
            Cond::Not(c) => format!("!({})", self.cond(c)),
            Cond::And(a, b) => format!("({} && {})", self.cond(a), self.cond(b)),
            Cond::Or(a, b) => format!("({} || {})", self.cond(a), self.cond(b)),
            // A comparison or a `!` would read as the condition's own.
            Cond::NonZero(e @ (Expr::Compare { .. } | Expr::Unary { op: UnOp::Not, .. })) => {
                format!("{{ {} }}", self.expr(e))
            }
            Cond::NonZero(e) => self.expr(e),
        }
    }

    fn tiles(&self, dims: &[DimId]) -> String {
        let n: Vec<String> = dims.iter().map(|&d| self.dim_name(d)).collect();
        format!("[{}]", n.join(", "))
    }

    fn expr(&self, e: &Expr) -> String {
        self.expr_in(e, false)
    }

    /// `e` as the receiver of a method: `-x.sum(t)` would sum `x`, then negate.
    fn receiver(&self, e: &Expr, bare: bool) -> String {
        match e {
            // `(-2.5)` would read as the literal -2.5, not the negation of 2.5.
            Expr::Unary { op: UnOp::Neg, arg }
                if matches!(**arg, Expr::Int(_) | Expr::Float(_)) =>
            {
                format!("(-({}))", self.expr_in(arg, bare))
            }
            Expr::Unary {
                op: UnOp::Neg | UnOp::Not,
                ..
            } => format!("({})", self.expr_in(e, bare)),
            _ => self.expr_in(e, bare),
        }
    }

    /// `e` as written; `bare`: tiles as their indices (inside an index).
    fn expr_in(&self, e: &Expr, bare: bool) -> String {
        let sub = |x: &Expr| self.expr_in(x, bare);
        match e {
            Expr::Var(v) => self.k.vars[*v].name.clone(),
            Expr::Load { tensor, index, .. } => self.index(*tensor, index),
            Expr::Full { dims, dtype, value } => {
                format!("full::<{dtype}>({}, {value:?})", self.tiles(dims))
            }
            Expr::Addmm { acc, a, b, .. } => format!("addmm({}, {}, {})", sub(acc), sub(a), sub(b)),
            Expr::Binary { op, lhs, rhs, .. } => match op.function() {
                Some(f) => format!("{f}({}, {})", sub(lhs), sub(rhs)),
                None => format!("({} {} {})", sub(lhs), op.symbol(), sub(rhs)),
            },
            Expr::Unary { op: UnOp::Neg, arg } => format!("-{}", sub(arg)),
            Expr::Unary { op: UnOp::Not, arg } => format!("!{}", sub(arg)),
            Expr::Unary { op, arg } => format!("{}({})", op.name(), sub(arg)),
            Expr::Rand {
                kind, seed, offset, ..
            } => format!("{}({}, {})", kind.name(), sub(seed), sub(offset)),
            Expr::Cast { arg, dtype } => match dtype {
                Some(d) => format!("{}.cast::<{d}>()", self.receiver(arg, bare)),
                None => format!("{}.cast()", self.receiver(arg, bare)),
            },
            // `-1` reads as the negation of `1`: a negative literal in parentheses.
            Expr::Int(v) if *v < 0 => format!("({v})"),
            Expr::Int(v) => v.to_string(),
            Expr::Float(v) if v.is_sign_negative() && !v.is_nan() => format!("({v:?})"),
            Expr::Float(v) => format!("{v:?}"),
            Expr::Scalar(s) => self.k.scalars[*s].name.clone(),
            Expr::Const(c) => self.k.constexprs[*c].name.clone(),
            Expr::TileBegin(d) => format!("{}.begin()", self.dim_name(*d)),
            Expr::TileEnd(d) => format!("{}.end()", self.dim_name(*d)),
            Expr::TileSize(d) => format!("{}.size()", self.dim_name(*d)),
            Expr::TileIndex(d) if bare || self.k.is_each(*d) => self.dim_name(*d),
            Expr::TileIndex(d) => format!("{}.index()", self.dim_name(*d)),
            Expr::Reduce { op, arg, dim, .. } => {
                format!(
                    "{}.{}({})",
                    self.receiver(arg, bare),
                    op.name(),
                    self.dim_name(*dim)
                )
            }
            Expr::ArgReduce { op, arg, dim, .. } => {
                format!(
                    "{}.{}({})",
                    self.receiver(arg, bare),
                    op.arg_name().unwrap_or("argmax"),
                    self.dim_name(*dim)
                )
            }
            Expr::Scan { op, arg, dim, .. } => {
                format!(
                    "{}.{}({})",
                    self.receiver(arg, bare),
                    op.scan_name(),
                    self.dim_name(*dim)
                )
            }
            Expr::Compare { op, lhs, rhs, .. } => {
                format!("({} {} {})", sub(lhs), op.symbol(), sub(rhs))
            }
            Expr::Select {
                mask,
                then,
                otherwise,
                ..
            } => format!("select({}, {}, {})", sub(mask), sub(then), sub(otherwise)),
            Expr::IfConst {
                cond,
                then,
                otherwise,
                ..
            } => format!(
                "if {} {{ {} }} else {{ {} }}",
                self.cond(cond),
                sub(then),
                sub(otherwise)
            ),
        }
    }
}
