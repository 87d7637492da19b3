//! Shared by the integration tests: skips with reasons, and the example kernels.
#![allow(dead_code)]

// Not every test binary that includes this module calls it.
#[allow(unused_imports)]
pub use tilefuse_testkit::nvrtc_or_skip;

/// The example programs' kernels, compiled into the tests.
#[path = "examples.rs"]
pub mod examples;
pub mod interp;

/// A GPU held by a test. Tests share the GPU; a test that makes the device report
/// an error on purpose (a `wait` timeout) holds it alone, so the error does not
/// surface in another test's synchronize.
pub struct Gpu {
    dev: std::sync::Arc<tilefuse::Device>,
    _shared: Option<std::sync::RwLockReadGuard<'static, ()>>,
    _alone: Option<std::sync::RwLockWriteGuard<'static, ()>>,
    _held: Held,
}

thread_local! {
    /// How many `Gpu`s this thread holds, and whether the outermost is alone.
    static HELD: std::cell::Cell<(u32, bool)> = const { std::cell::Cell::new((0, false)) };
}

/// One `Gpu` of this thread's; the count goes down when it is dropped.
struct Held;

impl Drop for Held {
    fn drop(&mut self) {
        HELD.with(|h| {
            let (n, alone) = h.get();
            let n = n.saturating_sub(1);
            h.set((n, alone && n > 0));
        });
    }
}

/// A second `Gpu` on a thread that holds one (a helper asking again) must not
/// take the lock again: `std`'s lock is not re-entrant, and a read behind a
/// waiting writer blocks, so the test would wait on itself for ever. It
/// shares the outer guard; asking to be alone under a shared guard is a bug
/// in the test, said at once rather than deadlocked.
fn nested(dev: &std::sync::Arc<tilefuse::Device>, alone: bool) -> Option<Gpu> {
    let (n, outer_alone) = HELD.with(|h| h.get());
    if n == 0 {
        return None;
    }
    assert!(
        !alone || outer_alone,
        "gpu_alone() called while this test holds gpu(): take gpu_alone() first"
    );
    HELD.with(|h| h.set((n + 1, outer_alone)));
    Some(Gpu {
        dev: dev.clone(),
        _shared: None,
        _alone: None,
        _held: Held,
    })
}

fn first(alone: bool) {
    HELD.with(|h| h.set((1, alone)));
}

impl std::ops::Deref for Gpu {
    type Target = std::sync::Arc<tilefuse::Device>;
    fn deref(&self) -> &Self::Target {
        &self.dev
    }
}

fn gpu_lock() -> &'static std::sync::RwLock<()> {
    static L: std::sync::RwLock<()> = std::sync::RwLock::new(());
    &L
}

fn device_or_skip() -> Option<std::sync::Arc<tilefuse::Device>> {
    // The suite tests the default and pinned configs; the autotuner's test turns
    // tuning on for itself.
    static NO_TUNING: std::sync::Once = std::sync::Once::new();
    NO_TUNING.call_once(|| {
        tilefuse::runtime::autotune::set_effort(Some(tilefuse::runtime::autotune::Effort::Off))
    });
    match tilefuse::Device::current() {
        Ok(d) if d.is_host() => {
            // Without a GPU the process runs in interpret mode (the suites of
            // `tests/interpret*.rs` cover that); these tests are the GPU's.
            eprintln!("SKIPPED (no GPU: this process runs in interpret mode)");
            None
        }
        Ok(d) => Some(d),
        Err(e) => {
            if std::env::var("TILEFUSE_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("TILEFUSE_REQUIRE_GPU=1 but no GPU is usable: {e}");
            }
            eprintln!("SKIPPED (no GPU): {e}");
            None
        }
    }
}

/// The current GPU, shared with other tests, or `None` with a printed reason.
/// With `TILEFUSE_REQUIRE_GPU=1`, a missing GPU fails the test instead.
pub fn gpu() -> Option<Gpu> {
    let dev = device_or_skip()?;
    if let Some(g) = nested(&dev, false) {
        return Some(g);
    }
    let g = gpu_lock().read().unwrap_or_else(|p| p.into_inner());
    first(false);
    Some(Gpu {
        dev,
        _shared: Some(g),
        _alone: None,
        _held: Held,
    })
}

/// Like [`gpu`], but no other test uses the GPU meanwhile.
pub fn gpu_alone() -> Option<Gpu> {
    let dev = device_or_skip()?;
    if let Some(g) = nested(&dev, true) {
        return Some(g);
    }
    let g = gpu_lock().write().unwrap_or_else(|p| p.into_inner());
    first(true);
    Some(Gpu {
        dev,
        _shared: None,
        _alone: Some(g),
        _held: Held,
    })
}

/// Relative error of a bf16/f16/f32 tensor against an f64 host reference.
pub fn err_vs<T: tilefuse::Element>(out: &tilefuse::Tensor<T>, reference: &[f64]) -> f64 {
    let o = out.to_vec().expect("copy to host");
    tilefuse_testkit::rel_error(&o, reference, T::to_f64, |x| x)
}

/// A tensor's values as f64 on the host.
pub fn host<T: tilefuse::Element>(t: &tilefuse::Tensor<T>) -> Vec<f64> {
    t.to_vec()
        .expect("copy to host")
        .into_iter()
        .map(T::to_f64)
        .collect()
}

/// Fresh random A [m, k] and B [k, n], and cuBLAS's A·B on the host as the reference.
pub fn gemm_operands<T: tilefuse::Element>(
    m: usize,
    n: usize,
    k: usize,
) -> (tilefuse::Tensor<T>, tilefuse::Tensor<T>, Vec<f64>) {
    let a = tilefuse_testkit::random_tensor::<T>([m, k], 1.0).expect("random A");
    let b = tilefuse_testkit::random_tensor::<T>([k, n], 1.0).expect("random B");
    let reference = host(&tilefuse::cublas::matmul(&a, &b).expect("cuBLAS reference"));
    (a, b, reference)
}

/// Hopper-path configs the tests run: both consumer counts, 64- to 256-wide N
/// blocks, 2 to 6 stages, one block per tile or persistent, clusters of one or two.
pub fn wgmma_configs() -> Vec<tilefuse::Config> {
    use tilefuse::Config;
    vec![
        Config::new(&[128, 256, 64])
            .num_warps(8)
            .num_stages(4)
            .wgmma(true),
        Config::new(&[128, 128, 64])
            .num_warps(8)
            .num_stages(5)
            .wgmma(true),
        Config::new(&[64, 256, 64])
            .num_warps(4)
            .num_stages(3)
            .wgmma(true),
        Config::new(&[128, 64, 64])
            .num_warps(8)
            .num_stages(2)
            .wgmma(true),
        Config::new(&[128, 256, 64])
            .num_warps(8)
            .num_stages(4)
            .wgmma(true)
            .persistent(true),
        Config::new(&[64, 128, 64])
            .num_warps(4)
            .num_stages(6)
            .wgmma(true)
            .persistent(true),
        Config::new(&[128, 256, 64])
            .num_warps(8)
            .num_stages(4)
            .wgmma(true)
            .cluster_m(2),
        Config::new(&[128, 128, 64])
            .num_warps(8)
            .num_stages(5)
            .wgmma(true)
            .persistent(true)
            .cluster_m(2),
        // Stream-K: a persistent pair, and one block per unit.
        Config::new(&[128, 256, 64])
            .num_warps(8)
            .num_stages(4)
            .wgmma(true)
            .persistent(true)
            .cluster_m(2)
            .stream_k(true),
        Config::new(&[128, 192, 64])
            .num_warps(8)
            .num_stages(4)
            .wgmma(true)
            .stream_k(true),
    ]
}

/// Hopper configs whose two consumer warpgroups take tiles in turn
/// (`Config::pingpong`): 128×128 (two `wgmma` rows a thread) and 64×256 tiles,
/// a cluster pair, stream-K, and the TMA-store epilogue (each warpgroup
/// staging its own tile's boxes).
pub fn pingpong_configs() -> Vec<tilefuse::Config> {
    use tilefuse::Config;
    let pp = |bs: &[usize], stages: usize| {
        Config::new(bs)
            .num_warps(8)
            .num_stages(stages)
            .wgmma(true)
            .persistent(true)
            .pingpong(true)
    };
    vec![
        pp(&[128, 128, 64], 5),
        pp(&[64, 256, 64], 4),
        pp(&[128, 128, 64], 4).cluster_m(2).tma_store(true),
        pp(&[64, 256, 64], 4).tma_store(true),
        pp(&[128, 128, 64], 4).stream_k(true).tma_store(true),
    ]
}

/// Hopper configs with the TMA-store epilogue (`Config::tma_store`; outputs
/// must be bf16/f16 with 16-byte aligned rows): a persistent pair, three boxes
/// per tile row (the ring's buffers alternate across tiles), one warpgroup per
/// tile, and stream-K (the epilogue after a fix-up).
pub fn tma_store_configs() -> Vec<tilefuse::Config> {
    use tilefuse::Config;
    vec![
        Config::new(&[128, 256, 64])
            .num_warps(8)
            .num_stages(4)
            .wgmma(true)
            .persistent(true)
            .cluster_m(2)
            .tma_store(true),
        Config::new(&[128, 192, 64])
            .num_warps(8)
            .num_stages(3)
            .wgmma(true)
            .tma_store(true),
        Config::new(&[64, 256, 64])
            .num_warps(4)
            .num_stages(4)
            .wgmma(true)
            .tma_store(true),
        Config::new(&[128, 128, 64])
            .num_warps(8)
            .num_stages(4)
            .wgmma(true)
            .persistent(true)
            .stream_k(true)
            .tma_store(true),
    ]
}
