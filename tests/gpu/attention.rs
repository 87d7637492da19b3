//! Flash attention against a float64 reference: ragged rows and keys (past the
//! row and key blocks), head dimensions below their block, causal and not,
//! cross-attention (fewer keys than queries), under the tuner's configs;
//! outputs poisoned. Also the errors for operands the lowering cannot load.

use crate::common::examples::attention::{
    attention, attention_gqa, attention_varlen, reference_row, run_varlen_and_check,
};
use crate::common::examples::attention_backward::{
    attention_dkdv, attention_dkdvdq, attention_dq, attention_lse, run_and_check,
    run_and_check_fused, run_and_check_grouped,
};
use crate::common::gpu;
use tilefuse::prelude::*;
use tilefuse_testkit::{poisoned, random_tensor};

fn host(t: &Tensor<bf16>) -> Vec<f64> {
    t.to_vec().unwrap().iter().map(|v| v.to_f64()).collect()
}

/// The example's kernel with a statement after `p·v` that reads the
/// accumulator (`acc * 1.0`, exact): the Hopper program then waits for each
/// tile's `p·v` in its own tile instead of issuing it with the next `q·kᵀ`.
#[fused_kernel]
fn attention_reading_acc(
    q: &Tensor<bf16>,
    k: &Tensor<bf16>,
    v: &Tensor<bf16>,
    out: &Tensor<bf16>,
    scale: f32,
    #[constexpr] causal: bool,
) {
    let [b, h, s, d] = q.shape();
    let [_, _, sk, _] = k.shape();
    for (tb, th, tm, td) in tile([b, h, s, whole(d)]) {
        let mut row_max = full::<f32>([tb, th, tm], f32::NEG_INFINITY);
        let mut denom = zeros::<f32>([tb, th, tm]);
        let mut acc = zeros::<f32>([tb, th, tm, td]);
        for tn in tile(sk).until(if causal { tm.end() } else { sk }) {
            let x = addmm(
                zeros::<f32>([tb, th, tm, tn]),
                q[(tb, th, tm, td)],
                k[(tb, th, tn, td)],
            ) * scale;
            let x = if causal {
                select(tm.index() >= tn.index(), x, f32::NEG_INFINITY)
            } else {
                x
            };
            let new_max = max(row_max, x.max(tn));
            let p = exp(x - new_max);
            let alpha = exp(row_max - new_max);
            denom = denom * alpha + p.sum(tn);
            acc = addmm(acc * alpha, p.cast::<bf16>(), v[(tb, th, tn, td)]);
            acc = acc * 1.0;
            row_max = new_max;
        }
        out[(tb, th, tm, td)] = (acc / denom).cast();
    }
}

/// Which attention kernel a check runs.
#[derive(Clone, Copy, PartialEq)]
enum Which {
    /// The example's.
    Example,
    /// [`attention_reading_acc`].
    ReadsAcc,
    /// The example's grouped-query kernel, with this many key/value heads.
    Grouped(usize),
}

/// Runs the kernel on `[b, h, s, d]` queries and `sk` keys, checks every row.
fn check(b: usize, h: usize, s: usize, sk: usize, d: usize, causal: bool, cfg: Option<Config>) {
    check_kernel(Which::Example, (b, h, s, sk, d), causal, cfg)
}

/// [`check`] of the kernel `which`; `dims` = (b, h, s, sk, d).
fn check_kernel(
    which: Which,
    (b, h, s, sk, d): (usize, usize, usize, usize, usize),
    causal: bool,
    cfg: Option<Config>,
) {
    let hk = match which {
        Which::Grouped(hk) => hk,
        _ => h,
    };
    let k = random_tensor::<bf16>([b, hk, sk, d], 1.0).unwrap();
    check_keys(which, (b, h, s, sk, d), causal, cfg, k)
}

/// [`check_kernel`] with the keys `k` given (`[b, hk, sk, d]`).
fn check_keys(
    which: Which,
    (b, h, s, sk, d): (usize, usize, usize, usize, usize),
    causal: bool,
    cfg: Option<Config>,
    k: Tensor<bf16>,
) {
    let [_, hk, _, _] = k.shape();
    let q = random_tensor::<bf16>([b, h, s, d], 1.0).unwrap();
    let v = random_tensor::<bf16>([b, hk, sk, d], 1.0).unwrap();
    let out = poisoned::<bf16>([b, h, s, d]).unwrap();
    let scale = 1.0 / (d as f32).sqrt();
    let run = || match which {
        Which::Example => attention(&q, &k, &v, &out, scale, causal).unwrap(),
        Which::ReadsAcc => attention_reading_acc(&q, &k, &v, &out, scale, causal).unwrap(),
        Which::Grouped(_) => attention_gqa(&q, &k, &v, &out, scale, causal).unwrap(),
    };
    let def = match which {
        Which::Example => attention::kernel(),
        Which::ReadsAcc => attention_reading_acc::kernel(),
        Which::Grouped(_) => attention_gqa::kernel(),
    };
    match &cfg {
        Some(c) => def.with_config(c.clone(), run),
        None => run(),
    }
    let (qh, kh, vh, oh) = (host(&q), host(&k), host(&v), host(&out));
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for sl in 0..b * h {
        let qs = &qh[sl * s * d..(sl + 1) * s * d];
        // A query head's key/value head: its group's.
        let kv = sl / h * hk + sl % h / (h / hk);
        let (ks, vs) = (
            &kh[kv * sk * d..(kv + 1) * sk * d],
            &vh[kv * sk * d..(kv + 1) * sk * d],
        );
        for r in 0..s {
            let want = reference_row(qs, ks, vs, r, (sk, d), f64::from(scale), causal);
            for (c, w) in want.iter().enumerate() {
                num += (oh[(sl * s + r) * d + c] - w).powi(2);
                den += w * w;
            }
        }
    }
    let err = (num / den).sqrt();
    let label = cfg.map_or("default".into(), |c| c.to_string());
    eprintln!("attention {b}x{h}x{s}x{d}, {hk} kv heads, {sk} keys, causal={causal}, {label}: rel err {err:.2e}");
    assert!(
        err <= 1e-2,
        "attention {b}x{h}x{s}x{d}, {hk} kv heads, causal={causal} {label}: rel err {err}"
    );
}

#[test]
fn attention_matches_f64() {
    let Some(_dev) = gpu() else { return };
    for causal in [false, true] {
        check(2, 3, 200, 200, 64, causal, None);
        check(1, 2, 333, 333, 80, causal, None);
        check(1, 1, 1, 1, 16, causal, None);
        check(1, 2, 129, 129, 128, causal, None);
        check(1, 1, 77, 77, 200, causal, None);
    }
    // Cross-attention: keys fewer and more than queries.
    check(1, 2, 300, 100, 64, false, None);
    check(1, 2, 100, 300, 64, false, None);
}

/// Keys that grow along the sequence (key `j` scaled by `2 (1 + j / 128)`),
/// so a row's maximum rises tile after tile (about 1.75 a 128-key tile, by
/// the keys' scale): nearly every step rescales the output by a factor below
/// 1, the case an online softmax with a stale or skipped rescale gets wrong. The default program
/// matches float64, causal and not, at ragged sizes.
#[test]
fn attention_matches_f64_where_the_row_maximum_keeps_growing() {
    let Some(_dev) = gpu() else { return };
    for (s, d) in [(700, 128), (333, 64)] {
        let mut rng = tilefuse_testkit::Rng::fresh();
        let host: Vec<bf16> = (0..2 * s * d)
            .map(|i| {
                let j = i / d % s;
                let x = (2.0 * rng.uniform() - 1.0) * 2.0 * (1.0 + j as f64 / 128.0);
                bf16::from_f64(x)
            })
            .collect();
        let k = Tensor::from_slice(&host, [1, 2, s, d]).unwrap();
        for causal in [false, true] {
            check_keys(Which::Example, (1, 2, s, s, d), causal, None, k.clone());
        }
    }
}

#[test]
fn attention_matches_f64_under_the_tuners_configs() {
    let Some(_dev) = gpu() else { return };
    // dims: tb, th, tm, td (fitted to the head dimension), tn
    for (bm, bn, w) in [
        (128, 32, 4),
        (64, 64, 4),
        (128, 128, 8),
        (128, 64, 8),
        (64, 128, 4),
        (256, 64, 8),
    ] {
        let cfg = Config::new(&[1, 1, bm, 64, bn]).num_warps(w);
        check(1, 2, 300, 300, 64, true, Some(cfg.clone()));
        check(1, 1, 250, 250, 48, false, Some(cfg));
    }
}

/// The Hopper program's tiles under test: one and two consumer warpgroups
/// (`bm` 64 or 128), a key block that does not divide the keys (176), 2 to 4
/// stages: `(bm, bn, stages)`.
const WGMMA_TILES: [(usize, usize, usize); 4] =
    [(128, 128, 3), (128, 176, 2), (64, 128, 3), (128, 64, 4)];

/// The float64 checks of the Hopper program under each of [`WGMMA_TILES`]
/// with `overlap`: causal and not, head dimensions that fill part of a
/// 64-column panel (48, 80) or two, cross-attention.
fn wgmma_checks(overlap: bool) {
    for (bm, bn, stages) in WGMMA_TILES {
        let cfg = Config::new(&[1, 1, bm, 64, bn])
            .num_warps(bm / 16)
            .num_stages(stages)
            .wgmma(true)
            .overlap(overlap);
        check(1, 2, 300, 300, 64, true, Some(cfg.clone()));
        check(2, 1, 250, 250, 48, false, Some(cfg.clone()));
        check(1, 1, 333, 333, 80, true, Some(cfg.clone()));
        check(1, 2, 100, 300, 128, false, Some(cfg));
    }
}

/// The Hopper program (`wgmma`) at [`WGMMA_TILES`], and at head dimensions
/// that fill four panels (200 → 256) or little of one (16).
#[test]
fn attention_matches_f64_on_the_wgmma_path() {
    let Some(_dev) = crate::wgmma::hopper() else {
        return;
    };
    wgmma_checks(false);
    let cfg = Config::new(&[1, 1, 128, 64, 64])
        .num_warps(8)
        .num_stages(2)
        .wgmma(true);
    check(1, 1, 200, 200, 200, true, Some(cfg.clone()));
    check(1, 1, 65, 65, 16, false, Some(cfg));
}

/// `overlap`: each step's softmax runs while the last tile's `p·v` is still
/// on the tensor cores.
#[test]
fn attention_matches_f64_with_the_softmax_overlapping_the_last_product() {
    let Some(_dev) = crate::wgmma::hopper() else {
        return;
    };
    wgmma_checks(true);
}

/// The split tail on the backward's forward (`attention_lse`): its
/// statements after the key loop (the output and each row's log-sum-exp
/// `m + ln(l)`) run once a split tile's two states are combined. 3×7×1000
/// (168 row tiles on at most 132 SMs: every tile split), two heads' output
/// and log-sum-exp against float64.
#[test]
fn attention_lse_matches_f64_with_the_split_tail() {
    let Some(_dev) = crate::wgmma::hopper() else {
        return;
    };
    let (b, h, s, d) = (3, 7, 1000, 128);
    let scale = 1.0 / (d as f32).sqrt();
    let q = random_tensor::<bf16>([b, h, s, d], 1.0).unwrap();
    let k = random_tensor::<bf16>([b, h, s, d], 1.0).unwrap();
    let v = random_tensor::<bf16>([b, h, s, d], 1.0).unwrap();
    let out = poisoned::<bf16>([b, h, s, d]).unwrap();
    let lse = poisoned::<f32>([b, h, s]).unwrap();
    attention_lse::kernel().with_config(persistent_default().stream_k(true), || {
        attention_lse(&q, &k, &v, &out, &lse, scale, false).unwrap()
    });
    let (qh, kh, vh, oh) = (host(&q), host(&k), host(&v), host(&out));
    let lh = lse.to_vec().unwrap();
    let (mut num, mut den, mut worst) = (0.0f64, 0.0f64, 0.0f64);
    for sl in [0, b * h - 1] {
        let at = |x: &[f64]| x[sl * s * d..(sl + 1) * s * d].to_vec();
        let (qs, ks, vs) = (at(&qh), at(&kh), at(&vh));
        for r in 0..s {
            let want = reference_row(&qs, &ks, &vs, r, (s, d), f64::from(scale), false);
            for (c, w) in want.iter().enumerate() {
                num += (oh[(sl * s + r) * d + c] - w).powi(2);
                den += w * w;
            }
            let x: Vec<f64> = (0..s)
                .map(|j| {
                    let dot: f64 = (0..d).map(|c| qs[r * d + c] * ks[j * d + c]).sum();
                    dot * f64::from(scale)
                })
                .collect();
            let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let want = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            worst = worst.max((f64::from(lh[sl * s + r]) - want).abs());
        }
    }
    let err = (num / den).sqrt();
    eprintln!(
        "attention_lse {b}x{h}x{s}x{d}, split tail: rel err {err:.2e}, lse max abs err {worst:.2e}"
    );
    assert!(err <= 1e-2, "out: rel err {err}");
    assert!(worst <= 1e-3, "lse: max abs err {worst}");
}

/// The Hopper forward's persistent program at head dimension 128 (the
/// default's tile, written out).
fn persistent_default() -> Config {
    Config::new(&[1, 1, 128, 128, 128])
        .num_warps(8)
        .num_stages(3)
        .wgmma(true)
        .overlap(true)
        .persistent(true)
}

/// `persistent`: one wave of blocks walking the grid's tiles. 2×9×1000 at
/// head dimension 128 is 144 row tiles of 128, past an H200's or H100's 132
/// blocks, so some blocks walk two (ragged, causal and not; grouped-query
/// with 3 key/value heads; cross-attention with fewer keys). Causal blocks
/// take their tiles from a counter: the grouped launch after the first
/// causal one finds it back at zero, or misses tiles (poisoned rows).
#[test]
fn attention_matches_f64_with_persistent_blocks() {
    let Some(_dev) = crate::wgmma::hopper() else {
        return;
    };
    let cfg = persistent_default();
    for causal in [false, true] {
        check(2, 9, 1000, 1000, 128, causal, Some(cfg.clone()));
    }
    check_kernel(
        Which::Grouped(3),
        (2, 9, 1000, 1000, 128),
        true,
        Some(cfg.clone()),
    );
    check(2, 9, 1000, 333, 128, false, Some(cfg));
}

/// `stream_k` on the persistent forward (the split tail): the tiles past the
/// last whole wave but one share their key steps, each split tile's two
/// parts meeting through scratch. 2×18×1000 at head dimension 128 is 288 row
/// tiles: on 132 SMs, 132 walked whole and 156 split; on 114, 114 and 174.
/// 3×7×1000 (168 tiles) splits every tile. Grouped-query with 6 key/value
/// heads, fewer keys than rows (cross-attention), the 176-key tile, and
/// three warpgroups of 192 rows at head dimension 64. Twice each, the second
/// launch finding the tiles' counters back at zero.
#[test]
fn attention_matches_f64_with_the_split_tail() {
    let Some(_dev) = crate::wgmma::hopper() else {
        return;
    };
    let cfg = persistent_default().stream_k(true);
    for _ in 0..2 {
        check(2, 18, 1000, 1000, 128, false, Some(cfg.clone()));
        check(3, 7, 1000, 1000, 128, false, Some(cfg.clone()));
    }
    check_kernel(
        Which::Grouped(6),
        (2, 18, 1000, 1000, 128),
        false,
        Some(cfg.clone()),
    );
    check(2, 18, 1000, 333, 128, false, Some(cfg.clone()));
    let mut wide = cfg.clone().num_stages(2);
    wide.block_sizes[4] = 176;
    check(2, 18, 1000, 3000, 128, false, Some(wide));
    let d64 = Config::new(&[1, 1, 192, 64, 128])
        .num_warps(12)
        .num_stages(2)
        .wgmma(true)
        .overlap(true)
        .persistent(true)
        .stream_k(true);
    check(3, 9, 1000, 1000, 64, false, Some(d64));
}

/// The output store by rows into views of a wider tensor (the head dimension
/// narrowed from `d + pad`), on the default program (Hopper's on an H100 or
/// H200) and on the `mma.sync` one: rows an odd number of elements apart take
/// the element-by-element store, an even number the pairs in 4 bytes; the
/// columns past the view keep their poison.
#[test]
fn attention_stores_into_narrowed_outputs_on_both_programs() {
    let Some(_dev) = gpu() else { return };
    let (b, h, s, d) = (1, 3, 333, 128);
    let scale = 1.0 / (d as f32).sqrt();
    let mma = Config::new(&[1, 1, 128, 128, 64])
        .num_warps(4)
        .num_stages(3);
    for (pad, causal, cfg) in [
        (1, true, None),
        (8, false, None),
        (1, false, Some(mma.clone())),
        (8, true, Some(mma)),
    ] {
        let q = random_tensor::<bf16>([b, h, s, d], 1.0).unwrap();
        let k = random_tensor::<bf16>([b, h, s, d], 1.0).unwrap();
        let v = random_tensor::<bf16>([b, h, s, d], 1.0).unwrap();
        let wide = poisoned::<bf16>([b, h, s, d + pad]).unwrap();
        let out = wide.narrow(3, 0, d).unwrap();
        let run = || attention(&q, &k, &v, &out, scale, causal).unwrap();
        match &cfg {
            Some(c) => attention::kernel().with_config(c.clone(), run),
            None => run(),
        }
        let (qh, kh, vh, wh) = (host(&q), host(&k), host(&v), host(&wide));
        let (mut num, mut den) = (0.0f64, 0.0f64);
        for sl in 0..b * h {
            let at = |x: &[f64]| x[sl * s * d..(sl + 1) * s * d].to_vec();
            let (qs, ks, vs) = (at(&qh), at(&kh), at(&vh));
            for r in 0..s {
                let want = reference_row(&qs, &ks, &vs, r, (s, d), f64::from(scale), causal);
                let row = &wh[(sl * s + r) * (d + pad)..(sl * s + r + 1) * (d + pad)];
                for (c, w) in want.iter().enumerate() {
                    num += (row[c] - w).powi(2);
                    den += w * w;
                }
                assert!(
                    row[d..].iter().all(|x| x.is_nan()),
                    "pad {pad}: row {r} of slice {sl} written past the view"
                );
            }
        }
        let err = (num / den).sqrt();
        eprintln!(
            "attention into a view of rows {} apart, {cfg:?}: rel err {err:.2e}",
            d + pad
        );
        assert!(err <= 1e-2, "pad {pad}, {cfg:?}: rel err {err}");
    }
}

/// The Hopper program's other schedule: a key loop that reads the accumulator
/// after `p·v` waits for each tile's `p·v` and releases its stage's `k` and `v`
/// after both products (one and two consumer warpgroups, 2 and 3 stages).
#[test]
fn attention_matches_f64_on_the_wgmma_path_when_the_loop_reads_the_accumulator() {
    let Some(_dev) = crate::wgmma::hopper() else {
        return;
    };
    for (bm, bn, stages) in [(128, 128, 3), (64, 128, 2), (128, 176, 2)] {
        let cfg = Config::new(&[1, 1, bm, 64, bn])
            .num_warps(bm / 16)
            .num_stages(stages)
            .wgmma(true);
        let mut spec = attention_reading_acc::kernel().declared_spec().unwrap();
        spec.constexprs = vec![1];
        let source = attention_reading_acc::kernel()
            .lower(&spec, &cfg)
            .unwrap()
            .source;
        assert!(source.contains("both products read the stage"), "{cfg}");
        check_kernel(
            Which::ReadsAcc,
            (1, 2, 300, 300, 64),
            true,
            Some(cfg.clone()),
        );
        check_kernel(
            Which::ReadsAcc,
            (2, 1, 250, 250, 48),
            false,
            Some(cfg.clone()),
        );
        check_kernel(Which::ReadsAcc, (1, 1, 333, 333, 80), true, Some(cfg));
    }
}

/// Grouped-query attention (3 query heads a key/value head), multi-query (one
/// key/value head for all) and one head a group (multi-head) on both paths,
/// causal and not, ragged rows and keys: each query head reads its group's
/// keys and values.
#[test]
fn grouped_query_attention_matches_f64() {
    let Some(_dev) = gpu() else { return };
    for causal in [false, true] {
        check_kernel(Which::Grouped(2), (2, 6, 200, 200, 64), causal, None);
        check_kernel(Which::Grouped(1), (1, 4, 129, 129, 128), causal, None);
        check_kernel(Which::Grouped(3), (1, 3, 77, 77, 80), causal, None);
    }
    check_kernel(Which::Grouped(2), (1, 4, 100, 300, 64), false, None);
}

/// [`grouped_query_attention_matches_f64`] on the Hopper program, whose TMA
/// loads take the group's head as a coordinate.
#[test]
fn grouped_query_attention_matches_f64_on_the_wgmma_path() {
    let Some(_dev) = crate::wgmma::hopper() else {
        return;
    };
    for (bm, warps) in [(128, 8), (64, 4)] {
        let cfg = Config::new(&[1, 1, bm, 64, 128])
            .num_warps(warps)
            .num_stages(3)
            .wgmma(true);
        check_kernel(
            Which::Grouped(2),
            (2, 6, 300, 300, 64),
            true,
            Some(cfg.clone()),
        );
        check_kernel(Which::Grouped(1), (1, 4, 250, 250, 128), false, Some(cfg));
    }
}

/// Attention's backward (`examples/attention_backward.rs`) on the attention
/// program's `mma.sync` form: dQ (`dO·Vᵀ` a second product of the scores'
/// form, `dS·K` the update) and dK/dV (the keys the rows, the queries
/// streamed, dK and dV two accumulators) with 4 and 8 warps of 16 rows (head
/// dimension 64 whole); ragged sequences, causal and not, against float64.
#[test]
fn attention_backward_matches_f64_with_tensor_core_addmm() {
    let Some(_dev) = gpu() else { return };
    // 4 and 8 warps: the key loop's threads spread differently (over the
    // queries alone, or over queries and keys).
    for (warps, causal) in [(4, false), (4, true), (8, false), (8, true)] {
        // dQ's dims: tb, th, tm, td, tn; dK/dV's: tb, th, tn, td, g, tm.
        let cfg = if warps == 4 {
            Config::new(&[1, 1, 64, 64, 64]).num_warps(4)
        } else {
            Config::new(&[1, 1, 128, 64, 32]).num_warps(8)
        };
        let kv_cfg = if warps == 4 {
            Config::new(&[1, 1, 64, 64, 1, 32]).num_warps(4)
        } else {
            Config::new(&[1, 1, 128, 64, 1, 32]).num_warps(8)
        };
        let errs = attention_dkdv::kernel()
            .with_config(kv_cfg, || {
                attention_dq::kernel()
                    .with_config(cfg.clone(), || run_and_check([1, 2, 77, 64], causal))
            })
            .unwrap();
        println!(
            "attention backward 1x2x77x64 {warps} warps causal={causal}: rel err dq, dk, dv {errs:?}"
        );
        assert!(
            errs.iter().all(|&e| e <= 1e-2),
            "attention backward 1x2x77x64, {warps} warps, causal={causal}: rel err dq, dk, dv {errs:?}"
        );
    }
}

/// Grouped-query attention's backward (4 query heads on 2, and on 1,
/// key/value heads; dK and dV summed over each group's query heads) at the
/// untuned defaults, causal and not, against float64.
#[test]
fn grouped_attention_backward_matches_f64_at_the_defaults() {
    let Some(_dev) = gpu() else { return };
    for (hk, causal) in [(2, false), (2, true), (1, false), (1, true)] {
        let errs = run_and_check_grouped([2, 4, 77, 64], hk, causal).unwrap();
        println!("grouped attention backward 2x4x77x64, {hk} key/value heads, causal={causal}: rel err dq, dk, dv {errs:?}");
        assert!(
            errs.iter().all(|&e| e <= 1e-2),
            "grouped attention backward, {hk} key/value heads, causal={causal}: rel err dq, dk, dv {errs:?}"
        );
    }
}

/// Attention's backward on the Hopper program (`default_wgmma_attention` for
/// dQ and for dK/dV, fitted at launch: 48 queries a step for dK/dV at head
/// dimension 128): ragged sequences past the row and key blocks, head
/// dimensions 64 and 128, causal and not, grouped-query (dK and dV summed over
/// a group's query heads: the loop around the key loop), against float64.
#[test]
fn attention_backward_matches_f64_on_the_hopper_program() {
    let Some(_dev) = crate::wgmma::hopper() else {
        return;
    };
    let dq = attention_dq::kernel();
    let dkdv = attention_dkdv::kernel();
    let cfg = tilefuse::codegen::default_wgmma_attention(dq.ir().unwrap()).unwrap();
    let kv_cfg = tilefuse::codegen::default_wgmma_attention(dkdv.ir().unwrap()).unwrap();
    for (shape, hk, causal) in [
        ([1, 2, 77, 64], 2, false),
        ([1, 2, 77, 64], 2, true),
        ([2, 4, 300, 128], 2, false),
        ([2, 4, 300, 128], 4, true),
        ([1, 2, 200, 128], 1, true),
    ] {
        let errs = dkdv
            .with_config(kv_cfg.clone(), || {
                dq.with_config(cfg.clone(), || run_and_check_grouped(shape, hk, causal))
            })
            .unwrap();
        println!(
            "attention backward (wgmma) {shape:?}, {hk} key/value heads, causal={causal}: rel err dq, dk, dv {errs:?}"
        );
        assert!(
            errs.iter().all(|&e| e <= 1e-2),
            "attention backward (wgmma) {shape:?}, {hk} key/value heads, causal={causal}: rel err dq, dk, dv {errs:?}"
        );
    }
}

/// The one-pass backward (dQ added atomically from the dK/dV kernel) at its
/// untuned default (on Hopper the Hopper program at these head dimensions:
/// 64 queries a step, `dS` through shared memory into a `wgmma` per step;
/// elsewhere the general lowering), on the general lowering pinned (its
/// tensor-core tiles), and on Hopper at `default_wgmma_attention` pinned,
/// its dQ added by the threads and by the TMA unit (`tma_store`), ragged and
/// grouped, causal and not, against float64.
#[test]
fn one_pass_attention_backward_matches_f64() {
    let Some(dev) = gpu() else { return };
    let cases = [
        ([1, 2, 77, 64], 2, false),
        ([2, 4, 300, 128], 2, true),
        ([1, 2, 200, 128], 1, false),
    ];
    let def = attention_dkdvdq::kernel();
    // dims: tb, th, tn, td (whole), g, tm.
    let general = Config::new(&[1, 1, 32, 128, 1, 32])
        .num_warps(8)
        .general(true);
    let mut configs = vec![("default", None), ("general", Some(general))];
    if dev.compute_capability().0 == 9 {
        let hopper = tilefuse::codegen::default_wgmma_attention(def.ir().unwrap()).unwrap();
        // dQ's adds by the TMA unit (two stages: three do not fit at 128).
        let by_tma = hopper.clone().tma_store(true).num_stages(2);
        configs.push(("wgmma", Some(hopper)));
        configs.push(("wgmma, dQ by TMA", Some(by_tma)));
    }
    for (name, cfg) in configs {
        let extra = name
            .starts_with("wgmma")
            .then_some(([1, 2, 333, 64], 1, true));
        for (shape, hk, causal) in cases.into_iter().chain(extra) {
            let run = || run_and_check_fused(shape, hk, causal);
            let errs = match &cfg {
                Some(c) => def.with_config(c.clone(), run),
                None => run(),
            }
            .unwrap();
            println!("one-pass attention backward ({name}) {shape:?}, {hk} key/value heads, causal={causal}: rel err dq, dk, dv {errs:?}");
            assert!(
                errs.iter().all(|&e| e <= 1e-2),
                "({name}) {shape:?} {hk} {causal}: {errs:?}"
            );
        }
    }
}

/// Variable-length attention on the attention programs (a program's rows one
/// block of its sequence, keys from the sequence's start): the untuned
/// default (on Hopper, the `wgmma` program), the `wgmma` program at 64 keys a
/// step, and the `mma.sync` program at 16 and 32 rows a warp, causal and not,
/// with sequences shorter than a block, empty, and ragged across blocks; each
/// sequence against float64 over its own tokens.
#[test]
fn varlen_attention_matches_f64_per_sequence() {
    let Some(_dev) = gpu() else { return };
    let def = attention_varlen::kernel();
    let ir = def.ir().unwrap();
    let mut narrow = tilefuse::codegen::default_wgmma_attention(ir).unwrap();
    narrow.block_sizes[5] = 64;
    let narrow = narrow.num_stages(2);
    // dims: b, th, tq, td, tm, tn.
    let configs = [
        None,
        Some(narrow),
        Some(Config::new(&[1, 1, 64, 64, 64, 64]).num_warps(4)),
        Some(Config::new(&[1, 1, 128, 64, 128, 64]).num_warps(4)),
    ];
    let lens = [100, 0, 257, 9, 300];
    for cfg in configs {
        for (d, causal) in [(64, false), (64, true), (128, true)] {
            let run = || run_varlen_and_check(&lens, 4, d, causal);
            let err = match &cfg {
                Some(c) => def.with_config(c.clone(), run),
                None => run(),
            }
            .unwrap();
            let name = cfg
                .as_ref()
                .map_or("default".to_string(), |c| c.to_string());
            println!("varlen attention {name}, d={d}, causal={causal}: rel err {err:.2e}");
            assert!(
                err <= 1e-2,
                "varlen attention {name}, d={d}, causal={causal}: rel err {err}"
            );
        }
    }
}

/// `cu_seqlens` is data: bounds before the tensors, past them, or decreasing
/// run without an error and write nothing outside `out` (a view of the
/// middle third of a poisoned buffer whose other thirds stay poisoned), on
/// the untuned default and the `mma.sync` program.
#[test]
fn varlen_attention_bounds_outside_the_tensors_stay_inside_them() {
    let Some(_dev) = gpu() else { return };
    let (total, h, d) = (64, 2, 64);
    let big = |x: f64| random_tensor::<bf16>([3 * total, h, d], x).unwrap();
    let (qb, kb, vb) = (big(1.0), big(1.0), big(1.0));
    let ob = poisoned::<bf16>([3 * total, h, d]).unwrap();
    let mid = |t: &Tensor<bf16>| t.narrow(0, total, total).unwrap();
    let (q, k, v, out) = (mid(&qb), mid(&kb), mid(&vb), mid(&ob));
    let cu = Tensor::from_slice(&[-40i64, 10, 5, 100, 30], [5]).unwrap();
    let def = attention_varlen::kernel();
    // dims: b, th, tq, td, tm, tn.
    let configs = [
        None,
        Some(Config::new(&[1, 1, 64, 64, 64, 64]).num_warps(4)),
    ];
    for cfg in configs {
        for causal in [false, true] {
            let run = || attention_varlen(&q, &k, &v, &cu, &out, 150, 0.3, causal);
            match &cfg {
                Some(c) => def.with_config(c.clone(), run),
                None => run(),
            }
            .unwrap_or_else(|e| panic!("{cfg:?} causal={causal}: {e}"));
            let all = ob.to_vec().unwrap();
            let row = h * d;
            let outside = all[..total * row].iter().chain(&all[2 * total * row..]);
            assert!(
                outside.into_iter().all(|x| x.to_f64().is_nan()),
                "{cfg:?} causal={causal}: a write outside `out`"
            );
        }
    }
}

#[test]
fn attention_rejects_unaligned_rows() {
    let Some(_dev) = gpu() else { return };
    // A head dimension of 60: rows of 120 bytes, not 16-byte aligned.
    let q = random_tensor::<bf16>([1, 1, 64, 60], 1.0).unwrap();
    let out = poisoned::<bf16>([1, 1, 64, 60]).unwrap();
    let err = attention(&q, &q, &q, &out, 0.1, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`q`") && err.contains("16-byte"), "{err}");
}
