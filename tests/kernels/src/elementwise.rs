//! Elementwise kernels and data movement: binary ops, concatenation and split
//! by offsets, and the like.

use crate::harness::*;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::verify::Rng;
use tilefuse::Device;

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
    ]
}
