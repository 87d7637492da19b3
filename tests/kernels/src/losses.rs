//! Losses over rows of logits or log-probabilities: cross-entropy forward
//! (a gather of the label's logit) and backward, KL divergence and
//! Jensen–Shannon divergence per row.

use crate::harness::*;
use crate::reductions::lse;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::Device;
use tilefuse_testkit::Rng;

/// The label PyTorch's losses skip by default.
pub const IGNORE: i64 = -100;

/// Cross-entropy per row: `loss = logsumexp(logits) - logits[label]`, the
/// label's logit gathered (`logits[(tm, labels[tm])]`), the log-sum-exp
/// stored for the backward; a row labelled `-100` has loss 0.
#[fused_kernel]
pub fn cross_entropy(
    logits: &Tensor<bf16>,
    labels: &Tensor<i64>,
    loss: &Tensor<f32>,
    lse: &Tensor<f32>,
) {
    let [m, n] = logits.shape();
    for tm in tile(m) {
        let mut row_max = full::<f32>([tm], f32::NEG_INFINITY);
        let mut denom = zeros::<f32>([tm]);
        for tn in tile(n) {
            let v = logits[(tm, tn)].cast::<f32>();
            let new_max = max(row_max, v.max(tn));
            denom = denom * exp(row_max - new_max) + exp(v - new_max).sum(tn);
            row_max = new_max;
        }
        let l = row_max + log(denom);
        let label = labels[tm];
        let picked = logits[(tm, label)].cast::<f32>();
        lse[tm] = l;
        loss[tm] = select(label == -100, 0.0, l - picked);
    }
}

/// Cross-entropy backward: `dlogits = (softmax(logits) - onehot(label)) ·
/// dloss`, the softmax from the forward's log-sum-exp; elementwise over a
/// grid of 2-D tiles, the row values broadcast.
#[fused_kernel]
pub fn cross_entropy_bwd(
    logits: &Tensor<bf16>,
    labels: &Tensor<i64>,
    lse: &Tensor<f32>,
    dloss: &Tensor<f32>,
    dlogits: &Tensor<bf16>,
) {
    let [m, n] = logits.shape();
    for (tm, tn) in tile([m, n]) {
        let label = labels[tm];
        let p = exp(logits[(tm, tn)].cast::<f32>() - lse[tm]);
        let onehot = select(tn.index() == label, 1.0, 0.0);
        let g = select(label == -100, 0.0, dloss[tm]);
        dlogits[(tm, tn)] = ((p - onehot) * g).cast();
    }
}

/// KL divergence per row between two log-probability rows,
/// `KL(q ‖ p) = Σ exp(lq) · (lq - lp)` (PyTorch's
/// `kl_div(lp, lq, log_target=True)` summed over the row).
#[fused_kernel]
pub fn kl_div(lp: &Tensor<bf16>, lq: &Tensor<bf16>, out: &Tensor<f32>) {
    let [m, n] = lp.shape();
    for tm in tile(m) {
        let mut acc = zeros::<f32>([tm]);
        for tn in tile(n) {
            let t = lq[(tm, tn)].cast::<f32>();
            acc = acc + (exp(t) * (t - lp[(tm, tn)].cast::<f32>())).sum(tn);
        }
        out[tm] = acc;
    }
}

/// Jensen–Shannon divergence per row from log-probabilities:
/// `½ KL(p ‖ m) + ½ KL(q ‖ m)` with `m = ½ (p + q)`.
#[fused_kernel]
pub fn jsd(lp: &Tensor<bf16>, lq: &Tensor<bf16>, out: &Tensor<f32>) {
    let [m, n] = lp.shape();
    for tm in tile(m) {
        let mut acc = zeros::<f32>([tm]);
        for tn in tile(n) {
            let a = lp[(tm, tn)].cast::<f32>();
            let b = lq[(tm, tn)].cast::<f32>();
            let p = exp(a);
            let q = exp(b);
            let lm = log(0.5 * (p + q));
            acc = acc + (0.5 * (p * (a - lm) + q * (b - lm))).sum(tn);
        }
        out[tm] = acc;
    }
}

/// Rows of log-probabilities (`log_softmax` of logits uniform in
/// [-scale, scale)), rounded to bf16, and those values as f64.
fn log_probs(
    dev: &Arc<Device>,
    rng: &mut Rng,
    m: usize,
    n: usize,
    scale: f64,
) -> Result<(Tensor<bf16>, Vec<f64>)> {
    let mut data = Vec::with_capacity(m * n);
    for _ in 0..m {
        let row: Vec<f64> = (0..n).map(|_| scale * rng.uniform()).collect();
        let l = lse(&row);
        data.extend(row.iter().map(|v| bf16::from_f64(v - l)));
    }
    let f = data.iter().map(|v| v.to_f64()).collect();
    Ok((Tensor::from_slice_on(dev, &data, [m, n])?, f))
}

/// Labels in `0..n`, every tenth row (from the fourth) ignored (`-100`).
fn labels(dev: &Arc<Device>, rng: &mut Rng, m: usize, n: usize) -> Result<(Tensor<i64>, Vec<i64>)> {
    let l: Vec<i64> = (0..m)
        .map(|i| {
            if i % 10 == 3 {
                IGNORE
            } else {
                (rng.next_u64() % n as u64) as i64
            }
        })
        .collect();
    Ok((Tensor::from_slice_on(dev, &l, [m])?, l))
}

fn cross_entropy_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 4.0)?;
    let (lab, labf) = labels(dev, &mut rng, m, n)?;
    let (loss, l) = (poisoned::<f32>(dev, &[m])?, poisoned::<f32>(dev, &[m])?);
    cross_entropy(&x, &lab, &loss, &l)?;
    let want_lse: Vec<f64> = (0..m).map(|i| lse(&xf[i * n..(i + 1) * n])).collect();
    let want_loss = (0..m)
        .map(|i| match labf[i] {
            IGNORE => 0.0,
            j => want_lse[i] - xf[i * n + j as usize],
        })
        .collect();
    Ok(vec![
        Output::new("loss", host(&loss)?, want_loss, F32_TOL),
        Output::new("lse", host(&l)?, want_lse, F32_TOL),
    ])
}

fn cross_entropy_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, n], 4.0)?;
    let (lab, _) = labels(dev, &mut rng, m, n)?;
    let loss = Tensor::<f32>::empty_on(dev, [m])?;
    let l = Tensor::<f32>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + m * 8 + 2 * m * 4,
        run: Box::new(move || cross_entropy(&x, &lab, &loss, &l)),
    })
}

/// Logits, labels, the forward's log-sum-exp (float64, as an f32 tensor)
/// and an incoming gradient, for the cross-entropy backward.
struct CeBwd {
    x: Tensor<bf16>,
    lab: Tensor<i64>,
    lse: Tensor<f32>,
    dloss: Tensor<f32>,
    xf: Vec<f64>,
    labf: Vec<i64>,
    lsef: Vec<f64>,
    dlf: Vec<f64>,
}

fn ce_bwd_inputs(dev: &Arc<Device>, seed: u64, m: usize, n: usize) -> Result<CeBwd> {
    let mut rng = Rng::new(seed);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 4.0)?;
    let (lab, labf) = labels(dev, &mut rng, m, n)?;
    let l: Vec<f32> = (0..m)
        .map(|i| lse(&xf[i * n..(i + 1) * n]) as f32)
        .collect();
    let lsef = l.iter().map(|&v| v as f64).collect();
    let lse = Tensor::from_slice_on(dev, &l, [m])?;
    let (dloss, dlf) = input::<f32>(dev, &mut rng, &[m], 1.0)?;
    Ok(CeBwd {
        x,
        lab,
        lse,
        dloss,
        xf,
        labf,
        lsef,
        dlf,
    })
}

fn cross_entropy_bwd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let (m, n) = (77, 3001);
    let t = ce_bwd_inputs(dev, seed, m, n)?;
    let dx = poisoned::<bf16>(dev, &[m, n])?;
    cross_entropy_bwd(&t.x, &t.lab, &t.lse, &t.dloss, &dx)?;
    let want = (0..m * n)
        .map(|k| {
            let (i, j) = (k / n, k % n);
            if t.labf[i] == IGNORE {
                return 0.0;
            }
            let onehot = if t.labf[i] == j as i64 { 1.0 } else { 0.0 };
            ((t.xf[k] - t.lsef[i]).exp() - onehot) * t.dlf[i]
        })
        .collect();
    Ok(vec![Output::new("dlogits", host(&dx)?, want, BF16_TOL)])
}

fn cross_entropy_bwd_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let t = ce_bwd_inputs(dev, 1, m, n)?;
    let dx = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2 + m * (8 + 4 + 4),
        run: Box::new(move || cross_entropy_bwd(&t.x, &t.lab, &t.lse, &t.dloss, &dx)),
    })
}

fn kl_div_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    let (lp, lpf) = log_probs(dev, &mut rng, m, n, 3.0)?;
    let (lq, lqf) = log_probs(dev, &mut rng, m, n, 3.0)?;
    let out = poisoned::<f32>(dev, &[m])?;
    kl_div(&lp, &lq, &out)?;
    let want = (0..m)
        .map(|i| {
            (i * n..(i + 1) * n)
                .map(|k| lqf[k].exp() * (lqf[k] - lpf[k]))
                .sum()
        })
        .collect();
    Ok(vec![Output::new("out", host(&out)?, want, F32_TOL)])
}

fn kl_div_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (lp, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (lq, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = Tensor::<f32>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2 + m * 4,
        run: Box::new(move || kl_div(&lp, &lq, &out)),
    })
}

fn jsd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    let (lp, lpf) = log_probs(dev, &mut rng, m, n, 3.0)?;
    let (lq, lqf) = log_probs(dev, &mut rng, m, n, 3.0)?;
    let out = poisoned::<f32>(dev, &[m])?;
    jsd(&lp, &lq, &out)?;
    let want = (0..m)
        .map(|i| {
            (i * n..(i + 1) * n)
                .map(|k| {
                    let (a, b) = (lpf[k], lqf[k]);
                    let lm = (0.5 * (a.exp() + b.exp())).ln();
                    0.5 * (a.exp() * (a - lm) + b.exp() * (b - lm))
                })
                .sum()
        })
        .collect();
    Ok(vec![Output::new("out", host(&out)?, want, F32_TOL)])
}

fn jsd_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (lp, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (lq, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = Tensor::<f32>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2 + m * 4,
        run: Box::new(move || jsd(&lp, &lq, &out)),
    })
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "cross_entropy",
            covers: "cross-entropy forward (online log-sum-exp, gathered label logit, ignore_index by select)",
            kernels: || vec![cross_entropy::kernel()],
            check: cross_entropy_check,
            bench: cross_entropy_bench,
        },
        Case {
            name: "cross_entropy_bwd",
            covers: "cross-entropy backward (softmax minus one-hot by tile index, row values broadcast)",
            kernels: || vec![cross_entropy_bwd::kernel()],
            check: cross_entropy_bwd_check,
            bench: cross_entropy_bwd_bench,
        },
        Case {
            name: "kl_div",
            covers: "KL divergence per row (exp of log-probs, a row sum)",
            kernels: || vec![kl_div::kernel()],
            check: kl_div_check,
            bench: kl_div_bench,
        },
        Case {
            name: "jsd",
            covers: "Jensen–Shannon divergence per row (log of a mixture, a row sum)",
            kernels: || vec![jsd::kernel()],
            check: jsd_check,
            bench: jsd_bench,
        },
    ]
}
