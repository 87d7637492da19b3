//! The IR's textual form: every kernel printed and parsed back is the same
//! kernel (the `at` texts aside, which the parser takes from the text), the
//! parser reads hand-written text as the macro reads the Rust it stands for,
//! and a text that is not a kernel gets an error that says where and why,
//! never a panic.

mod common;
use common::*;
use tilefuse_codegen::ParseError;

/// What a kernel means, as JSON: `at` emptied, NaN equal to itself.
fn structure(k: &Kernel) -> String {
    k.without_at().to_json()
}

/// Printing `k` and parsing the text gives `k` back, and the parsed kernel
/// prints as `k` does. Returns the parsed kernel.
fn round_trip(k: &Kernel) -> Kernel {
    let text = k.to_string();
    let back = Kernel::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(structure(&back), structure(k), "\n{text}");
    assert_eq!(back.to_string(), text);
    back
}

/// Every `at` of a parsed kernel holds the text it came from.
fn assert_ats_filled(k: &Kernel) {
    k.walk_stmts(&mut |s| {
        if !matches!(s, Stmt::Loop { .. }) {
            assert!(!s.at_text().is_empty(), "{s:?}");
        }
    });
    k.walk_exprs(&mut |e| {
        if let Some(at) = e.at() {
            assert!(!at.is_empty(), "{e:?}");
        }
    });
}

/// The kernels of the lowering tests: built by hand (`matmul`, …) or from text.
#[test]
fn the_tests_kernels_round_trip() {
    for k in [
        matmul(),
        matmul_with(DType::F16),
        matmul_bias_gelu(),
        pointwise_2d(),
        pointwise_1d(),
        rows_inner_loop(),
        histogram(),
        bits(),
        batched_softmax(),
        jagged_sum(),
        column_and_total_sums(),
        dropout(),
    ] {
        assert_ats_filled(&round_trip(&k));
    }
}

/// A kernel with every construct the text has.
const EVERYTHING: &str = "
kernel everything(x: Tensor<f32, 2>, out: Tensor<_, 2>, flags: Tensor<i32, 1>, ids: Tensor<i64, 1>; m, n, x.size(1), seed, s0; const ACT, C2) {
  // The grid: one index at a time along `b`, a whole head along `td`.
  for (b, tm, td) in tile([each(m), n, whole(x.size(1))]).starting_at([s0, s0, seed]) {
    wait(flags, b, 1);
    wait(flags, b..b + 2, seed);
    wait(flags, 0..=b, 1);
    let mut acc = zeros::<f32>([tm, td]);
    let row = ids[b] * 2 + 1;
    for tk in tile(n).until(tm.end()) {
      acc = addmm(acc, x[(tm, tk)].cast::<bf16>(), x[(tk, td)].cast::<bf16>());
      acc += x[(tm, td + tk.begin())];
    }
    for tr in tile(row..row + n) {
      let v = x[(tr, td)];
      let v = select(tr.index() >= tm.index(), v, -inf);
      acc = acc + v.max(tr) + v.min(tr) - v.sum(tr) * v.prod(tr);
    }
    for i in (0..row).until(b + 4) {
      acc = max(acc, -x[(i, td)]) / powf(2.0, atan2(1e-12, NaN));
    }
    for j in b..=row {
      out[(j, td)] = (-acc).cast();
    }
    if ACT == 1 && !(C2 > 0 || m != 0) {
      out[(tm, td)] = if ACT > 2 { relu(acc) } else { exp(-acc) }.cast::<f16>();
    } else if { !seed } {
      atomic_max(out[(tm, td)], acc.sum(td).sum(tm));
    } else {
      atomic_min(out[(ids[tm], td)], rand(seed, tm.index() * n + td.index()) + randn(seed, b));
      atomic_add(out[(0, (-1))], randint(seed, b).cast::<f32>() as f32);
    }
    let bits = (b << 3) ^ (b >> 1) & 255 | !b % 7;
    let mask = (bits == 0) & (bits != 1) | (bits < 2) ^ (bits <= 3);
    if mask {
      out[(tm, td)] = full::<f32>([tm, td], -2147483648.0) + f32::NEG_INFINITY + (-0.5) + -0.5;
    }
    signal(flags, b + (-1), tm.size() * td.size());
  }
}
";

#[test]
fn every_construct_round_trips() {
    let k = parse(EVERYTHING);
    assert_ats_filled(&k);
    let back = round_trip(&k);
    // A second round changes nothing either (the printed text is a fixed point).
    round_trip(&back);
    // The numbering is the source order.
    let dims: Vec<&str> = k.dims.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(dims, ["b", "tm", "td", "tk", "tr", "i", "j"]);
    let vars: Vec<&str> = k.vars.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(vars, ["acc", "row", "v", "v", "bits", "mask"]);
    assert_eq!(k.scalars[2].name, "x.size(1)");
    assert_eq!(k.grid, [0, 1, 2]);
    assert_eq!(k.grid_start, [4, 4, 3]);
    assert!(k.dims[0].each && k.dims[2].whole && k.dims[2].extent == Some(2));
    // `tile(a..b)`: no extent; `for i in a..b`: an `each` dimension.
    assert!(k.dims[4].extent.is_none() && !k.dims[4].each);
    assert!(k.dims[5].extent.is_none() && k.dims[5].each);
    let text = k.to_string();
    for printed in [
        "for i in (0..row).until((b + 4)) {",
        "for j in b..(row + 1) {",
        "} else {\n      if { !seed } {",
        "out[(0, (-1))]",
        "(-acc).cast()",
        "full::<f32>([tm, td], -2147483648.0)",
        "(-inf)",
        "-0.5",
        "(-0.5)",
        "NaN",
        "1e-12",
    ] {
        assert!(text.contains(printed), "`{printed}` not in\n{text}");
    }
}

#[test]
fn at_is_the_text_as_written() {
    let k = parse(EVERYTHING);
    let mut stmts = Vec::new();
    k.walk_stmts(&mut |s| stmts.push(s.at_text().to_string()));
    assert_eq!(stmts[0], "wait(flags, b, 1)");
    assert_eq!(stmts[3], "let mut acc = zeros::<f32>([tm, td])");
    assert!(stmts.contains(&"acc += x[(tm, td + tk.begin())]".to_string()));
    // An `if`: its condition.
    assert!(stmts.contains(&"ACT == 1 && !(C2 > 0 || m != 0)".to_string()));
    let mut exprs = Vec::new();
    k.walk_exprs(&mut |e| {
        if let Expr::Binary { at, .. } | Expr::Load { at, .. } | Expr::Reduce { at, .. } = e {
            exprs.push(at.clone());
        }
    });
    assert!(exprs.contains(&"ids[b] * 2 + 1".to_string()), "{exprs:?}");
    assert!(exprs.contains(&"ids[b]".to_string()));
    assert!(exprs.contains(&"acc.sum(td).sum(tm)".to_string()));
}

#[test]
fn hand_written_text_reads_with_rusts_precedence() {
    let written = parse(
        "kernel p(x: Tensor<f32, 1>, out: Tensor<f32, 1>; n, k) {
           for t in tile(n) {
             out[t] = x[t] + x[t] * 2.0 - -x[t].sum(t) / k as f32;
             out[t] = x[t].exp().max(1.0);
           }
         }",
    );
    let printed = parse(
        "kernel p(x: Tensor<f32, 1>, out: Tensor<f32, 1>; n, k) {
           for t in tile(n) {
             out[t] = ((x[t] + (x[t] * 2.0)) - (-x[t].sum(t) / k.cast::<f32>()));
             out[t] = max(exp(x[t]), 1.0);
           }
         }",
    );
    assert_eq!(structure(&written), structure(&printed));
}

#[test]
fn names_resolve_by_lexical_scope() {
    let k = parse(
        "kernel s(x: Tensor<f32, 1>, out: Tensor<f32, 1>; n, v) {
           for t in tile(n) {
             let v = x[t];
             for t2 in tile(n) {
               let v = v + 1.0;
               out[t2] = v;
             }
             let w = v + v;
             out[t] = w;
           }
         }",
    );
    // `v` is first a scalar of the header, then a `let` (var 0); the inner
    // `let v = v + 1.0` (var 1) reads the outer one, the store the inner one,
    // and after the loop `v` is the outer one again.
    let Stmt::Loop { body, .. } = &k.body[1] else {
        unreachable!()
    };
    assert!(
        matches!(&body[0], Stmt::Let { var: 1, value: Expr::Binary { lhs, .. }, .. } if **lhs == Expr::Var(0))
    );
    assert!(matches!(
        &body[1],
        Stmt::Store {
            value: Expr::Var(1),
            ..
        }
    ));
    assert!(
        matches!(&k.body[2], Stmt::Let { var: 2, value: Expr::Binary { lhs, rhs, .. }, .. }
        if **lhs == Expr::Var(0) && **rhs == Expr::Var(0))
    );
    // A tile is out of scope after its loop; an `each` tile is a value.
    let err = Kernel::parse(
        "kernel s(out: Tensor<f32, 1>; n) {
           for t in tile(n) {
             for i in 0..n { }
             out[t] = i;
           }
         }",
    )
    .unwrap_err();
    assert!(err.message.contains("unknown name `i`"), "{err}");
    assert_eq!(err.line, 4);
}

#[test]
fn a_minus_before_a_number_negates_it_and_a_negative_literal_is_in_parentheses() {
    let k = parse(
        "kernel n(out: Tensor<f32, 1>; n) {
           for t in tile(n) {
             out[t] = -1 + (-1) + -inf + (-inf) + -2.5 + (-2.5);
           }
         }",
    );
    let mut literals = Vec::new();
    k.walk_exprs(&mut |e| match e {
        Expr::Unary { op: UnOp::Neg, arg } => literals.push(format!("neg {arg:?}")),
        Expr::Int(_) | Expr::Float(_) => literals.push(format!("{e:?}")),
        _ => {}
    });
    assert_eq!(
        literals,
        [
            "neg Int(1)",
            "Int(1)",
            "Int(-1)",
            "neg Float(inf)",
            "Float(inf)",
            "Float(-inf)",
            "neg Float(2.5)",
            "Float(2.5)",
            "Float(-2.5)"
        ]
    );
    let text = k.to_string();
    assert!(
        text.contains("(((((-1 + (-1)) + -inf) + (-inf)) + -2.5) + (-2.5))"),
        "{text}"
    );
    round_trip(&k);
}

#[test]
fn conditions_read_as_the_macro_reads_them() {
    let k = parse(
        "kernel c(out: Tensor<f32, 1>; n, f; const A) {
           for t in tile(n) {
             if (A > 1) { }
             if !f { }
             if { !f } { }
             if f & 1 { }
             if { f < 2 } { }
           }
         }",
    );
    let conds: Vec<String> = k
        .body
        .iter()
        .map(|s| match s {
            Stmt::If { cond, .. } => format!("{cond:?}"),
            _ => String::new(),
        })
        .collect();
    assert!(conds[0].starts_with("Cmp { op: Gt"), "{}", conds[0]);
    assert!(
        conds[1].starts_with("Not(NonZero(Scalar(1)))"),
        "{}",
        conds[1]
    );
    assert!(
        conds[2].starts_with("NonZero(Unary { op: Not"),
        "{}",
        conds[2]
    );
    assert!(
        conds[3].starts_with("NonZero(Binary { op: BitAnd"),
        "{}",
        conds[3]
    );
    assert!(conds[4].starts_with("NonZero(Compare"), "{}", conds[4]);
    round_trip(&k);
}

// ---------------------------------------------------------------- errors

/// The error parsing `text` gives: on `line`, naming each of `needles`.
fn error(text: &str, line: usize, needles: &[&str]) -> ParseError {
    let e = Kernel::parse(text).expect_err(text);
    assert_eq!(e.line, line, "{e}");
    for n in needles {
        assert!(e.message.contains(n), "`{n}` not in: {e}");
    }
    assert!(e.to_string().starts_with(&format!("line {line}, column ")));
    e
}

const HEAD: &str = "kernel k(x: Tensor<f32, 1>, out: Tensor<f32, 1>; n) {\n  for t in tile(n) {\n";

#[test]
fn errors_say_where_and_what_was_expected() {
    let e = error(
        &format!("{HEAD}    out[t] = x[t] + y;\n  }}\n}}\n"),
        3,
        &["unknown name `y`", "n"],
    );
    assert_eq!(e.column, 21);
    let e = error(
        &format!("{HEAD}    out[t] = x[t]\n  }}\n}}\n"),
        4,
        &["expected `;` after the assignment, found `}`"],
    );
    assert_eq!(e.column, 3);
    error(
        "kernel k(x: Tensor<f33, 1>; n) {\n  for t in tile(n) {\n  }\n}\n",
        1,
        &["unknown element type `f33`", "bf16", "f32"],
    );
    // A brace missing: the text ends inside the kernel.
    error(
        &format!("{HEAD}    out[t] = x[t];\n  }}\n"),
        5,
        &["expected `}` closing the kernel", "the end of the text"],
    );
    error(
        &format!("{HEAD}    out[t] = x[t];\n  }}\n}}\n}}\n"),
        6,
        &["expected the end of the text", "found `}`"],
    );
    error(
        &format!("{HEAD}    out[t] = x[t];\n  }}\n}}\nfn main() {{}}\n"),
        6,
        &["the end of the text", "`fn`"],
    );
    error(
        &format!("{HEAD}    out[(t, t] = x[t];\n  }}\n}}\n"),
        3,
        &["expected `,` or `)`", "found `]`"],
    );
    error(
        &format!("{HEAD}    z[t] = x[t];\n  }}\n}}\n"),
        3,
        &["unknown tensor `z`", "x, out"],
    );
    error(
        &format!("{HEAD}    out[t] = x;\n  }}\n}}\n"),
        3,
        &["`x` is a tensor"],
    );
    error(
        &format!("{HEAD}    out[t] = t;\n  }}\n}}\n"),
        3,
        &["tile `t` is not a value", "t.index()"],
    );
    error(
        &format!("{HEAD}    out[t] = max(x[t]);\n  }}\n}}\n"),
        3,
        &["`max` takes 2 arguments"],
    );
    error(
        &format!("{HEAD}    out[t] = frob(x[t]);\n  }}\n}}\n"),
        3,
        &["unknown function `frob`", "exp"],
    );
    error(
        &format!("{HEAD}    out[t] = tanhh(x[t]);\n  }}\n}}\n"),
        3,
        &["unknown function `tanhh`", "did you mean `tanh`?"],
    );
    error(
        &format!("{HEAD}    out[t] = x[t].sume(t);\n  }}\n}}\n"),
        3,
        &["unknown method `.sume()`", "did you mean `.sum()`?"],
    );
    error(
        &format!("{HEAD}    let a = x[t];\n    a = 1.0;\n  }}\n}}\n"),
        4,
        &["let mut a"],
    );
    error(
        "kernel k(x: Tensor<f32, 1>; n) {\n  for t in tile(q) {\n  }\n}\n",
        2,
        &["`q` is not one of the kernel's scalars (n)"],
    );
    error(
        &format!("{HEAD}    out[t] = x[t] # 2;\n  }}\n}}\n"),
        3,
        &["unexpected character `#`"],
    );
    error(
        &format!("{HEAD}    out[t] = 99999999999999999999;\n  }}\n}}\n"),
        3,
        &["does not fit in an i64"],
    );
    error(
        &format!("{HEAD}    out[t] = x[t] < 1 < 2;\n  }}\n}}\n"),
        3,
        &["cannot be chained"],
    );
    error("", 1, &["expected `kernel`", "the end of the text"]);
}

#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    for (open, close) in [("(", ")"), ("-", ""), ("!", ""), ("{ ", " }")] {
        let deep = format!(
            "{HEAD}    out[t] = {}x[t]{};\n  }}\n}}\n",
            open.repeat(5000),
            close.repeat(5000)
        );
        error(&deep, 3, &["deeper than"]);
    }
    let long = format!(
        "{HEAD}    out[t] = x[t]{};\n  }}\n}}\n",
        " + 1.0".repeat(5000)
    );
    error(&long, 3, &["deeper than"]);
    let chain = format!(
        "{HEAD}    out[t] = x[t]{};\n  }}\n}}\n",
        ".exp()".repeat(5000)
    );
    error(&chain, 3, &["deeper than"]);
    let blocks = format!(
        "{HEAD}{}{}  }}\n}}\n",
        "if n { ".repeat(5000),
        "} ".repeat(5000)
    );
    error(&blocks, 3, &["deeper than"]);
    // Nesting a kernel may have reads fine.
    let fine = format!(
        "{HEAD}    out[t] = {}x[t]{};\n  }}\n}}\n",
        "(1.0 + ".repeat(40),
        ")".repeat(40)
    );
    parse(&fine);
}

/// A small deterministic generator (xorshift), for garbling and for random kernels.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

#[test]
fn truncated_and_garbled_texts_never_panic() {
    let texts = [
        EVERYTHING.to_string(),
        parse(EVERYTHING).to_string(),
        jagged_sum().to_string(),
        bits().to_string(),
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let tricky: Vec<char> = "(){}[]<>;,.:=!-+*/%&|^ _0123456789aezé\n\"'#?"
        .chars()
        .collect();
    for text in &texts {
        for (i, _) in text.char_indices() {
            let _ = Kernel::parse(&text[..i]);
        }
        let chars: Vec<char> = text.chars().collect();
        for _ in 0..3000 {
            let mut c = chars.clone();
            for _ in 0..1 + rng.below(3) {
                let at = rng.below(c.len());
                match rng.below(3) {
                    0 => {
                        c.remove(at);
                    }
                    1 => c.insert(at, *rng.pick(&tricky)),
                    _ => c[at] = *rng.pick(&tricky),
                }
            }
            let garbled: String = c.into_iter().collect();
            if let Ok(k) = Kernel::parse(&garbled) {
                // Whatever parses prints as a kernel that parses to itself.
                let again =
                    Kernel::parse(&k.to_string()).unwrap_or_else(|e| panic!("{e}\n{garbled}\n{k}"));
                assert_eq!(structure(&again), structure(&k), "{garbled}");
            }
        }
    }
}

// ---------------------------------------------------------------- random kernels

/// Random kernels in which every name means what the printer's text says:
/// each variable or tile referred to is the innermost of its name in scope.
struct Gen {
    rng: Rng,
    k: Kernel,
    scopes: Vec<Vec<(String, bool, usize)>>,
}

const VAR_NAMES: &[&str] = &["a", "acc", "v", "tn"];
const DIM_NAMES: &[&str] = &["tm", "tn", "tk", "i"];
const FLOATS: &[f64] = &[
    0.0,
    -0.0,
    2.5,
    -1.5,
    1e-12,
    1e300,
    1e16,
    0.1,
    f64::INFINITY,
    f64::NEG_INFINITY,
    f64::NAN,
    -2147483648.0,
];
const INTS: &[i64] = &[0, 1, -1, 7, 255, i64::MAX, i64::MIN, -100];

impl Gen {
    /// The variables (`false`) or tiles (`true`) visible by name.
    fn visible(&self, tiles: bool) -> Vec<usize> {
        let mut seen = Vec::new();
        let mut out = Vec::new();
        for scope in self.scopes.iter().rev() {
            for (name, tile, id) in scope.iter().rev() {
                if seen.contains(name) {
                    continue;
                }
                seen.push(name.clone());
                if *tile == tiles {
                    out.push(*id);
                }
            }
        }
        out
    }

    fn bind(&mut self, name: &str, tile: bool, id: usize) {
        if let Some(s) = self.scopes.last_mut() {
            s.push((name.to_string(), tile, id));
        }
    }

    fn leaf(&mut self) -> Expr {
        let vars = self.visible(false);
        let tiles = self.visible(true);
        loop {
            match self.rng.below(9) {
                0 if !vars.is_empty() => return Expr::Var(*self.rng.pick(&vars)),
                1 => return Expr::Int(*self.rng.pick(INTS)),
                2 => return Expr::Float(*self.rng.pick(FLOATS)),
                3 => return Expr::Scalar(self.rng.below(self.k.scalars.len())),
                4 => return Expr::Const(self.rng.below(self.k.constexprs.len())),
                5 if !tiles.is_empty() => {
                    let d = *self.rng.pick(&tiles);
                    return match self.rng.below(4) {
                        0 => Expr::TileBegin(d),
                        1 => Expr::TileEnd(d),
                        2 => Expr::TileSize(d),
                        _ => Expr::TileIndex(d),
                    };
                }
                6 => {
                    let n = self.rng.below(3).min(tiles.len());
                    let dims = (0..n).map(|_| *self.rng.pick(&tiles)).collect();
                    return Expr::Full {
                        dims,
                        dtype: *self.rng.pick(&DType::ALL),
                        value: *self.rng.pick(FLOATS),
                    };
                }
                _ => {}
            }
        }
    }

    fn expr(&mut self, depth: usize) -> Expr {
        if depth == 0 || self.rng.chance(25) {
            return self.leaf();
        }
        let tiles = self.visible(true);
        let at = String::new();
        match self.rng.below(13) {
            0 => {
                let tensor = self.rng.below(self.k.tensors.len());
                let n = 1 + self.rng.below(2);
                let index = (0..n).map(|_| self.expr(depth - 1)).collect();
                Expr::Load { tensor, index, at }
            }
            1 => Expr::Addmm {
                acc: self.sub(depth),
                a: self.sub(depth),
                b: self.sub(depth),
                at,
            },
            2 => Expr::Binary {
                op: *self.rng.pick(BinOp::ALL),
                lhs: self.sub(depth),
                rhs: self.sub(depth),
                at,
            },
            3 => Expr::Unary {
                op: *self.rng.pick(UnOp::ALL),
                arg: self.sub(depth),
            },
            4 => Expr::Rand {
                kind: *self.rng.pick(&RandKind::ALL),
                seed: self.sub(depth),
                offset: self.sub(depth),
                at,
            },
            5 => Expr::Cast {
                arg: self.sub(depth),
                dtype: if self.rng.chance(50) {
                    Some(*self.rng.pick(&DType::ALL))
                } else {
                    None
                },
            },
            6 if !tiles.is_empty() => Expr::Reduce {
                op: *self.rng.pick(ReduceOp::ALL),
                arg: self.sub(depth),
                dim: *self.rng.pick(&tiles),
                at,
            },
            11 if !tiles.is_empty() => Expr::ArgReduce {
                op: *self.rng.pick(&[ReduceOp::Max, ReduceOp::Min]),
                arg: self.sub(depth),
                dim: *self.rng.pick(&tiles),
                at,
            },
            10 if !tiles.is_empty() => Expr::Scan {
                op: *self.rng.pick(ReduceOp::ALL),
                arg: self.sub(depth),
                dim: *self.rng.pick(&tiles),
                at,
            },
            7 => Expr::Compare {
                op: *self.rng.pick(&CmpOp::ALL),
                lhs: self.sub(depth),
                rhs: self.sub(depth),
                at,
            },
            8 => Expr::Select {
                mask: self.sub(depth),
                then: self.sub(depth),
                otherwise: self.sub(depth),
                at,
            },
            9 => Expr::IfConst {
                cond: Box::new(self.cond(depth - 1)),
                then: self.sub(depth),
                otherwise: self.sub(depth),
                at,
            },
            _ => self.leaf(),
        }
    }

    fn sub(&mut self, depth: usize) -> Box<Expr> {
        Box::new(self.expr(depth - 1))
    }

    fn cond(&mut self, depth: usize) -> Cond {
        match self.rng.below(if depth == 0 { 2 } else { 5 }) {
            0 => Cond::Cmp {
                op: *self.rng.pick(&CmpOp::ALL),
                lhs: self.expr(depth),
                rhs: self.expr(depth),
            },
            1 => Cond::NonZero(self.expr(depth)),
            2 => Cond::Not(Box::new(self.cond(depth - 1))),
            3 => Cond::And(
                Box::new(self.cond(depth - 1)),
                Box::new(self.cond(depth - 1)),
            ),
            _ => Cond::Or(
                Box::new(self.cond(depth - 1)),
                Box::new(self.cond(depth - 1)),
            ),
        }
    }

    fn block(&mut self, depth: usize, bind: Option<(String, usize)>) -> Vec<Stmt> {
        self.scopes.push(Vec::new());
        if let Some((name, d)) = bind {
            self.bind(&name, true, d);
        }
        let n = self.rng.below(4);
        let body = (0..n).map(|_| self.stmt(depth)).collect();
        self.scopes.pop();
        body
    }

    fn stmt(&mut self, depth: usize) -> Stmt {
        let at = String::new();
        let e = 3;
        loop {
            match self.rng.below(9) {
                0 => {
                    let value = self.expr(e);
                    let name = *self.rng.pick(VAR_NAMES);
                    self.k.vars.push(Var {
                        name: name.into(),
                        mutable: self.rng.chance(50),
                    });
                    let var = self.k.vars.len() - 1;
                    self.bind(name, false, var);
                    return Stmt::Let { var, value, at };
                }
                1 => {
                    let vars: Vec<usize> = self
                        .visible(false)
                        .into_iter()
                        .filter(|&v| self.k.vars[v].mutable)
                        .collect();
                    if let Some(&var) = vars.first() {
                        return Stmt::Assign {
                            var,
                            value: self.expr(e),
                            at,
                        };
                    }
                }
                2 | 3 => {
                    let tensor = self.rng.below(self.k.tensors.len());
                    let index = (0..1 + self.rng.below(2)).map(|_| self.expr(2)).collect();
                    let value = self.expr(e);
                    return if self.rng.chance(50) {
                        Stmt::Store {
                            tensor,
                            index,
                            value,
                            at,
                        }
                    } else {
                        Stmt::Atomic {
                            op: *self.rng.pick(AtomicOp::ALL),
                            tensor,
                            index,
                            value,
                            old: None,
                            at,
                        }
                    };
                }
                4 => {
                    return Stmt::Wait {
                        tensor: self.rng.below(self.k.tensors.len()),
                        index: self.expr(2),
                        end: if self.rng.chance(50) {
                            Some(self.expr(2))
                        } else {
                            None
                        },
                        value: self.expr(2),
                        at,
                    }
                }
                5 => {
                    return Stmt::Signal {
                        tensor: self.rng.below(self.k.tensors.len()),
                        index: self.expr(2),
                        value: self.expr(2),
                        at,
                    }
                }
                6 | 7 if depth > 0 => {
                    let name = self.rng.pick(DIM_NAMES).to_string();
                    let kind = self.rng.below(3);
                    let range = (kind > 0).then(|| {
                        Box::new(LoopRange {
                            begin: self.expr(2),
                            end: self.expr(2),
                        })
                    });
                    let until = self.rng.chance(30).then(|| self.expr(2));
                    let whole = kind == 0 && self.rng.chance(20);
                    self.k.dims.push(TileDim {
                        name: name.clone(),
                        extent: (kind == 0).then(|| self.rng.below(self.k.scalars.len())),
                        whole,
                        each: kind == 2 || (kind == 0 && !whole && self.rng.chance(20)),
                    });
                    let dim = self.k.dims.len() - 1;
                    let body = self.block(depth - 1, Some((name, dim)));
                    return Stmt::Loop {
                        dim,
                        body,
                        until,
                        range,
                    };
                }
                8 if depth > 0 => {
                    let cond = self.cond(2);
                    let then = self.block(depth - 1, None);
                    let otherwise = self.block(depth - 1, None);
                    return Stmt::If {
                        cond,
                        then,
                        otherwise,
                        at,
                    };
                }
                _ => {}
            }
        }
    }

    fn kernel(seed: u64) -> Kernel {
        let mut k = Kernel::empty("random");
        k.tensors = vec![
            tensor("x", 2, Some(DType::F32)),
            tensor("y", 1, None),
            tensor("flags", 1, Some(DType::I32)),
        ];
        k.scalars = ["n", "m", "seed", "a.size(0)", "s0"]
            .iter()
            .map(|s| scalar(s))
            .collect();
        k.constexprs = vec![ConstParam { name: "C".into() }];
        let mut g = Gen {
            rng: Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1),
            k,
            scopes: vec![Vec::new()],
        };
        let grid = g.rng.below(4);
        for (d, name) in DIM_NAMES.iter().take(grid).enumerate() {
            let whole = g.rng.chance(20);
            let each = !whole && g.rng.chance(30);
            let extent = Some(g.rng.below(g.k.scalars.len()));
            g.k.dims.push(TileDim {
                name: name.to_string(),
                extent,
                whole,
                each,
            });
            g.k.grid.push(d);
            g.bind(name, true, d);
        }
        if grid > 0 && g.rng.chance(30) {
            g.k.grid_start = (0..grid).map(|_| g.rng.below(5)).collect();
        }
        g.k.body = (0..1 + g.rng.below(5)).map(|_| g.stmt(2)).collect();
        g.k
    }
}

#[test]
fn random_kernels_round_trip() {
    for seed in 0..400 {
        let k = Gen::kernel(seed);
        round_trip(&k);
    }
}

/// A negated number as a method's receiver prints as `(-(2.5))`: `(-2.5)`
/// would read back as the literal -2.5.
#[test]
fn a_negated_number_keeps_its_negation_as_a_receiver() {
    let k = parse(
        "kernel c(out: Tensor<f32, 1>; n) {
           for t in tile(n) {
             out[t] = (-(2.5)).cast() + (-2.5).cast() + (-(1)).cast::<f32>();
           }
         }",
    );
    let mut seen = Vec::new();
    k.walk_exprs(&mut |e| {
        if let Expr::Cast { arg, .. } = e {
            seen.push(format!("{arg:?}"));
        }
    });
    assert_eq!(
        seen,
        [
            "Unary { op: Neg, arg: Float(2.5) }",
            "Float(-2.5)",
            "Unary { op: Neg, arg: Int(1) }"
        ]
    );
    round_trip(&k);
}

/// A scalar's declared kind (`alpha: f32`, as the macro records a typed
/// parameter) prints and parses back, and is what a declared spec assumes;
/// an unsaid one is an `Int`, a type that is not a scalar an error.
#[test]
fn declared_scalar_kinds_round_trip() {
    let k = Kernel::parse(
        "kernel scale(x: Tensor<f32, 1>, out: Tensor<f32, 1>; n, alpha: f32, k: u32) {
           for ti in tile([n]) {
             out[ti] = x[ti] * alpha;
           }
         }",
    )
    .expect("parses");
    let kinds: Vec<Option<ScalarKind>> = k.scalars.iter().map(|s| s.declared).collect();
    assert_eq!(
        kinds,
        vec![None, Some(ScalarKind::Float), Some(ScalarKind::U32)]
    );
    assert_eq!(
        k.declared_scalar_kinds(),
        vec![ScalarKind::Int, ScalarKind::Float, ScalarKind::U32]
    );
    assert!(k.to_string().contains("; n, alpha: f32, k: u32)"), "{k}");
    round_trip(&k);
    let e = Kernel::parse(
        "kernel scale(x: Tensor<f32, 1>, out: Tensor<f32, 1>; n, alpha: bf16) {
           for ti in tile([n]) {
             out[ti] = x[ti];
           }
         }",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("a scalar type"), "{e}");
}
