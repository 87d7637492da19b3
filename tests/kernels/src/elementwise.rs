//! Elementwise kernels and data movement: binary ops, concatenation and split
//! by offsets, and the like.

use crate::harness::*;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::Device;
use tilefuse_testkit::Rng;

/// `out = x + y`.
#[fused_kernel]
pub fn add(x: &Tensor<bf16>, y: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = (x[(tm, tn)] + y[(tm, tn)]).cast();
    }
}

/// `out = [x | y]` along the columns: each part stored at its offset.
#[fused_kernel]
pub fn concat(x: &Tensor<bf16>, y: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n1] = x.shape();
    let [_, n2] = y.shape();
    for tm in tile(m) {
        for tn in tile(n1) {
            out[(tm, tn)] = x[(tm, tn)];
        }
        for tn in tile(n2) {
            out[(tm, tn + n1)] = y[(tm, tn)];
        }
    }
}

/// The inverse of `concat`: `[a | b] = x`, `b` loaded at a column offset.
#[fused_kernel]
pub fn split(x: &Tensor<bf16>, a: &Tensor<bf16>, b: &Tensor<bf16>) {
    let [m, n1] = a.shape();
    let [_, n2] = b.shape();
    for tm in tile(m) {
        for tn in tile(n1) {
            a[(tm, tn)] = x[(tm, tn)];
        }
        for tn in tile(n2) {
            b[(tm, tn)] = x[(tm, tn + n1)];
        }
    }
}

/// BLAS's `axpby`: `out = alpha·x + beta·y`, where `beta == 0` means `y` is
/// not read at all (it may hold NaNs), as BLAS promises.
#[fused_kernel]
pub fn axpby(x: &Tensor<bf16>, y: &Tensor<bf16>, out: &Tensor<bf16>, alpha: f32, beta: f32) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        if beta == 0.0 {
            out[(tm, tn)] = (alpha * x[(tm, tn)]).cast();
        } else {
            out[(tm, tn)] = (alpha * x[(tm, tn)] + beta * y[(tm, tn)]).cast();
        }
    }
}

/// A clamp then a signed power (`sign(v)·|v|^p`, gamma-style), and each
/// element's power-of-two scale `2^ceil(log2 |x|)` and `2^floor(log2 |x|)`
/// (the exponent of an MX/fp8 scale).
#[fused_kernel]
pub fn clamp_pow(
    x: &Tensor<bf16>,
    out: &Tensor<bf16>,
    pow2: &Tensor<f32>,
    lo: f32,
    hi: f32,
    p: f32,
) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        let v = x[(tm, tn)].max(lo).min(hi);
        let mag = pow(v.abs(), p);
        out[(tm, tn)] = select(v < 0.0, -mag, mag).cast();
        let e = log2(x[(tm, tn)].abs());
        pow2[(tm, tn)] = exp2(e.ceil()) + exp2(e.floor());
    }
}

/// `out = xᵀ`: the store's index is the load's, swapped.
#[fused_kernel]
pub fn transpose(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tn, tm)] = x[(tm, tn)];
    }
}

/// `torch.where(mask, a, b)` with a byte mask.
#[fused_kernel]
pub fn where_mask(mask: &Tensor<u8>, a: &Tensor<bf16>, b: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = a.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = select(mask[(tm, tn)] != 0, a[(tm, tn)], b[(tm, tn)]);
    }
}

fn add_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 1000);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 2.0)?;
    let (y, yf) = input::<bf16>(dev, &mut rng, &[m, n], 2.0)?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    add(&x, &y, &out)?;
    let want = xf.iter().zip(&yf).map(|(a, b)| a + b).collect();
    Ok(vec![Output::new("out", host(&out)?, want, BF16_TOL)])
}

fn add_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (y, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 3 * m * n * 2,
        run: Box::new(move || add(&x, &y, &out)),
    })
}

fn concat_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n1, n2) = (50, 300, 211);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n1], 1.0)?;
    let (y, yf) = input::<bf16>(dev, &mut rng, &[m, n2], 1.0)?;
    let out = poisoned::<bf16>(dev, &[m, n1 + n2])?;
    concat(&x, &y, &out)?;
    let mut want = Vec::with_capacity(m * (n1 + n2));
    for i in 0..m {
        want.extend_from_slice(&xf[i * n1..(i + 1) * n1]);
        want.extend_from_slice(&yf[i * n2..(i + 1) * n2]);
    }
    Ok(vec![Output::new("out", host(&out)?, want, 0.0)])
}

fn concat_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n1, n2) = (16384, 4096, 4096);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, n1], 1.0)?;
    let (y, _) = input::<bf16>(dev, &mut rng, &[m, n2], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n1 + n2])?;
    Ok(Bench {
        shape: format!("{m}x{n1}+{n2}"),
        bytes: 2 * m * (n1 + n2) * 2,
        run: Box::new(move || concat(&x, &y, &out)),
    })
}

fn split_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n1, n2) = (53, 301, 170);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n1 + n2], 1.0)?;
    let a = poisoned::<bf16>(dev, &[m, n1])?;
    let b = poisoned::<bf16>(dev, &[m, n2])?;
    split(&x, &a, &b)?;
    let n = n1 + n2;
    let wa = (0..m)
        .flat_map(|i| xf[i * n..i * n + n1].to_vec())
        .collect();
    let wb = (0..m)
        .flat_map(|i| xf[i * n + n1..(i + 1) * n].to_vec())
        .collect();
    Ok(vec![
        Output::new("a", host(&a)?, wa, 0.0),
        Output::new("b", host(&b)?, wb, 0.0),
    ])
}

fn split_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n1, n2) = (16384, 4096, 4096);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, n1 + n2], 1.0)?;
    let a = Tensor::<bf16>::empty_on(dev, [m, n1])?;
    let b = Tensor::<bf16>::empty_on(dev, [m, n2])?;
    Ok(Bench {
        shape: format!("{m}x{n1}+{n2}"),
        bytes: 2 * m * (n1 + n2) * 2,
        run: Box::new(move || split(&x, &a, &b)),
    })
}

fn axpby_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 1000);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 2.0)?;
    let (y, yf) = input::<bf16>(dev, &mut rng, &[m, n], 2.0)?;
    let (alpha, beta) = (1.0 + rng.uniform() as f32, rng.uniform() as f32 - 1.5);
    let out = poisoned::<bf16>(dev, &[m, n])?;
    axpby(&x, &y, &out, alpha, beta)?;
    let (a, b) = (f64::from(alpha), f64::from(beta));
    let want = xf.iter().zip(&yf).map(|(x, y)| a * x + b * y).collect();
    // beta == 0: y is never read, so its NaNs must not show.
    let nan_y = poisoned::<bf16>(dev, &[m, n])?;
    let out0 = poisoned::<bf16>(dev, &[m, n])?;
    axpby(&x, &nan_y, &out0, alpha, 0.0)?;
    let want0 = xf.iter().map(|x| a * x).collect();
    Ok(vec![
        Output::new("out", host(&out)?, want, BF16_TOL),
        Output::new("out (beta = 0, y NaN)", host(&out0)?, want0, BF16_TOL),
    ])
}

fn axpby_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (y, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 3 * m * n * 2,
        run: Box::new(move || axpby(&x, &y, &out, 1.5, -0.5)),
    })
}

fn clamp_pow_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (301, 333);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 4.0)?;
    let (lo, hi, p) = (-2.5f32, 3.0f32, 1.5f32 + rng.uniform() as f32);
    let out = poisoned::<bf16>(dev, &[m, n])?;
    let pow2 = poisoned::<f32>(dev, &[m, n])?;
    clamp_pow(&x, &out, &pow2, lo, hi, p)?;
    let want = xf
        .iter()
        .map(|&x| {
            let v = x.max(f64::from(lo)).min(f64::from(hi));
            v.signum() * v.abs().powf(f64::from(p))
        })
        .collect();
    // bf16 inputs: log2 of a power of two is exact and no other value lies
    // within f32's error of an integer, so floor and ceil are exact.
    let want2 = xf
        .iter()
        .map(|&x| {
            let e = x.abs().log2();
            e.ceil().exp2() + e.floor().exp2()
        })
        .collect();
    Ok(vec![
        Output::new("out", host(&out)?, want, BF16_TOL),
        Output::new("pow2", host(&pow2)?, want2, F32_TOL),
    ])
}

fn clamp_pow_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, n], 4.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    let pow2 = Tensor::<f32>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * (2 + 2 + 4),
        run: Box::new(move || clamp_pow(&x, &out, &pow2, -2.5, 3.0, 1.7)),
    })
}

fn transpose_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 1000);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = poisoned::<bf16>(dev, &[n, m])?;
    transpose(&x, &out)?;
    let want = (0..n)
        .flat_map(|j| (0..m).map(move |i| (i, j)))
        .map(|(i, j)| xf[i * n + j])
        .collect();
    Ok(vec![Output::new("out", host(&out)?, want, 0.0)])
}

fn transpose_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [n, m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2,
        run: Box::new(move || transpose(&x, &out)),
    })
}

fn where_mask_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (99, 777);
    // Bytes 0..4: a quarter zeros, and nonzero values other than 1.
    let (mask, mf) = ints::<u8>(dev, &mut rng, &[m, n], 0, 4)?;
    let (a, af) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (b, bf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    where_mask(&mask, &a, &b, &out)?;
    let want = (0..m * n)
        .map(|i| if mf[i] != 0.0 { af[i] } else { bf[i] })
        .collect();
    Ok(vec![Output::new("out", host(&out)?, want, 0.0)])
}

fn where_mask_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (mask, _) = ints::<u8>(dev, &mut rng, &[m, n], 0, 2)?;
    let (a, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (b, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * (1 + 3 * 2),
        run: Box::new(move || where_mask(&mask, &a, &b, &out)),
    })
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "add",
            covers: "elementwise",
            kernels: || vec![add::kernel()],
            check: add_check,
            bench: add_bench,
        },
        Case {
            name: "concat",
            covers: "concatenate (stores at an offset)",
            kernels: || vec![concat::kernel()],
            check: concat_check,
            bench: concat_bench,
        },
        Case {
            name: "split",
            covers: "split (loads at an offset)",
            kernels: || vec![split::kernel()],
            check: split_check,
            bench: split_bench,
        },
        Case {
            name: "axpby",
            covers: "runtime scalars, a runtime `if` that skips a load",
            kernels: || vec![axpby::kernel()],
            check: axpby_check,
            bench: axpby_bench,
        },
        Case {
            name: "clamp_pow",
            covers: "max/min clamp, powf, select, log2/exp2, floor/ceil",
            kernels: || vec![clamp_pow::kernel()],
            check: clamp_pow_check,
            bench: clamp_pow_bench,
        },
        Case {
            name: "transpose",
            covers: "transpose (a store indexed by swapped tiles)",
            kernels: || vec![transpose::kernel()],
            check: transpose_check,
            bench: transpose_bench,
        },
        Case {
            name: "where_mask",
            covers: "u8 mask tensor, comparison, select",
            kernels: || vec![where_mask::kernel()],
            check: where_mask_check,
            bench: where_mask_bench,
        },
    ]
}
