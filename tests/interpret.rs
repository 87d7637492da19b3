//! Interpret mode: the example kernels' IR run on the CPU
//! (`tilefuse::interpret`) at small ragged shapes, against float64 references,
//! with block sizes that leave partial tiles (configs the GPU's lowerings
//! take: interpret mode refuses the others, as a GPU launch does); reads
//! outside a tensor, zeros as on the GPU; and its errors. No GPU needed.

mod common;

use common::interp::{out, scalars, tensors};

use common::examples::{
    all_gather_matmul::ag_matmul, bias_gelu::matmul_bias_gelu, cross_entropy, layer_norm,
    matmul::matmul, rms_norm, softmax,
};
use std::time::{Duration, Instant};
use tilefuse::codegen::{Config, DType, Planned};
use tilefuse::interpret::{run, run_with, HostTensor, InterpretError, Options, Scalar};
use tilefuse_testkit::{gelu_f64, matmul_f64, Rng};

/// A bf16 tensor of fresh values in [-1, 1) and those values as f64.
fn random(shape: &[usize], rng: &mut Rng) -> (HostTensor, Vec<f64>) {
    let n = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|_| 2.0 * rng.uniform() - 1.0).collect();
    let t = HostTensor::from_f64(DType::BF16, shape, data).unwrap();
    let exact = t.values();
    (t, exact)
}

/// ‖out − ref‖ / ‖ref‖ (NaN where an element was never written).
fn rel_error(out: &[f64], reference: &[f64]) -> f64 {
    tilefuse_testkit::rel_error(out, reference, |x| x, |x| x)
}

fn nan(dtype: DType, shape: &[usize]) -> HostTensor {
    HostTensor::filled(dtype, shape, f64::NAN).expect("a test-sized tensor")
}

#[test]
fn matmul_and_its_epilogue_match_f64_on_partial_tiles() {
    let mut rng = Rng::fresh();
    // 67×45×40 on 32×32×16 blocks: the last tile is partial along M, N and K.
    let (m, n, k) = (67, 45, 40);
    let cfg = Config::new(&[32, 32, 16]);
    let (a, a64) = random(&[m, k], &mut rng);
    let (b, b64) = random(&[k, n], &mut rng);
    let (bias, bias64) = random(&[n], &mut rng);
    let reference = matmul_f64(&a64, &b64, m, k, n);
    let ints = |ir: &Planned| {
        scalars(
            ir,
            &[
                ("m", Scalar::Int(m as i64)),
                ("n", Scalar::Int(n as i64)),
                ("k", Scalar::Int(k as i64)),
            ],
        )
    };

    let ir = matmul::kernel().ir().unwrap().clone();
    let t = tensors(
        &ir,
        vec![
            ("a", a.clone()),
            ("b", b.clone()),
            ("out", nan(DType::BF16, &[m, n])),
        ],
    );
    run(&ir, &cfg, &[], &t, &ints(&ir)).unwrap();
    let err = rel_error(&out(&ir, &t, "out"), &reference);
    assert!(err < 1e-2, "matmul: rel err {err}");

    let ir = matmul_bias_gelu::kernel().ir().unwrap().clone();
    let t = tensors(
        &ir,
        vec![
            ("a", a),
            ("b", b),
            ("bias", bias),
            ("out", nan(DType::BF16, &[m, n])),
        ],
    );
    run(&ir, &cfg, &[], &t, &ints(&ir)).unwrap();
    let want: Vec<f64> = (0..m * n)
        .map(|i| gelu_f64(reference[i] + bias64[i % n]))
        .collect();
    let err = rel_error(&out(&ir, &t, "out"), &want);
    assert!(err < 1e-2, "matmul_bias_gelu: rel err {err}");
}

#[test]
fn row_kernels_match_f64_when_rows_take_several_steps() {
    let mut rng = Rng::fresh();
    // 13 rows of 600 on 4 × 256 blocks (the row lowering's columns: 32 lanes
    // of 8 bf16 each): rows and columns end in partial tiles, and each row is
    // reduced over three steps.
    let (m, n) = (13, 600);
    let (x, x64) = random(&[m, n], &mut rng);
    let (w, w64) = random(&[n], &mut rng);
    let (b, b64) = random(&[n], &mut rng);
    let eps = 1e-5f32;
    let named = [
        ("m", Scalar::Int(m as i64)),
        ("n", Scalar::Int(n as i64)),
        ("n as f32", Scalar::Float(n as f32)),
        ("eps", Scalar::Float(eps)),
    ];

    // Rows of 4, column steps of 256.
    let go = |ir: &Planned, named_tensors: Vec<(&str, HostTensor)>| {
        let mut c = Config::new(&vec![256; ir.dims.len()]);
        c.block_sizes[ir.grid[0]] = 4;
        let t = tensors(ir, named_tensors);
        run(ir, &c, &[], &t, &scalars(ir, &named)).unwrap();
        t
    };
    let out_of = || nan(DType::BF16, &[m, n]);

    let ir = softmax::softmax::kernel().ir().unwrap().clone();
    let t = go(&ir, vec![("x", x.clone()), ("out", out_of())]);
    let err = rel_error(&out(&ir, &t, "out"), &softmax::reference(&x64, m, n));
    assert!(err < 1e-2, "softmax: rel err {err}");

    let ir = rms_norm::rms_norm::kernel().ir().unwrap().clone();
    let t = go(
        &ir,
        vec![("x", x.clone()), ("weight", w.clone()), ("out", out_of())],
    );
    let want = rms_norm::reference(&x64, &w64, m, n, f64::from(eps));
    let err = rel_error(&out(&ir, &t, "out"), &want);
    assert!(err < 1e-2, "rms_norm: rel err {err}");

    let ir = layer_norm::layer_norm::kernel().ir().unwrap().clone();
    let t = go(
        &ir,
        vec![
            ("x", x.clone()),
            ("weight", w),
            ("bias", b),
            ("out", out_of()),
        ],
    );
    let want = layer_norm::reference(&x64, &w64, &b64, m, n, f64::from(eps));
    let err = rel_error(&out(&ir, &t, "out"), &want);
    assert!(err < 1e-2, "layer_norm: rel err {err}");

    // Labels at the first and last column and outside the row.
    let ir = cross_entropy::cross_entropy::kernel().ir().unwrap().clone();
    let mut labels = cross_entropy::random_labels(m, n);
    labels[0] = 0;
    labels[1] = n as i64 - 1;
    labels[2] = n as i64 + 5;
    let labels_t =
        HostTensor::from_f64(DType::I64, &[m], labels.iter().map(|&l| l as f64).collect()).unwrap();
    let t = go(
        &ir,
        vec![
            ("logits", x),
            ("labels", labels_t),
            ("loss", nan(DType::F32, &[m])),
        ],
    );
    let want = cross_entropy::reference(&x64, &labels, m, n);
    let err = rel_error(&out(&ir, &t, "loss"), &want);
    assert!(err < 1e-4, "cross_entropy: rel err {err}");
}

/// A tensor whose size is not the extent of the tile that indexes it is
/// refused, as the GPU path refuses it before a launch: `a` is one row short
/// of the M extent (the lowerings mask such an access by the extent alone).
#[test]
fn a_tensor_shorter_than_its_tile_extent_is_refused() {
    let mut rng = Rng::fresh();
    let ir = matmul::kernel().ir().unwrap().clone();
    let (a, _) = random(&[9, 16], &mut rng);
    let (b, _) = random(&[16, 16], &mut rng);
    let t = tensors(
        &ir,
        vec![("a", a), ("b", b), ("out", nan(DType::BF16, &[10, 16]))],
    );
    let s = scalars(
        &ir,
        &[
            ("m", Scalar::Int(10)),
            ("n", Scalar::Int(16)),
            ("k", Scalar::Int(16)),
        ],
    );
    let cfg = Config::new(&[16, 16, 16]).num_warps(1);
    let e = run(&ir, &cfg, &[], &t, &s).unwrap_err().to_string();
    assert!(
        e.contains("`a`") && e.contains("size 9") && e.contains("`tm`"),
        "{e}"
    );
}

/// Programs run on several threads, yet the error reported is always the
/// first failing program's in grid order, as with one thread: here every
/// program of `ag_matmul` times out on its flags, and the first in grid
/// order (after `starting_at`'s rotation: rows 16..32) is the one named.
#[test]
fn with_many_threads_the_first_failing_program_is_reported() {
    let ag = AgMatmul::new();
    for threads in [1, 4, 4, 4] {
        let msg = ag
            .launch_with(&flags(&[0.0; 4]), Duration::from_millis(30), threads)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("flag index 1 holds 0, expected >= 3"),
            "{threads} threads: {msg}"
        );
    }
}

#[test]
fn bad_arguments_are_errors_naming_them() {
    let ir = matmul::kernel().ir().unwrap().clone();
    let s = scalars(
        &ir,
        &[
            ("m", Scalar::Int(8)),
            ("n", Scalar::Int(8)),
            ("k", Scalar::Int(8)),
        ],
    );
    let t = || {
        [
            nan(DType::BF16, &[8, 8]),
            nan(DType::BF16, &[8, 8]),
            nan(DType::BF16, &[8, 8]),
        ]
    };
    let e = run(&ir, &Config::new(&[8, 8]), &[], &t(), &s).unwrap_err();
    assert!(
        e.to_string()
            .contains("one block size above 0 per tile dimension (3)"),
        "{e}"
    );
    let e = run(&ir, &Config::new(&[8, 8, 8]), &[], &t()[..2], &s).unwrap_err();
    assert!(
        e.to_string().contains("2 tensors and 3 scalars given"),
        "{e}"
    );
    let mut bad = t();
    bad[0] = nan(DType::BF16, &[64]);
    let e = run(&ir, &Config::new(&[8, 8, 8]), &[], &bad, &s).unwrap_err();
    assert!(
        e.to_string().contains("argument `a`: a tensor of rank 2"),
        "{e}"
    );
}

/// `ag_matmul` at 40×24×16 on 16×16×16 blocks with chunks of 10 rows, and its
/// f64 reference: `launch(flags, timeout)` runs it with those progress flags.
struct AgMatmul {
    ir: Planned,
    a: HostTensor,
    b: HostTensor,
    reference: Vec<f64>,
    scalars: Vec<Scalar>,
}

impl AgMatmul {
    const EPOCH: i64 = 3;

    fn new() -> AgMatmul {
        let mut rng = Rng::fresh();
        let ir = ag_matmul::kernel().ir().unwrap().clone();
        let (m, n, k) = (40, 24, 16);
        let (a, a64) = random(&[m, k], &mut rng);
        let (b, b64) = random(&[k, n], &mut rng);
        let scalars = scalars(
            &ir,
            &[
                ("m", Scalar::Int(m as i64)),
                ("n", Scalar::Int(n as i64)),
                ("k", Scalar::Int(k as i64)),
                ("rows_per_chunk", Scalar::Int(10)),
                ("cols_per_chunk", Scalar::Int(k as i64)),
                ("ranks", Scalar::Int(4)),
                ("epoch", Scalar::Int(Self::EPOCH)),
                ("first_row", Scalar::Int(20)),
                ("0", Scalar::Int(0)),
            ],
        );
        AgMatmul {
            reference: matmul_f64(&a64, &b64, m, k, n),
            ir,
            a,
            b,
            scalars,
        }
    }

    fn launch(&self, flags: &HostTensor, timeout: Duration) -> Result<Vec<f64>, InterpretError> {
        self.launch_with(flags, timeout, 0)
    }

    fn launch_with(
        &self,
        flags: &HostTensor,
        timeout: Duration,
        threads: usize,
    ) -> Result<Vec<f64>, InterpretError> {
        let t = tensors(
            &self.ir,
            vec![
                ("a", self.a.clone()),
                ("b", self.b.clone()),
                ("out", nan(DType::BF16, &[40, 24])),
                ("progress", flags.clone()),
            ],
        );
        let options = Options {
            wait_timeout: timeout,
            threads,
        };
        // One warp: the tensor-core path splits a block into 16×16 warp tiles.
        let cfg = Config::new(&[16, 16, 16]).num_warps(1);
        // along_k = false: chunks of rows.
        run_with(&self.ir, &cfg, &[0], &t, &self.scalars, &options)
            .map(|()| out(&self.ir, &t, "out"))
    }
}

fn flags(values: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::U32, &[values.len()], values.to_vec()).unwrap()
}

/// `wait` reads the flags as the GPU does: a range of chunks, each at least the
/// epoch; a flag left unset gives the GPU's timeout message once the timeout
/// has passed.
#[test]
fn waits_pass_on_set_flags_and_time_out_on_unset_ones() {
    let ag = AgMatmul::new();
    let got = ag
        .launch(&flags(&[3.0, 4.0, 3.0, 3.0]), Duration::from_secs(10))
        .unwrap();
    let err = rel_error(&got, &ag.reference);
    assert!(err < 1e-2, "rel err {err}");

    let started = Instant::now();
    let e = ag
        .launch(&flags(&[3.0, 3.0, 2.0, 3.0]), Duration::from_millis(200))
        .unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(200));
    let msg = e.to_string();
    assert!(
        msg.contains("stopped waiting at `wait(progress")
            && msg.contains("after 200 ms: flag index 2 holds 2, expected >= 3"),
        "{msg}"
    );
}

/// A `wait` blocks until another thread sets its flag: the flags start unset,
/// a thread sets them one by one in the order an all-gather's chunks arrive,
/// and the kernel, started first, finishes with the right product.
#[test]
fn a_wait_blocks_until_another_thread_sets_the_flag() {
    let ag = AgMatmul::new();
    let progress = flags(&[0.0; 4]);
    let setter = {
        let mem = progress.memory().clone();
        std::thread::spawn(move || {
            // This rank's own chunks first (rows 20..40), then the peer's.
            for chunk in [2, 3, 0, 1] {
                std::thread::sleep(Duration::from_millis(30));
                mem.store_flag(chunk, AgMatmul::EPOCH as u32).unwrap();
            }
        })
    };
    let started = Instant::now();
    let got = ag.launch(&progress, Duration::from_secs(20)).unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "the kernel finished before the last flag was set"
    );
    setter.join().unwrap();
    let err = rel_error(&got, &ag.reference);
    assert!(err < 1e-2, "rel err {err}");
}
