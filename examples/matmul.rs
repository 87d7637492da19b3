//! C = A·B in bf16 with a tilefuse kernel, checked against cuBLAS and timed next to it.
//!
//! ```text
//! cargo run --release --example matmul -- [M N K]     (default 4096 4096 4096)
//! ```

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse_testkit::{mnk_main, poisoned, print_versus, random_tensor, rel_error_tensors};

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

    // The first launch compiles (or loads from the cache) and, unless a config is
    // pinned or TILEFUSE_AUTOTUNE=off, tunes (or loads the tuned config).
    let c = matmul(&a, &b)?;
    dev.synchronize()?;
    println!(
        "first launch done {:.0} ms after start ({})",
        started().elapsed().as_secs_f64() * 1e3,
        tilefuse::runtime::autotune::counters()
    );
    let mut reference = poisoned::<bf16>([m, n])?;
    tilefuse::cublas::matmul_into(&mut reference, &a, &b)?;
    let err = rel_error_tensors(&c, &reference)?;
    let ok = err <= 1e-2;
    println!(
        "check: ‖C − C_cublas‖/‖C_cublas‖ = {err:.2e} ({})",
        if ok { "ok" } else { "FAILED" }
    );

    if dev.is_host() {
        return Ok(ok); // interpret mode: a CPU time says nothing of the GPU kernel
    }
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let ours = tilefuse::time_gpu(&dev, 3, 20, true, || matmul(&a, &b).map(drop))?;
    let theirs = tilefuse::time_gpu(&dev, 3, 20, true, || {
        tilefuse::cublas::matmul_into(&mut reference, &a, &b)
    })?;
    print_versus(flops, ("tilefuse", &ours), ("cuBLAS", &theirs));
    Ok(ok)
}

/// When the program started (set first thing in `main`).
fn started() -> std::time::Instant {
    static T: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *T.get_or_init(std::time::Instant::now)
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    started();
    mnk_main("matmul", [4096, 4096, 4096], run)
}
