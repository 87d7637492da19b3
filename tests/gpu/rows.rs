//! The row kernels (softmax, RMSNorm, LayerNorm) against float64 references on
//! ragged shapes (rows not a multiple of the block, columns not a multiple of a
//! chunk, rows not 16-byte aligned), under several configs, outputs poisoned.

use crate::common::examples::{cross_entropy, layer_norm, rms_norm, softmax};
use crate::common::gpu;
use tilefuse::prelude::*;
use tilefuse_testkit::{poisoned, random_tensor, rel_error};

pub(crate) const SHAPES: [(usize, usize); 6] = [
    (1, 1),
    (7, 13),
    (130, 1000),
    (33, 3000),
    (5, 8193),
    (300, 8192),
];

pub(crate) fn configs() -> Vec<Option<Config>> {
    vec![
        None,
        Some(Config::new(&[1, 8192, 8192]).num_warps(8)),
        Some(Config::new(&[2, 4096, 2048]).num_warps(16)),
        Some(Config::new(&[16, 256, 512]).num_warps(4)),
        Some(Config::new(&[8, 2048, 1024]).num_warps(8)),
        // The general lowering, which the tuner weighs against the row one.
        Some(Config::new(&[1, 8192, 8192]).num_warps(8).general(true)),
        Some(Config::new(&[4, 1024, 1024]).num_warps(4).general(true)),
    ]
}

fn host(t: &Tensor<bf16>) -> Vec<f64> {
    t.to_vec().unwrap().iter().map(|v| v.to_f64()).collect()
}

fn check(name: &str, m: usize, n: usize, cfg: &Option<Config>, out: &Tensor<bf16>, expect: &[f64]) {
    let err = rel_error(&out.to_vec().unwrap(), expect, |v: bf16| v.to_f64(), |v| v);
    let label = cfg.as_ref().map_or("default".into(), |c| c.to_string());
    eprintln!("{name} {m}x{n} {label}: rel err {err:.2e}");
    assert!(err <= 1e-2, "{name} {m}x{n} {label}: rel err {err}");
}

fn with<R>(def: &tilefuse::KernelDef, cfg: &Option<Config>, f: impl FnOnce() -> R) -> R {
    match cfg {
        Some(c) => def.with_config(c.clone(), f),
        None => f(),
    }
}

#[test]
fn softmax_matches_f64() {
    let Some(_dev) = gpu() else { return };
    for (m, n) in SHAPES {
        let x = random_tensor::<bf16>([m, n], 6.0).unwrap();
        let expect = softmax::reference(&host(&x), m, n);
        for cfg in configs() {
            let out = poisoned::<bf16>([m, n]).unwrap();
            with(softmax::softmax::kernel(), &cfg, || {
                softmax::softmax(&x, &out)
            })
            .unwrap();
            check("softmax", m, n, &cfg, &out, &expect);
        }
    }
}

#[test]
fn rms_norm_matches_f64() {
    let Some(_dev) = gpu() else { return };
    for (m, n) in SHAPES {
        let x = random_tensor::<bf16>([m, n], 2.0).unwrap();
        let w = random_tensor::<bf16>([n], 1.0).unwrap();
        let expect = rms_norm::reference(&host(&x), &host(&w), m, n, 1e-5);
        for cfg in configs() {
            let out = poisoned::<bf16>([m, n]).unwrap();
            with(rms_norm::rms_norm::kernel(), &cfg, || {
                rms_norm::rms_norm(&x, &w, &out, 1e-5)
            })
            .unwrap();
            check("rms_norm", m, n, &cfg, &out, &expect);
        }
    }
}

#[test]
fn layer_norm_matches_f64() {
    let Some(_dev) = gpu() else { return };
    for (m, n) in SHAPES {
        // Shifted by 8: a variance from E[x²] - E[x]² would lose its digits.
        let x = random_tensor::<bf16>([m, n], 2.0).unwrap();
        let shifted: Vec<bf16> = host(&x).iter().map(|v| bf16::from_f64(v + 8.0)).collect();
        let x = Tensor::from_slice(&shifted, [m, n]).unwrap();
        let w = random_tensor::<bf16>([n], 1.0).unwrap();
        let b = random_tensor::<bf16>([n], 1.0).unwrap();
        let expect = layer_norm::reference(&host(&x), &host(&w), &host(&b), m, n, 1e-5);
        for cfg in configs() {
            let out = poisoned::<bf16>([m, n]).unwrap();
            with(layer_norm::layer_norm::kernel(), &cfg, || {
                layer_norm::layer_norm(&x, &w, &b, &out, 1e-5)
            })
            .unwrap();
            check("layer_norm", m, n, &cfg, &out, &expect);
        }
    }
}

/// Cross-entropy: the label's logit picked by a mask (`tn.index() == label`), on
/// ragged shapes, with labels at the row's first and last column among them and
/// one outside the row (it picks nothing); the loss is f32, poisoned with NaN.
#[test]
fn cross_entropy_matches_f64() {
    let Some(_dev) = gpu() else { return };
    for (m, n) in SHAPES {
        let x = random_tensor::<bf16>([m, n], 4.0).unwrap();
        let mut labels = cross_entropy::random_labels(m, n);
        labels[0] = 0;
        labels[m - 1] = n as i64 - 1;
        if m > 2 {
            labels[1] = n as i64 + 5;
        }
        let labels_d = Tensor::from_slice(&labels, [m]).unwrap();
        let expect = cross_entropy::reference(&host(&x), &labels, m, n);
        // One walk: each config's rows and its first walk's columns.
        let two = configs()
            .into_iter()
            .map(|c| c.map(|c| Config::new(&c.block_sizes[..2]).num_warps(c.num_warps)));
        for cfg in two {
            let loss = Tensor::full([m], f32::NAN).unwrap();
            with(cross_entropy::cross_entropy::kernel(), &cfg, || {
                cross_entropy::cross_entropy(&x, &labels_d, &loss)
            })
            .unwrap();
            let err = rel_error(&loss.to_vec().unwrap(), &expect, |v: f32| v as f64, |v| v);
            let label = cfg.as_ref().map_or("default".into(), |c| c.to_string());
            eprintln!("cross_entropy {m}x{n} {label}: rel err {err:.2e}");
            assert!(err <= 1e-4, "cross_entropy {m}x{n} {label}: rel err {err}");
        }
    }
}
