//! Fused epilogues and prologues, against cuBLAS followed by the same math in f64.

use crate::common::{err_vs, gpu, host};
use tilefuse::prelude::*;
use tilefuse_testkit::{gelu_f64, poisoned, random_tensor};

#[fused_kernel]
pub(crate) fn bias_gelu(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    bias: &Tensor<bf16>,
    out: &Tensor<bf16>,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = gelu(acc + bias[tn]).cast();
    }
}

/// Scalar argument, residual tile, row-broadcast vector, relu.
#[fused_kernel]
pub(crate) fn scaled_residual_relu(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    residual: &Tensor<bf16>,
    row_bias: &Tensor<f32>,
    alpha: f32,
    out: &Tensor<bf16>,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        let y = acc * alpha + residual[(tm, tn)] + row_bias[tm];
        out[(tm, tn)] = relu(y).cast();
    }
}

/// The accumulator starts from a tensor (C += A·B), output in f32.
#[fused_kernel]
pub(crate) fn accumulate_into(
    a: &Tensor<f16>,
    b: &Tensor<f16>,
    c: &Tensor<f32>,
    out: &Tensor<f32>,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        let mut acc = c[(tm, tn)] * 1.0;
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = silu(acc) + tanh(acc * 0.5);
    }
}

/// Two outputs from one accumulator, one of them transposed.
#[fused_kernel]
pub(crate) fn two_outputs(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    out: &Tensor<bf16>,
    out_t: &Tensor<f16>,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = sigmoid(acc).cast();
        out_t[(tn, tm)] = (acc - 1.0).cast::<f16>();
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

pub(crate) const SHAPES: [[usize; 3]; 3] = [[257, 384, 200], [1000, 1000, 1000], [64, 72, 40]];

#[test]
fn bias_gelu_matches() {
    let Some(_dev) = gpu() else { return };
    for [m, n, k] in SHAPES {
        let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
        let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
        let bias = random_tensor::<bf16>([n], 3.0).unwrap();
        let c = host(&tilefuse::cublas::matmul(&a, &b).unwrap());
        let bh = host(&bias);
        let reference: Vec<f64> = c
            .iter()
            .enumerate()
            .map(|(i, v)| gelu_f64(v + bh[i % n]))
            .collect();
        let out = poisoned::<bf16>([m, n]).unwrap();
        bias_gelu(&a, &b, &bias, &out).unwrap();
        let err = err_vs(&out, &reference);
        assert!(err <= 1e-2, "{m}x{n}x{k}: rel err {err}");
    }
}

#[test]
fn scaled_residual_relu_matches() {
    let Some(_dev) = gpu() else { return };
    for [m, n, k] in SHAPES {
        let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
        let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
        let residual = random_tensor::<bf16>([m, n], 8.0).unwrap();
        let row_bias = random_tensor::<f32>([m], 2.0).unwrap();
        let alpha = 0.75f32;
        let c = host(&tilefuse::cublas::matmul(&a, &b).unwrap());
        let (r, rb) = (host(&residual), host(&row_bias));
        let reference: Vec<f64> = (0..m * n)
            .map(|i| (c[i] * f64::from(alpha) + r[i] + rb[i / n]).max(0.0))
            .collect();
        let out = poisoned::<bf16>([m, n]).unwrap();
        scaled_residual_relu(&a, &b, &residual, &row_bias, alpha, &out).unwrap();
        let err = err_vs(&out, &reference);
        assert!(err <= 1e-2, "{m}x{n}x{k}: rel err {err}");
    }
}

#[test]
fn accumulator_initialized_from_tensor() {
    let Some(_dev) = gpu() else { return };
    for [m, n, k] in SHAPES {
        let a = random_tensor::<f16>([m, k], 1.0).unwrap();
        let b = random_tensor::<f16>([k, n], 1.0).unwrap();
        let c = random_tensor::<f32>([m, n], 4.0).unwrap();
        let ab = host(&tilefuse::cublas::matmul(&a, &b).unwrap());
        let ch = host(&c);
        let reference: Vec<f64> = (0..m * n)
            .map(|i| {
                let x = ch[i] + ab[i];
                x * sigmoid(x) + (x * 0.5).tanh()
            })
            .collect();
        let out = poisoned::<f32>([m, n]).unwrap();
        accumulate_into(&a, &b, &c, &out).unwrap();
        let err = err_vs(&out, &reference);
        assert!(err <= 1e-2, "{m}x{n}x{k}: rel err {err}");
    }
}

#[test]
fn two_outputs_one_transposed() {
    let Some(_dev) = gpu() else { return };
    for [m, n, k] in SHAPES {
        let a = random_tensor::<bf16>([m, k], 0.5).unwrap();
        let b = random_tensor::<bf16>([k, n], 0.5).unwrap();
        let c = host(&tilefuse::cublas::matmul(&a, &b).unwrap());
        let out = poisoned::<bf16>([m, n]).unwrap();
        let out_t = poisoned::<f16>([n, m]).unwrap();
        two_outputs(&a, &b, &out, &out_t).unwrap();
        let ref1: Vec<f64> = c.iter().map(|&x| sigmoid(x)).collect();
        let ref2: Vec<f64> = (0..n * m).map(|i| c[(i % m) * n + i / m] - 1.0).collect();
        let (e1, e2) = (err_vs(&out, &ref1), err_vs(&out_t, &ref2));
        assert!(e1 <= 1e-2 && e2 <= 1e-2, "{m}x{n}x{k}: rel errs {e1}, {e2}");
    }
}

/// The TMA-store epilogue (`Config::tma_store`, Hopper only) on epilogues that
/// read other tensors, and next to a second output stored the usual way
/// (transposed, f16): every element written, each output right.
#[test]
fn tma_store_epilogues_match() {
    let Some(dev) = gpu() else { return };
    if dev.compute_capability().0 != 9 {
        eprintln!(
            "SKIPPED: the TMA-store epilogue needs an sm_90 GPU, this is {}",
            dev.arch()
        );
        return;
    }
    for [m, n, k] in SHAPES {
        let a = random_tensor::<bf16>([m, k], 0.5).unwrap();
        let b = random_tensor::<bf16>([k, n], 0.5).unwrap();
        let residual = random_tensor::<bf16>([m, n], 8.0).unwrap();
        let row_bias = random_tensor::<f32>([m], 2.0).unwrap();
        let c = host(&tilefuse::cublas::matmul(&a, &b).unwrap());
        let (r, rb) = (host(&residual), host(&row_bias));
        let relu_ref: Vec<f64> = (0..m * n)
            .map(|i| (c[i] * 0.75 + r[i] + rb[i / n]).max(0.0))
            .collect();
        let ref1: Vec<f64> = c.iter().map(|&x| sigmoid(x)).collect();
        let ref2: Vec<f64> = (0..n * m).map(|i| c[(i % m) * n + i / m] - 1.0).collect();
        // With ping-pong too: each warpgroup stages and stores its own tiles.
        let pingpong = crate::common::pingpong_configs().into_iter().skip(2);
        for cfg in crate::common::tma_store_configs()
            .into_iter()
            .chain(pingpong)
        {
            let out = poisoned::<bf16>([m, n]).unwrap();
            scaled_residual_relu::kernel()
                .with_config(cfg.clone(), || {
                    scaled_residual_relu(&a, &b, &residual, &row_bias, 0.75, &out)
                })
                .unwrap_or_else(|e| panic!("{m}x{n}x{k} {cfg}: {e}"));
            let err = err_vs(&out, &relu_ref);
            assert!(
                err <= 1e-2,
                "scaled_residual_relu {m}x{n}x{k} {cfg}: rel err {err}"
            );

            let out = poisoned::<bf16>([m, n]).unwrap();
            let out_t = poisoned::<f16>([n, m]).unwrap();
            two_outputs::kernel()
                .with_config(cfg.clone(), || two_outputs(&a, &b, &out, &out_t))
                .unwrap_or_else(|e| panic!("{m}x{n}x{k} {cfg}: {e}"));
            let (e1, e2) = (err_vs(&out, &ref1), err_vs(&out_t, &ref2));
            assert!(
                e1 <= 1e-2 && e2 <= 1e-2,
                "two_outputs {m}x{n}x{k} {cfg}: rel errs {e1}, {e2}"
            );
        }
    }
}
