//! C = A·B in bf16 with a tilefuse kernel, checked against cuBLAS and timed next to it.
//!
//! ```text
//! cargo run --release --example matmul -- [M N K]     (default 4096 4096 4096)
//! ```

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse::verify::{exit_code, mnk_from_args, poisoned, random_tensor, rel_error_tensors};

/// `a[M, K] · b[K, N]` with f32 accumulation, rounded to bf16.
#[fused_kernel]
pub fn matmul(a: &Tensor<bf16>, b: &Tensor<bf16>) -> Tensor<bf16> {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    let mut out = Tensor::<bf16>::empty([m, n])?;
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = acc.cast();
    }
    out
}

fn run(m: usize, n: usize, k: usize) -> tilefuse::Result<bool> {
    let dev = Device::current()?;
    println!(
        "device: {} ({}), C[{m}x{n}] = A[{m}x{k}] · B[{k}x{n}], bf16",
        dev.name(),
        dev.arch()
    );
    let a = random_tensor::<bf16>([m, k], 1.0)?;
    let b = random_tensor::<bf16>([k, n], 1.0)?;

    let c = matmul(&a, &b)?;
    let mut reference = poisoned::<bf16>([m, n])?;
    tilefuse::cublas::matmul_into(&mut reference, &a, &b)?;
    let err = rel_error_tensors(&c, &reference)?;
    let ok = err <= 1e-2;
    println!(
        "check: ‖C − C_cublas‖/‖C_cublas‖ = {err:.2e} ({})",
        if ok { "ok" } else { "FAILED" }
    );

    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let ours = tilefuse::time_gpu(&dev, 3, 20, true, || matmul(&a, &b).map(drop))?;
    let theirs = tilefuse::time_gpu(&dev, 3, 20, true, || {
        tilefuse::cublas::matmul_into(&mut reference, &a, &b)
    })?;
    let tf = |ms: f64| flops / ms / 1e9;
    println!(
        "tilefuse {:.3} ms ({:.0} TFLOP/s)  cuBLAS {:.3} ms ({:.0} TFLOP/s)  ratio {:.2}",
        ours.median_ms,
        tf(ours.median_ms),
        theirs.median_ms,
        tf(theirs.median_ms),
        theirs.median_ms / ours.median_ms
    );
    Ok(ok)
}

fn main() -> ExitCode {
    match mnk_from_args([4096, 4096, 4096]) {
        Ok([m, n, k]) => exit_code(run(m, n, k)),
        Err(e) => {
            eprintln!("usage: matmul [M N K]: {e}");
            ExitCode::from(2)
        }
    }
}
