//! Jagged and segmented reductions: segments of rows given by offsets (one
//! program per segment, a loop over its rows with bounds loaded in the
//! program), and unsorted segment ids combined with atomics.

use crate::harness::*;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::Device;
use tilefuse_testkit::Rng;

/// `out[b] = Σ values[offsets[b]..offsets[b + 1]]` (rows of `d` columns):
/// one program per (segment, column block), walking the segment's rows.
#[fused_kernel]
pub fn jagged_sum(values: &Tensor<bf16>, offsets: &Tensor<i64>, out: &Tensor<bf16>) {
    let [nb, d] = out.shape();
    for (b, td) in tile([each(nb), d]) {
        let mut acc = zeros::<f32>([td]);
        for tr in tile(offsets[b]..offsets[b + 1]) {
            acc = acc + values[(tr, td)].cast::<f32>().sum(tr);
        }
        out[(b, td)] = acc.cast();
    }
}

/// The mean of each segment's rows (an empty segment's is 0).
#[fused_kernel]
pub fn jagged_mean(values: &Tensor<bf16>, offsets: &Tensor<i64>, out: &Tensor<bf16>) {
    let [nb, d] = out.shape();
    for (b, td) in tile([each(nb), d]) {
        let begin = offsets[b];
        let end = offsets[b + 1];
        let mut acc = zeros::<f32>([td]);
        for tr in tile(begin..end) {
            acc = acc + values[(tr, td)].cast::<f32>().sum(tr);
        }
        out[(b, td)] = (acc / (max(end - begin, 1) as f32)).cast();
    }
}

/// Softmax over each segment's rows, per column (the jagged softmax of
/// recommendation models): an online walk for the maximum and the sum, a
/// second walk that writes.
#[fused_kernel]
pub fn jagged_softmax(values: &Tensor<bf16>, offsets: &Tensor<i64>, out: &Tensor<bf16>) {
    let [_, d] = values.shape();
    let [bounds] = offsets.shape();
    let nb = bounds - 1;
    for (b, td) in tile([each(nb), d]) {
        let begin = offsets[b];
        let end = offsets[b + 1];
        let mut col_max = full::<f32>([td], f32::NEG_INFINITY);
        let mut denom = zeros::<f32>([td]);
        for tr in tile(begin..end) {
            let v = values[(tr, td)].cast::<f32>();
            let new_max = max(col_max, v.max(tr));
            denom = denom * exp(col_max - new_max) + exp(v - new_max).sum(tr);
            col_max = new_max;
        }
        for tr in tile(begin..end) {
            let v = values[(tr, td)].cast::<f32>();
            out[(tr, td)] = (exp(v - col_max) / denom).cast();
        }
    }
}

/// `out[ids[i]] += values[i]` for unsorted segment ids: a grid over the
/// rows, each element added into its segment's row with `atomic_add`.
#[fused_kernel]
pub fn segment_sum(values: &Tensor<bf16>, ids: &Tensor<i64>, out: &Tensor<f32>) {
    let [n, d] = values.shape();
    for (tn, td) in tile([n, d]) {
        atomic_add(out[(ids[tn], td)], values[(tn, td)].cast::<f32>());
    }
}

/// `out[ids[i]] = max(out[ids[i]], values[i])` for unsorted segment ids,
/// with `atomic_max` (`out` starts at -inf: an empty segment stays so).
#[fused_kernel]
pub fn segment_max(values: &Tensor<bf16>, ids: &Tensor<i64>, out: &Tensor<f32>) {
    let [n, d] = values.shape();
    for (tn, td) in tile([n, d]) {
        atomic_max(out[(ids[tn], td)], values[(tn, td)].cast::<f32>());
    }
}

/// A jagged batch: `nb` segments of rows (lengths from the seed, a few
/// empty, some longer than a block of rows), as offsets.
fn random_offsets(rng: &mut Rng, nb: usize) -> Vec<i64> {
    let mut offsets = vec![0i64];
    for b in 0..nb {
        let len = if b % 5 == 1 {
            0
        } else {
            (rng.next_u64() % 150) as i64
        };
        offsets.push(offsets[b] + len);
    }
    offsets
}

/// The benchmark's segments: 2000 of lengths `(i · 7919) mod 2001` (a
/// permutation of 0..=2000 but one: about 1000 rows on average, one
/// empty), as `scripts/corpus/jagged.py` makes them.
fn bench_offsets() -> Vec<i64> {
    let mut offsets = vec![0i64];
    for i in 0..2000i64 {
        offsets.push(offsets[i as usize] + (i * 7919) % 2001);
    }
    offsets
}

/// Values `[offsets[nb], d]` and offsets on `dev`, with their f64 values.
struct Jagged {
    values: Tensor<bf16>,
    offsets: Tensor<i64>,
    vf: Vec<f64>,
    off: Vec<i64>,
}

fn jagged_inputs(
    dev: &Arc<Device>,
    rng: &mut Rng,
    off: Vec<i64>,
    d: usize,
    scale: f64,
) -> Result<Jagged> {
    let total = *off.last().unwrap_or(&0) as usize;
    let (values, vf) = input::<bf16>(dev, rng, &[total, d], scale)?;
    let offsets = Tensor::from_slice_on(dev, &off, [off.len()])?;
    Ok(Jagged {
        values,
        offsets,
        vf,
        off,
    })
}

/// Per segment and column, `f` of the segment's values in that column.
fn per_segment(j: &Jagged, d: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut out = Vec::new();
    for w in j.off.windows(2) {
        for c in 0..d {
            let col: Vec<f64> = (w[0] as usize..w[1] as usize)
                .map(|r| j.vf[r * d + c])
                .collect();
            out.push(f(&col));
        }
    }
    out
}

fn jagged_sum_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (nb, d) = (13, 100);
    let off = random_offsets(&mut rng, nb);
    let j = jagged_inputs(dev, &mut rng, off, d, 1.0)?;
    let out = poisoned::<bf16>(dev, &[nb, d])?;
    jagged_sum(&j.values, &j.offsets, &out)?;
    let want = per_segment(&j, d, |c| c.iter().sum());
    Ok(vec![Output::new("out", host(&out)?, want, BF16_TOL)])
}

fn jagged_bench_inputs(dev: &Arc<Device>) -> Result<(Jagged, usize, usize)> {
    let off = bench_offsets();
    let (nb, d) = (off.len() - 1, 128);
    Ok((jagged_inputs(dev, &mut Rng::new(1), off, d, 1.0)?, nb, d))
}

/// The benchmark's shape: segments, total rows, columns.
fn jagged_shape(j: &Jagged, nb: usize, d: usize) -> String {
    format!("{nb}x{}x{d}", j.off[nb])
}

fn jagged_sum_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (j, nb, d) = jagged_bench_inputs(dev)?;
    let out = Tensor::<bf16>::empty_on(dev, [nb, d])?;
    let total = j.off[nb] as usize;
    Ok(Bench {
        shape: jagged_shape(&j, nb, d),
        bytes: total * d * 2 + (nb + 1) * 8 + nb * d * 2,
        run: Box::new(move || jagged_sum(&j.values, &j.offsets, &out)),
    })
}

fn jagged_mean_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (nb, d) = (13, 100);
    let off = random_offsets(&mut rng, nb);
    let j = jagged_inputs(dev, &mut rng, off, d, 1.0)?;
    let out = poisoned::<bf16>(dev, &[nb, d])?;
    jagged_mean(&j.values, &j.offsets, &out)?;
    let want = per_segment(&j, d, |c| c.iter().sum::<f64>() / c.len().max(1) as f64);
    Ok(vec![Output::new("out", host(&out)?, want, BF16_TOL)])
}

fn jagged_mean_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (j, nb, d) = jagged_bench_inputs(dev)?;
    let out = Tensor::<bf16>::empty_on(dev, [nb, d])?;
    let total = j.off[nb] as usize;
    Ok(Bench {
        shape: jagged_shape(&j, nb, d),
        bytes: total * d * 2 + (nb + 1) * 8 + nb * d * 2,
        run: Box::new(move || jagged_mean(&j.values, &j.offsets, &out)),
    })
}

fn jagged_softmax_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (nb, d) = (13, 100);
    let off = random_offsets(&mut rng, nb);
    let j = jagged_inputs(dev, &mut rng, off, d, 4.0)?;
    let total = j.off[nb] as usize;
    let out = poisoned::<bf16>(dev, &[total, d])?;
    jagged_softmax(&j.values, &j.offsets, &out)?;
    let mut want = vec![0.0; total * d];
    for w in j.off.windows(2) {
        let rows = w[0] as usize..w[1] as usize;
        for c in 0..d {
            let mx = rows
                .clone()
                .map(|r| j.vf[r * d + c])
                .fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = rows.clone().map(|r| (j.vf[r * d + c] - mx).exp()).sum();
            for r in rows.clone() {
                want[r * d + c] = (j.vf[r * d + c] - mx).exp() / sum;
            }
        }
    }
    Ok(vec![Output::new("out", host(&out)?, want, BF16_TOL)])
}

fn jagged_softmax_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (j, nb, d) = jagged_bench_inputs(dev)?;
    let total = j.off[nb] as usize;
    let out = Tensor::<bf16>::empty_on(dev, [total, d])?;
    Ok(Bench {
        shape: jagged_shape(&j, nb, d),
        bytes: 2 * total * d * 2 + (nb + 1) * 8,
        run: Box::new(move || jagged_softmax(&j.values, &j.offsets, &out)),
    })
}

/// Unsorted segment ids for `n` rows into `nseg` segments: every segment
/// but the last gets a row, the last none, the rest at random.
fn segment_ids(
    dev: &Arc<Device>,
    rng: &mut Rng,
    n: usize,
    nseg: usize,
) -> Result<(Tensor<i64>, Vec<i64>)> {
    let mut ids: Vec<i64> = (0..n)
        .map(|i| {
            if i < nseg - 1 {
                i as i64
            } else {
                (rng.next_u64() % (nseg as u64 - 1)) as i64
            }
        })
        .collect();
    // Shuffle (Fisher–Yates), so that one segment's rows are far apart.
    for i in (1..n).rev() {
        ids.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    Ok((Tensor::from_slice_on(dev, &ids, [n])?, ids))
}

/// The per-segment fold `f` (from `init`) of the rows with each id.
fn per_id(
    vf: &[f64],
    ids: &[i64],
    nseg: usize,
    d: usize,
    init: f64,
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let mut out = vec![init; nseg * d];
    for (i, &s) in ids.iter().enumerate() {
        for c in 0..d {
            let o = &mut out[s as usize * d + c];
            *o = f(*o, vf[i * d + c]);
        }
    }
    out
}

fn segment_sum_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (n, d, nseg) = (1003, 100, 37);
    let (values, vf) = input::<bf16>(dev, &mut rng, &[n, d], 1.0)?;
    let (ids, idf) = segment_ids(dev, &mut rng, n, nseg)?;
    let out = zeros::<f32>(dev, &[nseg, d])?;
    segment_sum(&values, &ids, &out)?;
    let want = per_id(&vf, &idf, nseg, d, 0.0, |a, b| a + b);
    Ok(vec![Output::new("out", host(&out)?, want, 1e-5)])
}

/// The benchmark of the segment ops: 2M rows of 128 into 2000 segments.
struct SegmentBench {
    values: Tensor<bf16>,
    ids: Tensor<i64>,
    shape: String,
    /// Values and ids read once, the output written once.
    bytes: usize,
}

fn segment_bench_inputs(dev: &Arc<Device>) -> Result<(SegmentBench, [usize; 2])> {
    let (n, d, nseg) = (1 << 21, 128, 2000);
    let mut rng = Rng::new(1);
    let (values, _) = input::<bf16>(dev, &mut rng, &[n, d], 1.0)?;
    let (ids, _) = ints::<i64>(dev, &mut rng, &[n], 0, nseg as i64)?;
    let b = SegmentBench {
        values,
        ids,
        shape: format!("{n}x{d}->{nseg}"),
        bytes: n * d * 2 + n * 8 + nseg * d * 4,
    };
    Ok((b, [nseg, d]))
}

fn segment_sum_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (b, out_shape) = segment_bench_inputs(dev)?;
    let out = zeros::<f32>(dev, &out_shape)?;
    Ok(Bench {
        shape: b.shape,
        bytes: b.bytes,
        // The sums start from zero at every call, as PyTorch's `zeros` +
        // `index_add_` do.
        run: Box::new(move || {
            out.zero()?;
            segment_sum(&b.values, &b.ids, &out)
        }),
    })
}

/// -inf (an empty segment's maximum) as a finite stand-in, so that it
/// compares equal to itself in [`Output::err`].
fn finite(v: Vec<f64>) -> Vec<f64> {
    v.into_iter()
        .map(|x| if x == f64::NEG_INFINITY { -1e30 } else { x })
        .collect()
}

fn segment_max_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (n, d, nseg) = (1003, 100, 37);
    let (values, vf) = input::<bf16>(dev, &mut rng, &[n, d], 4.0)?;
    let (ids, idf) = segment_ids(dev, &mut rng, n, nseg)?;
    let out = Tensor::from_slice_on(dev, &vec![f32::NEG_INFINITY; nseg * d], [nseg, d])?;
    segment_max(&values, &ids, &out)?;
    let want = per_id(&vf, &idf, nseg, d, f64::NEG_INFINITY, f64::max);
    Ok(vec![Output::new(
        "out",
        finite(host(&out)?),
        finite(want),
        0.0,
    )])
}

fn segment_max_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (b, [nseg, d]) = segment_bench_inputs(dev)?;
    let init = Tensor::from_slice_on(dev, &vec![f32::NEG_INFINITY; nseg * d], [nseg, d])?;
    let out = Tensor::<f32>::empty_on(dev, [nseg, d])?;
    Ok(Bench {
        shape: b.shape,
        bytes: b.bytes,
        // The maxima start from -inf at every call, as PyTorch's `full` +
        // `scatter_reduce_` do: kept from the last call, every value would
        // already be in place and `atomic_max` would skip its update.
        run: Box::new(move || {
            out.copy_from(&init)?;
            segment_max(&b.values, &b.ids, &out)
        }),
    })
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "jagged_sum",
            covers: "jagged sum (each(nb) grid, tile(offsets[b]..offsets[b + 1]) with loaded bounds)",
            kernels: || vec![jagged_sum::kernel()],
            check: jagged_sum_check,
            bench: jagged_sum_bench,
        },
        Case {
            name: "jagged_mean",
            covers: "jagged mean (scalar bounds in the program, integer max, empty segments)",
            kernels: || vec![jagged_mean::kernel()],
            check: jagged_mean_check,
            bench: jagged_mean_bench,
        },
        Case {
            name: "jagged_softmax",
            covers: "softmax within jagged segments (two walks over loaded bounds, stores at jagged rows)",
            kernels: || vec![jagged_softmax::kernel()],
            check: jagged_softmax_check,
            bench: jagged_softmax_bench,
        },
        Case {
            name: "segment_sum",
            covers: "unsorted segment sum (gathered index in an atomic_add)",
            kernels: || vec![segment_sum::kernel()],
            check: segment_sum_check,
            bench: segment_sum_bench,
        },
        Case {
            name: "segment_max",
            covers: "unsorted segment max (gathered index in an f32 atomic_max)",
            kernels: || vec![segment_max::kernel()],
            check: segment_max_check,
            bench: segment_max_bench,
        },
    ]
}
