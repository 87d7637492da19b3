//! Benchmark: the generated bf16 GEMM against cuBLAS, same run, same GPU.
//!
//! ```text
//! cargo run --release --example bench_matmul [-- --sweep]
//! ```
//!
//! For each shape it prints tilefuse's time with the default config, and with
//! `--sweep` also the best of a fixed list of configs (each checked against cuBLAS
//! before it is timed), cuBLAS's time, the ratio and TFLOP/s. CUDA events, L2
//! flushed before each timed run, median of repeats. Ends with a markdown table.

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse::verify::{exit_code, random_tensor, rel_error_tensors};

#[fused_kernel]
fn matmul(a: &Tensor<bf16>, b: &Tensor<bf16>) -> Tensor<bf16> {
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

const SHAPES: [[usize; 3]; 4] = [
    [4096, 6656, 16384],
    [8192, 8192, 8192],
    [4096, 4096, 4096],
    [1000, 1000, 1000],
];

fn sweep_configs() -> Vec<Config> {
    vec![
        Config::new(&[128, 256, 32]).num_warps(8).num_stages(4),
        Config::new(&[128, 256, 64]).num_warps(8).num_stages(3),
        Config::new(&[128, 256, 32]).num_warps(8).num_stages(3),
        Config::new(&[256, 128, 32]).num_warps(8).num_stages(4),
        Config::new(&[256, 128, 64]).num_warps(8).num_stages(3),
        Config::new(&[128, 128, 32]).num_warps(4).num_stages(4),
        Config::new(&[128, 128, 64]).num_warps(4).num_stages(3),
        Config::new(&[128, 128, 32]).num_warps(8).num_stages(4),
        Config::new(&[64, 128, 64]).num_warps(4).num_stages(4),
        Config::new(&[128, 128, 32]).num_warps(4).num_stages(3),
        Config::new(&[128, 256, 32]).num_warps(8).num_stages(5),
        Config::new(&[128, 128, 32]).num_warps(4).num_stages(5),
    ]
}

struct Row {
    shape: [usize; 3],
    default_ms: f64,
    best_ms: f64,
    best_cfg: String,
    cublas_ms: f64,
}

fn run() -> tilefuse::Result<bool> {
    let sweep = std::env::args().any(|a| a == "--sweep");
    let dev = Device::current()?;
    println!(
        "device: {} ({}, {} SMs)",
        dev.name(),
        dev.arch(),
        dev.sm_count()
    );
    let mut rows = Vec::new();
    let mut all_ok = true;
    for shape @ [m, n, k] in SHAPES {
        let a = random_tensor::<bf16>([m, k], 1.0)?;
        let b = random_tensor::<bf16>([k, n], 1.0)?;
        let mut reference = Tensor::<bf16>::empty([m, n])?;
        tilefuse::cublas::matmul_into(&mut reference, &a, &b)?;
        let reps = if m * n * k > 1 << 32 { 20 } else { 50 };
        let cublas = tilefuse::time_gpu(&dev, 5, reps, true, || {
            tilefuse::cublas::matmul_into(&mut reference, &a, &b)
        })?;

        let default = matmul::kernel().config()?;
        let mut candidates = vec![default.clone()];
        if sweep {
            candidates.extend(sweep_configs().into_iter().filter(|c| *c != default));
        }
        let (mut default_ms, mut best) = (f64::NAN, (f64::INFINITY, String::new()));
        for cfg in candidates {
            let label = cfg.to_string();
            let outcome =
                matmul::kernel().with_config(cfg.clone(), || -> tilefuse::Result<(f64, f64)> {
                    let c = matmul(&a, &b)?;
                    let err = rel_error_tensors(&c, &reference)?;
                    let t = tilefuse::time_gpu(&dev, 5, reps, true, || matmul(&a, &b).map(drop))?;
                    Ok((err, t.median_ms))
                });
            match outcome {
                Ok((err, ms)) => {
                    let ok = err <= 1e-2;
                    all_ok &= ok || cfg != default;
                    println!(
                        "  {m}x{n}x{k} {label}: {ms:.3} ms, {:.0} TFLOP/s, rel err {err:.1e}{}",
                        2.0 * (m * n * k) as f64 / ms / 1e9,
                        if ok { "" } else { "  WRONG RESULT, excluded" }
                    );
                    if cfg == default {
                        default_ms = ms;
                    }
                    if ok && ms < best.0 {
                        best = (ms, label);
                    }
                }
                Err(e) => println!("  {m}x{n}x{k} {label}: skipped ({e})"),
            }
        }
        rows.push(Row {
            shape,
            default_ms,
            best_ms: best.0,
            best_cfg: best.1,
            cublas_ms: cublas.median_ms,
        });
    }
    let tflops = |s: [usize; 3], ms: f64| 2.0 * (s[0] * s[1] * s[2]) as f64 / ms / 1e9;
    println!("\n| M×N×K | tilefuse default ms | cuBLAS ms | default/cuBLAS | TFLOP/s (tilefuse / cuBLAS) | best swept ms | best/cuBLAS | best config |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {}×{}×{} | {:.3} | {:.3} | {:.0}% | {:.0} / {:.0} | {:.3} | {:.0}% | {} |",
            r.shape[0],
            r.shape[1],
            r.shape[2],
            r.default_ms,
            r.cublas_ms,
            100.0 * r.cublas_ms / r.default_ms,
            tflops(r.shape, r.default_ms),
            tflops(r.shape, r.cublas_ms),
            r.best_ms,
            100.0 * r.cublas_ms / r.best_ms,
            r.best_cfg
        );
    }
    Ok(all_ok)
}

fn main() -> ExitCode {
    exit_code(run())
}
