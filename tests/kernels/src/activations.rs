//! Activations, forward and backward.

use crate::harness::*;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::verify::Rng;
use tilefuse::Device;

/// SwiGLU: `out = silu(gate) * up`, the halves of `x` (`[m, 2n]`) by offset.
#[fused_kernel]
pub fn swiglu(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = out.shape();
    for (tm, tn) in tile([m, n]) {
        let gate = x[(tm, tn)].cast::<f32>();
        let up = x[(tm, tn + n)].cast::<f32>();
        out[(tm, tn)] = (silu(gate) * up).cast();
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn swiglu_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (37, 520);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, 2 * n], 3.0)?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    swiglu(&x, &out)?;
    let mut want = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            want.push(silu(xf[i * 2 * n + j]) * xf[i * 2 * n + n + j]);
        }
    }
    Ok(vec![Output::new("out", host(&out)?, want, BF16_TOL)])
}

fn swiglu_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, 2 * n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 3 * m * n * 2,
        run: Box::new(move || swiglu(&x, &out)),
    })
}

pub fn cases() -> Vec<Case> {
    vec![Case {
        name: "swiglu",
        covers: "activations (forward), offsets",
        kernels: || vec![swiglu::kernel()],
        check: swiglu_check,
        bench: swiglu_bench,
    }]
}
