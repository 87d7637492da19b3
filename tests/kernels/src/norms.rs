//! Normalizations, forward and backward: LayerNorm and RMSNorm, their input
//! gradients (row walks) and their weight gradients (column sums over rows,
//! by column blocks or by shares of rows combined with atomics).

use crate::harness::*;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::Device;
use tilefuse_testkit::Rng;

/// LayerNorm forward as Triton's tutorial writes it: a walk for the mean, a
/// walk for the variance around it, a walk that normalizes; the mean and
/// `1 / std` are stored for the backward.
#[fused_kernel]
pub fn layer_norm(
    x: &Tensor<bf16>,
    weight: &Tensor<bf16>,
    bias: &Tensor<bf16>,
    out: &Tensor<bf16>,
    mean: &Tensor<f32>,
    rstd: &Tensor<f32>,
    eps: f32,
) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut sum = zeros::<f32>([tm]);
        for tn in tile(n) {
            sum = sum + x[(tm, tn)].cast::<f32>().sum(tn);
        }
        let mu = sum / (n as f32);
        let mut sq = zeros::<f32>([tm]);
        for tn in tile(n) {
            let d = x[(tm, tn)].cast::<f32>() - mu;
            sq = sq + (d * d).sum(tn);
        }
        let r = rsqrt(sq / (n as f32) + eps);
        mean[tm] = mu;
        rstd[tm] = r;
        for tn in tile(n) {
            let xhat = (x[(tm, tn)].cast::<f32>() - mu) * r;
            let y = xhat * weight[tn].cast::<f32>() + bias[tn].cast::<f32>();
            out[(tm, tn)] = y.cast();
        }
    }
}

/// LayerNorm backward, the input's gradient, from the stored mean and rstd:
/// `dx = (w·dy - mean(w·dy) - x̂·mean(x̂·w·dy)) · rstd`, both means in a
/// first walk.
#[fused_kernel]
pub fn layer_norm_bwd(
    x: &Tensor<bf16>,
    dy: &Tensor<bf16>,
    weight: &Tensor<bf16>,
    mean: &Tensor<f32>,
    rstd: &Tensor<f32>,
    dx: &Tensor<bf16>,
) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mu = mean[tm];
        let r = rstd[tm];
        let mut sum_wdy = zeros::<f32>([tm]);
        let mut sum_xwdy = zeros::<f32>([tm]);
        for tn in tile(n) {
            let xhat = (x[(tm, tn)].cast::<f32>() - mu) * r;
            let wdy = weight[tn].cast::<f32>() * dy[(tm, tn)].cast::<f32>();
            sum_wdy = sum_wdy + wdy.sum(tn);
            sum_xwdy = sum_xwdy + (xhat * wdy).sum(tn);
        }
        let c1 = sum_xwdy / (n as f32);
        let c2 = sum_wdy / (n as f32);
        for tn in tile(n) {
            let xhat = (x[(tm, tn)].cast::<f32>() - mu) * r;
            let wdy = weight[tn].cast::<f32>() * dy[(tm, tn)].cast::<f32>();
            dx[(tm, tn)] = ((wdy - (xhat * c1 + c2)) * r).cast();
        }
    }
}

/// LayerNorm's weight and bias gradients, `dw = Σ_rows dy·x̂` and
/// `db = Σ_rows dy`: each program owns a block of columns and walks every
/// row (no atomics, deterministic).
#[fused_kernel]
pub fn layer_norm_dwdb(
    x: &Tensor<bf16>,
    dy: &Tensor<bf16>,
    mean: &Tensor<f32>,
    rstd: &Tensor<f32>,
    dw: &Tensor<f32>,
    db: &Tensor<f32>,
) {
    let [m, n] = x.shape();
    for tn in tile(n) {
        let mut acc_w = zeros::<f32>([tn]);
        let mut acc_b = zeros::<f32>([tn]);
        for tm in tile(m) {
            let xhat = (x[(tm, tn)].cast::<f32>() - mean[tm]) * rstd[tm];
            let g = dy[(tm, tn)].cast::<f32>();
            acc_w = acc_w + (g * xhat).sum(tm);
            acc_b = acc_b + g.sum(tm);
        }
        dw[tn] = acc_w;
        db[tn] = acc_b;
    }
}

/// RMSNorm forward, storing `rstd = 1 / sqrt(mean(x²) + eps)` for the backward.
#[fused_kernel]
pub fn rms_norm(
    x: &Tensor<bf16>,
    weight: &Tensor<bf16>,
    out: &Tensor<bf16>,
    rstd: &Tensor<f32>,
    eps: f32,
) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut sum_sq = zeros::<f32>([tm]);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            sum_sq = sum_sq + (v * v).sum(tn);
        }
        let r = rsqrt(sum_sq / (n as f32) + eps);
        rstd[tm] = r;
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            out[(tm, tn)] = (v * r * weight[tn].cast::<f32>()).cast();
        }
    }
}

/// RMSNorm backward, the input's gradient:
/// `dx = (w·dy - x̂·mean(x̂·w·dy)) · rstd` with `x̂ = x·rstd`.
#[fused_kernel]
pub fn rms_norm_bwd(
    x: &Tensor<bf16>,
    dy: &Tensor<bf16>,
    weight: &Tensor<bf16>,
    rstd: &Tensor<f32>,
    dx: &Tensor<bf16>,
) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let r = rstd[tm];
        let mut sum_xwdy = zeros::<f32>([tm]);
        for tn in tile(n) {
            let xhat = x[(tm, tn)].cast::<f32>() * r;
            let wdy = weight[tn].cast::<f32>() * dy[(tm, tn)].cast::<f32>();
            sum_xwdy = sum_xwdy + (xhat * wdy).sum(tn);
        }
        let c1 = sum_xwdy / (n as f32);
        for tn in tile(n) {
            let xhat = x[(tm, tn)].cast::<f32>() * r;
            let wdy = weight[tn].cast::<f32>() * dy[(tm, tn)].cast::<f32>();
            dx[(tm, tn)] = ((wdy - xhat * c1) * r).cast();
        }
    }
}

/// RMSNorm's weight gradient `dw = Σ_rows dy·x·rstd`: each program takes a
/// share of `rows` rows (`tile(begin..end)`) for a block of columns and adds
/// its partial sums into `dw` with `atomic_add`. The last share runs past
/// the end, where loads read zero.
#[fused_kernel]
pub fn rms_norm_dw(
    x: &Tensor<bf16>,
    dy: &Tensor<bf16>,
    rstd: &Tensor<f32>,
    dw: &Tensor<f32>,
    rows: usize,
) {
    let [m, n] = x.shape();
    let shares = m.div_ceil(rows);
    for (s, tn) in tile([each(shares), n]) {
        let mut acc = zeros::<f32>([tn]);
        for tm in tile(s * rows..s * rows + rows) {
            let g = dy[(tm, tn)].cast::<f32>() * x[(tm, tn)].cast::<f32>() * rstd[tm];
            acc = acc + g.sum(tm);
        }
        atomic_add(dw[tn], acc);
    }
}

/// Per-row mean and `1 / sqrt(var + eps)` in float64.
fn ln_stats(x: &[f64], m: usize, n: usize, eps: f64) -> (Vec<f64>, Vec<f64>) {
    (0..m)
        .map(|i| {
            let row = &x[i * n..(i + 1) * n];
            let mu = row.iter().sum::<f64>() / n as f64;
            let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n as f64;
            (mu, 1.0 / (var + eps).sqrt())
        })
        .unzip()
}

/// Per-row `1 / sqrt(mean(x²) + eps)` in float64.
fn rms_stats(x: &[f64], m: usize, n: usize, eps: f64) -> Vec<f64> {
    (0..m)
        .map(|i| {
            let row = &x[i * n..(i + 1) * n];
            1.0 / (row.iter().map(|v| v * v).sum::<f64>() / n as f64 + eps).sqrt()
        })
        .collect()
}

/// A bf16 input whose rows have means far from zero (each its own), so
/// that a variance taken as `E[x²] - E[x]²` would lose digits.
fn shifted_rows(
    dev: &Arc<Device>,
    rng: &mut Rng,
    m: usize,
    n: usize,
) -> Result<(Tensor<bf16>, Vec<f64>)> {
    let data: Vec<bf16> = (0..m * n)
        .map(|k| bf16::from_f64(4.0 + (k / n % 5) as f64 + 2.0 * rng.uniform()))
        .collect();
    let f = data.iter().map(|v| v.to_f64()).collect();
    Ok((Tensor::from_slice_on(dev, &data, [m, n])?, f))
}

/// f32 values as a tensor on `dev`, and those values as f64.
fn f32_tensor(dev: &Arc<Device>, v: &[f64], shape: &[usize]) -> Result<(Tensor<f32>, Vec<f64>)> {
    let data: Vec<f32> = v.iter().map(|&x| x as f32).collect();
    let f = data.iter().map(|&x| x as f64).collect();
    Ok((Tensor::from_slice_on(dev, &data, shape)?, f))
}

const EPS: f32 = 1e-5;

fn layer_norm_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    let (x, xf) = shifted_rows(dev, &mut rng, m, n)?;
    let (w, wf) = input::<bf16>(dev, &mut rng, &[n], 1.0)?;
    let (b, bf) = input::<bf16>(dev, &mut rng, &[n], 1.0)?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    let (mean, rstd) = (poisoned::<f32>(dev, &[m])?, poisoned::<f32>(dev, &[m])?);
    layer_norm(&x, &w, &b, &out, &mean, &rstd, EPS)?;
    let (mu, rs) = ln_stats(&xf, m, n, EPS as f64);
    let want: Vec<f64> = (0..m * n)
        .map(|k| (xf[k] - mu[k / n]) * rs[k / n] * wf[k % n] + bf[k % n])
        .collect();
    Ok(vec![
        Output::new("out", host(&out)?, want, BF16_TOL),
        Output::new("mean", host(&mean)?, mu, F32_TOL),
        Output::new("rstd", host(&rstd)?, rs, 5e-5),
    ])
}

fn layer_norm_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (w, _) = input::<bf16>(dev, &mut rng, &[n], 1.0)?;
    let (b, _) = input::<bf16>(dev, &mut rng, &[n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    let mean = Tensor::<f32>::empty_on(dev, [m])?;
    let rstd = Tensor::<f32>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2 + 2 * n * 2 + 2 * m * 4,
        run: Box::new(move || layer_norm(&x, &w, &b, &out, &mean, &rstd, EPS)),
    })
}

/// `x`, `dy`, the weight and the forward's float64 statistics (rounded to
/// f32 tensors as the forward stores them), for a LayerNorm backward.
struct LnBwd {
    x: Tensor<bf16>,
    dy: Tensor<bf16>,
    w: Tensor<bf16>,
    mean: Tensor<f32>,
    rstd: Tensor<f32>,
    xf: Vec<f64>,
    dyf: Vec<f64>,
    wf: Vec<f64>,
    mu: Vec<f64>,
    rs: Vec<f64>,
}

fn ln_bwd_inputs(dev: &Arc<Device>, seed: u64, m: usize, n: usize) -> Result<LnBwd> {
    let mut rng = Rng::new(seed);
    let (x, xf) = shifted_rows(dev, &mut rng, m, n)?;
    let (dy, dyf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (w, wf) = input::<bf16>(dev, &mut rng, &[n], 1.0)?;
    let (mu, rs) = ln_stats(&xf, m, n, EPS as f64);
    let (mean, mu) = f32_tensor(dev, &mu, &[m])?;
    let (rstd, rs) = f32_tensor(dev, &rs, &[m])?;
    Ok(LnBwd {
        x,
        dy,
        w,
        mean,
        rstd,
        xf,
        dyf,
        wf,
        mu,
        rs,
    })
}

fn layer_norm_bwd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let (m, n) = (77, 3001);
    let t = ln_bwd_inputs(dev, seed, m, n)?;
    let dx = poisoned::<bf16>(dev, &[m, n])?;
    layer_norm_bwd(&t.x, &t.dy, &t.w, &t.mean, &t.rstd, &dx)?;
    let mut want = Vec::with_capacity(m * n);
    for i in 0..m {
        let xhat: Vec<f64> = (0..n)
            .map(|j| (t.xf[i * n + j] - t.mu[i]) * t.rs[i])
            .collect();
        let wdy: Vec<f64> = (0..n).map(|j| t.wf[j] * t.dyf[i * n + j]).collect();
        let c1 = xhat.iter().zip(&wdy).map(|(a, b)| a * b).sum::<f64>() / n as f64;
        let c2 = wdy.iter().sum::<f64>() / n as f64;
        want.extend((0..n).map(|j| (wdy[j] - (xhat[j] * c1 + c2)) * t.rs[i]));
    }
    Ok(vec![Output::new("dx", host(&dx)?, want, BF16_TOL)])
}

fn layer_norm_bwd_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let t = ln_bwd_inputs(dev, 1, m, n)?;
    let dx = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 3 * m * n * 2 + n * 2 + 2 * m * 4,
        run: Box::new(move || layer_norm_bwd(&t.x, &t.dy, &t.w, &t.mean, &t.rstd, &dx)),
    })
}

fn layer_norm_dwdb_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let (m, n) = (1237, 301);
    let t = ln_bwd_inputs(dev, seed, m, n)?;
    let (dw, db) = (poisoned::<f32>(dev, &[n])?, poisoned::<f32>(dev, &[n])?);
    layer_norm_dwdb(&t.x, &t.dy, &t.mean, &t.rstd, &dw, &db)?;
    let want_w = (0..n)
        .map(|j| {
            (0..m)
                .map(|i| t.dyf[i * n + j] * (t.xf[i * n + j] - t.mu[i]) * t.rs[i])
                .sum()
        })
        .collect();
    let want_b = (0..n)
        .map(|j| (0..m).map(|i| t.dyf[i * n + j]).sum())
        .collect();
    Ok(vec![
        Output::new("dw", host(&dw)?, want_w, 1e-4),
        Output::new("db", host(&db)?, want_b, 1e-4),
    ])
}

fn layer_norm_dwdb_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let t = ln_bwd_inputs(dev, 1, m, n)?;
    let dw = Tensor::<f32>::empty_on(dev, [n])?;
    let db = Tensor::<f32>::empty_on(dev, [n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2 + 2 * m * 4 + 2 * n * 4,
        run: Box::new(move || layer_norm_dwdb(&t.x, &t.dy, &t.mean, &t.rstd, &dw, &db)),
    })
}

fn rms_norm_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 2.0)?;
    let (w, wf) = input::<bf16>(dev, &mut rng, &[n], 1.0)?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    let rstd = poisoned::<f32>(dev, &[m])?;
    rms_norm(&x, &w, &out, &rstd, EPS)?;
    let rs = rms_stats(&xf, m, n, EPS as f64);
    let want: Vec<f64> = (0..m * n).map(|k| xf[k] * rs[k / n] * wf[k % n]).collect();
    Ok(vec![
        Output::new("out", host(&out)?, want, BF16_TOL),
        Output::new("rstd", host(&rstd)?, rs, 5e-5),
    ])
}

fn rms_norm_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (w, _) = input::<bf16>(dev, &mut rng, &[n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    let rstd = Tensor::<f32>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2 + n * 2 + m * 4,
        run: Box::new(move || rms_norm(&x, &w, &out, &rstd, EPS)),
    })
}

/// `x`, `dy`, the weight and the forward's float64 rstd (as an f32
/// tensor), for an RMSNorm backward.
struct RmsBwd {
    x: Tensor<bf16>,
    dy: Tensor<bf16>,
    w: Tensor<bf16>,
    rstd: Tensor<f32>,
    xf: Vec<f64>,
    dyf: Vec<f64>,
    wf: Vec<f64>,
    rs: Vec<f64>,
}

fn rms_bwd_inputs(dev: &Arc<Device>, seed: u64, m: usize, n: usize) -> Result<RmsBwd> {
    let mut rng = Rng::new(seed);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 2.0)?;
    let (dy, dyf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (w, wf) = input::<bf16>(dev, &mut rng, &[n], 1.0)?;
    let (rstd, rs) = f32_tensor(dev, &rms_stats(&xf, m, n, EPS as f64), &[m])?;
    Ok(RmsBwd {
        x,
        dy,
        w,
        rstd,
        xf,
        dyf,
        wf,
        rs,
    })
}

fn rms_norm_bwd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let (m, n) = (77, 3001);
    let t = rms_bwd_inputs(dev, seed, m, n)?;
    let dx = poisoned::<bf16>(dev, &[m, n])?;
    rms_norm_bwd(&t.x, &t.dy, &t.w, &t.rstd, &dx)?;
    let mut want = Vec::with_capacity(m * n);
    for i in 0..m {
        let xhat: Vec<f64> = (0..n).map(|j| t.xf[i * n + j] * t.rs[i]).collect();
        let wdy: Vec<f64> = (0..n).map(|j| t.wf[j] * t.dyf[i * n + j]).collect();
        let c1 = xhat.iter().zip(&wdy).map(|(a, b)| a * b).sum::<f64>() / n as f64;
        want.extend((0..n).map(|j| (wdy[j] - xhat[j] * c1) * t.rs[i]));
    }
    Ok(vec![Output::new("dx", host(&dx)?, want, BF16_TOL)])
}

fn rms_norm_bwd_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let t = rms_bwd_inputs(dev, 1, m, n)?;
    let dx = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 3 * m * n * 2 + n * 2 + m * 4,
        run: Box::new(move || rms_norm_bwd(&t.x, &t.dy, &t.w, &t.rstd, &dx)),
    })
}

fn rms_norm_dw_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let (m, n) = (1237, 301);
    let t = rms_bwd_inputs(dev, seed, m, n)?;
    let dw = zeros::<f32>(dev, &[n])?;
    // Shares of 100 rows: no multiple of a block, the last one short.
    rms_norm_dw(&t.x, &t.dy, &t.rstd, &dw, 100)?;
    let want = (0..n)
        .map(|j| {
            (0..m)
                .map(|i| t.dyf[i * n + j] * t.xf[i * n + j] * t.rs[i])
                .sum()
        })
        .collect();
    Ok(vec![Output::new("dw", host(&dw)?, want, 1e-4)])
}

fn rms_norm_dw_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let t = rms_bwd_inputs(dev, 1, m, n)?;
    let dw = zeros::<f32>(dev, &[n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2 + m * 4 + n * 4,
        // From zero at every call (the row groups add into it).
        run: Box::new(move || {
            dw.zero()?;
            rms_norm_dw(&t.x, &t.dy, &t.rstd, &dw, 256)
        }),
    })
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "layer_norm",
            covers: "LayerNorm forward (three walks: mean, variance, normalize; statistics stored)",
            kernels: || vec![layer_norm::kernel()],
            check: layer_norm_check,
            bench: layer_norm_bench,
        },
        Case {
            name: "layer_norm_bwd",
            covers: "LayerNorm backward dx (two row sums, then a walk)",
            kernels: || vec![layer_norm_bwd::kernel()],
            check: layer_norm_bwd_check,
            bench: layer_norm_bwd_bench,
        },
        Case {
            name: "layer_norm_dwdb",
            covers: "LayerNorm dw and db (column blocks walking the rows, row vectors broadcast)",
            kernels: || vec![layer_norm_dwdb::kernel()],
            check: layer_norm_dwdb_check,
            bench: layer_norm_dwdb_bench,
        },
        Case {
            name: "rms_norm",
            covers: "RMSNorm forward (rstd stored)",
            kernels: || vec![rms_norm::kernel()],
            check: rms_norm_check,
            bench: rms_norm_bench,
        },
        Case {
            name: "rms_norm_bwd",
            covers: "RMSNorm backward dx",
            kernels: || vec![rms_norm_bwd::kernel()],
            check: rms_norm_bwd_check,
            bench: rms_norm_bwd_bench,
        },
        Case {
            name: "rms_norm_dw",
            covers: "RMSNorm dw (shares of rows by tile(begin..end), atomic_add of partials)",
            kernels: || vec![rms_norm_dw::kernel()],
            check: rms_norm_dw_check,
            bench: rms_norm_dw_bench,
        },
    ]
}
