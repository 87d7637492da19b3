//! Every entry of the primitive tables (`codegen::prims`) on the GPU against
//! interpret mode: one kernel per elementwise function, binary operation and
//! reduction, for floats and for integers where the entry takes them, built
//! from the IR's text. A new table entry is tested here without another
//! line: the kernels are made from the tables.

use crate::common::gpu;
use crate::common::interp::{out, tensors};
use tilefuse::codegen::dtype::DType;
use tilefuse::codegen::ir::Kernel;
use tilefuse::codegen::prims::cast::Num;
use tilefuse::codegen::prims::{binary, unary, BinOp, ReduceOp, UnOp};
use tilefuse::codegen::{default_config, fit_whole_dims, Config};
use tilefuse::interpret::{run, HostTensor, Scalar};
use tilefuse::runtime::args::{AsTensorArg, ScalarArg};
use tilefuse::{KernelDef, Tensor};
use tilefuse_testkit::Rng;

/// Rows and columns: ragged against every block size.
const M: usize = 37;
const N: usize = 301;

/// One kernel of the tables, with what its inputs must avoid.
struct Case {
    what: String,
    text: String,
    /// i32 tensors (else f32).
    ints: bool,
    /// The operation of a second input `b`, if there is one.
    binary: Option<BinOp>,
    /// A product: inputs near 1.
    product: bool,
    /// Combines many elements (a reduction, a scan): floats in another
    /// order than interpret mode's.
    reorders: bool,
    /// The output's shape.
    out: Vec<usize>,
}

fn elementwise(name: &str, ints: bool, body: &str, binary: Option<BinOp>) -> Case {
    let t = if ints { "i32" } else { "f32" };
    let b = if binary.is_some() {
        format!(", b: Tensor<{t}, 2>")
    } else {
        String::new()
    };
    Case {
        what: format!("{name} on {t}"),
        text: format!(
            "kernel prim(a: Tensor<{t}, 2>{b}, out: Tensor<{t}, 2>; m, n) {{\n  \
             for (tm, tn) in tile([m, n]) {{\n    out[(tm, tn)] = ({body}).cast();\n  }}\n}}\n"
        ),
        ints,
        binary,
        product: false,
        reorders: false,
        out: vec![M, N],
    }
}

/// A kernel per table entry and element type it takes.
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for e in unary::TABLE {
        let call = format!("{}(a[(tm, tn)])", e.name);
        if !e.cuda.is_empty() {
            cases.push(elementwise(e.name, false, &call, None));
        }
        if !e.cuda_int.is_empty() {
            cases.push(elementwise(e.name, true, &call, None));
        }
    }
    for e in binary::TABLE {
        let (x, y) = ("a[(tm, tn)]", "b[(tm, tn)]");
        let call = match e.function {
            Some(f) => format!("{f}({x}, {y})"),
            None => format!("{x} {} {y}", e.symbol),
        };
        if !e.cuda.is_empty() {
            cases.push(elementwise(e.symbol, false, &call, Some(e.op)));
        }
        if !e.cuda_int.is_empty() {
            cases.push(elementwise(e.symbol, true, &call, Some(e.op)));
        }
    }
    for &op in ReduceOp::ALL {
        for ints in [false, true] {
            let t = if ints { "i32" } else { "f32" };
            cases.push(Case {
                what: format!("{} on {t}", op.name()),
                text: format!(
                    "kernel prim(a: Tensor<{t}, 2>, out: Tensor<{t}, 1>; m, n) {{\n  \
                     for (tm, tn) in tile([m, whole(n)]) {{\n    \
                     out[tm] = a[(tm, tn)].{}(tn).cast();\n  }}\n}}\n",
                    op.name()
                ),
                ints,
                binary: None,
                product: op == ReduceOp::Prod,
                reorders: true,
                out: vec![M],
            });
        }
        // Carried down a loop, as a column reduction writes it (the general
        // lowering keeps per-element totals and reduces them after the loop),
        // and along a row, as a norm writes it (the row lowering's form).
        let id = match op.identity(DType::F32) {
            Num::F(v) if v.is_infinite() => format!("{}inf", if v < 0.0 { "-" } else { "" }),
            Num::F(v) => format!("{v:?}"),
            Num::I(v) => v.to_string(),
        };
        for (form, kept, walked, len) in [
            ("down a loop", "tn", "tm", N),
            ("along a row", "tm", "tn", M),
        ] {
            let x = format!("a[(tm, tn)].{}({walked})", op.name());
            let step = match op.binary().function() {
                Some(f) => format!("{f}(acc, {x})"),
                None => format!("acc {} {x}", op.binary().symbol()),
            };
            cases.push(Case {
                what: format!("{} {form} on f32", op.name()),
                text: format!(
                    "kernel prim(a: Tensor<f32, 2>, out: Tensor<f32, 1>; m, n) {{\n  \
                     for {kept} in tile({}) {{\n    let mut acc = full::<f32>([{kept}], {id});\n    \
                     for {walked} in tile({}) {{\n      acc = {step};\n    }}\n    out[{kept}] = acc;\n  }}\n}}\n",
                    &kept[1..],
                    &walked[1..],
                ),
                ints: false,
                binary: None,
                product: op == ReduceOp::Prod,
                reorders: true,
                out: vec![len],
            });
        }
    }
    // The index a reduction picks, over whole rows (ties are common among
    // integers in (−1000, 1000): the first counts).
    for &op in ReduceOp::ALL {
        let Some(pick) = op.arg_name() else { continue };
        for ints in [false, true] {
            let t = if ints { "i32" } else { "f32" };
            cases.push(Case {
                what: format!("{pick} on {t}"),
                text: format!(
                    "kernel prim(a: Tensor<{t}, 2>, out: Tensor<{t}, 1>; m, n) {{\n  \
                     for (tm, tn) in tile([m, whole(n)]) {{\n    \
                     out[tm] = a[(tm, tn)].{pick}(tn).cast();\n  }}\n}}\n"
                ),
                ints,
                binary: None,
                product: false,
                reorders: false,
                out: vec![M],
            });
        }
    }
    for &op in ReduceOp::ALL {
        let scan = op.scan_name();
        // Over whole rows, on floats and integers.
        for ints in [false, true] {
            let t = if ints { "i32" } else { "f32" };
            cases.push(Case {
                what: format!("{scan} on {t}"),
                text: format!(
                    "kernel prim(a: Tensor<{t}, 2>, out: Tensor<{t}, 2>; m, n) {{\n  \
                     for (tm, tn) in tile([m, whole(n)]) {{\n    \
                     out[(tm, tn)] = a[(tm, tn)].{scan}(tn).cast();\n  }}\n}}\n"
                ),
                ints,
                binary: None,
                product: op == ReduceOp::Prod,
                reorders: true,
                out: vec![M, N],
            });
        }
        // Block by block with the total carried: along the rows (lanes side
        // by side) and down the columns (lanes and warps at strides).
        let id = match op.identity(DType::F32) {
            Num::F(v) if v.is_infinite() => format!("{}inf", if v < 0.0 { "-" } else { "" }),
            Num::F(v) => format!("{v:?}"),
            Num::I(v) => v.to_string(),
        };
        let with = |a: &str, b: &str| match op.binary().function() {
            Some(f) => format!("{f}({a}, {b})"),
            None => format!("({a} {} {b})", op.binary().symbol()),
        };
        for (form, kept, walked) in [
            ("carried along rows", "tm", "tn"),
            ("carried down columns", "tn", "tm"),
        ] {
            let x = "a[(tm, tn)]";
            cases.push(Case {
                what: format!("{scan} {form} on f32"),
                text: format!(
                    "kernel prim(a: Tensor<f32, 2>, out: Tensor<f32, 2>; m, n) {{\n  \
                     for {kept} in tile({}) {{\n    let mut acc = full::<f32>([{kept}], {id});\n    \
                     for {walked} in tile({}) {{\n      out[(tm, tn)] = {};\n      acc = {};\n    }}\n  }}\n}}\n",
                    &kept[1..],
                    &walked[1..],
                    with("acc", &format!("{x}.{scan}({walked})")),
                    with("acc", &format!("{x}.{}({walked})", op.name())),
                ),
                ints: false,
                binary: None,
                product: op == ReduceOp::Prod,
                reorders: true,
                out: vec![M, N],
            });
        }
    }
    cases
}

/// Inputs: floats in (−3, 3) (products near 1); integers in (−1000, 1000),
/// divisors without 0, shift amounts in [-4, 40) (negative and past the
/// width too).
fn input(rng: &mut Rng, case: &Case, second: bool) -> Vec<f64> {
    (0..M * N)
        .map(|_| {
            let u = rng.uniform();
            match (case.ints, case.binary, second) {
                (false, _, _) if case.product => 1.0 + 0.01 * u,
                (false, _, _) => 3.0 * u,
                (true, Some(BinOp::Shl | BinOp::Shr), true) => (u * 22.0 + 18.0).floor(),
                (true, Some(BinOp::Div | BinOp::Rem), true) => {
                    let v = (u * 50.0).round();
                    if v == 0.0 {
                        7.0
                    } else {
                        v
                    }
                }
                (true, _, _) if case.product => (u * 3.0).round(),
                (true, _, _) => (u * 1000.0).round(),
            }
        })
        .collect()
}

fn device_tensor(
    ints: bool,
    shape: &[usize],
    v: &[f64],
) -> (Option<Tensor<f32>>, Option<Tensor<i32>>) {
    if ints {
        let d: Vec<i32> = v.iter().map(|&x| x as i32).collect();
        (None, Some(Tensor::from_slice(&d, shape).unwrap()))
    } else {
        let d: Vec<f32> = v.iter().map(|&x| x as f32).collect();
        (Some(Tensor::from_slice(&d, shape).unwrap()), None)
    }
}

fn arg(t: &(Option<Tensor<f32>>, Option<Tensor<i32>>)) -> tilefuse::runtime::args::TensorArg {
    match t {
        (Some(f), _) => f.tensor_arg(),
        (_, Some(i)) => i.tensor_arg(),
        _ => unreachable!("one of the two is made"),
    }
}

fn to_host(t: &(Option<Tensor<f32>>, Option<Tensor<i32>>)) -> Vec<f64> {
    match t {
        (Some(f), _) => f.to_vec().unwrap().into_iter().map(f64::from).collect(),
        (_, Some(i)) => i.to_vec().unwrap().into_iter().map(f64::from).collect(),
        _ => unreachable!("one of the two is made"),
    }
}

/// The case's kernel, as the macro would define it.
fn define(c: &Case) -> &'static KernelDef {
    define_text(&c.text, &c.what)
}

/// A kernel from the IR's text, as the macro would define it.
fn define_text(text: &str, what: &str) -> &'static KernelDef {
    let kernel = Kernel::parse(text).unwrap_or_else(|e| panic!("{what}: {e}\n{text}"));
    let json: &'static str = Box::leak(kernel.to_json().into_boxed_str());
    Box::leak(Box::new(KernelDef::new("prim", json, None)))
}

/// Every case parses, passes the checker and lowers with its default; with
/// NVRTC present (CI), it compiles for sm_90a and sm_80. Needs no GPU, so a
/// table entry whose kernel the compiler refuses fails here.
#[test]
fn every_primitive_compiles() {
    let cases = cases();
    assert!(cases.len() >= UnOp::ALL.len() + BinOp::ALL.len() + 4 * ReduceOp::ALL.len());
    let nvrtc = crate::common::nvrtc_or_skip();
    for c in &cases {
        let def = define(c);
        let spec = def
            .declared_spec()
            .unwrap_or_else(|e| panic!("{}: {e}", c.what));
        let cfg = default_config(def.ir().unwrap());
        let lowered = def
            .lower(&spec, &cfg)
            .unwrap_or_else(|e| panic!("{} does not lower: {e}\n{}", c.what, c.text));
        // The loop forms take the lowering and form they are here to test.
        if c.what.contains("along a row") {
            assert_eq!(def.ir().unwrap().lowering(), "rows", "{}", c.what);
        }
        if c.what.contains("down a loop") {
            assert!(
                lowered.source.contains("reduced after the loop"),
                "{}: not deferred",
                c.what
            );
        }
        if nvrtc {
            // A carried scan also at one row or column a step: no lane,
            // warp or repeat along its dimension (its totals go unused).
            let mut configs = vec![cfg.clone()];
            if c.what.contains("carried") {
                configs.push(Config::new(&[64, 1]).num_warps(1));
                configs.push(Config::new(&[1, 64]).num_warps(1));
            }
            for cfg in &configs {
                for arch in ["sm_90a", "sm_80"] {
                    let log = def
                        .compile(&spec, cfg, arch)
                        .unwrap_or_else(|e| panic!("{} at {cfg} for {arch}: {e}", c.what))
                        .log;
                    assert!(
                        !log.contains("warning"),
                        "{} at {cfg} for {arch} warns:\n{log}",
                        c.what
                    );
                }
            }
        }
    }
}

#[test]
fn every_primitive_on_the_gpu_matches_interpret_mode() {
    let Some(dev) = gpu() else { return };
    let mut rng = Rng::fresh();
    let mut failed = Vec::new();
    for c in cases() {
        let def = define(&c);
        let a = input(&mut rng, &c, false);
        let b = c.binary.map(|_| input(&mut rng, &c, true));
        let out_shape = c.out.clone();
        let poison = vec![-12345.0; out_shape.iter().product()];
        let ta = device_tensor(c.ints, &[M, N], &a);
        let tb = b.as_ref().map(|b| device_tensor(c.ints, &[M, N], b));
        let to = device_tensor(c.ints, &out_shape, &poison);
        let mut args = vec![arg(&ta)];
        args.extend(tb.as_ref().map(arg));
        args.push(arg(&to));
        let scalars = [ScalarArg::Int(M as i64), ScalarArg::Int(N as i64)];
        def.launch(&args, &scalars, &[])
            .unwrap_or_else(|e| panic!("{}: {e}", c.what));
        let gpu_out = to_host(&to);

        let ir = def.ir().unwrap().clone();
        // The interpreter takes the config the launch fitted: `whole(n)` covers `n`.
        let extents: Vec<Option<usize>> = ir
            .dims
            .iter()
            .map(|d| Some(if d.name == "tm" { M } else { N }))
            .collect();
        let cfg = fit_whole_dims(&ir, def.config_on(&dev).unwrap(), &extents);
        let dt = if c.ints { DType::I32 } else { DType::F32 };
        let host =
            |v: &[f64], shape: &[usize]| HostTensor::from_f64(dt, shape, v.to_vec()).unwrap();
        let mut named = vec![("a", host(&a, &[M, N]))];
        named.extend(b.as_ref().map(|b| ("b", host(b, &[M, N]))));
        named.push(("out", host(&poison, &out_shape)));
        let t = tensors(&ir, named);
        run(
            &ir,
            &cfg,
            &[],
            &t,
            &[Scalar::Int(M as i64), Scalar::Int(N as i64)],
        )
        .unwrap_or_else(|e| panic!("{} in interpret mode: {e}", c.what));
        let cpu_out = out(&ir, &t, "out");

        // Integers agree exactly; floats elementwise within a few f32 ulp of
        // the larger magnitude plus a floor (f32 evaluation of a function that
        // cancels, as `gelu` near −3, against interpret mode's f64 rounded
        // once), NaN where the other has NaN.
        // A float reduction or scan sums in another order than interpret
        // mode: its error scales with the largest result, not each one.
        let floor = if c.reorders {
            1e-6 * cpu_out.iter().fold(1.0f64, |m, v| m.max(v.abs()))
        } else {
            1e-6
        };
        let bad = gpu_out.iter().zip(&cpu_out).position(|(&g, &h)| {
            if c.ints {
                g != h
            } else if g.is_nan() || h.is_nan() {
                g.is_nan() != h.is_nan()
            } else {
                (g - h).abs() > 4e-6 * g.abs().max(h.abs()) + floor
            }
        });
        let verdict = match bad {
            None => "ok".to_string(),
            Some(i) => {
                let at = format!(
                    "element {i}: GPU {} vs interpret {}",
                    gpu_out[i], cpu_out[i]
                );
                failed.push(format!("{}: {at}", c.what));
                at
            }
        };
        eprintln!("{}: {verdict}", c.what);
    }
    assert!(
        failed.is_empty(),
        "GPU and interpret mode disagree:\n{}",
        failed.join("\n")
    );
}

/// `/` on f32 at the ends of the range, where `tf_div` scales the divisor
/// into `rcp.approx`'s range (above 2^126, below 2^-126, zeros and
/// infinities), elementwise and with a divisor shared by a row (its
/// reciprocal computed once): within 2 ulp of the quotient rounded once,
/// the same infinities, zeros and NaNs.
#[test]
fn division_across_the_f32_range_is_within_two_ulp() {
    let texts = [
        "kernel div(a: Tensor<f32, 2>, b: Tensor<f32, 2>, d: Tensor<f32, 1>, out: Tensor<f32, 2>; m, n) {\n  \
         for (tm, tn) in tile([m, n]) {\n    out[(tm, tn)] = a[(tm, tn)] / b[(tm, tn)];\n  }\n}\n",
        "kernel div(a: Tensor<f32, 2>, b: Tensor<f32, 2>, d: Tensor<f32, 1>, out: Tensor<f32, 2>; m, n) {\n  \
         for (tm, tn) in tile([m, n]) {\n    out[(tm, tn)] = a[(tm, tn)] / d[tm];\n  }\n}\n",
    ];
    // Divisors: each end of the range, both signs, and ordinary values.
    let ends: [f32; 12] = [
        3.0e38,
        1.0e38,
        9.0e37,
        1.0e-37,
        1.1e-38,
        1.0e-39,
        1.0e-42,
        1.0e-45,
        0.0,
        f32::INFINITY,
        0.75,
        3.0,
    ];
    let mut rng = Rng::fresh();
    let mut b = vec![0f32; M * N];
    let mut a = vec![0f32; M * N];
    for (i, (x, y)) in a.iter_mut().zip(b.iter_mut()).enumerate() {
        let sign = if rng.uniform() < 0.0 { -1.0 } else { 1.0 };
        *y = sign * ends[i % ends.len()];
        // Numerators: ordinary, tiny and huge, so quotients overflow and
        // underflow too.
        let u = rng.uniform() as f32;
        *x = match (i / ends.len()) % 4 {
            0 => 3.0 * u,
            1 => 1.0e-30 * u,
            2 => 1.0e30 * u,
            _ => 2.0e38 * u,
        };
    }
    let d: Vec<f32> = (0..M).map(|r| ends[r % ends.len()]).collect();
    let defs: Vec<&'static KernelDef> = texts.iter().map(|t| define_text(t, "division")).collect();
    if crate::common::nvrtc_or_skip() {
        for (form, def) in defs.iter().enumerate() {
            let spec = def.declared_spec().unwrap();
            let cfg = default_config(def.ir().unwrap());
            for arch in ["sm_90a", "sm_80"] {
                def.compile(&spec, &cfg, arch)
                    .unwrap_or_else(|e| panic!("form {form} for {arch}: {e}"));
            }
        }
    }
    let Some(_dev) = gpu() else { return };
    let tiny = f32::from_bits(1);
    for (form, def) in defs.iter().enumerate() {
        let ta = Tensor::from_slice(&a, [M, N]).unwrap();
        let tb = Tensor::from_slice(&b, [M, N]).unwrap();
        let td = Tensor::from_slice(&d, [M]).unwrap();
        let to = Tensor::from_slice(&vec![-12345.0f32; M * N], [M, N]).unwrap();
        let args = [
            ta.tensor_arg(),
            tb.tensor_arg(),
            td.tensor_arg(),
            to.tensor_arg(),
        ];
        def.launch(
            &args,
            &[ScalarArg::Int(M as i64), ScalarArg::Int(N as i64)],
            &[],
        )
        .unwrap_or_else(|e| panic!("form {form}: {e}"));
        let got = to.to_vec().unwrap();
        for (i, &g) in got.iter().enumerate() {
            let den = if form == 0 { b[i] } else { d[i / N] };
            let want = (f64::from(a[i]) / f64::from(den)) as f32;
            let ok = if want.is_nan() || g.is_nan() {
                want.is_nan() && g.is_nan()
            } else if want.is_infinite() {
                // Overflowed: infinity, or within 2 ulp of the largest finite.
                g == want
                    || (g.signum() == want.signum()
                        && g.abs() >= f32::MAX * (1.0 - 4.0 * f32::EPSILON))
            } else {
                // An ulp of the quotient (of the subnormals below 2^-126).
                let ulp = (want.abs() * f32::EPSILON).max(tiny);
                (g - want).abs() <= 2.0 * ulp
            };
            assert!(
                ok,
                "form {form}, element {i}: {} / {den} = {g} on the GPU, {want} rounded once",
                a[i]
            );
        }
    }
}

/// A value rounded once to a 16-bit float, and the distance to the next one.
type Rounding = fn(f64) -> (f64, f64);

/// The 16-bit floats a narrow form rounds to: the next value up.
trait Half: tilefuse::runtime::Element {
    fn next(self) -> Self;
}

impl Half for half::bf16 {
    fn next(self) -> Self {
        half::bf16::from_bits(self.to_bits() + 1)
    }
}

impl Half for half::f16 {
    fn next(self) -> Self {
        half::f16::from_bits(self.to_bits() + 1)
    }
}

/// `out = f(a, b).cast()` into a poisoned `T` tensor, as f64.
fn narrow_run<T: Half>(def: &KernelDef, a: &Tensor<f32>, b: &Tensor<f32>, what: &str) -> Vec<f64> {
    let to = Tensor::from_slice(&[T::from_f64(-1234.0); M * N], [M, N]).unwrap();
    let scalars = [ScalarArg::Int(M as i64), ScalarArg::Int(N as i64)];
    def.launch(
        &[a.tensor_arg(), b.tensor_arg(), to.tensor_arg()],
        &scalars,
        &[],
    )
    .unwrap_or_else(|err| panic!("{what}: {err}"));
    to.to_vec().unwrap().into_iter().map(T::to_f64).collect()
}

/// `x` rounded once to `T`, and the distance from it to the next `T` up.
fn rounded<T: Half>(x: f64) -> (f64, f64) {
    let r = T::from_f64(x);
    (r.to_f64(), (r.next().to_f64() - r.to_f64()).abs())
}

/// Each binary operation with a narrow form (`pow` into a 16-bit float:
/// `lg2.approx`, `ex2.approx`) against the float64 result rounded once to
/// bf16 and to f16: within one unit of the last place (the f32 error before
/// the rounding, far below it, moves a value only across a rounding
/// boundary), over magnitudes from 2^-20 to 2^20, both signs, and the
/// special values (zeros, infinities, NaN, subnormals, negative bases with
/// integral and fractional exponents, 1 to a NaN power, results below
/// 2^-126): the same zeros,
/// infinities and NaNs. The sources are checked to take the narrow form.
#[test]
fn narrow_forms_round_as_the_float64_result_does() {
    use half::{bf16, f16};
    let specials_a = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0,
        -1.0,
        -2.0,
        1.0e-40,
        2.0,
        // Results below 2^-126 for most exponents: powf's, not ex2's flushed ones.
        1.0e-20,
    ];
    let specials_b = [
        0.0f32,
        3.0,
        -3.0,
        2.0,
        0.5,
        f32::NAN,
        f32::INFINITY,
        -1.0,
        1.5,
        -0.5,
    ];
    let mut rng = Rng::fresh();
    let mut a = vec![0f32; M * N];
    let mut b = vec![0f32; M * N];
    for (i, (x, y)) in a.iter_mut().zip(b.iter_mut()).enumerate() {
        let (u, v, w) = (rng.uniform(), rng.uniform(), rng.uniform());
        *x = if i % 7 == 0 {
            specials_a[(i / 7) % specials_a.len()]
        } else {
            let sign = if w < -0.8 { -1.0 } else { 1.0 };
            sign * 2f64.powf(20.0 * u) as f32
        };
        *y = if i % 5 == 0 {
            specials_b[(i / 5) % specials_b.len()]
        } else {
            (6.0 * v) as f32
        };
    }
    let nvrtc = crate::common::nvrtc_or_skip();
    let dev = gpu();
    for e in binary::TABLE.iter().filter(|e| !e.narrow.is_empty()) {
        for half in ["bf16", "f16"] {
            let f = e.function.expect("a narrow form is a function's");
            let text = format!(
                "kernel narrow(a: Tensor<f32, 2>, b: Tensor<f32, 2>, out: Tensor<{half}, 2>; m, n) {{\n  \
                 for (tm, tn) in tile([m, n]) {{\n    out[(tm, tn)] = {f}(a[(tm, tn)], b[(tm, tn)]).cast();\n  }}\n}}\n"
            );
            let what = format!("{f} into {half}");
            let def = define_text(&text, &what);
            let spec = def.declared_spec().unwrap();
            let cfg = default_config(def.ir().unwrap());
            let source = def.lower(&spec, &cfg).unwrap().source;
            let call = e.narrow.split('(').next().unwrap();
            assert!(
                source.contains(&format!("{call}(")),
                "{what}: not narrow\n{source}"
            );
            if nvrtc {
                for arch in ["sm_90a", "sm_80"] {
                    def.compile(&spec, &cfg, arch)
                        .unwrap_or_else(|err| panic!("{what} for {arch}: {err}"));
                }
            }
            let Some(_dev) = &dev else { continue };
            let ta = Tensor::from_slice(&a, [M, N]).unwrap();
            let tb = Tensor::from_slice(&b, [M, N]).unwrap();
            let (got, round): (Vec<f64>, Rounding) = if half == "bf16" {
                (narrow_run::<bf16>(def, &ta, &tb, &what), rounded::<bf16>)
            } else {
                (narrow_run::<f16>(def, &ta, &tb, &what), rounded::<f16>)
            };
            for (i, &g) in got.iter().enumerate() {
                let exact = (e.cpu)(f64::from(a[i]), f64::from(b[i]));
                let (want, ulp) = round(exact);
                let max = if half == "bf16" {
                    bf16::MAX.to_f64()
                } else {
                    f16::MAX.to_f64()
                };
                let ok = if want.is_nan() || g.is_nan() {
                    want.is_nan() && g.is_nan()
                } else if want.is_infinite() {
                    // Or the largest finite value, the rounding boundary
                    // moved by the f32 error.
                    g == want || (g.signum() == want.signum() && g.abs() == max)
                } else {
                    (g - want).abs() <= ulp
                };
                assert!(
                    ok,
                    "{what}, element {i}: {f}({}, {}) = {g} on the GPU, {want} rounded once",
                    a[i], b[i]
                );
            }
            eprintln!("{what}: ok");
        }
    }
}

/// `rand(..) op p` with one `p` for the whole tile compares the draw's words
/// with a bound made from `p` (`tf_uniform_bound`) instead of the floats:
/// the same masks as interpret mode's float compares, bit for bit, for each
/// of `>`, `>=`, `<`, `<=` (either side), at `p` equal to drawn values and
/// one ulp either side of them, at the ends of [0, 1), outside it, at
/// infinities and NaN. The offsets' rows start at every residue of 4, so
/// both the grouped draws and the per-element ones are compared.
#[test]
fn random_compares_with_a_shared_value_match_interpret_mode() {
    let text = "kernel rcmp(out: Tensor<i32, 2>; m, n, seed, p) {\n  \
                for (tm, tn) in tile([m, n]) {\n    \
                let o = tm.index() * n + tn.index();\n    \
                out[(tm, tn)] = select(rand(seed, o) > p, 1, 0) + select(rand(seed, o) >= p, 2, 0) \
                + select(rand(seed, o) < p, 4, 0) + select(p >= rand(seed, o), 8, 0);\n  }\n}\n";
    let def = define_text(text, "random compares");
    let ir = def.ir().unwrap().clone();
    let lowered = def
        .lower(&def.declared_spec().unwrap(), &default_config(&ir))
        .unwrap();
    assert!(
        lowered.source.matches("= tf_uniform_bound(").count() == 4,
        "{}",
        lowered.source
    );
    let Some(dev) = gpu() else { return };
    let mut rng = Rng::fresh();
    let seed = (rng.next_u64() >> 1) as i64;
    let drawn = |o: u32| match tilefuse::codegen::prims::RandKind::Uniform.cpu(seed, o) {
        Num::F(v) => v as f32,
        Num::I(_) => unreachable!("a uniform is a float"),
    };
    let mut ps = vec![
        0.0f32,
        -0.0,
        f32::from_bits(1),
        2f32.powi(-23),
        3.0 * 2f32.powi(-23),
        0.5,
        0.5 + 2f32.powi(-24),
        1.0 - 2f32.powi(-23),
        1.0 - 2f32.powi(-24),
        1.0,
        2.0,
        -0.25,
        1.0e-30,
        f32::MAX,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    for o in [0u32, 5, 301, 4000] {
        let u = drawn(o);
        ps.extend([
            u,
            f32::from_bits(u.to_bits() + 1),
            f32::from_bits(u.to_bits().max(1) - 1),
        ]);
    }
    let cfg = fit_whole_dims(&ir, def.config_on(&dev).unwrap(), &[Some(M), Some(N)]);
    for p in ps {
        let poison = vec![-7.0; M * N];
        let to = device_tensor(true, &[M, N], &poison);
        let scalars = [
            ScalarArg::Int(M as i64),
            ScalarArg::Int(N as i64),
            ScalarArg::Int(seed),
            ScalarArg::Float(p),
        ];
        def.launch(&[arg(&to)], &scalars, &[])
            .unwrap_or_else(|e| panic!("p = {p:e}: {e}"));
        let gpu_out = to_host(&to);
        let t = tensors(
            &ir,
            vec![(
                "out",
                HostTensor::from_f64(DType::I32, &[M, N], poison).unwrap(),
            )],
        );
        let host_scalars = [
            Scalar::Int(M as i64),
            Scalar::Int(N as i64),
            Scalar::Int(seed),
            Scalar::Float(p),
        ];
        run(&ir, &cfg, &[], &t, &host_scalars)
            .unwrap_or_else(|e| panic!("p = {p:e} in interpret mode: {e}"));
        let cpu_out = out(&ir, &t, "out");
        if let Some(i) = gpu_out.iter().zip(&cpu_out).position(|(g, h)| g != h) {
            panic!(
                "p = {p:e} ({:#x}), element {i} (uniform {:e}): GPU {} vs interpret {}",
                p.to_bits(),
                drawn(i as u32),
                gpu_out[i],
                cpu_out[i]
            );
        }
    }
}
