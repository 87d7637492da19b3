//! Reductions along any tile: rows, columns, a whole tensor.

use crate::harness::*;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::verify::Rng;
use tilefuse::Device;

/// Column sums: each program owns a block of columns and walks the rows.
#[fused_kernel]
pub fn col_sum(x: &Tensor<bf16>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for tn in tile(n) {
        let mut acc = zeros::<f32>([tn]);
        for tm in tile(m) {
            acc = acc + x[(tm, tn)].cast::<f32>().sum(tm);
        }
        out[tn] = acc;
    }
}

/// The sum of a whole tensor: each program reduces its tile and adds it in.
#[fused_kernel]
pub fn total_sum(x: &Tensor<bf16>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        atomic_add(out[0], x[(tm, tn)].cast::<f32>().sum(tn).sum(tm));
    }
}

fn col_sum_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (333, 1000);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = poisoned::<f32>(dev, &[n])?;
    col_sum(&x, &out)?;
    let want = (0..n).map(|j| (0..m).map(|i| xf[i * n + j]).sum()).collect();
    Ok(vec![Output::new("out", host(&out)?, want, F32_TOL)])
}

fn col_sum_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, n], 1.0)?;
    let out = Tensor::<f32>::empty_on(dev, [n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + n * 4,
        run: Box::new(move || col_sum(&x, &out)),
    })
}

fn total_sum_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (301, 1000);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = zeros::<f32>(dev, &[1])?;
    total_sum(&x, &out)?;
    let want = vec![xf.iter().sum()];
    Ok(vec![Output::new("out", host(&out)?, want, 1e-4)])
}

fn total_sum_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, n], 1.0)?;
    let out = zeros::<f32>(dev, &[1])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2,
        run: Box::new(move || total_sum(&x, &out)),
    })
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "col_sum",
            covers: "sum over columns (a loop of rows, a carried accumulator)",
            kernels: || vec![col_sum::kernel()],
            check: col_sum_check,
            bench: col_sum_bench,
        },
        Case {
            name: "total_sum",
            covers: "sum of a whole tensor (atomics)",
            kernels: || vec![total_sum::kernel()],
            check: total_sum_check,
            bench: total_sum_bench,
        },
    ]
}
