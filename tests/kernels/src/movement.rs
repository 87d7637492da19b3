//! Data movement by computed indices: gathers (embedding, index_select),
//! scatters with atomics (embedding's backward), rotary embedding's halves,
//! and dropout's recomputed random mask.

use crate::harness::*;
use std::sync::Arc;
use tilefuse::codegen::prims::rand::{philox, uniform};
use tilefuse::prelude::*;
use tilefuse::Device;
use tilefuse_testkit::Rng;

/// `out[t] = weight[ids[t]]`: one gathered row per token.
#[fused_kernel]
pub fn embedding(weight: &Tensor<bf16>, ids: &Tensor<i64>, out: &Tensor<bf16>) {
    let [t] = ids.shape();
    let [_, d] = weight.shape();
    for (tt, td) in tile([t, d]) {
        out[(tt, td)] = weight[(ids[tt], td)];
    }
}

/// Embedding's backward sorted by id, as PyTorch's `embedding_dense_backward`
/// sorts: each id's tokens listed ([`id_slots`], [`list_starts`],
/// [`place_by_id`]), then one program per (id, column block) sums its
/// tokens' rows and writes the gradient row once ([`embedding_bwd`]): no zero
/// fill of the table and no atomics on it (the scatter by atomics is
/// `segment_sum`'s form). Runs the four kernels; `counts` is zeroed first.
pub fn embedding_backward(
    dout: &Tensor<bf16>,
    ids: &Tensor<i64>,
    dweight: &Tensor<f32>,
    lists: &IdLists,
) -> Result<()> {
    lists.counts.zero()?;
    id_slots(ids, &lists.counts, &lists.slots)?;
    let [v] = lists.counts.shape();
    list_starts(
        &lists.counts.reshape([1, v])?,
        &lists.starts.reshape([1, v])?,
    )?;
    place_by_id(ids, &lists.starts, &lists.slots, &lists.order)?;
    embedding_bwd(dout, &lists.order, &lists.starts, &lists.counts, dweight)?;
    Ok(())
}

/// The scratch of [`embedding_backward`]: per id its token count and where
/// its list starts, per token its slot in its id's list and the tokens in
/// id order.
pub struct IdLists {
    counts: Tensor<i32>,
    starts: Tensor<i32>,
    slots: Tensor<i32>,
    order: Tensor<i32>,
}

impl IdLists {
    pub fn new(dev: &Arc<Device>, vocab: usize, tokens: usize) -> Result<IdLists> {
        Ok(IdLists {
            counts: Tensor::empty_on(dev, [vocab])?,
            starts: Tensor::empty_on(dev, [vocab])?,
            slots: Tensor::empty_on(dev, [tokens])?,
            order: Tensor::empty_on(dev, [tokens])?,
        })
    }
}

/// Each token's slot in its id's list: how many tokens of its id the
/// atomics counted before it (`counts` from zero ends as each id's count).
#[fused_kernel]
pub fn id_slots(ids: &Tensor<i64>, counts: &Tensor<i32>, slots: &Tensor<i32>) {
    let [t] = ids.shape();
    for tt in tile(t) {
        let slot = atomic_add(counts[ids[tt]], 1);
        slots[tt] = slot;
    }
}

/// Where each list starts: the exclusive prefix sum of each row of
/// `counts`, one program walking a row.
#[fused_kernel]
pub fn list_starts(counts: &Tensor<i32>, starts: &Tensor<i32>) {
    let [r, v] = counts.shape();
    for tr in tile(each(r)) {
        let mut seen = zeros::<i32>([]);
        for tv in tile(v) {
            let c = counts[(tr, tv)];
            starts[(tr, tv)] = seen + c.cumsum(tv) - c;
            seen = seen + c.sum(tv);
        }
    }
}

/// The tokens in id order: each at its id's start plus its slot.
#[fused_kernel]
pub fn place_by_id(
    ids: &Tensor<i64>,
    starts: &Tensor<i32>,
    slots: &Tensor<i32>,
    order: &Tensor<i32>,
) {
    let [t] = ids.shape();
    for tt in tile(t) {
        order[starts[ids[tt]] + slots[tt]] = tt.index().cast::<i32>();
    }
}

/// Each id's gradient row: the sum of its tokens' rows, gathered through
/// its list, zero for an id no token has. A tile of ids walks as many list
/// places as its longest list has (one or two for most tiles of uniform
/// ids); past a row's own count its index leaves `dout`, so the load reads
/// zero.
#[fused_kernel]
pub fn embedding_bwd(
    dout: &Tensor<bf16>,
    order: &Tensor<i32>,
    starts: &Tensor<i32>,
    counts: &Tensor<i32>,
    dweight: &Tensor<f32>,
) {
    let [v, d] = dweight.shape();
    let [t, _] = dout.shape();
    for (tv, td) in tile([v, d]) {
        let begin = starts[tv];
        let count = counts[tv];
        let longest = count.max(tv);
        let mut acc = zeros::<f32>([tv, td]);
        for j in 0..longest {
            let row = select(j < count, order[begin + j], t as i32);
            acc = acc + dout[(row, td)].cast::<f32>();
        }
        dweight[(tv, td)] = acc;
    }
}

/// Mixture-of-experts dispatch with a capacity: each token takes the next
/// slot of its expert (`let slot = atomic_add(counts[e], 1)`, the old
/// count) and its row goes to that slot of the expert's `cap` rows of
/// `out`; a token past its expert's capacity is dropped (its row index
/// leaves `out`, so the store skips it). The slot, one per token, is used
/// by every column of the row copy.
#[fused_kernel]
pub fn moe_dispatch(
    x: &Tensor<bf16>,
    expert: &Tensor<i64>,
    counts: &Tensor<i32>,
    slots: &Tensor<i32>,
    out: &Tensor<bf16>,
    cap: usize,
) {
    let [t, d] = x.shape();
    let [rows, _] = out.shape();
    for tt in tile(t) {
        let e = expert[tt];
        let slot = atomic_add(counts[e], 1);
        slots[tt] = slot;
        let row = select(
            slot < cap as i32,
            e * cap as i64 + slot.cast::<i64>(),
            rows as i64,
        );
        for td in tile(d) {
            out[(row, td)] = x[(tt, td)];
        }
    }
}

/// `out = x.index_select(1, idx)`: columns gathered by an i32 index.
#[fused_kernel]
pub fn index_select(x: &Tensor<bf16>, idx: &Tensor<i32>, out: &Tensor<bf16>) {
    let [m, _] = x.shape();
    let [n] = idx.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = x[(tm, idx[tn])];
    }
}

/// Rotary embedding (the "rotate half" form) of `x` (`[batch, seq, heads,
/// head_dim]`): each pair `(x[d], x[d + half])` rotated by the position's
/// angle, `cos` and `sin` tables of `[seq, half]`.
#[fused_kernel]
pub fn rope(x: &Tensor<bf16>, cos: &Tensor<f32>, sin: &Tensor<f32>, out: &Tensor<bf16>) {
    let [b, s, h, d] = x.shape();
    let half = d / 2;
    for (tb, ts, th, td) in tile([b, s, h, half]) {
        let x1 = x[(tb, ts, th, td)];
        let x2 = x[(tb, ts, th, td + half)];
        let c = cos[(ts, td)];
        let si = sin[(ts, td)];
        out[(tb, ts, th, td)] = (x1 * c - x2 * si).cast();
        out[(tb, ts, th, td + half)] = (x2 * c + x1 * si).cast();
    }
}

/// Dropout: each element kept with probability `1 - p` and scaled by
/// `1 / (1 - p)`, its coin `rand(seed, flat index)` (Philox, as `tl.rand`).
#[fused_kernel]
pub fn dropout(x: &Tensor<bf16>, out: &Tensor<bf16>, p: f32, seed: u64) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        let keep = rand(seed, tm.index() * n + tn.index()) > p;
        out[(tm, tn)] = select(keep, x[(tm, tn)] / (1.0 - p), 0.0).cast();
    }
}

/// Dropout's backward: the forward's mask, recomputed from the same seed
/// and offsets rather than stored.
#[fused_kernel]
pub fn dropout_bwd(dout: &Tensor<bf16>, dx: &Tensor<bf16>, p: f32, seed: u64) {
    let [m, n] = dout.shape();
    for (tm, tn) in tile([m, n]) {
        let keep = rand(seed, tm.index() * n + tn.index()) > p;
        dx[(tm, tn)] = select(keep, dout[(tm, tn)] / (1.0 - p), 0.0).cast();
    }
}

/// Token ids for a vocabulary of `v`, drawn from its first `distinct` ids so
/// that they repeat, as a host vector and a tensor.
fn token_ids(
    dev: &Arc<Device>,
    rng: &mut Rng,
    t: usize,
    distinct: usize,
) -> Result<(Tensor<i64>, Vec<usize>)> {
    let ids: Vec<i64> = (0..t)
        .map(|_| (rng.next_u64() % distinct as u64) as i64)
        .collect();
    let host = ids.iter().map(|&i| i as usize).collect();
    Ok((Tensor::from_slice_on(dev, &ids, [t])?, host))
}

fn embedding_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (v, d, t) = (1013, 200, 301);
    let (w, wf) = input::<bf16>(dev, &mut rng, &[v, d], 1.0)?;
    let (ids, idh) = token_ids(dev, &mut rng, t, v)?;
    let out = poisoned::<bf16>(dev, &[t, d])?;
    embedding(&w, &ids, &out)?;
    let want = idh
        .iter()
        .flat_map(|&i| wf[i * d..(i + 1) * d].to_vec())
        .collect();
    Ok(vec![Output::new("out", host(&out)?, want, 0.0)])
}

/// Embedding's benchmark: 16384 tokens of a 32000-row table of 4096.
const EMB: (usize, usize, usize) = (32000, 4096, 16384);

fn embedding_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (v, d, t) = EMB;
    let mut rng = Rng::new(1);
    let (w, _) = input::<bf16>(dev, &mut rng, &[v, d], 1.0)?;
    let (ids, idh) = token_ids(dev, &mut rng, t, v)?;
    let out = Tensor::<bf16>::empty_on(dev, [t, d])?;
    let mut rows = idh;
    rows.sort_unstable();
    rows.dedup();
    Ok(Bench {
        shape: format!("{t}x{d}/V{v}"),
        // Each distinct row read once (a repeated id's row comes from L2),
        // each token's row written, and the ids.
        bytes: rows.len() * d * 2 + t * (d * 2 + 8),
        run: Box::new(move || embedding(&w, &ids, &out)),
    })
}

fn embedding_bwd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (v, d, t) = (97, 130, 1001);
    // Ids from the first 60 only: every used id repeats, some rows get none
    // (written zero: the gradient starts poisoned).
    let (ids, idh) = token_ids(dev, &mut rng, t, 60)?;
    let (dout, df) = input::<bf16>(dev, &mut rng, &[t, d], 1.0)?;
    let dw = poisoned::<f32>(dev, &[v, d])?;
    let lists = IdLists::new(dev, v, t)?;
    embedding_backward(&dout, &ids, &dw, &lists)?;
    let mut want = vec![0.0; v * d];
    for (k, &i) in idh.iter().enumerate() {
        for j in 0..d {
            want[i * d + j] += df[k * d + j];
        }
    }
    // The lists themselves: a count per id, each id's tokens once in its range.
    let mut count = vec![0.0; v];
    idh.iter().for_each(|&i| count[i] += 1.0);
    let (starts, order) = (lists.starts.to_vec()?, lists.order.to_vec()?);
    let mut listed = vec![0.0; t];
    for (k, &i) in idh.iter().enumerate() {
        let at = (starts[i]..starts[i] + count[i] as i32).find(|&j| order[j as usize] == k as i32);
        listed[k] = f64::from(u8::from(at.is_some()));
    }
    Ok(vec![
        Output::new("dweight", host(&dw)?, want, F32_TOL),
        Output::new("counts", host(&lists.counts)?, count, 0.0),
        Output::new("each token in its id's list", listed, vec![1.0; t], 0.0),
    ])
}

fn embedding_bwd_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (v, d, t) = EMB;
    let mut rng = Rng::new(1);
    let (ids, _) = token_ids(dev, &mut rng, t, v)?;
    let (dout, _) = input::<bf16>(dev, &mut rng, &[t, d], 1.0)?;
    let dw = Tensor::<f32>::empty_on(dev, [v, d])?;
    let lists = IdLists::new(dev, v, t)?;
    Ok(Bench {
        shape: format!("{t}x{d}/V{v}"),
        // dout and the ids read, the dense gradient written once (f32 here;
        // PyTorch's `embedding_dense_backward` writes it in bf16).
        bytes: t * (d * 2 + 8) + v * d * 4,
        // The four kernels and the counts' zeroing, every call.
        run: Box::new(move || embedding_backward(&dout, &ids, &dw, &lists)),
    })
}

fn moe_dispatch_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    // About 143 tokens an expert for 120 places: some are dropped.
    let (t, d, experts, cap) = (1001, 130, 7, 120);
    let (x, xf) = input::<bf16>(dev, &mut rng, &[t, d], 1.0)?;
    let (expert, eh) = token_ids(dev, &mut rng, t, experts)?;
    let counts = zeros::<i32>(dev, &[experts])?;
    let slots = poisoned::<i32>(dev, &[t])?;
    let out = poisoned::<bf16>(dev, &[experts * cap, d])?;
    moe_dispatch(&x, &expert, &counts, &slots, &out, cap)?;
    let (sh, oh) = (slots.to_vec()?, host(&out)?);
    let mut count = vec![0.0; experts];
    eh.iter().for_each(|&e| count[e] += 1.0);
    // Each expert's slots are 0..count, once each.
    let mut seen = vec![vec![false; t]; experts];
    let mut distinct = vec![0.0; t];
    for (k, &e) in eh.iter().enumerate() {
        let s = sh[k];
        if s >= 0 && (s as f64) < count[e] && !seen[e][s as usize] {
            seen[e][s as usize] = true;
            distinct[k] = 1.0;
        }
    }
    // A kept token's row at its place (a dropped token's own row stands in
    // for it: which tokens an expert keeps depends on the atomics' order,
    // so the outputs compare alike with interpret mode's); the places past
    // each expert's count stay as they were (poisoned).
    let mut got = xf.clone();
    for (k, &e) in eh.iter().enumerate() {
        let s = sh[k] as usize;
        if s < cap && distinct[k] == 1.0 {
            got[k * d..(k + 1) * d].copy_from_slice(&oh[(e * cap + s) * d..(e * cap + s + 1) * d]);
        } else if distinct[k] == 0.0 {
            got[k * d..(k + 1) * d]
                .iter_mut()
                .for_each(|v| *v = f64::NAN);
        }
    }
    let want = xf;
    let untouched = (0..experts)
        .flat_map(|e| (count[e] as usize).min(cap)..cap)
        .count();
    let left: Vec<f64> = (0..experts)
        .flat_map(|e| ((count[e] as usize).min(cap)..cap).map(move |j| e * cap + j))
        .map(|r| f64::from(u8::from(oh[r * d..(r + 1) * d].iter().all(|v| v.is_nan()))))
        .collect();
    Ok(vec![
        Output::new("counts", host(&counts)?, count, 0.0),
        Output::new("each slot once", distinct, vec![1.0; t], 0.0),
        Output::new("out (kept rows)", got, want, 0.0),
        Output::new(
            "out (places past the count untouched)",
            left,
            vec![1.0; untouched],
            0.0,
        ),
    ])
}

/// MoE dispatch's benchmark: 16384 tokens of 4096 to 64 experts, capacity
/// 1.25× the even share.
const MOE: (usize, usize, usize, usize) = (16384, 4096, 64, 320);

fn moe_dispatch_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (t, d, experts, cap) = MOE;
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[t, d], 1.0)?;
    let (expert, eh) = token_ids(dev, &mut rng, t, experts)?;
    let counts = zeros::<i32>(dev, &[experts])?;
    let slots = Tensor::<i32>::empty_on(dev, [t])?;
    let out = Tensor::<bf16>::empty_on(dev, [experts * cap, d])?;
    let mut per = vec![0usize; experts];
    eh.iter().for_each(|&e| per[e] += 1);
    let kept: usize = per.iter().map(|&c| c.min(cap)).sum();
    Ok(Bench {
        shape: format!("{t}x{d}/E{experts}"),
        // x read (a dropped token's row too: its load is not masked), the
        // kept rows written, the ids read and the slots written.
        bytes: t * d * 2 + kept * d * 2 + t * (8 + 4),
        // The counts start from zero at every call.
        run: Box::new(move || {
            counts.zero()?;
            moe_dispatch(&x, &expert, &counts, &slots, &out, cap)
        }),
    })
}

/// Column indices in `0..n` (repeating, in no order).
fn columns(
    dev: &Arc<Device>,
    rng: &mut Rng,
    k: usize,
    n: usize,
) -> Result<(Tensor<i32>, Vec<usize>)> {
    let idx: Vec<i32> = (0..k).map(|_| (rng.next_u64() % n as u64) as i32).collect();
    let host = idx.iter().map(|&i| i as usize).collect();
    Ok((Tensor::from_slice_on(dev, &idx, [k])?, host))
}

fn index_select_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let mut outs = Vec::new();
    // On a GPU: rows staged in shared memory, 16-byte aligned; staged with
    // rows of an odd length (copied element by element); a long row of
    // which the program reads too little to stage it.
    for (m, n, k, name) in [
        (77, 1000, 301, "out"),
        (33, 999, 130, "out (odd rows)"),
        (5, 20000, 64, "out (sparse)"),
    ] {
        let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
        let (idx, ih) = columns(dev, &mut rng, k, n)?;
        let out = poisoned::<bf16>(dev, &[m, k])?;
        index_select(&x, &idx, &out)?;
        let want = (0..m * k).map(|e| xf[(e / k) * n + ih[e % k]]).collect();
        outs.push(Output::new(name, host(&out)?, want, 0.0));
    }
    Ok(outs)
}

fn index_select_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n, k) = (16384, 8192, 4096);
    let mut rng = Rng::new(1);
    let (x, _) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (idx, _) = columns(dev, &mut rng, k, n)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, k])?;
    Ok(Bench {
        shape: format!("{m}x{n}->{k}"),
        // All of x read: 4096 random columns of 8192 leave almost no 32-byte
        // sector (16 columns) of a row untouched (each column is missed with
        // odds e^-1/2, a sector with e^-8), so the memory moves every byte
        // of it; the output written, the index.
        bytes: m * n * 2 + m * k * 2 + k * 4,
        run: Box::new(move || index_select(&x, &idx, &out)),
    })
}

/// A rotary table: the f32 tensor `[s, d/2]` and its values.
type Table = (Tensor<f32>, Vec<f64>);

/// `cos` and `sin` of the angles `pos · base^(-2i/d)` (f32 tables, `[s, d/2]`).
fn rope_tables(dev: &Arc<Device>, s: usize, d: usize) -> Result<(Table, Table)> {
    let half = d / 2;
    let (mut c, mut sn) = (Vec::with_capacity(s * half), Vec::with_capacity(s * half));
    for pos in 0..s {
        for i in 0..half {
            let a = pos as f64 * 10000f64.powf(-2.0 * i as f64 / d as f64);
            c.push(a.cos() as f32);
            sn.push(a.sin() as f32);
        }
    }
    let table = |v: Vec<f32>| -> Result<Table> {
        let f = v.iter().map(|&e| f64::from(e)).collect();
        Ok((Tensor::from_slice_on(dev, &v, [s, half])?, f))
    };
    Ok((table(c)?, table(sn)?))
}

fn rope_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (b, s, h, d) = (3, 37, 5, 46);
    let half = d / 2;
    let (x, xf) = input::<bf16>(dev, &mut rng, &[b, s, h, d], 2.0)?;
    let ((cos, cf), (sin, sf)) = rope_tables(dev, s, d)?;
    let out = poisoned::<bf16>(dev, &[b, s, h, d])?;
    rope(&x, &cos, &sin, &out)?;
    let mut want = vec![0.0; b * s * h * d];
    for row in 0..b * s * h {
        let pos = (row / h) % s;
        for i in 0..half {
            let (x1, x2) = (xf[row * d + i], xf[row * d + half + i]);
            let (c, sn) = (cf[pos * half + i], sf[pos * half + i]);
            want[row * d + i] = x1 * c - x2 * sn;
            want[row * d + half + i] = x2 * c + x1 * sn;
        }
    }
    Ok(vec![Output::new("out", host(&out)?, want, BF16_TOL)])
}

fn rope_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (b, s, h, d) = (4, 4096, 32, 128);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[b, s, h, d], 1.0)?;
    let ((cos, _), (sin, _)) = rope_tables(dev, s, d)?;
    let out = Tensor::<bf16>::empty_on(dev, [b, s, h, d])?;
    Ok(Bench {
        shape: format!("{b}x{s}x{h}x{d}"),
        bytes: 2 * b * s * h * d * 2 + 2 * s * (d / 2) * 4,
        run: Box::new(move || rope(&x, &cos, &sin, &out)),
    })
}

/// Whether element `offset` is kept: `rand(seed, offset) > p`, computed on
/// the host from the same Philox stream (word `offset % 4` of the counter
/// `offset / 4`).
fn kept(seed: u64, offset: usize, p: f32) -> bool {
    let o = offset as u32;
    uniform(philox(seed, o / 4)[(o % 4) as usize]) > p
}

/// Runs dropout forward and backward with one seed; `bwd` picks the
/// backward's outputs (its values, its mask against the forward's) rather
/// than the forward's (its values, its mask against Philox, the kept share).
fn dropout_outputs(dev: &Arc<Device>, seed: u64, bwd: bool) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 1000);
    let p = 0.1 + 0.5 * (rng.uniform() as f32 + 1.0) / 2.0;
    // Within i64's range: a u64 scalar above i64::MAX is saturated to
    // i64::MAX on its way to the kernel (reported to the lead), which the
    // host's Philox below would not see.
    let key = rng.next_u64() >> 1;
    let (x, xf) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let (dout, df) = input::<bf16>(dev, &mut rng, &[m, n], 1.0)?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    let dx = poisoned::<bf16>(dev, &[m, n])?;
    dropout(&x, &out, p, key)?;
    dropout_bwd(&dout, &dx, p, key)?;
    let scale = 1.0 / (1.0 - f64::from(p));
    let mask: Vec<bool> = (0..m * n).map(|i| kept(key, i, p)).collect();
    let pick = |v: &[f64]| -> Vec<f64> {
        (0..m * n)
            .map(|i| if mask[i] { v[i] * scale } else { 0.0 })
            .collect()
    };
    let (got, gdx) = (host(&out)?, host(&dx)?);
    // Which elements each pass kept (no input is exactly 0).
    let nz = |v: &[f64]| -> Vec<f64> { v.iter().map(|&e| f64::from(u8::from(e != 0.0))).collect() };
    let kept_frac = nz(&got).iter().sum::<f64>() / (m * n) as f64;
    let pf = f64::from(p);
    let sigma = (pf / ((1.0 - pf) * (m * n) as f64)).sqrt();
    if bwd {
        return Ok(vec![
            Output::new("dx", gdx.clone(), pick(&df), BF16_TOL),
            Output::new("bwd mask vs fwd mask", nz(&gdx), nz(&got), 0.0),
        ]);
    }
    let philox_mask = mask.iter().map(|&k| f64::from(u8::from(k))).collect();
    Ok(vec![
        Output::new("out", got.clone(), pick(&xf), BF16_TOL),
        // The mask exactly: one flipped element would hide in a bf16 tolerance.
        Output::new("mask vs Philox", nz(&got), philox_mask, 0.0),
        // 1 - p within 6 standard deviations of a binomial share:
        // σ / (1 - p) = sqrt(p / ((1 - p)·N)) relative.
        Output::new(
            "kept fraction",
            vec![kept_frac],
            vec![1.0 - pf],
            6.0 * sigma,
        ),
    ])
}

fn dropout_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    dropout_outputs(dev, seed, false)
}

fn dropout_bwd_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    dropout_outputs(dev, seed, true)
}

fn dropout_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, n], 1.0)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2,
        run: Box::new(move || dropout(&x, &out, 0.1, 1234)),
    })
}

fn dropout_bwd_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let (dout, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, n], 1.0)?;
    let dx = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: 2 * m * n * 2,
        run: Box::new(move || dropout_bwd(&dout, &dx, 0.1, 1234)),
    })
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "embedding",
            covers: "gather rows by i64 ids (`w[(ids[tt], td)]`)",
            kernels: || vec![embedding::kernel()],
            check: embedding_check,
            bench: embedding_bench,
        },
        Case {
            name: "embedding_bwd",
            covers: "lists by id: slots from atomic_add's old values, a scan, a scatter, a jagged sum of gathered rows",
            kernels: || {
                // The gradient's kernel first: the one `--config` sets.
                vec![
                    embedding_bwd::kernel(),
                    id_slots::kernel(),
                    list_starts::kernel(),
                    place_by_id::kernel(),
                ]
            },
            check: embedding_bwd_check,
            bench: embedding_bwd_bench,
        },
        Case {
            name: "moe_dispatch",
            covers: "atomic_add's old values as slots, used by a nested loop's row copy; stores dropped by their index",
            kernels: || vec![moe_dispatch::kernel()],
            check: moe_dispatch_check,
            bench: moe_dispatch_bench,
        },
        Case {
            name: "index_select",
            covers: "gather columns by i32 indices (`x[(tm, idx[tn])]`)",
            kernels: || vec![index_select::kernel()],
            check: index_select_check,
            bench: index_select_bench,
        },
        Case {
            name: "rope",
            covers: "a 4-d grid, a host value (`d / 2`), loads and stores at an offset, broadcast tables",
            kernels: || vec![rope::kernel()],
            check: rope_check,
            bench: rope_bench,
        },
        Case {
            name: "dropout",
            covers: "rand(seed, flat offset), a runtime f32 scalar, select",
            kernels: || vec![dropout::kernel()],
            check: dropout_check,
            bench: dropout_bench,
        },
        Case {
            name: "dropout_bwd",
            covers: "the forward's dropout mask recomputed from (seed, offset)",
            kernels: || vec![dropout_bwd::kernel()],
            check: dropout_bwd_check,
            bench: dropout_bwd_bench,
        },
    ]
}
