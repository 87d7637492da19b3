//! Kernels without a matmul: elementwise over 1-D and 2-D grids, and a grid loop
//! with a nested sequential tile loop.

use crate::common::{err_vs, gpu, host};
use tilefuse::prelude::*;
use tilefuse_testkit::{poisoned, random_tensor};

#[fused_kernel]
pub(crate) fn axpy_relu(x: &Tensor<f32>, y: &Tensor<f32>, alpha: f32, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = relu(x[(tm, tn)] * alpha + y[(tm, tn)]);
    }
}

#[fused_kernel]
pub(crate) fn sigmoid_1d(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [n] = x.shape();
    for t in tile(n) {
        out[t] = sigmoid(x[t]).cast();
    }
}

#[fused_kernel]
pub(crate) fn add_bias_rows(x: &Tensor<f16>, bias: &Tensor<f16>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        for tn in tile(n) {
            out[(tm, tn)] = (x[(tm, tn)] + bias[tn]).cast::<f32>();
        }
    }
}

#[test]
fn axpy_relu_2d() {
    let Some(_dev) = gpu() else { return };
    let (m, n) = (1000, 777);
    let x = random_tensor::<f32>([m, n], 1.0).unwrap();
    let y = random_tensor::<f32>([m, n], 1.0).unwrap();
    let out = poisoned::<f32>([m, n]).unwrap();
    axpy_relu(&x, &y, 1.5, &out).unwrap();
    let (xh, yh) = (host(&x), host(&y));
    let reference: Vec<f64> = (0..m * n).map(|i| (xh[i] * 1.5 + yh[i]).max(0.0)).collect();
    let err = err_vs(&out, &reference);
    assert!(err <= 1e-6, "rel err {err}");
}

#[test]
fn sigmoid_1d_ragged() {
    let Some(_dev) = gpu() else { return };
    let n = 100_003;
    let x = random_tensor::<bf16>([n], 6.0).unwrap();
    let out = poisoned::<bf16>([n]).unwrap();
    sigmoid_1d(&x, &out).unwrap();
    let reference: Vec<f64> = host(&x).iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
    let err = err_vs(&out, &reference);
    assert!(err <= 1e-2, "rel err {err}");
}

#[test]
fn nested_tile_loop() {
    let Some(_dev) = gpu() else { return };
    let (m, n) = (301, 1029);
    let x = random_tensor::<f16>([m, n], 1.0).unwrap();
    let bias = random_tensor::<f16>([n], 1.0).unwrap();
    let out = poisoned::<f32>([m, n]).unwrap();
    add_bias_rows(&x, &bias, &out).unwrap();
    let (xh, bh) = (host(&x), host(&bias));
    let reference: Vec<f64> = (0..m * n).map(|i| xh[i] + bh[i % n]).collect();
    let err = err_vs(&out, &reference);
    assert!(err <= 1e-3, "rel err {err}");
}
