//! The ceiling of the portable tensor-core path: how many TFLOP/s
//! `mma.sync.m16n8k16` (bf16 in, f32 accumulate) delivers on this GPU with no
//! memory traffic at all, next to cuBLAS on a large GEMM. The generated GEMM's
//! efficiency is judged against this number, not only against cuBLAS (which uses
//! the Hopper-only `wgmma`).
//!
//! cargo run --release --example mma_peak

use cudarc::driver::{LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use std::process::ExitCode;
use tilefuse::runtime::error::driver;
use tilefuse::{bf16, Device, Tensor};
use tilefuse_testkit::{exit_code, random_tensor};

/// `chains` independent accumulators per warp, `iters` rounds of one MMA each.
fn source(chains: usize) -> String {
    format!(
        r#"typedef unsigned int tf_u32;
extern "C" __global__ void tf_mma_peak(float* out, int iters) {{
  tf_u32 a[4], b[2];
  #pragma unroll
  for (int i = 0; i < 4; ++i) a[i] = threadIdx.x * 2654435761u + i;
  b[0] = threadIdx.x ^ 0x3c003c00u; b[1] = threadIdx.x ^ 0x3f803f80u;
  float acc[{chains}][4];
  #pragma unroll
  for (int c = 0; c < {chains}; ++c) {{ acc[c][0] = acc[c][1] = acc[c][2] = acc[c][3] = 0.f; }}
  for (int it = 0; it < iters; ++it) {{
    #pragma unroll
    for (int c = 0; c < {chains}; ++c)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
                   : "+f"(acc[c][0]), "+f"(acc[c][1]), "+f"(acc[c][2]), "+f"(acc[c][3])
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }}
  float s = 0.f;
  #pragma unroll
  for (int c = 0; c < {chains}; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}}
"#
    )
}

fn run() -> tilefuse::Result<bool> {
    let dev = Device::current()?;
    dev.require_gpu("mma_peak (it measures the tensor cores)")?;
    let sms = dev.sm_count();
    println!("device: {} ({}, {sms} SMs)", dev.name(), dev.arch());
    let iters = 4096i32;
    let mut best = 0.0f64;
    for chains in [8usize, 16, 32] {
        let cubin = tilefuse::jit::compile_cubin("tf_mma_peak", &source(chains), &dev.arch())?;
        let module = dev
            .context()?
            .load_module(Ptx::from_binary(cubin.image))
            .map_err(driver("loading the peak kernel"))?;
        let func = module
            .load_function("tf_mma_peak")
            .map_err(driver("finding the peak kernel"))?;
        for (warps, blocks_per_sm) in [(4usize, 1usize), (8, 1), (4, 2), (8, 2), (16, 1)] {
            let threads = warps * 32;
            let blocks = sms * blocks_per_sm;
            let out = Tensor::<f32>::empty([blocks * threads])?;
            let ptr = out.device_ptr();
            let cfg = LaunchConfig {
                grid_dim: (blocks as u32, 1, 1),
                block_dim: (threads as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let timed = tilefuse::time_gpu(&dev, 2, 10, false, || {
                let mut launch = dev.stream()?.launch_builder(&func);
                launch.arg(&ptr).arg(&iters);
                // SAFETY: the kernel takes (float*, int); `out` holds one float per
                // launched thread and outlives the launch (synchronized in time_gpu).
                unsafe { launch.launch(cfg) }
                    .map(drop)
                    .map_err(driver("launching the peak kernel"))
            });
            // Too many registers for this many warps: not a shape the GEMM uses either.
            let t = match timed {
                Ok(t) => t,
                Err(e) => {
                    println!("  {chains:>2} chains, {warps:>2} warps x {blocks_per_sm} blocks/SM: skipped ({e})");
                    continue;
                }
            };
            let flops = 2.0 * 16.0 * 8.0 * 16.0 * (chains * iters as usize * warps * blocks) as f64;
            let tflops = flops / t.median_ms / 1e9;
            best = best.max(tflops);
            println!(
                "  {chains:>2} chains, {warps:>2} warps x {blocks_per_sm} blocks/SM: {:.3} ms, {tflops:.0} TFLOP/s",
                t.median_ms
            );
        }
    }
    let (m, n, k) = (8192, 8192, 8192);
    let a = random_tensor::<bf16>([m, k], 1.0)?;
    let b = random_tensor::<bf16>([k, n], 1.0)?;
    let mut c = Tensor::<bf16>::empty([m, n])?;
    let t = tilefuse::time_gpu(&dev, 5, 20, true, || {
        tilefuse::cublas::matmul_into(&mut c, &a, &b)
    })?;
    let cublas = 2.0 * (m * n * k) as f64 / t.median_ms / 1e9;
    println!(
        "mma.sync peak: {best:.0} TFLOP/s; cuBLAS {m}x{n}x{k}: {cublas:.0} TFLOP/s; peak/cuBLAS = {:.0}%",
        100.0 * best / cublas
    );
    Ok(best > 0.0)
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    // It takes no arguments: one given is a mistake, not something to ignore.
    if let Some(a) = std::env::args().nth(1) {
        eprintln!("usage: mma_peak (no arguments): unexpected argument `{a}`");
        return ExitCode::from(2);
    }
    exit_code(run())
}
