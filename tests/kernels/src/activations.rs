//! Activations, forward and backward.

use crate::harness::*;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::Device;
use tilefuse_testkit::Rng;

/// SwiGLU: `out = silu(gate) * up`, the halves of `x` (`[m, 2n]`) by offset.
#[fused_kernel]
pub fn swiglu(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = out.shape();
    for (tm, tn) in tile([m, n]) {
        let gate = x[(tm, tn)].cast::<f32>();
        let up = x[(tm, tn + n)].cast::<f32>();
        out[(tm, tn)] = (silu(gate) * up).cast();
    }
}

/// GELU (erf form), forward.
#[fused_kernel]
pub fn gelu_fwd(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = gelu(x[(tm, tn)]).cast();
    }
}

/// GELU's backward: `dx = dout · gelu'(x)`.
#[fused_kernel]
pub fn gelu_bwd(x: &Tensor<bf16>, dout: &Tensor<bf16>, dx: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        dx[(tm, tn)] = (dout[(tm, tn)] * gelu_grad(x[(tm, tn)])).cast();
    }
}

/// SwiGLU's backward: from `out = silu(gate)·up`, `dgate = dout·up·silu'(gate)`
/// and `dup = dout·silu(gate)`, stored into the two halves of `dx` (`[m, 2n]`).
#[fused_kernel]
pub fn swiglu_bwd(x: &Tensor<bf16>, dout: &Tensor<bf16>, dx: &Tensor<bf16>) {
    let [m, n] = dout.shape();
    for (tm, tn) in tile([m, n]) {
        let gate = x[(tm, tn)].cast::<f32>();
        let up = x[(tm, tn + n)].cast::<f32>();
        let g = dout[(tm, tn)].cast::<f32>();
        dx[(tm, tn)] = (g * up * silu_grad(gate)).cast();
        dx[(tm, tn + n)] = (g * silu(gate)).cast();
    }
}

/// GeGLU: `out = gelu_tanh(gate)·up`, the halves of `x` (`[m, 2n]`) by offset.
#[fused_kernel]
pub fn geglu(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = out.shape();
    for (tm, tn) in tile([m, n]) {
        let gate = x[(tm, tn)].cast::<f32>();
        let up = x[(tm, tn + n)].cast::<f32>();
        out[(tm, tn)] = (gelu_tanh(gate) * up).cast();
    }
}

/// Leaky ReLU with a runtime slope, forward.
#[fused_kernel]
pub fn leaky_relu_fwd(x: &Tensor<bf16>, out: &Tensor<bf16>, slope: f32) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        let v = x[(tm, tn)];
        out[(tm, tn)] = select(v > 0.0, v, v * slope).cast();
    }
}

/// Leaky ReLU's backward: `dx = dout` where `x > 0`, else `slope·dout`.
#[fused_kernel]
pub fn leaky_relu_bwd(x: &Tensor<bf16>, dout: &Tensor<bf16>, dx: &Tensor<bf16>, slope: f32) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        let g = dout[(tm, tn)];
        dx[(tm, tn)] = select(x[(tm, tn)] > 0.0, g, g * slope).cast();
    }
}

/// Squared ReLU (Primer), forward: `relu(x)²`.
#[fused_kernel]
pub fn relu_sq_fwd(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        let r = relu(x[(tm, tn)]);
        out[(tm, tn)] = (r * r).cast();
    }
}

/// Squared ReLU's backward: `dx = 2·relu(x)·dout`.
#[fused_kernel]
pub fn relu_sq_bwd(x: &Tensor<bf16>, dout: &Tensor<bf16>, dx: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        dx[(tm, tn)] = (2.0 * relu(x[(tm, tn)]) * dout[(tm, tn)]).cast();
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// `d silu / dx`, from the product rule.
fn silu_grad(x: f64) -> f64 {
    sigmoid(x) + x * sigmoid(x) * (1.0 - sigmoid(x))
}

/// The error function in f64: `2/√π · e^(-x²) · Σ 2ⁿ x^(2n+1) / (2n+1)!!`, a
/// series of positive terms (no cancellation), 1 beyond |x| = 6.
fn erf(x: f64) -> f64 {
    if x.abs() > 6.0 {
        return x.signum();
    }
    let x2 = x * x;
    let (mut term, mut sum) = (x, x);
    for k in 1..400 {
        term *= 2.0 * x2 / f64::from(2 * k + 1);
        sum += term;
        if term.abs() < 1e-17 * sum.abs() {
            break;
        }
    }
    2.0 / std::f64::consts::PI.sqrt() * (-x2).exp() * sum
}

/// GELU (erf form) and its derivative `Φ(x) + x·φ(x)`.
fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))
}

fn gelu_grad(x: f64) -> f64 {
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2)) + x * pdf
}

/// GELU's tanh approximation.
fn gelu_tanh(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
}

/// An elementwise case's check: `x` (and `dout` if `bwd`) random at a
/// ragged shape, `run` launches the kernel, `f(x, dout)` is the reference.
fn unary_check(
    dev: &Arc<Device>,
    seed: u64,
    (m, n): (usize, usize),
    bwd: bool,
    run: impl FnOnce(&Tensor<bf16>, &Tensor<bf16>, &Tensor<bf16>) -> Result<()>,
    f: impl Fn(f64, f64) -> f64,
) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 4.0)?;
    let (dout, df) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    run(&x, &dout, &out)?;
    let want = xf.iter().zip(&df).map(|(&x, &d)| f(x, d)).collect();
    Ok(vec![Output::new(
        if bwd { "dx" } else { "out" },
        host(&out)?,
        want,
        BF16_TOL,
    )])
}

/// An elementwise case's bench at 16384x8192 bf16: `x` (and `dout`) read,
/// one output written.
fn unary_bench(
    dev: &Arc<Device>,
    bwd: bool,
    mut run: impl FnMut(&Tensor<bf16>, &Tensor<bf16>, &Tensor<bf16>) -> Result<()> + 'static,
) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, n], 2.0)?;
    let (dout, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: if bwd { 3 } else { 2 } * m * n * 2,
        run: Box::new(move || run(&x, &dout, &out)),
    })
}

fn gelu_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    unary_check(
        dev,
        seed,
        (77, 1000),
        false,
        |x, _, o| gelu_fwd(x, o),
        |x, _| gelu(x),
    )
}

fn gelu_bench(dev: &Arc<Device>) -> Result<Bench> {
    unary_bench(dev, false, |x, _, o| gelu_fwd(x, o))
}

fn gelu_bwd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    unary_check(dev, seed, (301, 257), true, gelu_bwd, |x, d| {
        d * gelu_grad(x)
    })
}

fn gelu_bwd_bench(dev: &Arc<Device>) -> Result<Bench> {
    unary_bench(dev, true, gelu_bwd)
}

const SLOPE: f32 = 0.01;

fn leaky_relu_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    // A slope from the seed, rarely a power of two.
    let slope = 0.05 + (seed % 97) as f32 / 400.0;
    let s = f64::from(slope);
    let run = |x: &Tensor<bf16>, _: &Tensor<bf16>, o: &Tensor<bf16>| leaky_relu_fwd(x, o, slope);
    unary_check(dev, seed, (1000, 77), false, run, |x, _| {
        if x > 0.0 {
            x
        } else {
            x * s
        }
    })
}

fn leaky_relu_bench(dev: &Arc<Device>) -> Result<Bench> {
    unary_bench(dev, false, |x, _, o| leaky_relu_fwd(x, o, SLOPE))
}

fn leaky_relu_bwd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let slope = 0.05 + (seed % 97) as f32 / 400.0;
    let s = f64::from(slope);
    let run = |x: &Tensor<bf16>, d: &Tensor<bf16>, o: &Tensor<bf16>| leaky_relu_bwd(x, d, o, slope);
    unary_check(dev, seed, (33, 3001), true, run, |x, d| {
        if x > 0.0 {
            d
        } else {
            d * s
        }
    })
}

fn leaky_relu_bwd_bench(dev: &Arc<Device>) -> Result<Bench> {
    unary_bench(dev, true, |x, d, o| leaky_relu_bwd(x, d, o, SLOPE))
}

fn relu_sq_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    unary_check(
        dev,
        seed,
        (77, 1000),
        false,
        |x, _, o| relu_sq_fwd(x, o),
        |x, _| x.max(0.0).powi(2),
    )
}

fn relu_sq_bench(dev: &Arc<Device>) -> Result<Bench> {
    unary_bench(dev, false, |x, _, o| relu_sq_fwd(x, o))
}

fn relu_sq_bwd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    unary_check(dev, seed, (129, 511), true, relu_sq_bwd, |x, d| {
        2.0 * x.max(0.0) * d
    })
}

fn relu_sq_bwd_bench(dev: &Arc<Device>) -> Result<Bench> {
    unary_bench(dev, true, relu_sq_bwd)
}

/// The gate and up halves of row `i`, column `j` of a `[m, 2n]` tensor.
fn halves(xf: &[f64], n: usize, i: usize, j: usize) -> (f64, f64) {
    (xf[i * 2 * n + j], xf[i * 2 * n + n + j])
}

fn swiglu_bwd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (41, 333);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, 2 * n], 3.0)?;
    let (dout, df) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let dx = poisoned::<bf16>(dev, &[m, 2 * n])?;
    swiglu_bwd(&x, &dout, &dx)?;
    let mut want = vec![0.0; m * 2 * n];
    for i in 0..m {
        for j in 0..n {
            let (g, u) = halves(&xf, n, i, j);
            let d = df[i * n + j];
            want[i * 2 * n + j] = d * u * silu_grad(g);
            want[i * 2 * n + n + j] = d * silu(g);
        }
    }
    Ok(vec![Output::new("dx", host(&dx)?, want, BF16_TOL)])
}

fn swiglu_bwd_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, 2 * n], 1.0)?;
    let (dout, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let dx = Tensor::<bf16>::empty_on(dev, [m, 2 * n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 5 * m * n * 2,
        run: Box::new(move || swiglu_bwd(&x, &dout, &dx)),
    })
}

fn geglu_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (53, 771);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, 2 * n], 3.0)?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    geglu(&x, &out)?;
    let want = (0..m * n)
        .map(|k| {
            let (g, u) = halves(&xf, n, k / n, k % n);
            gelu_tanh(g) * u
        })
        .collect();
    Ok(vec![Output::new("out", host(&out)?, want, BF16_TOL)])
}

fn geglu_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, 2 * n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 3 * m * n * 2,
        run: Box::new(move || geglu(&x, &out)),
    })
}

fn swiglu_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (37, 520);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, 2 * n], 3.0)?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    swiglu(&x, &out)?;
    let mut want = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            want.push(silu(xf[i * 2 * n + j]) * xf[i * 2 * n + n + j]);
        }
    }
    Ok(vec![Output::new("out", host(&out)?, want, BF16_TOL)])
}

fn swiglu_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, 2 * n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 3 * m * n * 2,
        run: Box::new(move || swiglu(&x, &out)),
    })
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "swiglu",
            covers: "activations (forward), offsets",
            kernels: || vec![swiglu::kernel()],
            check: swiglu_check,
            bench: swiglu_bench,
        },
        Case {
            name: "swiglu_bwd",
            covers: "activation backward (silu, silu_grad), two stores at offsets",
            kernels: || vec![swiglu_bwd::kernel()],
            check: swiglu_bwd_check,
            bench: swiglu_bwd_bench,
        },
        Case {
            name: "geglu",
            covers: "gelu_tanh, offsets",
            kernels: || vec![geglu::kernel()],
            check: geglu_check,
            bench: geglu_bench,
        },
        Case {
            name: "gelu",
            covers: "gelu (erf)",
            kernels: || vec![gelu_fwd::kernel()],
            check: gelu_check,
            bench: gelu_bench,
        },
        Case {
            name: "gelu_bwd",
            covers: "gelu_grad",
            kernels: || vec![gelu_bwd::kernel()],
            check: gelu_bwd_check,
            bench: gelu_bwd_bench,
        },
        Case {
            name: "leaky_relu",
            covers: "a runtime f32 scalar, comparison, select",
            kernels: || vec![leaky_relu_fwd::kernel()],
            check: leaky_relu_check,
            bench: leaky_relu_bench,
        },
        Case {
            name: "leaky_relu_bwd",
            covers: "select on another tensor's comparison",
            kernels: || vec![leaky_relu_bwd::kernel()],
            check: leaky_relu_bwd_check,
            bench: leaky_relu_bwd_bench,
        },
        Case {
            name: "relu_sq",
            covers: "relu",
            kernels: || vec![relu_sq_fwd::kernel()],
            check: relu_sq_check,
            bench: relu_sq_bench,
        },
        Case {
            name: "relu_sq_bwd",
            covers: "relu, a float literal times a tile",
            kernels: || vec![relu_sq_bwd::kernel()],
            check: relu_sq_bwd_check,
            bench: relu_sq_bwd_bench,
        },
    ]
}
