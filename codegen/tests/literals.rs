//! Values made of integer literals take the integer type they meet
//! (`tilefuse_codegen::literals`): a count carried down a loop as
//! `count + select(v > 0.0, 1, 0).sum(tm)` is summed in `count`'s i32, not in
//! 64 bits, where every literal fits; elsewhere nothing changes.

mod common;
use common::*;
use std::borrow::Cow;
use tilefuse_codegen::literals::with_literal_types;

fn ints_spec(k: &Kernel) -> Spec {
    spec_of(k, &vec![ScalarKind::Int; k.scalars.len()])
}

/// Per column: how many elements are positive, counted in a `t`, each
/// positive element adding `one`.
fn positive_count(one: &str, t: &str) -> Kernel {
    parse(&format!(
        "kernel positive_count(x: Tensor<f32, 2>, out: Tensor<{t}, 1>; n, m) {{
           for tn in tile(n) {{
             let mut count = zeros::<{t}>([tn]);
             for tm in tile(m) {{
               count = count + select(x[(tm, tn)] > 0.0, {one}, 0).sum(tm);
             }}
             out[tn] = count;
           }}
         }}"
    ))
}

/// The literals the rewrite cast, with their types.
fn casts(k: &Kernel) -> Vec<(i64, DType)> {
    let mut out = Vec::new();
    k.walk_exprs(&mut |e| {
        if let Expr::Cast {
            arg,
            dtype: Some(t),
        } = e
        {
            if let Expr::Int(v) = **arg {
                out.push((v, *t));
            }
        }
    });
    out
}

#[test]
fn a_count_of_literals_is_summed_in_the_counts_type() {
    for (t, dtype) in [("i32", DType::I32), ("u32", DType::U32)] {
        let k = positive_count("1", t);
        let spec = ints_spec(&k);
        let typed = with_literal_types(&k, &spec).unwrap();
        assert!(matches!(typed, Cow::Owned(_)), "{t}");
        assert_eq!(casts(&typed), vec![(1, dtype), (0, dtype)], "{t}");
        // The loop defers the sum into a register tile of the count's type,
        // selecting in that type: no 64-bit select, add or shuffle.
        let l = lower(
            &Planned::new(k.clone()),
            &spec,
            &Config::new(&[128, 16]).num_warps(1),
        )
        .unwrap();
        let c = if t == "i32" { "int" } else { "unsigned int" };
        assert!(
            l.source.contains(&format!("{c} tf_d")) && l.source.contains("`count`'s terms"),
            "{t}:\n{}",
            l.source
        );
        assert!(
            !l.source.contains("tf_select<long long>"),
            "{t}:\n{}",
            l.source
        );
    }
}

#[test]
fn literals_that_do_not_fit_or_meet_an_i64_stay_as_they_are() {
    // 2^32 fits neither i32 nor u32: the value stays an i64.
    let k = positive_count("4294967296", "i32");
    assert!(matches!(
        with_literal_types(&k, &ints_spec(&k)).unwrap(),
        Cow::Borrowed(_)
    ));
    // An i64 count: the literals are i64 already.
    let k = positive_count("1", "i64");
    assert!(matches!(
        with_literal_types(&k, &ints_spec(&k)).unwrap(),
        Cow::Borrowed(_)
    ));
    // A float count: floats are not retyped.
    let k = positive_count("1", "f32");
    assert!(matches!(
        with_literal_types(&k, &ints_spec(&k)).unwrap(),
        Cow::Borrowed(_)
    ));
}
