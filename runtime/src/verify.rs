//! Helpers for checking kernels: fresh random inputs, poisoned outputs, and the
//! relative error ‖out − ref‖ / ‖ref‖ computed in f64.

use crate::element::Element;
use crate::error::Result;
use crate::tensor::Tensor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A SplitMix64 generator: small, fast, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A generator seeded from the clock and a counter: fresh data on every call.
    pub fn fresh() -> Rng {
        static N: AtomicU64 = AtomicU64::new(0);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng::new(t ^ N.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// Host data with values uniform in [-scale, scale), rounded to `T`.
pub fn random_vec<T: Element>(rng: &mut Rng, n: usize, scale: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.uniform() * scale)).collect()
}

/// A tensor on the current device with fresh random values in [-scale, scale).
pub fn random_tensor<T: Element>(shape: impl AsRef<[usize]>, scale: f64) -> Result<Tensor<T>> {
    let shape = shape.as_ref();
    let data = random_vec::<T>(&mut Rng::fresh(), shape.iter().product(), scale);
    Tensor::from_slice(&data, shape)
}

/// A tensor filled with a value a correct kernel does not write (NaN for floats,
/// 1e9 for integers; NaN would convert to 0), so that elements a kernel forgot to
/// write show up in the error.
pub fn poisoned<T: Element>(shape: impl AsRef<[usize]>) -> Result<Tensor<T>> {
    let poison = if T::DTYPE.is_float() { f64::NAN } else { 1e9 };
    Tensor::full(shape, T::from_f64(poison))
}

/// ‖out − ref‖₂ / ‖ref‖₂ in f64. NaN anywhere in `out` gives NaN (never passes a `<=` check).
pub fn rel_error<A: Copy, B: Copy>(
    out: &[A],
    reference: &[B],
    a: impl Fn(A) -> f64,
    b: impl Fn(B) -> f64,
) -> f64 {
    if out.len() != reference.len() {
        return f64::NAN;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        let (o, r) = (a(o), b(r));
        num += (o - r) * (o - r);
        den += r * r;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// The relative error of a device tensor against a device reference.
pub fn rel_error_tensors<T: Element, U: Element>(
    out: &Tensor<T>,
    reference: &Tensor<U>,
) -> Result<f64> {
    let (o, r) = (out.to_vec()?, reference.to_vec()?);
    Ok(rel_error(&o, &r, T::to_f64, U::to_f64))
}

/// `A·B` in f64 on the host, row-major: the reference for small problems.
pub fn matmul_f64(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += x * b[p * n + j];
            }
        }
    }
    c
}

/// `M N K` from the command line (after the program name), or `default` when none
/// are given: what the example programs take.
pub fn mnk_from_args(default: [usize; 3]) -> std::result::Result<[usize; 3], String> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .map_err(|_| format!("expected M N K as integers, got `{a}`"))
        })
        .collect::<std::result::Result<_, _>>()?;
    match args.as_slice() {
        [] => Ok(default),
        [m, n, k] => Ok([*m, *n, *k]),
        _ => Err(format!("expected three sizes M N K, got {}", args.len())),
    }
}

/// The exit code of a self-checking program: success only when it ran and its
/// check passed; errors are printed.
pub fn exit_code(outcome: Result<bool>) -> std::process::ExitCode {
    match outcome {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("check FAILED");
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The default sizes of a GEMM example in interpret mode: ragged against
/// every block size, and a few seconds on one CPU core.
pub const INTERPRET_MNK: [usize; 3] = [200, 168, 136];

/// The default sizes of a row-kernel example in interpret mode.
pub const INTERPRET_ROWS: [usize; 2] = [100, 1000];

/// `default`, or in interpret mode `cpu` (with a line saying so).
fn default_sizes<const N: usize>(default: [usize; N], cpu: [usize; N]) -> [usize; N] {
    if !crate::mode::interpreting() {
        return default;
    }
    println!("interpret mode: default sizes {cpu:?} for the CPU (the GPU's are {default:?})");
    cpu
}

/// The `main` of a self-checking `M N K` example: parses the sizes (or takes
/// `default`; in interpret mode [`INTERPRET_MNK`]), runs `run`, and turns its
/// outcome into the exit code.
pub fn mnk_main(
    program: &str,
    default: [usize; 3],
    run: impl FnOnce(usize, usize, usize) -> Result<bool>,
) -> std::process::ExitCode {
    let given = std::env::args().len() > 1;
    let default = if given {
        default
    } else {
        default_sizes(default, INTERPRET_MNK)
    };
    match mnk_from_args(default) {
        Ok([m, n, k]) => exit_code(run(m, n, k)),
        Err(e) => {
            eprintln!("usage: {program} [M N K]: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

/// The `main` of a self-checking row-kernel example (`[M N] [--bench]`): parses the
/// sizes (or takes `default`; in interpret mode [`INTERPRET_ROWS`]), runs
/// `run(m, n, bench)`, and turns its outcome into the exit code.
pub fn rows_main(
    program: &str,
    default: [usize; 2],
    run: impl FnOnce(usize, usize, bool) -> Result<bool>,
) -> std::process::ExitCode {
    let mut bench = false;
    let mut sizes = Vec::new();
    for a in std::env::args().skip(1) {
        if a == "--bench" {
            bench = true;
        } else if let Ok(v) = a.parse::<usize>() {
            sizes.push(v);
        } else {
            eprintln!("usage: {program} [M N] [--bench]: unexpected argument `{a}`");
            return std::process::ExitCode::from(2);
        }
    }
    let [m, n] = match sizes.as_slice() {
        [] => default_sizes(default, INTERPRET_ROWS),
        [m, n] => [*m, *n],
        _ => {
            eprintln!(
                "usage: {program} [M N] [--bench]: expected two sizes, got {}",
                sizes.len()
            );
            return std::process::ExitCode::from(2);
        }
    };
    exit_code(run(m, n, bench))
}

/// Times a memory-bound kernel (`f`, moving `bytes`: inputs read once and outputs
/// written once) against the device's copy bandwidth in the same run, prints
/// both, and returns the fraction of the copy bandwidth reached.
pub fn bench_bandwidth(
    dev: &crate::Device,
    label: &str,
    bytes: usize,
    f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let t = crate::time_gpu(dev, 5, 50, true, f)?;
    let copy = crate::timing::copy_bandwidth_gbs(dev, bytes / 2)?;
    let gbs = bytes as f64 / t.median_ms / 1e6;
    println!(
        "{label}: {:.4} ms, {gbs:.0} GB/s; device-to-device copy {copy:.0} GB/s; {:.1}% of copy",
        t.median_ms,
        100.0 * gbs / copy
    );
    Ok(gbs / copy)
}

/// Prints two timings of the same `flops` of work side by side, with the ratio
/// `theirs / ours` (above 1: ours is faster).
pub fn print_versus(flops: f64, ours: (&str, &crate::Timing), theirs: (&str, &crate::Timing)) {
    let tflops = |t: &crate::Timing| flops / t.median_ms / 1e9;
    println!(
        "{} {:.3} ms ({:.0} TFLOP/s)  {} {:.3} ms ({:.0} TFLOP/s)  ratio {:.2}",
        ours.0,
        ours.1.median_ms,
        tflops(ours.1),
        theirs.0,
        theirs.1.median_ms,
        tflops(theirs.1),
        theirs.1.median_ms / ours.1.median_ms
    );
}

/// erf-based GELU in f64 (PyTorch's default GELU), for host references.
pub fn gelu_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + erf_f64(x / std::f64::consts::SQRT_2))
}

/// erf with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26): ample for bf16 checks.
pub fn erf_f64(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
        + 0.254829592)
        * t;
    (1.0 - poly * (-x * x).exp()).copysign(x)
}
