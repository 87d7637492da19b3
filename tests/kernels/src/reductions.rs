//! Reductions along any tile: rows, columns, a whole tensor, long rows split
//! across programs, and the row kernels built on them (softmax, log-sum-exp,
//! Welford's mean and variance, argmax).

use crate::harness::*;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::Device;
use tilefuse_testkit::Rng;

/// Column sums: each program owns a block of columns and walks the rows.
#[fused_kernel]
pub fn col_sum(x: &Tensor<bf16>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for tn in tile(n) {
        let mut acc = zeros::<f32>([tn]);
        for tm in tile(m) {
            acc = acc + x[(tm, tn)].cast::<f32>().sum(tm);
        }
        out[tn] = acc;
    }
}

/// Per column, the largest element and how many are positive: a max and an
/// integer count carried down the rows (several programs may share the
/// walk down a tall matrix; their maxima and counts meet at the end).
#[fused_kernel]
pub fn col_max_count(x: &Tensor<bf16>, top: &Tensor<f32>, positive: &Tensor<i32>) {
    let [m, n] = x.shape();
    for tn in tile(n) {
        let mut hi = full::<f32>([tn], f32::NEG_INFINITY);
        let mut count = zeros::<i32>([tn]);
        for tm in tile(m) {
            let v = x[(tm, tn)].cast::<f32>();
            hi = max(hi, v.max(tm));
            count = count + select(v > 0.0, 1, 0).sum(tm);
        }
        top[tn] = hi;
        positive[tn] = count;
    }
}

/// The sum of a whole tensor: each program reduces its tile and adds it in.
#[fused_kernel]
pub fn total_sum(x: &Tensor<bf16>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        atomic_add(out[0], x[(tm, tn)].cast::<f32>().sum(tn).sum(tm));
    }
}

/// Row sums: each program owns a block of rows and walks the columns,
/// carrying one f32 accumulator per row.
#[fused_kernel]
pub fn row_sum(x: &Tensor<bf16>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut acc = zeros::<f32>([tm]);
        for tn in tile(n) {
            acc = acc + x[(tm, tn)].cast::<f32>().sum(tn);
        }
        out[tm] = acc;
    }
}

/// Row means, stored in bf16 as `x.mean(1)` does.
#[fused_kernel]
pub fn row_mean(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut acc = zeros::<f32>([tm]);
        for tn in tile(n) {
            acc = acc + x[(tm, tn)].cast::<f32>().sum(tn);
        }
        out[tm] = (acc / (n as f32)).cast();
    }
}

/// Sums of a few very long rows: each row is cut into chunks of `chunk`
/// elements, one program per (row, chunk) walks its chunk and adds its
/// partial sum into the row's output with `atomic_add` (split-K style).
/// The last chunk runs past the row's end, where loads read zero.
///
/// The chunk is walked as a tile of extent `chunk` at an offset rather than
/// as `for tn in tile(c * chunk..c * chunk + chunk)` with `x[(r, tn)]` (which
/// compiles too): a loop over a whole extent has a tile count the runtime
/// knows at launch, so several programs may share it (`Config::split`).
#[fused_kernel]
pub fn long_row_sum(x: &Tensor<bf16>, out: &Tensor<f32>, chunk: usize) {
    let [m, n] = x.shape();
    let chunks = n.div_ceil(chunk);
    for (r, c) in tile([each(m), each(chunks)]) {
        let mut acc = zeros::<f32>([]);
        for tn in tile(chunk) {
            acc = acc + x[(r, tn + c * chunk)].cast::<f32>().sum(tn);
        }
        atomic_add(out[r], acc);
    }
}

/// The same row sums written as one walk along each row: the runtime shares
/// the walk among programs (`Config::split`) and the last of a row's programs
/// adds their sums in order. No atomics, so the output needs no zeroing.
#[fused_kernel]
pub fn long_row_sum_split(x: &Tensor<bf16>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for r in tile(each(m)) {
        let mut acc = zeros::<f32>([]);
        for tn in tile(n) {
            acc = acc + x[(r, tn)].cast::<f32>().sum(tn);
        }
        out[r] = acc;
    }
}

/// The first position of each long row's largest element, one walk a row
/// that programs share: the last of a row's programs takes a later share's
/// position only where its maximum is larger (a tie keeps the earlier).
#[fused_kernel]
pub fn long_row_argmax(x: &Tensor<bf16>, out: &Tensor<i64>) {
    let [m, n] = x.shape();
    for r in tile(each(m)) {
        let mut best = full::<f32>([], f32::NEG_INFINITY);
        let mut at = zeros::<i64>([]);
        for tn in tile(n) {
            let v = x[(r, tn)].cast::<f32>();
            let hi = v.max(tn);
            at = select(hi > best, v.argmax(tn), at);
            best = max(best, hi);
        }
        out[r] = at;
    }
}

/// Per-row mean and (population) variance in one walk: each column tile's
/// count, mean and sum of squared deviations are merged into the carried
/// ones (Welford/Chan), so the variance never subtracts two large sums.
#[fused_kernel]
pub fn welford(x: &Tensor<bf16>, mean: &Tensor<f32>, var: &Tensor<f32>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut count = 0.0f32;
        let mut mu = zeros::<f32>([tm]);
        let mut m2 = zeros::<f32>([tm]);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            let c = tn.size() as f32;
            let step_mean = v.sum(tn) / c;
            let d = v - step_mean;
            let total = count + c;
            let delta = step_mean - mu;
            mu = mu + delta * (c / total);
            m2 = m2 + (d * d).sum(tn) + delta * delta * (count * c / total);
            count = total;
        }
        mean[tm] = mu;
        var[tm] = m2 / count;
    }
}

/// Row softmax: a first walk keeps the running maximum and the sum of
/// exponentials rescaled to it (online softmax), a second writes the result.
#[fused_kernel]
pub fn softmax(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut row_max = full::<f32>([tm], f32::NEG_INFINITY);
        let mut denom = zeros::<f32>([tm]);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            let new_max = max(row_max, v.max(tn));
            denom = denom * exp(row_max - new_max) + exp(v - new_max).sum(tn);
            row_max = new_max;
        }
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            out[(tm, tn)] = (exp(v - row_max) / denom).cast();
        }
    }
}

/// Softmax backward from the forward's output `y`:
/// `dx = y * (dy - sum(dy * y))`, the row's dot product in a first walk.
#[fused_kernel]
pub fn softmax_bwd(y: &Tensor<bf16>, dy: &Tensor<bf16>, dx: &Tensor<bf16>) {
    let [m, n] = y.shape();
    for tm in tile(m) {
        let mut dot = zeros::<f32>([tm]);
        for tn in tile(n) {
            let yv = y[(tm, tn)].cast::<f32>();
            dot = dot + (dy[(tm, tn)].cast::<f32>() * yv).sum(tn);
        }
        for tn in tile(n) {
            let yv = y[(tm, tn)].cast::<f32>();
            dx[(tm, tn)] = (yv * (dy[(tm, tn)].cast::<f32>() - dot)).cast();
        }
    }
}

/// Softmax over the last axis of `x[b, m, n]`: a grid of (batch, row)
/// tiles, the walks over the row inside.
#[fused_kernel]
pub fn batched_softmax(x: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [b, m, n] = x.shape();
    for (tb, tm) in tile([b, m]) {
        let mut row_max = full::<f32>([tb, tm], f32::NEG_INFINITY);
        let mut denom = zeros::<f32>([tb, tm]);
        for tn in tile(n) {
            let v = x[(tb, tm, tn)].cast::<f32>();
            let new_max = max(row_max, v.max(tn));
            denom = denom * exp(row_max - new_max) + exp(v - new_max).sum(tn);
            row_max = new_max;
        }
        for tn in tile(n) {
            let v = x[(tb, tm, tn)].cast::<f32>();
            out[(tb, tm, tn)] = (exp(v - row_max) / denom).cast();
        }
    }
}

/// `out[i] = log(sum(exp(x[i, :])))`, stable: an online maximum and sum.
#[fused_kernel]
pub fn logsumexp(x: &Tensor<bf16>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut row_max = full::<f32>([tm], f32::NEG_INFINITY);
        let mut denom = zeros::<f32>([tm]);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            let new_max = max(row_max, v.max(tn));
            denom = denom * exp(row_max - new_max) + exp(v - new_max).sum(tn);
            row_max = new_max;
        }
        out[tm] = row_max + log(denom);
    }
}

/// The largest and smallest element of each row of an i32 matrix, exact.
#[fused_kernel]
pub fn row_max_min(x: &Tensor<i32>, hi: &Tensor<i32>, lo: &Tensor<i32>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        // `full` takes a number literal: `i32::MIN`/`i32::MAX` are refused.
        let mut big = full::<i32>([tm], -2147483648);
        let mut small = full::<i32>([tm], 2147483647);
        for tn in tile(n) {
            let v = x[(tm, tn)];
            big = max(big, v.max(tn));
            small = min(small, v.min(tn));
        }
        hi[tm] = big;
        lo[tm] = small;
    }
}

/// The index of each row's largest element (the first, on ties), in one
/// walk: each tile's maximum and the smallest index holding it, kept where
/// it beats the carried maximum.
#[fused_kernel]
pub fn argmax(x: &Tensor<bf16>, out: &Tensor<i64>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut best = full::<f32>([tm], f32::NEG_INFINITY);
        let mut best_idx = zeros::<i64>([tm]);
        for tn in tile(n) {
            let v = x[(tm, tn)].cast::<f32>();
            let tile_max = v.max(tn);
            let tile_idx = select(v == tile_max, tn.index(), n).min(tn);
            best_idx = select(tile_max > best, tile_idx, best_idx);
            best = max(best, tile_max);
        }
        out[tm] = best_idx;
    }
}

/// Per column, the row of its smallest element (the first of ties): each
/// block of rows picks with `.argmin(tm)`, kept where its minimum beats the
/// carried one.
#[fused_kernel]
pub fn col_argmin(x: &Tensor<bf16>, out: &Tensor<i64>) {
    let [m, n] = x.shape();
    for tn in tile(n) {
        let mut best = full::<f32>([tn], f32::INFINITY);
        let mut best_row = zeros::<i64>([tn]);
        for tm in tile(m) {
            let v = x[(tm, tn)].cast::<f32>();
            let lo = v.min(tm);
            best_row = select(lo < best, v.argmin(tm), best_row);
            best = min(best, lo);
        }
        out[tn] = best_row;
    }
}

/// The rows of an `m` × `n` matrix, each mapped to one value.
fn per_row(x: &[f64], m: usize, n: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    (0..m).map(|i| f(&x[i * n..(i + 1) * n])).collect()
}

/// The first position of a row's largest value (as `torch.argmax`).
fn first_argmax(row: &[f64]) -> f64 {
    let mut best = 0;
    for (j, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = j;
        }
    }
    best as f64
}

/// `log(sum(exp(row)))` in float64.
pub(crate) fn lse(row: &[f64]) -> f64 {
    let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    mx + row.iter().map(|v| (v - mx).exp()).sum::<f64>().ln()
}

/// The softmax of each row of an `m` × `n` matrix in float64.
pub(crate) fn softmax_ref(x: &[f64], m: usize, n: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        let row = &x[i * n..(i + 1) * n];
        let l = lse(row);
        out.extend(row.iter().map(|v| (v - l).exp()));
    }
    out
}

/// A `[m, n]` bf16 benchmark input (uniform in [-1, 1)).
fn bench_input(dev: &Arc<Device>, m: usize, n: usize) -> Result<Tensor<bf16>> {
    Ok(input::<bf16>(dev, &mut Rng::new(1), &[m, n], 1.0)?.0)
}

fn col_sum_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let mut outs = Vec::new();
    // Few rows (each program walks them all), then a tall matrix whose walk
    // down the rows several programs share on a GPU.
    for (m, n, name) in [(333, 1000, "out"), (3001, 300, "out (tall)")] {
        let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
        let out = poisoned::<f32>(dev, &[n])?;
        col_sum(&x, &out)?;
        let want = (0..n)
            .map(|j| (0..m).map(|i| xf[i * n + j]).sum())
            .collect();
        outs.push(Output::new(name, host(&out)?, want, F32_TOL));
    }
    Ok(outs)
}

fn col_max_count_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (3001, 300);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let top = poisoned::<f32>(dev, &[n])?;
    let positive = poisoned::<i32>(dev, &[n])?;
    col_max_count(&x, &top, &positive)?;
    let xf = &xf;
    let col = |j: usize| (0..m).map(move |i| xf[i * n + j]);
    let want_top = (0..n)
        .map(|j| col(j).fold(f64::NEG_INFINITY, f64::max))
        .collect();
    let want_pos = (0..n)
        .map(|j| col(j).filter(|&v| v > 0.0).count() as f64)
        .collect();
    Ok(vec![
        Output::new("top", host(&top)?, want_top, 0.0),
        Output::new("positive", host(&positive)?, want_pos, 0.0),
    ])
}

fn col_max_count_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let x = bench_input(dev, m, n)?;
    let top = Tensor::<f32>::empty_on(dev, [n])?;
    let positive = Tensor::<i32>::empty_on(dev, [n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + n * 8,
        run: Box::new(move || col_max_count(&x, &top, &positive)),
    })
}

fn col_sum_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let x = bench_input(dev, m, n)?;
    let out = Tensor::<f32>::empty_on(dev, [n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + n * 4,
        run: Box::new(move || col_sum(&x, &out)),
    })
}

fn total_sum_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (301, 1000);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = zeros::<f32>(dev, &[1])?;
    total_sum(&x, &out)?;
    let want = vec![xf.iter().sum()];
    Ok(vec![Output::new("out", host(&out)?, want, 1e-4)])
}

fn total_sum_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let x = bench_input(dev, m, n)?;
    let out = zeros::<f32>(dev, &[1])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2,
        // From zero at every call (the programs add into it).
        run: Box::new(move || {
            out.zero()?;
            total_sum(&x, &out)
        }),
    })
}

fn row_sum_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = poisoned::<f32>(dev, &[m])?;
    row_sum(&x, &out)?;
    let want = per_row(&xf, m, n, |r| r.iter().sum());
    Ok(vec![Output::new("out", host(&out)?, want, 2e-5)])
}

fn row_sum_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let x = bench_input(dev, m, n)?;
    let out = Tensor::<f32>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + m * 4,
        run: Box::new(move || row_sum(&x, &out)),
    })
}

fn row_mean_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    // Rows with means away from zero (each its own), so that the bf16
    // result's relative rounding is what is measured.
    let data: Vec<bf16> = (0..m * n)
        .map(|k| bf16::from_f64((k / n % 7) as f64 - 3.0 + rng.uniform()))
        .collect();
    let xf: Vec<f64> = data.iter().map(|v| v.to_f64()).collect();
    let x = Tensor::from_slice_on(dev, &data, [m, n])?;
    let out = poisoned::<bf16>(dev, &[m])?;
    row_mean(&x, &out)?;
    let want = per_row(&xf, m, n, |r| r.iter().sum::<f64>() / n as f64);
    Ok(vec![Output::new("out", host(&out)?, want, BF16_TOL)])
}

fn row_mean_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let x = bench_input(dev, m, n)?;
    let out = Tensor::<bf16>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + m * 2,
        run: Box::new(move || row_mean(&x, &out)),
    })
}

fn long_row_sum_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    // A chunk that is no multiple of a block, and a row that is no multiple
    // of the chunk.
    let (m, n, chunk) = (3, 200_003, 9_999);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = zeros::<f32>(dev, &[m])?;
    long_row_sum(&x, &out, chunk)?;
    let want = per_row(&xf, m, n, |r| r.iter().sum());
    Ok(vec![Output::new("out", host(&out)?, want, 1e-4)])
}

fn long_row_sum_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (4, 4 << 20);
    let x = bench_input(dev, m, n)?;
    let out = zeros::<f32>(dev, &[m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + m * 4,
        // From zero at every call (the chunks add into it).
        run: Box::new(move || {
            out.zero()?;
            long_row_sum(&x, &out, 32768)
        }),
    })
}

fn long_row_sum_split_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (3, 200_003);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = poisoned::<f32>(dev, &[m])?;
    long_row_sum_split(&x, &out)?;
    let want = per_row(&xf, m, n, |r| r.iter().sum());
    Ok(vec![Output::new("out", host(&out)?, want, 1e-4)])
}

fn long_row_sum_split_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (4, 4 << 20);
    let x = bench_input(dev, m, n)?;
    let out = zeros::<f32>(dev, &[m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + m * 4,
        run: Box::new(move || long_row_sum_split(&x, &out)),
    })
}

fn welford_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    // A mean far from zero, so that E[x²] - E[x]² would lose digits.
    let data: Vec<bf16> = (0..m * n)
        .map(|_| bf16::from_f64(8.0 + 2.0 * rng.uniform()))
        .collect();
    let xf: Vec<f64> = data.iter().map(|v| v.to_f64()).collect();
    let x = Tensor::from_slice_on(dev, &data, [m, n])?;
    let (mean, var) = (poisoned::<f32>(dev, &[m])?, poisoned::<f32>(dev, &[m])?);
    welford(&x, &mean, &var)?;
    let want_mean = per_row(&xf, m, n, |r| r.iter().sum::<f64>() / n as f64);
    let want_var = per_row(&xf, m, n, |r| {
        let mu = r.iter().sum::<f64>() / n as f64;
        r.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / n as f64
    });
    Ok(vec![
        Output::new("mean", host(&mean)?, want_mean, F32_TOL),
        Output::new("var", host(&var)?, want_var, 1e-4),
    ])
}

fn welford_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let x = bench_input(dev, m, n)?;
    let mean = Tensor::<f32>::empty_on(dev, [m])?;
    let var = Tensor::<f32>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + 2 * m * 4,
        run: Box::new(move || welford(&x, &mean, &var)),
    })
}

fn softmax_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 4.0)?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    softmax(&x, &out)?;
    Ok(vec![Output::new(
        "out",
        host(&out)?,
        softmax_ref(&xf, m, n),
        BF16_TOL,
    )])
}

fn softmax_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let x = bench_input(dev, m, n)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2,
        run: Box::new(move || softmax(&x, &out)),
    })
}

fn softmax_bwd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    // `y` a softmax output (rows summing to one), rounded to bf16.
    let logits: Vec<f64> = (0..m * n).map(|_| 4.0 * rng.uniform()).collect();
    let yb: Vec<bf16> = softmax_ref(&logits, m, n)
        .iter()
        .map(|&v| bf16::from_f64(v))
        .collect();
    let yf: Vec<f64> = yb.iter().map(|v| v.to_f64()).collect();
    let y = Tensor::from_slice_on(dev, &yb, [m, n])?;
    let (dy, dyf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let dx = poisoned::<bf16>(dev, &[m, n])?;
    softmax_bwd(&y, &dy, &dx)?;
    let mut want = Vec::with_capacity(m * n);
    for i in 0..m {
        let (yr, dr) = (&yf[i * n..(i + 1) * n], &dyf[i * n..(i + 1) * n]);
        let dot: f64 = yr.iter().zip(dr).map(|(a, b)| a * b).sum();
        want.extend(yr.iter().zip(dr).map(|(a, b)| a * (b - dot)));
    }
    Ok(vec![Output::new("dx", host(&dx)?, want, BF16_TOL)])
}

fn softmax_bwd_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (y, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (dy, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let dx = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 3 * m * n * 2,
        run: Box::new(move || softmax_bwd(&y, &dy, &dx)),
    })
}

fn batched_softmax_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (b, m, n) = (3, 37, 1500);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[b, m, n], 4.0)?;
    let out = poisoned::<bf16>(dev, &[b, m, n])?;
    batched_softmax(&x, &out)?;
    Ok(vec![Output::new(
        "out",
        host(&out)?,
        softmax_ref(&xf, b * m, n),
        BF16_TOL,
    )])
}

fn batched_softmax_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (b, m, n) = (16, 1024, 8192);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[b, m, n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [b, m, n])?;
    Ok(Bench {
        shape: format!("{b}x{m}x{n}"),
        bytes: 2 * b * m * n * 2,
        run: Box::new(move || batched_softmax(&x, &out)),
    })
}

fn logsumexp_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 4.0)?;
    let out = poisoned::<f32>(dev, &[m])?;
    logsumexp(&x, &out)?;
    Ok(vec![Output::new(
        "out",
        host(&out)?,
        per_row(&xf, m, n, lse),
        F32_TOL,
    )])
}

fn logsumexp_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let x = bench_input(dev, m, n)?;
    let out = Tensor::<f32>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + m * 4,
        run: Box::new(move || logsumexp(&x, &out)),
    })
}

fn row_max_min_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 3001);
    let (x, xf) = ints::<i32>(dev, &mut rng, &[m, n], -2_000_000_000, 2_000_000_000)?;
    let (hi, lo) = (poisoned::<i32>(dev, &[m])?, poisoned::<i32>(dev, &[m])?);
    row_max_min(&x, &hi, &lo)?;
    let want_hi = per_row(&xf, m, n, |r| r.iter().cloned().fold(f64::MIN, f64::max));
    let want_lo = per_row(&xf, m, n, |r| r.iter().cloned().fold(f64::MAX, f64::min));
    Ok(vec![
        Output::new("max", host(&hi)?, want_hi, 0.0),
        Output::new("min", host(&lo)?, want_lo, 0.0),
    ])
}

fn row_max_min_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let (x, _) = ints::<i32>(dev, &mut Rng::new(1), &[m, n], -1 << 30, 1 << 30)?;
    let hi = Tensor::<i32>::empty_on(dev, [m])?;
    let lo = Tensor::<i32>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 4 + 2 * m * 4,
        run: Box::new(move || row_max_min(&x, &hi, &lo)),
    })
}

fn argmax_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    // bf16 values in [-4, 4) repeat often: the first of tied maxima counts.
    let (m, n) = (77, 3001);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 4.0)?;
    let out = poisoned::<i64>(dev, &[m])?;
    argmax(&x, &out)?;
    let want = per_row(&xf, m, n, first_argmax);
    Ok(vec![Output::new("index", host(&out)?, want, 0.0)])
}

fn long_row_argmax_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    // bf16 values in [-4, 4) repeat often: the largest occurs many times a
    // row, in different programs' shares; the first counts.
    let (m, n) = (3, 200_003);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 4.0)?;
    let out = poisoned::<i64>(dev, &[m])?;
    long_row_argmax(&x, &out)?;
    let want = per_row(&xf, m, n, first_argmax);
    Ok(vec![Output::new("index", host(&out)?, want, 0.0)])
}

fn long_row_argmax_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (4, 4 << 20);
    let x = bench_input(dev, m, n)?;
    let out = Tensor::<i64>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + m * 8,
        run: Box::new(move || long_row_argmax(&x, &out)),
    })
}

fn col_argmin_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let mut outs = Vec::new();
    // bf16 values in [-4, 4) repeat often: the first of tied minima counts.
    for (m, n, name) in [(3001, 77, "row"), (5, 300, "row (few rows)")] {
        let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 4.0)?;
        let out = poisoned::<i64>(dev, &[n])?;
        col_argmin(&x, &out)?;
        let want: Vec<f64> = (0..n)
            .map(|c| {
                let mut best = 0;
                for r in 1..m {
                    if xf[r * n + c] < xf[best * n + c] {
                        best = r;
                    }
                }
                best as f64
            })
            .collect();
        outs.push(Output::new(name, host(&out)?, want, 0.0));
    }
    Ok(outs)
}

fn col_argmin_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let x = bench_input(dev, m, n)?;
    let out = Tensor::<i64>::empty_on(dev, [n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + n * 8,
        run: Box::new(move || col_argmin(&x, &out)),
    })
}

fn argmax_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let x = bench_input(dev, m, n)?;
    let out = Tensor::<i64>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * 2 + m * 8,
        run: Box::new(move || argmax(&x, &out)),
    })
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "col_sum",
            covers: "sum over columns (a loop of rows, a carried accumulator)",
            kernels: || vec![col_sum::kernel()],
            check: col_sum_check,
            bench: col_sum_bench,
        },
        Case {
            name: "col_max_count",
            covers: "max and integer count over columns (a full(-inf) accumulator, select, i32 sum)",
            kernels: || vec![col_max_count::kernel()],
            check: col_max_count_check,
            bench: col_max_count_bench,
        },
        Case {
            name: "total_sum",
            covers: "sum of a whole tensor (atomics)",
            kernels: || vec![total_sum::kernel()],
            check: total_sum_check,
            bench: total_sum_bench,
        },
        Case {
            name: "row_sum",
            covers: "sum over rows (a loop of column tiles, a carried accumulator)",
            kernels: || vec![row_sum::kernel()],
            check: row_sum_check,
            bench: row_sum_bench,
        },
        Case {
            name: "row_mean",
            covers: "mean over rows (host extent as a float, bf16 store)",
            kernels: || vec![row_mean::kernel()],
            check: row_mean_check,
            bench: row_mean_bench,
        },
        Case {
            name: "long_row_sum",
            covers: "long rows split across programs (each × each grid, tile(begin..end), scalar accumulator, atomic_add)",
            kernels: || vec![long_row_sum::kernel()],
            check: long_row_sum_check,
            bench: long_row_sum_bench,
        },
        Case {
            name: "long_row_sum_split",
            covers: "long rows as one walk each, the walk shared by programs (split along the row, scalar accumulator, no atomics)",
            kernels: || vec![long_row_sum_split::kernel()],
            check: long_row_sum_split_check,
            bench: long_row_sum_split_bench,
        },
        Case {
            name: "long_row_argmax",
            covers: "the first position of a long row's maximum, the walk shared by programs (a scalar select carried beside a max, ties across shares)",
            kernels: || vec![long_row_argmax::kernel()],
            check: long_row_argmax_check,
            bench: long_row_argmax_bench,
        },
        Case {
            name: "welford",
            covers: "per-row mean and variance (carried count, mean, M2 merged per tile)",
            kernels: || vec![welford::kernel()],
            check: welford_check,
            bench: welford_bench,
        },
        Case {
            name: "softmax",
            covers: "online softmax (two walks, carried max and sum)",
            kernels: || vec![softmax::kernel()],
            check: softmax_check,
            bench: softmax_bench,
        },
        Case {
            name: "softmax_bwd",
            covers: "softmax backward (a row dot product, then a walk)",
            kernels: || vec![softmax_bwd::kernel()],
            check: softmax_bwd_check,
            bench: softmax_bwd_bench,
        },
        Case {
            name: "batched_softmax",
            covers: "softmax over a 2-D grid of tiles (3-D tensor, rank-2 accumulators)",
            kernels: || vec![batched_softmax::kernel()],
            check: batched_softmax_check,
            bench: batched_softmax_bench,
        },
        Case {
            name: "logsumexp",
            covers: "log-sum-exp of rows (online max and sum)",
            kernels: || vec![logsumexp::kernel()],
            check: logsumexp_check,
            bench: logsumexp_bench,
        },
        Case {
            name: "row_max_min",
            covers: "max and min of i32 rows (integer reductions, extreme literals)",
            kernels: || vec![row_max_min::kernel()],
            check: row_max_min_check,
            bench: row_max_min_bench,
        },
        Case {
            name: "argmax",
            covers: "argmax of rows (select on tile indices, a min reduction, carried index)",
            kernels: || vec![argmax::kernel()],
            check: argmax_check,
            bench: argmax_bench,
        },
        Case {
            name: "col_argmin",
            covers: "argmin down columns (`.argmin(tm)` a block, carried with the block's minimum)",
            kernels: || vec![col_argmin::kernel()],
            check: col_argmin_check,
            bench: col_argmin_bench,
        },
    ]
}
