//! Scans along a tile: prefix sums carried across a loop's blocks, a running
//! maximum over whole rows, and integer positions from a padding mask.

use crate::harness::*;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::Device;
use tilefuse_testkit::Rng;

/// `x.cumsum(1)`: each block of a row scanned, plus the running total of
/// the blocks before it (carried in f32 across the loop).
#[fused_kernel]
pub fn cumsum(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut carry = zeros::<f32>([tm]);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            out[(tm, tn)] = (carry + v.cumsum(tn)).cast();
            carry = carry + v.sum(tn);
        }
    }
}

/// `x.cummax(1).values`: a running maximum over rows held whole (`whole(n)`
/// fits the row's block to its length at launch).
#[fused_kernel]
pub fn cummax(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, whole(n)]) {
        out[(tm, tn)] = x[(tm, tn)].cast::<f32>().cummax(tn).cast();
    }
}

/// Position ids from a padding mask, as Hugging Face models make them:
/// `mask.cumsum(-1) - 1`, and 1 where the mask is 0.
#[fused_kernel]
pub fn position_ids(mask: &Tensor<i64>, out: &Tensor<i64>) {
    let [b, s] = mask.shape();
    for tb in tile(b) {
        let mut seen = zeros::<i64>([tb]);
        for ts in tile(s) {
            let m = mask[(tb, ts)];
            out[(tb, ts)] = select(m == 0, 1, seen + m.cumsum(ts) - 1);
            seen = seen + m.sum(ts);
        }
    }
}

/// `f` along each row of an `m` × `n` matrix, element by element: `f(acc, x)`
/// from `init`, every prefix kept.
fn scan_rows(x: &[f64], m: usize, n: usize, init: f64, f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(m * n);
    for r in 0..m {
        let mut acc = init;
        for &v in &x[r * n..(r + 1) * n] {
            acc = f(acc, v);
            out.push(acc);
        }
    }
    out
}

fn cumsum_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let mut outs = Vec::new();
    // Rows of many blocks (the carry), and rows shorter than one.
    for (m, n, name) in [(77, 3001, "out"), (5, 37, "out (short rows)")] {
        let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
        let out = poisoned::<bf16>(dev, &[m, n])?;
        cumsum(&x, &out)?;
        let want: Vec<f64> = scan_rows(&xf, m, n, 0.0, |a, v| a + v)
            .into_iter()
            .map(bf16r)
            .collect();
        outs.push(Output::new(name, host(&out)?, want, BF16_TOL));
    }
    Ok(outs)
}

fn cumsum_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 * 2,
        run: Box::new(move || cumsum(&x, &out)),
    })
}

fn cummax_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let mut outs = Vec::new();
    for (m, n, name) in [(33, 1500, "out"), (7, 5, "out (short rows)")] {
        let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
        let out = poisoned::<bf16>(dev, &[m, n])?;
        cummax(&x, &out)?;
        let want = scan_rows(&xf, m, n, f64::NEG_INFINITY, f64::max);
        // The maxima of bf16 values are bf16 values: exact.
        outs.push(Output::new(name, host(&out)?, want, 0.0));
    }
    Ok(outs)
}

fn cummax_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 4096);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 * 2,
        run: Box::new(move || cummax(&x, &out)),
    })
}

/// A padding mask: each row's first few positions padded (left padding),
/// then ones with a few holes.
fn padding_mask(rng: &mut Rng, b: usize, s: usize) -> Vec<i64> {
    let mut mask = Vec::with_capacity(b * s);
    for _ in 0..b {
        let pad = (rng.next_u64() % (s as u64 / 3 + 1)) as usize;
        for j in 0..s {
            mask.push(i64::from(j >= pad && !rng.next_u64().is_multiple_of(10)));
        }
    }
    mask
}

fn position_ids_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (b, s) = (13, 2500);
    let mask = padding_mask(&mut rng, b, s);
    let mf: Vec<f64> = mask.iter().map(|&v| v as f64).collect();
    let out = poisoned::<i64>(dev, &[b, s])?;
    position_ids(&Tensor::from_slice_on(dev, &mask, [b, s])?, &out)?;
    let want: Vec<f64> = scan_rows(&mf, b, s, 0.0, |a, v| a + v)
        .into_iter()
        .zip(&mf)
        .map(|(c, &m)| if m == 0.0 { 1.0 } else { c - 1.0 })
        .collect();
    Ok(vec![Output::new("out", host(&out)?, want, 0.0)])
}

fn position_ids_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (b, s) = (8192, 4096);
    let mask = padding_mask(&mut Rng::new(1), b, s);
    let mask = Tensor::from_slice_on(dev, &mask, [b, s])?;
    let out = Tensor::<i64>::empty_on(dev, [b, s])?;
    Ok(Bench {
        shape: format!("{b}x{s}"),
        bytes: b * s * 8 * 2,
        run: Box::new(move || position_ids(&mask, &out)),
    })
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "cumsum",
            covers: "prefix sums along rows (a scan per block, its running total carried across the loop)",
            kernels: || vec![cumsum::kernel()],
            check: cumsum_check,
            bench: cumsum_bench,
        },
        Case {
            name: "cummax",
            covers: "running maximum over whole rows (a scan along a `whole` tile)",
            kernels: || vec![cummax::kernel()],
            check: cummax_check,
            bench: cummax_bench,
        },
        Case {
            name: "position_ids",
            covers: "integer prefix sums of a padding mask (i64 scan, carry, select)",
            kernels: || vec![position_ids::kernel()],
            check: position_ids_check,
            bench: position_ids_bench,
        },
    ]
}
