//! RMSNorm with a weight in one kernel: a walk over the row sums its squares, a
//! second writes `x / sqrt(mean(x²) + eps) * weight`. Checked against a float64
//! reference.
//!
//! ```text
//! cargo run --release --example rms_norm -- [M N] [--bench]     (default 1000 3000)
//! ```

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse_testkit::{bench_bandwidth, poisoned, random_tensor, rel_error, rows_main};

/// `out[i, :] = x[i, :] * rsqrt(mean(x[i, :]²) + eps) * weight`.
#[fused_kernel]
pub fn rms_norm(x: &Tensor<bf16>, weight: &Tensor<bf16>, out: &Tensor<bf16>, eps: f32) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut sum_sq = zeros::<f32>([tm]);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            sum_sq = sum_sq + (v * v).sum(tn);
        }
        let rstd = rsqrt(sum_sq / (n as f32) + eps);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            out[(tm, tn)] = (v * rstd * weight[tn].cast::<f32>()).cast();
        }
    }
}

/// The float64 RMSNorm of each row of `x` (`m` × `n`).
pub fn reference(x: &[f64], w: &[f64], m: usize, n: usize, eps: f64) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        let row = &x[i * n..(i + 1) * n];
        let rstd = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / n as f64 + eps).sqrt();
        for j in 0..n {
            out[i * n + j] = row[j] * rstd * w[j];
        }
    }
    out
}

fn run(m: usize, n: usize, bench: bool) -> tilefuse::Result<bool> {
    let dev = Device::current()?;
    println!(
        "device: {} ({}), RMSNorm over rows of x[{m}x{n}], bf16",
        dev.name(),
        dev.arch()
    );
    let eps = 1e-5;
    let x = random_tensor::<bf16>([m, n], 2.0)?;
    let w = random_tensor::<bf16>([n], 1.0)?;
    let out = poisoned::<bf16>([m, n])?;
    rms_norm(&x, &w, &out, eps)?;
    let f = |t: &Tensor<bf16>| -> tilefuse::Result<Vec<f64>> {
        Ok(t.to_vec()?.iter().map(|v| v.to_f64()).collect())
    };
    let expect = reference(&f(&x)?, &f(&w)?, m, n, eps as f64);
    let err = rel_error(&out.to_vec()?, &expect, |v: bf16| v.to_f64(), |v| v);
    let ok = err <= 1e-2;
    println!(
        "check: ‖out − ref‖/‖ref‖ = {err:.2e} ({})",
        if ok { "ok" } else { "FAILED" }
    );
    if bench {
        bench_bandwidth(&dev, "rms_norm", 2 * m * n * 2 + 2 * n, || {
            rms_norm(&x, &w, &out, eps)
        })?;
    }
    Ok(ok)
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    rows_main("rms_norm", [1000, 3000], run)
}
