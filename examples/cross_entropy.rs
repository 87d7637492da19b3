//! Cross-entropy loss per row, from logits and class labels, in one kernel: one
//! walk over the row keeps the running maximum and the sum of exponentials
//! rescaled to it (online log-sum-exp) and picks the label's logit with a mask
//! (`select(tn.index() == label, v, 0.0)`); the loss is `log(sum) + max - picked`.
//! Checked against a float64 reference.
//!
//! ```text
//! cargo run --release --example cross_entropy -- [M N] [--bench]     (default 1000 3000)
//! ```

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse_testkit::{bench_bandwidth, random_tensor, rel_error, rows_main, Rng};

/// `loss[i] = logsumexp(logits[i, :]) - logits[i, labels[i]]`, bf16 logits, f32 loss.
/// A label outside `0..n` picks nothing (its loss is the log-sum-exp).
#[fused_kernel]
pub fn cross_entropy(logits: &Tensor<bf16>, labels: &Tensor<i64>, loss: &Tensor<f32>) {
    let [m, n] = logits.shape();
    for tm in tile(m) {
        let label = labels[tm];
        let mut row_max = full::<f32>([tm], f32::NEG_INFINITY);
        let mut denom = zeros::<f32>([tm]);
        let mut picked = zeros::<f32>([tm]);
        for tn in tile(n) {
            let v = logits[(tm, tn)].cast::<f32>();
            let new_max = max(row_max, v.max(tn));
            denom = denom * exp(row_max - new_max) + exp(v - new_max).sum(tn);
            row_max = new_max;
            picked = picked + select(tn.index() == label, v, 0.0).sum(tn);
        }
        loss[tm] = log(denom) + row_max - picked;
    }
}

/// The float64 loss of each row of `x` (`m` × `n`) for its label.
pub fn reference(x: &[f64], labels: &[i64], m: usize, n: usize) -> Vec<f64> {
    (0..m)
        .map(|i| {
            let row = &x[i * n..(i + 1) * n];
            let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = mx + row.iter().map(|v| (v - mx).exp()).sum::<f64>().ln();
            let picked = usize::try_from(labels[i])
                .ok()
                .and_then(|j| row.get(j))
                .copied()
                .unwrap_or(0.0);
            lse - picked
        })
        .collect()
}

/// Labels in `0..n`, each fresh.
pub fn random_labels(m: usize, n: usize) -> Vec<i64> {
    let mut rng = Rng::fresh();
    (0..m).map(|_| (rng.next_u64() % n as u64) as i64).collect()
}

fn run(m: usize, n: usize, bench: bool) -> tilefuse::Result<bool> {
    let dev = Device::current()?;
    println!(
        "device: {} ({}), cross-entropy over rows of logits[{m}x{n}], bf16",
        dev.name(),
        dev.arch()
    );
    let x = random_tensor::<bf16>([m, n], 4.0)?;
    let labels_h = random_labels(m, n);
    let labels = Tensor::from_slice(&labels_h, [m])?;
    let loss = Tensor::full([m], f32::NAN)?;
    cross_entropy(&x, &labels, &loss)?;
    let xh: Vec<f64> = x.to_vec()?.iter().map(|v| v.to_f64()).collect();
    let err = rel_error(
        &loss.to_vec()?,
        &reference(&xh, &labels_h, m, n),
        |v: f32| v as f64,
        |v| v,
    );
    let ok = err <= 1e-4;
    println!(
        "check: ‖loss − ref‖/‖ref‖ = {err:.2e} ({})",
        if ok { "ok" } else { "FAILED" }
    );
    if bench {
        // Logits read once; labels and the loss are 12 bytes a row.
        bench_bandwidth(&dev, "cross_entropy", m * n * 2 + 12 * m, || {
            cross_entropy(&x, &labels, &loss)
        })?;
    }
    Ok(ok)
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    rows_main("cross_entropy", [1000, 3000], run)
}
