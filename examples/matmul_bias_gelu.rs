//! out = gelu(A·B + bias) in one kernel: the bias add and the GELU run on the
//! accumulators in registers, so C never makes a round trip through memory.
//! Checked against cuBLAS followed by the same epilogue on the host (f64).
//!
//! ```text
//! cargo run --release --example matmul_bias_gelu -- [M N K]     (default 4096 4096 4096)
//! ```

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse_testkit::{gelu_f64, mnk_main, print_versus, random_tensor, rel_error};

/// `gelu(a·b + bias[n])`, bf16 in and out, f32 inside.
#[fused_kernel]
pub fn matmul_bias_gelu(a: &Tensor<bf16>, b: &Tensor<bf16>, bias: &Tensor<bf16>) -> Tensor<bf16> {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    let mut out = Tensor::<bf16>::empty([m, n])?;
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = gelu(acc + bias[tn]).cast();
    }
    out
}

fn run(m: usize, n: usize, k: usize) -> tilefuse::Result<bool> {
    let dev = Device::current()?;
    println!(
        "device: {} ({}), out[{m}x{n}] = gelu(A[{m}x{k}] · B[{k}x{n}] + bias[{n}]), bf16",
        dev.name(),
        dev.arch()
    );
    let a = random_tensor::<bf16>([m, k], 1.0)?;
    let b = random_tensor::<bf16>([k, n], 1.0)?;
    let bias = random_tensor::<bf16>([n], 4.0)?;

    let out = matmul_bias_gelu(&a, &b, &bias)?;
    let mut c = Tensor::<bf16>::empty([m, n])?;
    tilefuse::cublas::matmul_into(&mut c, &a, &b)?;
    let (c_host, bias_host) = (c.to_vec()?, bias.to_vec()?);
    let reference: Vec<f64> = c_host
        .iter()
        .enumerate()
        .map(|(i, v)| gelu_f64(v.to_f64() + bias_host[i % n].to_f64()))
        .collect();
    let err = rel_error(&out.to_vec()?, &reference, |x: bf16| x.to_f64(), |x| x);
    let ok = err <= 1e-2;
    println!(
        "check: ‖out − ref‖/‖ref‖ = {err:.2e} ({})",
        if ok { "ok" } else { "FAILED" }
    );

    if dev.is_host() {
        return Ok(ok); // interpret mode: a CPU time says nothing of the GPU kernel
    }
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    let fused = tilefuse::time_gpu(&dev, 3, 20, true, || {
        matmul_bias_gelu(&a, &b, &bias).map(drop)
    })?;
    let gemm = tilefuse::time_gpu(&dev, 3, 20, true, || {
        tilefuse::cublas::matmul_into(&mut c, &a, &b)
    })?;
    print_versus(
        flops,
        ("tilefuse fused", &fused),
        ("cuBLAS GEMM alone", &gemm),
    );
    Ok(ok)
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    mnk_main("matmul_bias_gelu", [4096, 4096, 4096], run)
}
