//! Row softmax, numerically stable, in one kernel: a first walk over the row keeps
//! its running maximum and the sum of exponentials rescaled to it (online
//! softmax); a second writes `exp(x - max) / sum`. With a column block that covers
//! the row, each walk is one step. Checked against a float64 reference.
//!
//! ```text
//! cargo run --release --example softmax -- [M N] [--bench]     (default 1000 3000)
//! ```

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse_testkit::{bench_bandwidth, poisoned, random_tensor, rel_error, rows_main};

/// `out[i, :] = softmax(x[i, :])`, bf16 in and out, f32 inside.
#[fused_kernel]
pub fn softmax(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut row_max = full::<f32>([tm], f32::NEG_INFINITY);
        let mut denom = zeros::<f32>([tm]);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            let new_max = max(row_max, v.max(tn));
            denom = denom * exp(row_max - new_max) + exp(v - new_max).sum(tn);
            row_max = new_max;
        }
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            out[(tm, tn)] = (exp(v - row_max) / denom).cast();
        }
    }
}

/// The float64 softmax of each row of `x` (`m` × `n`).
pub fn reference(x: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        let row = &x[i * n..(i + 1) * n];
        let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - mx).exp()).sum();
        for j in 0..n {
            out[i * n + j] = (row[j] - mx).exp() / sum;
        }
    }
    out
}

fn run(m: usize, n: usize, bench: bool) -> tilefuse::Result<bool> {
    let dev = Device::current()?;
    println!(
        "device: {} ({}), softmax over rows of x[{m}x{n}], bf16",
        dev.name(),
        dev.arch()
    );
    let x = random_tensor::<bf16>([m, n], 4.0)?;
    let out = poisoned::<bf16>([m, n])?;
    softmax(&x, &out)?;
    let xh: Vec<f64> = x.to_vec()?.iter().map(|v| v.to_f64()).collect();
    let err = rel_error(
        &out.to_vec()?,
        &reference(&xh, m, n),
        |v: bf16| v.to_f64(),
        |v| v,
    );
    let ok = err <= 1e-2;
    println!(
        "check: ‖out − ref‖/‖ref‖ = {err:.2e} ({})",
        if ok { "ok" } else { "FAILED" }
    );
    if bench {
        bench_bandwidth(&dev, "softmax", 2 * m * n * 2, || softmax(&x, &out))?;
    }
    Ok(ok)
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    rows_main("softmax", [1000, 3000], run)
}
