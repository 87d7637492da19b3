//! The IR the macro builds from each form of device syntax, and its errors.
//! (The messages as a user sees them, spans included, are the trybuild cases
//! of `tests/ui`.)

use crate::attr::Pinned;
use crate::glue::{declared_spec, expand, parse};
use proc_macro2::TokenStream;
use tilefuse_codegen::dtype::DType;
use tilefuse_codegen::ir::*;

fn item(src: &str) -> syn::ItemFn {
    syn::parse_str(src).unwrap_or_else(|e| panic!("test source does not parse: {e}"))
}

/// The kernel the macro builds from `src`.
fn kernel(src: &str) -> Kernel {
    match parse(&mut item(src)) {
        Ok(p) => p.builder.kernel,
        Err(e) => panic!("macro error: {e}"),
    }
}

/// The whole expansion (with the compile-time check and lowering), or its error.
fn expanded(src: &str) -> Result<TokenStream, String> {
    expand(Pinned::default(), TokenStream::new(), item(src)).map_err(|e| e.to_string())
}

/// The macro's error for `src` (the syntax's or the compile-time check's).
fn error(src: &str) -> String {
    match expanded(src) {
        Ok(_) => panic!("expected an error for\n{src}"),
        Err(e) => e,
    }
}

/// Expands `src`, checking and lowering it (every dtype is declared).
fn lowers(src: &str) {
    let k = kernel(src);
    assert!(
        declared_spec(&k).is_some(),
        "declare every tensor's dtype so the kernel is checked at expansion"
    );
    if let Err(e) = expanded(src) {
        panic!("kernel `{}` does not expand: {e}", k.name);
    }
}

fn dim(k: &Kernel, name: &str) -> DimId {
    k.dims
        .iter()
        .position(|d| d.name == name)
        .unwrap_or_else(|| panic!("no dimension `{name}`"))
}

fn scalar(k: &Kernel, name: &str) -> ScalarId {
    k.scalars
        .iter()
        .position(|s| s.name == name)
        .unwrap_or_else(|| panic!("no scalar `{name}`"))
}

fn tensor(k: &Kernel, name: &str) -> TensorId {
    k.tensors
        .iter()
        .position(|t| t.name == name)
        .unwrap_or_else(|| panic!("no tensor `{name}`"))
}

fn b(e: Expr) -> Box<Expr> {
    Box::new(e)
}

/// Every expression of the kernel, with the `at`s blanked (they are the
/// code's text, checked elsewhere).
fn exprs(k: &Kernel) -> Vec<Expr> {
    let mut v = Vec::new();
    k.walk_exprs(&mut |e| v.push(e.clone()));
    v
}

/// The first store's index and value.
fn first_store(stmts: &[Stmt]) -> (&[Expr], &Expr) {
    let mut found = None;
    walk_stmts(stmts, &mut |s| {
        if let Stmt::Store { index, value, .. } = s {
            found.get_or_insert((index.as_slice(), value));
        }
    });
    found.expect("a store")
}

fn no_at(e: &Expr) -> Expr {
    let e = e.map_children(&mut no_at);
    match e {
        Expr::Load { tensor, index, .. } => Expr::Load {
            tensor,
            index,
            at: String::new(),
        },
        Expr::Binary { op, lhs, rhs, .. } => Expr::Binary {
            op,
            lhs,
            rhs,
            at: String::new(),
        },
        Expr::Compare { op, lhs, rhs, .. } => Expr::Compare {
            op,
            lhs,
            rhs,
            at: String::new(),
        },
        Expr::Rand {
            kind, seed, offset, ..
        } => Expr::Rand {
            kind,
            seed,
            offset,
            at: String::new(),
        },
        Expr::Reduce { op, arg, dim, .. } => Expr::Reduce {
            op,
            arg,
            dim,
            at: String::new(),
        },
        Expr::Scan { op, arg, dim, .. } => Expr::Scan {
            op,
            arg,
            dim,
            at: String::new(),
        },
        Expr::ArgReduce { op, arg, dim, .. } => Expr::ArgReduce {
            op,
            arg,
            dim,
            at: String::new(),
        },
        other => other,
    }
}

fn load(tensor: TensorId, index: Vec<Expr>) -> Expr {
    Expr::Load {
        tensor,
        index,
        at: String::new(),
    }
}

fn bin(op: BinOp, lhs: Expr, rhs: Expr) -> Expr {
    Expr::Binary {
        op,
        lhs: b(lhs),
        rhs: b(rhs),
        at: String::new(),
    }
}

#[test]
fn index_components_are_expressions() {
    let k = kernel(
        r#"
        fn shift(x: &Tensor<f32>, out: &Tensor<f32>, n1: usize) {
            let [m, n] = x.shape();
            for (tm, tn) in tile([m, n]) {
                out[(tm, tn)] = x[(tm, tn + n1)] - x[(tm, tn - n1)] + x[(0, tn)];
            }
        }"#,
    );
    let (tm, tn, x) = (dim(&k, "tm"), dim(&k, "tn"), tensor(&k, "x"));
    let n1 = scalar(&k, "n1");
    let (index, value) = first_store(&k.body);
    assert_eq!(index, tile_index(&[tm, tn]).as_slice());
    let plus = load(
        x,
        vec![
            Expr::TileIndex(tm),
            bin(BinOp::Add, Expr::TileIndex(tn), Expr::Scalar(n1)),
        ],
    );
    let minus = load(
        x,
        vec![
            Expr::TileIndex(tm),
            bin(BinOp::Sub, Expr::TileIndex(tn), Expr::Scalar(n1)),
        ],
    );
    let row0 = load(x, vec![Expr::Int(0), Expr::TileIndex(tn)]);
    assert_eq!(
        no_at(value),
        bin(BinOp::Add, bin(BinOp::Sub, plus, minus), row0)
    );
}

#[test]
fn gathers_nest_loads() {
    let k = kernel(
        r#"
        fn embed(w: &Tensor<f32>, ids: &Tensor<i64>, labels: &Tensor<i64>, logits: &Tensor<f32>, out: &Tensor<f32>, picked: &Tensor<f32>) {
            let [t] = ids.shape();
            let [_, d] = w.shape();
            for (tt, td) in tile([t, d]) {
                out[(tt, td)] = w[(ids[tt], td)];
                picked[tt] = logits[(tt, labels[tt])];
            }
        }"#,
    );
    let (tt, td) = (dim(&k, "tt"), dim(&k, "td"));
    let (w, ids, labels, logits) = (
        tensor(&k, "w"),
        tensor(&k, "ids"),
        tensor(&k, "labels"),
        tensor(&k, "logits"),
    );
    let (_, value) = first_store(&k.body);
    assert_eq!(
        no_at(value),
        load(
            w,
            vec![load(ids, vec![Expr::TileIndex(tt)]), Expr::TileIndex(td)]
        )
    );
    let Stmt::Store { value, .. } = &k.body[1] else {
        panic!("a store")
    };
    assert_eq!(
        no_at(value),
        load(
            logits,
            vec![Expr::TileIndex(tt), load(labels, vec![Expr::TileIndex(tt)])]
        )
    );
}

#[test]
fn each_and_index_loops() {
    let k = kernel(
        r#"
        fn jagged_sum(x: &Tensor<f32>, offsets: &Tensor<i64>, out: &Tensor<f32>, nb: usize) {
            let [_, n] = x.shape();
            for (b, tn) in tile([each(nb), n]) {
                let mut acc = zeros::<f32>([tn]);
                for i in offsets[b]..offsets[b + 1] {
                    acc = acc + x[(i, tn)];
                }
                for j in 0..=3 {
                    acc = acc * 0.5;
                }
                out[(b, tn)] = acc;
            }
        }"#,
    );
    let (bd, tn, i, j) = (dim(&k, "b"), dim(&k, "tn"), dim(&k, "i"), dim(&k, "j"));
    assert_eq!(k.grid, vec![bd, tn]);
    assert!(k.dims[bd].each && k.dims[bd].extent == Some(scalar(&k, "nb")));
    assert!(!k.dims[tn].each);
    assert!(k.dims[i].each && k.dims[i].extent.is_none());
    let offsets = tensor(&k, "offsets");
    let Stmt::Loop {
        dim: d,
        range: Some(r),
        until: None,
        body,
    } = &k.body[1]
    else {
        panic!("an index loop: {:?}", k.body[1])
    };
    assert_eq!(*d, i);
    assert_eq!(no_at(&r.begin), load(offsets, vec![Expr::TileIndex(bd)]));
    assert_eq!(
        no_at(&r.end),
        load(
            offsets,
            vec![bin(BinOp::Add, Expr::TileIndex(bd), Expr::Int(1))]
        )
    );
    let Stmt::Assign { value, .. } = &body[0] else {
        panic!("an assignment")
    };
    assert_eq!(
        no_at(value),
        bin(
            BinOp::Add,
            Expr::Var(0),
            load(
                tensor(&k, "x"),
                vec![Expr::TileIndex(i), Expr::TileIndex(tn)]
            )
        )
    );
    // `0..=3` ends at 3 + 1.
    let Stmt::Loop { range: Some(r), .. } = &k.body[2] else {
        panic!("a loop")
    };
    assert_eq!(r.begin, Expr::Int(0));
    assert_eq!(no_at(&r.end), bin(BinOp::Add, Expr::Int(3), Expr::Int(1)));
    assert!(k.dims[j].each);
}

#[test]
fn an_each_index_is_a_scalar_value() {
    let k = kernel(
        r#"
        fn rows(x: &Tensor<f32>, out: &Tensor<f32>, nb: usize) {
            let [_, n] = x.shape();
            for tn in tile(n) {
                for r in tile(each(nb)) {
                    out[(r, tn)] = x[(r, tn)] * r;
                }
            }
        }"#,
    );
    let r = dim(&k, "r");
    assert!(k.dims[r].each && k.dims[r].extent.is_some());
    let (_, value) = first_store(&k.body);
    let Expr::Binary { rhs, .. } = value else {
        panic!("a product")
    };
    assert_eq!(**rhs, Expr::TileIndex(r));
}

#[test]
fn range_tile_loops() {
    let k = kernel(
        r#"
        fn seg(x: &Tensor<f32>, starts: &Tensor<i64>, out: &Tensor<f32>, nb: usize) {
            for b in tile(each(nb)) {
                let mut acc = zeros::<f32>([]);
                for tn in tile(starts[b]..starts[b + 1]) {
                    acc = acc + x[tn].sum(tn);
                }
                for tk in tile(0..=starts[b]) {
                    acc = acc + x[tk].sum(tk);
                }
                for tu in tile(nb).until(starts[b]) {
                    acc = acc + x[tu].sum(tu);
                }
                out[b] = acc;
            }
        }"#,
    );
    let tn = dim(&k, "tn");
    assert_eq!(k.dims[tn].extent, None);
    assert!(!k.dims[tn].each);
    assert!(
        matches!(&k.body[1], Stmt::Loop { dim, range: Some(_), until: None, .. } if *dim == tn)
    );
    let Stmt::Loop { range: Some(r), .. } = &k.body[2] else {
        panic!("a loop")
    };
    assert!(matches!(r.end, Expr::Binary { op: BinOp::Add, .. }));
    let tu = dim(&k, "tu");
    assert!(
        matches!(&k.body[3], Stmt::Loop { dim, range: None, until: Some(_), .. } if *dim == tu)
    );
    assert!(k.dims[tu].extent.is_some());
}

#[test]
fn atomics_are_statements() {
    let k = kernel(
        r#"
        fn hist(ids: &Tensor<i64>, counts: &Tensor<i32>, x: &Tensor<f32>, total: &Tensor<f32>, big: &Tensor<f32>) {
            let [n] = ids.shape();
            for tn in tile(n) {
                atomic_add(counts[ids[tn]], 1);
                atomic_add(total[0], x[tn].sum(tn));
                atomic_max(big[0], x[tn].max(tn));
                atomic_min(&mut big[1], x[tn].min(tn));
            }
        }"#,
    );
    let ops: Vec<AtomicOp> = k
        .body
        .iter()
        .map(|s| match s {
            Stmt::Atomic { op, .. } => *op,
            other => panic!("an atomic: {other:?}"),
        })
        .collect();
    assert_eq!(
        ops,
        [AtomicOp::Add, AtomicOp::Add, AtomicOp::Max, AtomicOp::Min]
    );
    let Stmt::Atomic {
        tensor: t, index, ..
    } = &k.body[0]
    else {
        panic!()
    };
    assert_eq!(*t, tensor(&k, "counts"));
    assert_eq!(
        no_at(&index[0]),
        load(tensor(&k, "ids"), vec![Expr::TileIndex(dim(&k, "tn"))])
    );
}

#[test]
fn functions_operators_and_casts() {
    let k = kernel(
        r#"
        fn ops(x: &Tensor<f32>, y: &Tensor<i32>, out: &Tensor<f32>, seed: u64) {
            let [n] = x.shape();
            for tn in tile(n) {
                let a = exp2(x[tn]) + x[tn].floor() + x[tn].ln() + log(x[tn]) + x[tn].signum();
                let b = max(x[tn], 0.0) + x[tn].max(1.0) + pow(x[tn], 2.0) + x[tn].powf(0.5) + x[tn].atan2(1.0);
                let c = (y[tn] & 3) | (y[tn] ^ 1) | (y[tn] << 2) | (y[tn] >> 1) | !y[tn];
                let m = x[tn] > 0.0 && x[tn] < 1.0 || !(x[tn] == 0.5);
                let r = rand(seed, tn.index()) + randn(seed, tn.index()) + randint(seed, tn.index()).cast::<f32>();
                let mut z = y[tn];
                z %= 5;
                z &= 7;
                z |= 8;
                z ^= 1;
                z <<= 2;
                z >>= 1;
                z += 1;
                let w = (z as i8).cast::<u8>() as i16;
                let v = w.cast::<bool>();
                out[tn] = select(m, a + b + r, c as f32 + x[tn].prod(tn) + v as f32);
            }
        }"#,
    );
    let all = exprs(&k);
    let has_un = |op: UnOp| {
        all.iter()
            .any(|e| matches!(e, Expr::Unary { op: o, .. } if *o == op))
    };
    let has_bin = |op: BinOp| {
        all.iter()
            .any(|e| matches!(e, Expr::Binary { op: o, .. } if *o == op))
    };
    for op in [UnOp::Exp2, UnOp::Floor, UnOp::Log, UnOp::Sign, UnOp::Not] {
        assert!(has_un(op), "{op:?}");
    }
    for op in [
        BinOp::Max,
        BinOp::Pow,
        BinOp::Atan2,
        BinOp::BitAnd,
        BinOp::BitOr,
        BinOp::BitXor,
        BinOp::Shl,
        BinOp::Shr,
        BinOp::Rem,
    ] {
        assert!(has_bin(op), "{op:?}");
    }
    for kind in RandKind::ALL {
        assert!(all
            .iter()
            .any(|e| matches!(e, Expr::Rand { kind: k, .. } if *k == kind)));
    }
    assert!(all.iter().any(|e| matches!(
        e,
        Expr::Reduce {
            op: ReduceOp::Prod,
            ..
        }
    )));
    for dt in [DType::I8, DType::U8, DType::I16, DType::Bool] {
        assert!(
            all.iter()
                .any(|e| matches!(e, Expr::Cast { dtype: Some(d), .. } if *d == dt)),
            "{dt}"
        );
    }
    // Six compound assignments of the new kinds, and `+=`.
    let assigns = k
        .body
        .iter()
        .filter(|s| matches!(s, Stmt::Assign { .. }))
        .count();
    assert_eq!(assigns, 7);
}

/// Rust's spellings: `clamp` (as a function and a method) is `min(max(x, lo),
/// hi)`; `powi` is `powf`; the scans are `Scan`s of their reductions, and
/// `argmax`/`argmin` the indices theirs pick.
#[test]
fn clamp_powi_scans_and_argmax() {
    let k = kernel(
        r#"
        fn ops(x: &Tensor<f32>, out: &Tensor<f32>) {
            let [m, n] = x.shape();
            for (tm, tn) in tile([m, whole(n)]) {
                let v = x[(tm, tn)];
                out[(tm, tn)] = v.clamp(-1.0, 2.0) + clamp(v, 0.0, 1.0) + v.powi(3) + v.cumsum(tn) + v.cummin(tn)
                    + v.argmax(tn).cast::<f32>() + v.argmin(tn).cast::<f32>();
            }
        }"#,
    );
    let (_, value) = first_store(&k.body);
    let x = Expr::Var(0);
    let clamped =
        |lo: Expr, hi: f64| bin(BinOp::Min, bin(BinOp::Max, x.clone(), lo), Expr::Float(hi));
    let minus_one = Expr::Unary {
        op: UnOp::Neg,
        arg: b(Expr::Float(1.0)),
    };
    let all = exprs(&k);
    let has = |e: &Expr| all.iter().any(|x| no_at(x) == *e);
    assert!(has(&clamped(minus_one, 2.0)), "{value:?}");
    assert!(has(&clamped(Expr::Float(0.0), 1.0)));
    assert!(has(&bin(BinOp::Pow, x.clone(), Expr::Int(3))));
    for op in [ReduceOp::Sum, ReduceOp::Min] {
        assert!(
            all.iter()
                .any(|e| matches!(e, Expr::Scan { op: o, .. } if *o == op)),
            "{op:?}"
        );
    }
    for op in [ReduceOp::Max, ReduceOp::Min] {
        assert!(
            all.iter()
                .any(|e| matches!(e, Expr::ArgReduce { op: o, .. } if *o == op)),
            "{op:?}"
        );
    }
}

#[test]
fn if_conditions_read_any_scalar() {
    let k = kernel(
        r#"
        fn branches(x: &Tensor<f32>, out: &Tensor<f32>, lens: &Tensor<i64>, factor: usize, #[constexpr] act: bool) {
            let [m] = x.shape();
            for tm in tile(m) {
                let y = if factor == 1 { x[tm] } else { x[tm] * 2.0 };
                if act && tm.begin() < lens[0] || !(factor > 2) {
                    out[tm] = y;
                } else if lens[1] {
                    out[tm] = relu(y);
                }
            }
        }"#,
    );
    let Stmt::Let {
        value: Expr::IfConst { cond, .. },
        ..
    } = &k.body[0]
    else {
        panic!("an if value")
    };
    assert!(matches!(
        cond.as_ref(),
        Cond::Cmp {
            op: CmpOp::Eq,
            lhs: Expr::Scalar(_),
            rhs: Expr::Int(1)
        }
    ));
    let Stmt::If {
        cond, otherwise, ..
    } = &k.body[1]
    else {
        panic!("an if")
    };
    let Cond::Or(a, n) = cond else {
        panic!("or: {cond:?}")
    };
    let Cond::And(c, t) = a.as_ref() else {
        panic!("and")
    };
    assert!(matches!(c.as_ref(), Cond::NonZero(Expr::Const(0))));
    assert!(matches!(
        t.as_ref(),
        Cond::Cmp {
            op: CmpOp::Lt,
            lhs: Expr::TileBegin(_),
            rhs: Expr::Load { .. }
        }
    ));
    assert!(
        matches!(n.as_ref(), Cond::Not(c) if matches!(c.as_ref(), Cond::Cmp { op: CmpOp::Gt, .. }))
    );
    assert!(matches!(
        &otherwise[..],
        [Stmt::If {
            cond: Cond::NonZero(Expr::Load { .. }),
            ..
        }]
    ));
}

#[test]
fn new_forms_check_and_lower() {
    // Jagged rows: a sum over each batch's rows.
    lowers(
        r#"
        fn jagged_sum(x: &Tensor<f32>, offsets: &Tensor<i64>, out: &Tensor<f32>, nb: usize) {
            let [_, n] = x.shape();
            for (b, tn) in tile([each(nb), n]) {
                let mut acc = zeros::<f32>([tn]);
                for i in offsets[b]..offsets[b + 1] {
                    acc = acc + x[(i, tn)];
                }
                out[(b, tn)] = acc;
            }
        }"#,
    );
    // An embedding gather.
    lowers(
        r#"
        fn embed(w: &Tensor<bf16>, ids: &Tensor<i64>, out: &Tensor<bf16>) {
            let [t] = ids.shape();
            let [_, d] = w.shape();
            for (tt, td) in tile([t, d]) {
                out[(tt, td)] = w[(ids[tt], td)];
            }
        }"#,
    );
    // A histogram with atomics, and a row sum into one place.
    lowers(
        r#"
        fn hist(ids: &Tensor<i64>, counts: &Tensor<i32>, x: &Tensor<f32>, total: &Tensor<f32>) {
            let [n] = ids.shape();
            for tn in tile(n) {
                atomic_add(counts[ids[tn]], 1);
                atomic_add(total[0], x[tn].sum(tn));
            }
        }"#,
    );
    // Dropout, with a runtime `if` on a host value.
    lowers(
        r#"
        fn dropout(x: &Tensor<f32>, out: &Tensor<f32>, seed: u64, keep_all: usize) {
            let [m, n] = x.shape();
            for (tm, tn) in tile([m, n]) {
                let keep = rand(seed, tm.index() * n + tn.index()) > 0.1;
                if keep_all != 0 {
                    out[(tm, tn)] = x[(tm, tn)];
                } else {
                    out[(tm, tn)] = select(keep, x[(tm, tn)] / 0.9, 0.0);
                }
            }
        }"#,
    );
    // Cross-entropy's picked logit, and a loop over a range computed in the program.
    lowers(
        r#"
        fn picked(logits: &Tensor<f32>, labels: &Tensor<i64>, starts: &Tensor<i64>, out: &Tensor<f32>, seg: &Tensor<f32>, nb: usize) {
            let [m, v] = logits.shape();
            for tm in tile(m) {
                out[tm] = logits[(tm, labels[tm])];
                for b in tile(each(nb)) {
                    let mut acc = zeros::<f32>([]);
                    for tv in tile(starts[b]..starts[b + 1]) {
                        acc = acc + logits[(0, tv)].sum(tv);
                    }
                    seg[b] = acc;
                }
            }
        }"#,
    );
    // Bit tricks on small integer types.
    lowers(
        r#"
        fn bits(x: &Tensor<u8>, y: &Tensor<i16>, out: &Tensor<i8>) {
            let [n] = x.shape();
            for tn in tile(n) {
                let mut z = (x[tn] & 15) | (y[tn] << 2);
                z ^= 3;
                z >>= 1;
                out[tn] = z.cast::<i8>();
            }
        }"#,
    );
}

#[test]
fn a_bare_tile_is_not_a_value() {
    let e = error(
        r#"
        fn f(x: &Tensor<f32>, out: &Tensor<f32>) {
            let [n] = x.shape();
            for tn in tile(n) {
                out[tn] = x[tn] + tn;
            }
        }"#,
    );
    assert!(
        e.contains("tile `tn` is not a value; use `tn.index()`"),
        "{e}"
    );
}

#[test]
fn reducing_along_an_each_index_is_refused() {
    let e = error(
        r#"
        fn f(x: &Tensor<f32>, out: &Tensor<f32>, nb: usize) {
            let [_, n] = x.shape();
            for (b, tn) in tile([each(nb), n]) {
                out[tn] = x[(b, tn)].max(b);
            }
        }"#,
    );
    assert!(e.contains("nothing to reduce along it"), "{e}");
    assert!(e.contains("max(x, b)"), "{e}");
}

#[test]
fn float_index_components_are_refused() {
    let e = error(
        r#"
        fn f(x: &Tensor<f32>, out: &Tensor<f32>) {
            let [n] = x.shape();
            for tn in tile(n) {
                out[tn] = x[(tn, 0.5)];
            }
        }"#,
    );
    assert!(e.contains("index components are integers"), "{e}");
    // A float computed in the program: the checker's message.
    let e = error(
        r#"
        fn f(x: &Tensor<f32>, w: &Tensor<f32>, out: &Tensor<f32>) {
            let [n] = x.shape();
            for tn in tile(n) {
                out[tn] = w[x[tn]];
            }
        }"#,
    );
    assert!(e.contains("indices are integers"), "{e}");
    assert!(
        !e.starts_with("in kernel"),
        "spanned errors carry just the message: {e}"
    );
}

#[test]
fn host_extents_cannot_use_device_values() {
    let e = error(
        r#"
        fn f(x: &Tensor<f32>, offsets: &Tensor<i64>, out: &Tensor<f32>, nb: usize) {
            for b in tile(each(nb)) {
                let len = offsets[b + 1] - offsets[b];
                for tn in tile(len) {
                    out[tn] = x[tn];
                }
            }
        }"#,
    );
    assert!(e.contains("uses `len` of the device code"), "{e}");
    assert!(e.contains("tile(begin..end)"), "{e}");
}

#[test]
fn grid_ranges_and_open_ranges_are_refused() {
    let e = error(
        r#"
        fn f(x: &Tensor<f32>, out: &Tensor<f32>) {
            let [n] = x.shape();
            for tn in tile(0..n) {
                out[tn] = x[tn];
            }
        }"#,
    );
    assert!(
        e.contains("the grid's tiles need extents computed on the host"),
        "{e}"
    );
    let e = error(
        r#"
        fn f(x: &Tensor<f32>, out: &Tensor<f32>, nb: usize) {
            let [n] = x.shape();
            for tn in tile(n) {
                for i in 1.. {
                    out[tn] = x[tn];
                }
            }
        }"#,
    );
    assert!(e.contains("needs both ends"), "{e}");
}

#[test]
fn atomics_need_a_place_and_are_not_values() {
    let e = error(
        r#"
        fn f(x: &Tensor<f32>, total: &Tensor<f32>) {
            let [n] = x.shape();
            for tn in tile(n) {
                atomic_add(total, x[tn].sum(tn));
            }
        }"#,
    );
    assert!(e.contains("the place to update, a tensor index"), "{e}");
    // The old values go to a `let` only: not inside an expression.
    let e = error(
        r#"
        fn f(x: &Tensor<f32>, total: &Tensor<f32>, out: &Tensor<f32>) {
            let [n] = x.shape();
            for tn in tile(n) {
                out[0] = 1.0 + atomic_add(total[0], x[tn].sum(tn));
            }
        }"#,
    );
    assert!(
        e.contains("is a statement") && e.contains("let old = atomic_add(t[index], value);"),
        "{e}"
    );
}

#[test]
fn a_let_keeps_an_atomics_old_values() {
    let k = kernel(
        r#"
        fn slots(ids: &Tensor<i64>, counts: &Tensor<i32>, slot: &Tensor<i32>) {
            let [n] = ids.shape();
            for tn in tile(n) {
                let mut s = atomic_add(counts[ids[tn]], 1);
                slot[tn] = s;
            }
        }"#,
    );
    let Stmt::Atomic {
        op: AtomicOp::Add,
        tensor: t,
        old: Some(v),
        ..
    } = &k.body[0]
    else {
        panic!("an atomic keeping its old values: {:?}", k.body[0])
    };
    assert_eq!(*t, tensor(&k, "counts"));
    assert_eq!(k.vars[*v].name, "s");
    assert!(k.vars[*v].mutable);
    let Stmt::Store { value, .. } = &k.body[1] else {
        panic!("a store: {:?}", k.body[1])
    };
    assert_eq!(*value, Expr::Var(*v));
}

#[test]
fn checker_errors_keep_their_message() {
    let e = error(
        r#"
        fn f(x: &Tensor<f32>, out: &Tensor<f32>) {
            let [m, n] = x.shape();
            for tm in tile(m) {
                for tn in tile(n) {
                    out[tm] = x[(tm, tn)].sum(tn);
                }
            }
        }"#,
    );
    assert!(
        e.contains("only the last block's partial result remains"),
        "{e}"
    );
    let e = error(
        r#"
        fn f(ids: &Tensor<i64>, counts: &Tensor<u8>) {
            let [n] = ids.shape();
            for tn in tile(n) {
                atomic_add(counts[ids[tn]], 1);
            }
        }"#,
    );
    assert!(e.contains("this one holds u8"), "{e}");
}

#[test]
fn full_takes_the_bounds_a_double_holds() {
    let k = kernel(
        r#"
        fn bounds(x: &Tensor<i32>, out: &Tensor<i32>) {
            for tm in tile(x.size(0)) {
                let lo = full::<i32>([tm], i32::MIN);
                let hi = full::<u32>([tm], u32::MAX);
                out[tm] = max(x[tm], lo) + hi.cast::<i32>();
            }
        }
    "#,
    );
    let values: Vec<f64> = exprs(&k)
        .iter()
        .filter_map(|e| match e {
            Expr::Full { value, .. } => Some(*value),
            _ => None,
        })
        .collect();
    assert_eq!(values, vec![i32::MIN as f64, u32::MAX as f64]);
    let e = error(
        r#"
        fn big(out: &Tensor<i64>) {
            for tm in tile(out.size(0)) {
                out[tm] = full::<i64>([tm], i64::MAX);
            }
        }
    "#,
    );
    assert!(e.contains("not `i64::MAX`"), "{e}");
}

#[test]
fn a_tuple_let_binds_every_value_before_any_name() {
    // `(b, a)` swaps: the values are read before the names are rebound.
    let k = kernel(
        r#"
        fn swap(x: &Tensor<f32>, y: &Tensor<f32>, out: &Tensor<f32>) {
            for tm in tile(x.size(0)) {
                let (a, b) = (x[tm], y[tm]);
                let (a, mut b) = (b, a);
                b += 1.0;
                out[tm] = a - b;
            }
        }
    "#,
    );
    let names: Vec<(&str, bool)> = k
        .vars
        .iter()
        .map(|v| (v.name.as_str(), v.mutable))
        .collect();
    assert_eq!(
        names,
        vec![("a", false), ("b", false), ("a", false), ("b", true)]
    );
    // The grid's loop is the kernel's body. The second let's values are the
    // first let's variables, crossed.
    let body = &k.body;
    assert!(matches!(
        &body[2],
        Stmt::Let {
            var: 2,
            value: Expr::Var(1),
            ..
        }
    ));
    assert!(matches!(
        &body[3],
        Stmt::Let {
            var: 3,
            value: Expr::Var(0),
            ..
        }
    ));
    let e = error(
        r#"
        fn bad(x: &Tensor<f32>, out: &Tensor<f32>) {
            for tm in tile(x.size(0)) {
                let (a, b) = x[tm];
                out[tm] = a + b;
            }
        }
    "#,
    );
    assert!(e.contains("takes a tuple of 2 values"), "{e}");
}

/// A name near a device function (or method) gets the nearest one; any other name gets
/// every function of the tables (computed from them, so a new table entry
/// shows up here without another edit).
#[test]
fn unknown_functions_get_the_nearest_name_or_every_name() {
    let call = |f: &str| {
        error(&format!(
            r#"
            fn bad(x: &Tensor<f32>, out: &Tensor<f32>) {{
                for tm in tile(x.size(0)) {{
                    out[tm] = {f}(x[tm]);
                }}
            }}
        "#
        ))
    };
    let e = call("sigmiod");
    assert!(
        e.contains("unknown function `sigmiod`") && e.contains("did you mean `sigmoid`?"),
        "{e}"
    );
    let method = |m: &str| {
        error(&format!(
            r#"
            fn bad(x: &Tensor<f32>, out: &Tensor<f32>) {{
                for tm in tile(x.size(0)) {{
                    out[tm] = x[tm].{m}();
                }}
            }}
        "#
        ))
    };
    let e = method("sigmiod");
    assert!(
        e.contains("unknown method `.sigmiod()`") && e.contains("did you mean `.sigmoid()`?"),
        "{e}"
    );
    assert!(method("frobnicate").contains("the DSL has"));
    let e = call("softmax");
    assert!(!e.contains("did you mean"), "{e}");
    for op in tilefuse_codegen::prims::UnOp::ALL {
        assert!(e.contains(op.name()), "`{}` missing: {e}", op.name());
    }
    for op in tilefuse_codegen::prims::BinOp::ALL {
        if let Some(f) = op.function() {
            assert!(e.contains(f), "`{f}` missing: {e}");
        }
    }
}
