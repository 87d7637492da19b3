//! Interpret mode through the user's API: the examples' `#[fused_kernel]`
//! functions called on `Tensor`s, which live in host memory, and run by the
//! interpreter (this process chooses interpret mode, GPU or not). Ragged shapes
//! on block sizes that leave partial tiles, outputs poisoned with NaN, f64
//! references; a `wait` released by another thread, and one that times out
//! with the GPU's error.

mod common;

use common::examples::{
    all_gather_matmul::ag_matmul, attention, attention_backward, bias_gelu::matmul_bias_gelu,
    cross_entropy, layer_norm, matmul::matmul, rms_norm, softmax,
};
use std::time::{Duration, Instant};
use tilefuse::prelude::*;
use tilefuse::runtime::mode::{set_mode, Mode};
use tilefuse_testkit::{gelu_f64, matmul_f64, poisoned, random_tensor, rel_error};

/// The wait timeout is per process: the tests that wait take turns.
static WAITS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn interpret() {
    set_mode(Mode::Interpret).expect("this test process runs in interpret mode");
}

fn host(t: &Tensor<bf16>) -> Vec<f64> {
    t.to_vec().unwrap().into_iter().map(f64::from).collect()
}

#[test]
fn the_current_device_is_the_host() {
    interpret();
    let dev = Device::current().unwrap();
    assert!(dev.is_host(), "{dev:?}");
    let t = Tensor::<f32>::empty([3]).unwrap();
    assert!(
        t.to_vec().unwrap().iter().all(|x| x.is_nan()),
        "empty is poisoned"
    );
    assert!(dev
        .stream()
        .unwrap_err()
        .to_string()
        .contains("needs a GPU"));
}

/// `t()` swaps a 2-D view's dimensions, leaves 1-D as it is, and refuses more
/// dimensions with an error (no panic on a user's tensor).
#[test]
fn transposes_are_views_and_3d_is_an_error() {
    interpret();
    let x = Tensor::<f32>::from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]).unwrap();
    let xt = x.t().unwrap();
    assert_eq!(xt.dims(), &[3, 2]);
    assert_eq!(xt.strides(), &[1, 3]);
    let v = Tensor::<f32>::empty([5]).unwrap();
    assert_eq!(v.t().unwrap().dims(), &[5]);
    let cube = Tensor::<f32>::empty([2, 3, 4]).unwrap();
    let e = cube.t().unwrap_err().to_string();
    assert!(e.contains("[2, 3, 4]") && e.contains("t()"), "{e}");
}

/// `matmul` and `matmul_bias_gelu` at 67×45×40, on the default config and on
/// 32×32×16 blocks (partial tiles along M, N and K), against f64.
#[test]
fn gemm_kernels_match_f64() {
    interpret();
    let (m, n, k) = (67, 45, 40);
    let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
    let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
    let bias = random_tensor::<bf16>([n], 2.0).unwrap();
    let reference = matmul_f64(&host(&a), &host(&b), m, k, n);
    let with_bias: Vec<f64> = (0..m * n)
        .map(|i| gelu_f64(reference[i] + host(&bias)[i % n]))
        .collect();
    let blocks = Config::new(&[32, 32, 16]);
    for cfg in [None, Some(blocks)] {
        let run = |f: &dyn Fn() -> tilefuse::Result<Tensor<bf16>>, def: &tilefuse::KernelDef| {
            match &cfg {
                Some(c) => def.with_config(c.clone(), f),
                None => f(),
            }
            .unwrap()
        };
        let c = run(&|| matmul(&a, &b), matmul::kernel());
        let err = rel_error(&host(&c), &reference, |x| x, |x| x);
        assert!(err < 1e-2, "matmul {cfg:?}: rel err {err}");
        let c = run(
            &|| matmul_bias_gelu(&a, &b, &bias),
            matmul_bias_gelu::kernel(),
        );
        let err = rel_error(&host(&c), &with_bias, |x| x, |x| x);
        assert!(err < 1e-2, "matmul_bias_gelu {cfg:?}: rel err {err}");
    }
    // The cuBLAS call the examples check with computes on the CPU here.
    let mut c = poisoned::<bf16>([m, n]).unwrap();
    tilefuse::cublas::matmul_into(&mut c, &a, &b).unwrap();
    let err = rel_error(&host(&c), &reference, |x| x, |x| x);
    assert!(err < 1e-2, "host cuBLAS stand-in: rel err {err}");
}

/// The row kernels at 13×600 on rows of 4 and column steps of 256 (each row
/// reduced over three steps, the last partial; the smallest step the row
/// lowering takes for bf16), against the examples' f64 references.
#[test]
fn row_kernels_match_f64() {
    interpret();
    let (m, n, eps) = (13, 600, 1e-5f32);
    let x = random_tensor::<bf16>([m, n], 3.0).unwrap();
    let w = random_tensor::<bf16>([n], 1.0).unwrap();
    let b = random_tensor::<bf16>([n], 1.0).unwrap();
    let (x64, w64, b64) = (host(&x), host(&w), host(&b));
    let rows = |def: &tilefuse::KernelDef| {
        let dims = def.ir().unwrap().dims.len();
        let mut c = Config::new(&vec![256; dims]);
        c.block_sizes[def.ir().unwrap().grid[0]] = 4;
        c
    };
    let check = |what: &str, out: &Tensor<bf16>, want: Vec<f64>| {
        let err = rel_error(&host(out), &want, |x| x, |x| x);
        assert!(err < 1e-2, "{what}: rel err {err}");
    };

    let out = poisoned::<bf16>([m, n]).unwrap();
    let def = softmax::softmax::kernel();
    def.with_config(rows(def), || softmax::softmax(&x, &out))
        .unwrap();
    check("softmax", &out, softmax::reference(&x64, m, n));

    let out = poisoned::<bf16>([m, n]).unwrap();
    let def = rms_norm::rms_norm::kernel();
    def.with_config(rows(def), || rms_norm::rms_norm(&x, &w, &out, eps))
        .unwrap();
    check(
        "rms_norm",
        &out,
        rms_norm::reference(&x64, &w64, m, n, f64::from(eps)),
    );

    let out = poisoned::<bf16>([m, n]).unwrap();
    let def = layer_norm::layer_norm::kernel();
    def.with_config(rows(def), || layer_norm::layer_norm(&x, &w, &b, &out, eps))
        .unwrap();
    check(
        "layer_norm",
        &out,
        layer_norm::reference(&x64, &w64, &b64, m, n, f64::from(eps)),
    );

    let labels = cross_entropy::random_labels(m, n);
    let labels_t = Tensor::from_slice(&labels, [m]).unwrap();
    let loss = poisoned::<f32>([m]).unwrap();
    let def = cross_entropy::cross_entropy::kernel();
    def.with_config(rows(def), || {
        cross_entropy::cross_entropy(&x, &labels_t, &loss)
    })
    .unwrap();
    let got: Vec<f64> = loss.to_vec().unwrap().into_iter().map(f64::from).collect();
    let want = cross_entropy::reference(&x64, &labels, m, n);
    let err = rel_error(&got, &want, |x| x, |x| x);
    assert!(err < 1e-2, "cross_entropy: rel err {err}");
}

/// Flash attention at 2 × 2 × 45 queries over 45 keys, head dimension 20, on
/// blocks of 16 rows and 16 keys (the last tiles partial, the head dimension's
/// block fitted to 32), causal (the key loop stopping at the diagonal) and
/// not, and cross-attention over 30 keys: against the example's f64 rows. A
/// pinned head-dimension block below the extent is refitted, not trusted.
/// The grouped-query kernel too: 4 query heads on 2 key/value heads, and on 1.
#[test]
fn attention_matches_f64() {
    interpret();
    let (b, d) = (2, 20);
    for (h, hk, s, sk, causal) in [
        (2, 2, 45, 45, false),
        (2, 2, 45, 45, true),
        (2, 2, 45, 30, false),
        (4, 2, 45, 45, true),
        (4, 1, 45, 30, false),
    ] {
        let grouped = hk != h;
        let q = random_tensor::<bf16>([b, h, s, d], 1.0).unwrap();
        let k = random_tensor::<bf16>([b, hk, sk, d], 1.0).unwrap();
        let v = random_tensor::<bf16>([b, hk, sk, d], 1.0).unwrap();
        let out = poisoned::<bf16>([b, h, s, d]).unwrap();
        let scale = 0.3f32;
        // dims: tb, th, tm, td, tn; td's 8 is refitted to the extent; 16
        // rows a warp, as the GPU's attention program takes them.
        let cfg = Config::new(&[1, 1, 64, 8, 16]).num_warps(4);
        if grouped {
            attention::attention_gqa::kernel().with_config(cfg, || {
                attention::attention_gqa(&q, &k, &v, &out, scale, causal)
            })
        } else {
            attention::attention::kernel().with_config(cfg, || {
                attention::attention(&q, &k, &v, &out, scale, causal)
            })
        }
        .unwrap();
        let (qh, kh, vh, oh) = (host(&q), host(&k), host(&v), host(&out));
        let mut want = Vec::new();
        for sl in 0..b * h {
            // A query head's key/value head: its group's.
            let kv = sl / h * hk + sl % h / (h / hk);
            let (qs, ks, vs) = (
                &qh[sl * s * d..(sl + 1) * s * d],
                &kh[kv * sk * d..(kv + 1) * sk * d],
                &vh[kv * sk * d..(kv + 1) * sk * d],
            );
            for r in 0..s {
                want.extend(attention::reference_row(
                    qs,
                    ks,
                    vs,
                    r,
                    (sk, d),
                    f64::from(scale),
                    causal,
                ));
            }
        }
        let err = rel_error(&oh, &want, |x| x, |x| x);
        assert!(
            err < 1e-2,
            "attention {h}/{hk} heads {s}x{sk} causal={causal}: rel err {err}"
        );
    }
}

/// Variable-length attention over packed sequences of 37, 0, 150 and 5
/// tokens (an empty one, blocks of 64 rows and 16 keys that end
/// mid-sequence), 3 heads of dimension 20, causal and not, at a config the
/// attention programs run: every sequence against the example's f64 rows of
/// its own tokens only.
#[test]
fn varlen_attention_matches_f64_per_sequence() {
    interpret();
    // dims: b, th, tq, td, tm, tn (td refitted to the extent).
    let cfg = Config::new(&[1, 1, 64, 8, 64, 16]).num_warps(4);
    for causal in [false, true] {
        let err = attention::attention_varlen::kernel()
            .with_config(cfg.clone(), || {
                attention::run_varlen_and_check(&[37, 0, 150, 5], 3, 20, causal)
            })
            .unwrap();
        assert!(
            err < 1e-2,
            "varlen attention causal={causal}: rel err {err}"
        );
    }
}

/// `cu_seqlens` bounds before the tensors, past them, or decreasing: the
/// interpreter runs them as the GPU does (loads outside a tensor are zeros),
/// without an error, and writes nothing outside `out`, a view of the middle
/// third of a poisoned buffer.
#[test]
fn varlen_attention_bounds_outside_the_tensors_stay_inside_them() {
    interpret();
    let (total, h, d) = (64, 2, 16);
    let big = || random_tensor::<bf16>([3 * total, h, d], 1.0).unwrap();
    let (qb, kb, vb) = (big(), big(), big());
    let ob = poisoned::<bf16>([3 * total, h, d]).unwrap();
    let mid = |t: &Tensor<bf16>| t.narrow(0, total, total).unwrap();
    let (q, k, v, out) = (mid(&qb), mid(&kb), mid(&vb), mid(&ob));
    let cu = Tensor::from_slice(&[-40i64, 10, 5, 100, 30], [5]).unwrap();
    for causal in [false, true] {
        attention::attention_varlen(&q, &k, &v, &cu, &out, 150, 0.3, causal)
            .unwrap_or_else(|e| panic!("causal={causal}: {e}"));
        let all = host(&ob);
        let row = h * d;
        let outside = all[..total * row].iter().chain(&all[2 * total * row..]);
        assert!(
            outside.into_iter().all(|x| x.is_nan()),
            "causal={causal}: a write outside `out`"
        );
        // Rows 10..30 lie in the sequence 5..100 alone (10..5 and 100..30
        // are empty): written, finite (its keys past the tensor are zeros).
        assert!(host(&out)[10 * row..30 * row].iter().all(|x| x.is_finite()));
    }
}

/// Grouped-query attention refuses key/value heads that do not divide the
/// query heads (a query head past the last group would read no keys), naming
/// `k`, before any launch.
#[test]
fn grouped_attention_refuses_heads_that_do_not_divide() {
    interpret();
    for (h, hk) in [(4, 3), (2, 4)] {
        let q = random_tensor::<bf16>([1, h, 20, 16], 1.0).unwrap();
        let k = random_tensor::<bf16>([1, hk, 20, 16], 1.0).unwrap();
        let v = random_tensor::<bf16>([1, hk, 20, 16], 1.0).unwrap();
        let out = poisoned::<bf16>([1, h, 20, 16]).unwrap();
        let e = attention::attention_gqa(&q, &k, &v, &out, 0.3, false)
            .unwrap_err()
            .to_string();
        let want = format!(
            "attention_gqa: argument `k`: {hk} key/value heads do not divide the {h} query heads"
        );
        assert_eq!(e, want);
    }
}

/// Attention's backward (`examples/attention_backward.rs`): the forward with
/// its saved log-sum-exp, `delta`, dK and dV per key tile, dQ per query tile,
/// at 1 × 2 × 37 × 16 (partial tiles), causal and not: dQ, dK and dV against
/// float64.
#[test]
fn attention_backward_matches_f64() {
    interpret();
    for causal in [false, true] {
        let errs = attention_backward::run_and_check([1, 2, 37, 16], causal).unwrap();
        assert!(
            errs.iter().all(|e| *e < 2e-2),
            "causal={causal}: dQ, dK, dV rel errs {errs:?}"
        );
    }
}

/// The one-pass backward (`attention_dkdvdq`: dQ added atomically from the
/// dK/dV kernel), plain and grouped, causal and not, against float64.
#[test]
fn one_pass_attention_backward_matches_f64() {
    interpret();
    for (hk, causal) in [(4, false), (2, true), (1, false)] {
        let errs = attention_backward::run_and_check_fused([2, 4, 29, 16], hk, causal).unwrap();
        assert!(
            errs.iter().all(|e| *e < 2e-2),
            "{hk} key/value heads, causal={causal}: dQ, dK, dV rel errs {errs:?}"
        );
    }
}

/// Grouped-query attention's backward: 4 query heads on 2 and on 1 key/value
/// heads, causal and not; a key/value head's dK and dV sum over its group's
/// query heads (`attention_dkdv`'s loop over the group), dQ reads the group's keys.
#[test]
fn grouped_attention_backward_matches_f64() {
    interpret();
    for (hk, causal) in [(2, false), (2, true), (1, false), (1, true)] {
        let errs = attention_backward::run_and_check_grouped([2, 4, 29, 16], hk, causal).unwrap();
        assert!(
            errs.iter().all(|e| *e < 2e-2),
            "{hk} key/value heads, causal={causal}: dQ, dK, dV rel errs {errs:?}"
        );
    }
}

/// The all-gather matmul's kernel on the host: the flags start unset, and a
/// thread plays the copy engine, setting each chunk's flag in the order the
/// chunks arrive (this rank's first). The kernel, started first, waits for
/// each chunk it reads and finishes with the right product.
#[test]
fn ag_matmul_waits_for_flags_another_thread_sets() {
    interpret();
    let _turn = WAITS.lock().unwrap_or_else(|p| p.into_inner());
    let (m, n, k, chunk) = (40, 24, 16, 10);
    let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
    let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
    let reference = matmul_f64(&host(&a), &host(&b), m, k, n);
    let progress = Tensor::<u32>::flags(m / chunk).unwrap();
    let out = poisoned::<bf16>([m, n]).unwrap();
    let copier = {
        let flags = progress.clone();
        std::thread::spawn(move || {
            for c in [2u32, 3, 0, 1] {
                std::thread::sleep(Duration::from_millis(30));
                let mut f = flags.narrow(0, c as usize, 1).unwrap();
                f.copy_from_slice(&[7]).unwrap();
            }
        })
    };
    let started = Instant::now();
    ag_matmul::kernel()
        .with_config(Config::new(&[16, 16, 16]).num_warps(1), || {
            ag_matmul(&a, &b, &out, &progress, chunk, k, 4, 7, 20, false)
        })
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(100));
    copier.join().unwrap();
    let err = rel_error(&host(&out), &reference, |x| x, |x| x);
    assert!(err < 1e-2, "rel err {err}");
}

/// Chunks along K: 4 ranks of 10 rows, K cut into bands of 16 columns (flag
/// `band * 4 + rank`); the copier sets band 0 of every rank, then band 1. The
/// kernel waits inside its K loop, per k-tile of 16 columns, and finishes only
/// once the last band of its rows is set, with the right product.
#[test]
fn ag_matmul_along_k_waits_per_k_tile() {
    interpret();
    let _turn = WAITS.lock().unwrap_or_else(|p| p.into_inner());
    let (m, n, k, rows, cols) = (40, 24, 32, 10, 16);
    let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
    let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
    let reference = matmul_f64(&host(&a), &host(&b), m, k, n);
    let progress = Tensor::<u32>::flags(8).unwrap();
    let out = poisoned::<bf16>([m, n]).unwrap();
    let copier = {
        let flags = progress.clone();
        std::thread::spawn(move || {
            for f in [2usize, 3, 0, 1, 6, 7, 4, 5] {
                std::thread::sleep(Duration::from_millis(20));
                flags
                    .narrow(0, f, 1)
                    .unwrap()
                    .copy_from_slice(&[7])
                    .unwrap();
            }
        })
    };
    let started = Instant::now();
    ag_matmul::kernel()
        .with_config(Config::new(&[16, 16, 16]).num_warps(1), || {
            ag_matmul(&a, &b, &out, &progress, rows, cols, 4, 7, 20, true)
        })
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(160));
    copier.join().unwrap();
    let err = rel_error(&host(&out), &reference, |x| x, |x| x);
    assert!(err < 1e-2, "rel err {err}");

    // Band 1 of rank 3 never set: the wait in the K loop times out, named.
    let progress = Tensor::<u32>::flags(8).unwrap();
    progress
        .clone()
        .copy_from_slice(&[1, 1, 1, 1, 1, 1, 1, 0])
        .unwrap();
    tilefuse::runtime::status::set_wait_timeout_ms(Some(100));
    let e = ag_matmul(&a, &b, &out, &progress, rows, cols, 4, 1, 0, true).unwrap_err();
    tilefuse::runtime::status::set_wait_timeout_ms(None);
    let msg = e.to_string();
    assert!(
        matches!(e, Error::WaitTimeout { .. })
            && msg.contains("flag index 7 holds 0, expected >= 1"),
        "{msg}"
    );
}

/// A flag nobody sets: the launch fails after the wait timeout with the same
/// error a GPU launch reports.
#[test]
fn an_unset_flag_times_out_with_the_gpus_error() {
    interpret();
    let _turn = WAITS.lock().unwrap_or_else(|p| p.into_inner());
    let (m, n, k) = (20, 8, 16);
    let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
    let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
    let progress = Tensor::<u32>::flags(2).unwrap();
    progress
        .narrow(0, 0, 1)
        .unwrap()
        .copy_from_slice(&[1])
        .unwrap();
    let out = poisoned::<bf16>([m, n]).unwrap();
    tilefuse::runtime::status::set_wait_timeout_ms(Some(150));
    let started = Instant::now();
    let e = ag_matmul(&a, &b, &out, &progress, 10, k, 2, 1, 0, false).unwrap_err();
    tilefuse::runtime::status::set_wait_timeout_ms(None);
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(matches!(e, Error::WaitTimeout { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("kernel `ag_matmul` stopped waiting at `wait(progress")
            && msg.contains("after 150 ms: flag index 1 holds 0, expected >= 1"),
        "{msg}"
    );
}
