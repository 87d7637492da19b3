//! LayerNorm with weight and bias in one kernel. The walk over the row merges
//! each step's mean and sum of squared deviations into the running ones (Chan's
//! parallel update), so the variance never subtracts two large sums; a second
//! walk writes `(x - mean) * rstd * weight + bias`. Checked against a float64
//! reference.
//!
//! ```text
//! cargo run --release --example layer_norm -- [M N] [--bench]     (default 1000 3000)
//! ```

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse_testkit::{bench_bandwidth, poisoned, random_tensor, rel_error, rows_main};

/// `out[i, :] = (x[i, :] - mean) / sqrt(var + eps) * weight + bias`, per row.
#[fused_kernel]
pub fn layer_norm(
    x: &Tensor<bf16>,
    weight: &Tensor<bf16>,
    bias: &Tensor<bf16>,
    out: &Tensor<bf16>,
    eps: f32,
) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut mean = zeros::<f32>([tm]);
        let mut m2 = zeros::<f32>([tm]);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            let seen = tn.begin() as f32;
            let count = tn.size() as f32;
            let step_mean = v.sum(tn) / count;
            let d = v - step_mean;
            let delta = step_mean - mean;
            mean = mean + delta * (count / (seen + count));
            m2 = m2 + (d * d).sum(tn) + delta * delta * (seen * count / (seen + count));
        }
        let rstd = rsqrt(m2 / (n as f32) + eps);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            let y = (v - mean) * rstd * weight[tn].cast::<f32>() + bias[tn].cast::<f32>();
            out[(tm, tn)] = y.cast();
        }
    }
}

/// The float64 LayerNorm of each row of `x` (`m` × `n`).
pub fn reference(x: &[f64], w: &[f64], b: &[f64], m: usize, n: usize, eps: f64) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        let row = &x[i * n..(i + 1) * n];
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for j in 0..n {
            out[i * n + j] = (row[j] - mean) * rstd * w[j] + b[j];
        }
    }
    out
}

fn run(m: usize, n: usize, bench: bool) -> tilefuse::Result<bool> {
    let dev = Device::current()?;
    println!(
        "device: {} ({}), LayerNorm over rows of x[{m}x{n}], bf16",
        dev.name(),
        dev.arch()
    );
    let eps = 1e-5;
    // A mean far from zero, so a variance taken as E[x²] - E[x]² would lose digits.
    let x = random_tensor::<bf16>([m, n], 2.0)?;
    let x = {
        let shifted: Vec<bf16> = x
            .to_vec()?
            .iter()
            .map(|v| bf16::from_f64(v.to_f64() + 8.0))
            .collect();
        Tensor::from_slice(&shifted, [m, n])?
    };
    let w = random_tensor::<bf16>([n], 1.0)?;
    let b = random_tensor::<bf16>([n], 1.0)?;
    let out = poisoned::<bf16>([m, n])?;
    layer_norm(&x, &w, &b, &out, eps)?;
    let f = |t: &Tensor<bf16>| -> tilefuse::Result<Vec<f64>> {
        Ok(t.to_vec()?.iter().map(|v| v.to_f64()).collect())
    };
    let expect = reference(&f(&x)?, &f(&w)?, &f(&b)?, m, n, eps as f64);
    let err = rel_error(&out.to_vec()?, &expect, |v: bf16| v.to_f64(), |v| v);
    let ok = err <= 1e-2;
    println!(
        "check: ‖out − ref‖/‖ref‖ = {err:.2e} ({})",
        if ok { "ok" } else { "FAILED" }
    );
    if bench {
        bench_bandwidth(&dev, "layer_norm", 2 * m * n * 2 + 4 * n, || {
            layer_norm(&x, &w, &b, &out, eps)
        })?;
    }
    Ok(ok)
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    rows_main("layer_norm", [1000, 3000], run)
}
