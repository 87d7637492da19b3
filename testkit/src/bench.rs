//! Timings the examples print: bandwidth against the device's copy, and two
//! timings of the same work side by side.

use tilefuse_runtime::{time_gpu, timing::copy_bandwidth_gbs, Device, Result, Timing};

/// Times a memory-bound kernel (`f`, moving `bytes`: inputs read once and outputs
/// written once) against the device's copy bandwidth in the same run, prints
/// both, and returns the fraction of the copy bandwidth reached.
pub fn bench_bandwidth(
    dev: &Device,
    label: &str,
    bytes: usize,
    f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let t = time_gpu(dev, 5, 50, true, f)?;
    let copy = copy_bandwidth_gbs(dev, bytes / 2)?;
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
pub fn print_versus(flops: f64, ours: (&str, &Timing), theirs: (&str, &Timing)) {
    let tflops = |t: &Timing| flops / t.median_ms / 1e9;
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
