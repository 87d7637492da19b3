//! `wait`: a GEMM whose programs wait on per-chunk flags that a second stream
//! writes with `cuStreamWriteValue32` after a delay; a wait that times out is an
//! error naming the site, and the device stays usable after it.

use crate::common::{err_vs, gpu_alone};
use std::time::{Duration, Instant};
use tilefuse::prelude::*;
use tilefuse::runtime::status::set_wait_timeout_ms;
use tilefuse::SideStream;
use tilefuse_testkit::poisoned;

/// Rows of A arrive in chunks of `rows_per_chunk`; each program waits for the
/// chunk holding its rows before it reads them.
#[fused_kernel]
pub(crate) fn gated_matmul(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    progress: &Tensor<u32>,
    rows_per_chunk: usize,
    out: &Tensor<bf16>,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        wait(progress, tm.begin() / rows_per_chunk, 1);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = acc.cast();
    }
}

/// The lowerings a `wait` runs in on this GPU: the portable GEMM, and on Hopper
/// the wgmma GEMM with one block per tile and with a persistent grid (there the
/// producer thread waits and the consumers never see the flags).
pub(crate) fn wait_configs(dev: &Device) -> Vec<Config> {
    let mut out = vec![Config::new(&[64, 128, 32]).num_warps(4).num_stages(3)];
    if dev.compute_capability().0 == 9 {
        for persistent in [false, true] {
            out.push(
                Config::new(&[128, 128, 64])
                    .num_warps(8)
                    .num_stages(4)
                    .wgmma(true)
                    .persistent(persistent),
            );
        }
    }
    out
}

// One test, run in order: the timeout setting is process-wide.
#[test]
fn wait_released_by_stream_write_then_timeout_then_recovery() {
    let Some(dev) = gpu_alone() else { return };
    for cfg in wait_configs(&dev) {
        eprintln!("wait: {cfg}");
        gated_matmul::kernel().with_config(cfg, || released_timeout_recovery(&dev));
    }
}

/// The Hopper GEMM's barrier waits are bounded (9-13 s, `tf_mbar_wait`), but a
/// user `wait` may take longer: a chunk that arrives after 13.5 s, within a
/// 30 s wait timeout, still gives the right product, with no stop on the way.
#[test]
fn a_wait_longer_than_the_barrier_bound_completes() {
    let Some(dev) = crate::wgmma::hopper_alone() else {
        return;
    };
    let (m, n, k, chunk) = (512, 256, 256, 256);
    let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);
    // Flags for stream writes come from Tensor::flags, zeroed; chunk 0 is there.
    let flags = Tensor::flags(2).unwrap();
    let out = poisoned::<bf16>([m, n]).unwrap();
    let side = SideStream::new(&dev, true).unwrap();
    side.write_flag(&flags, 0, 1).unwrap();
    dev.synchronize().unwrap();
    let cfg = Config::new(&[128, 128, 64])
        .num_warps(8)
        .num_stages(4)
        .wgmma(true)
        .persistent(true);
    set_wait_timeout_ms(Some(30_000));
    gated_matmul::kernel().with_config(cfg, || {
        gated_matmul(&a, &b, &flags, chunk, &out).unwrap();
    });
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_millis(13_500));
    side.write_flag(&flags, 1, 1).unwrap();
    let done = dev.synchronize();
    set_wait_timeout_ms(None);
    done.expect("the producer's wait outlasted the barrier bound and then succeeded");
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(13_400), "{waited:?}");
    let err = err_vs(&out, &reference);
    assert!(err <= 1e-2, "rel err {err}");
}

fn released_timeout_recovery(dev: &std::sync::Arc<Device>) {
    let (m, n, k, chunk) = (1024, 512, 256, 256);
    let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);

    // Stream memory operations reject pooled memory: a clear error, not a driver code.
    let pooled = Tensor::<u32>::zeros([4]).unwrap();
    let side = SideStream::new(dev, true).unwrap();
    let e = side
        .write_flag(&pooled, 0, 1)
        .expect_err("pooled flags are refused");
    assert!(e.to_string().contains("Tensor::flags"), "{e}");

    // 1. Released: flags start at 0; a side stream sets them after 300 ms.
    let flags = Tensor::flags(m / chunk).unwrap();
    let out = poisoned::<bf16>([m, n]).unwrap();
    dev.synchronize().unwrap();
    let t0 = Instant::now();
    gated_matmul(&a, &b, &flags, chunk, &out).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // Last chunk first: programs of earlier chunks must keep waiting until theirs.
    for i in (0..m / chunk).rev() {
        side.write_flag(&flags, i, 1).unwrap();
    }
    dev.synchronize().unwrap();
    let waited = t0.elapsed();
    let err = err_vs(&out, &reference);
    assert!(err <= 1e-2, "rel err {err}");
    assert!(
        waited >= Duration::from_millis(290),
        "the kernel finished after {waited:?}, before its flags were set"
    );

    // 2. Timeout: one flag is never set.
    set_wait_timeout_ms(Some(300));
    let flags = Tensor::<u32>::from_slice(&[1, 1, 0, 1], [4]).unwrap();
    let out = poisoned::<bf16>([m, n]).unwrap();
    gated_matmul(&a, &b, &flags, chunk, &out).unwrap();
    let e = dev
        .synchronize()
        .expect_err("a wait on a flag nobody sets must time out");
    set_wait_timeout_ms(None);
    let msg = e.to_string();
    eprintln!("timeout error: {msg}");
    assert!(
        matches!(
            e,
            tilefuse::Error::WaitTimeout {
                index: 2,
                expected: 1,
                seen: 0,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("wait(progress") && msg.contains("gated_matmul"),
        "{msg}"
    );

    // 3. Index outside the flags: reported, not read out of bounds.
    let short = Tensor::<u32>::full([2], 1).unwrap();
    gated_matmul(&a, &b, &short, chunk, &out).unwrap();
    let e = dev.synchronize().expect_err("flag index 2 of 2 flags");
    assert!(
        matches!(e, tilefuse::Error::WaitIndex { len: 2, .. }),
        "{e}"
    );

    // 4. The device is still usable, and the status block was cleared.
    let flags = Tensor::<u32>::full([m / chunk], 7).unwrap();
    let out = poisoned::<bf16>([m, n]).unwrap();
    gated_matmul(&a, &b, &flags, chunk, &out).unwrap();
    dev.synchronize().unwrap();
    let err = err_vs(&out, &reference);
    assert!(err <= 1e-2, "rel err after recovery {err}");
}

/// Each program waits for every chunk its rows touch: `lo..=hi`, so a tile that
/// spans several chunks is not released by its first one.
#[fused_kernel]
fn range_gated_matmul(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    progress: &Tensor<u32>,
    rows_per_chunk: usize,
    out: &Tensor<bf16>,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        wait(
            progress,
            tm.begin() / rows_per_chunk..=(tm.end() - 1) / rows_per_chunk,
            1,
        );
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = acc.cast();
    }
}

#[test]
fn wait_on_a_range_holds_until_its_middle_chunk_arrives() {
    let Some(dev) = gpu_alone() else { return };
    for cfg in wait_configs(&dev) {
        eprintln!("range wait: {cfg}");
        range_gated_matmul::kernel().with_config(cfg, || range_held_then_timeout(&dev));
    }
}

fn range_held_then_timeout(dev: &std::sync::Arc<Device>) {
    // Ragged M; chunks of 16 rows are smaller than any GEMM block, so the first
    // program's rows span chunks 0, 1, ...: only chunk 1 is held back.
    let (m, n, k, chunk) = (1000, 384, 192, 16);
    let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);
    let chunks = m.div_ceil(chunk);
    let mut init = vec![1u32; chunks];
    init[1] = 0;
    let mut flags = Tensor::<u32>::flags(chunks).unwrap();
    flags.copy_from_slice(&init).unwrap();
    let side = SideStream::new(dev, true).unwrap();
    let out = poisoned::<bf16>([m, n]).unwrap();
    dev.synchronize().unwrap();
    let t0 = Instant::now();
    range_gated_matmul(&a, &b, &flags, chunk, &out).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    side.write_flag(&flags, 1, 1).unwrap();
    dev.synchronize().unwrap();
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(290),
        "the kernel finished after {waited:?}, before chunk 1 (inside the first tile) arrived"
    );
    let err = err_vs(&out, &reference);
    assert!(err <= 1e-2, "rel err {err}");

    // A range that never completes times out naming the missing flag.
    set_wait_timeout_ms(Some(300));
    let mut flags = Tensor::<u32>::flags(chunks).unwrap();
    flags.copy_from_slice(&init).unwrap();
    range_gated_matmul(&a, &b, &flags, chunk, &out).unwrap();
    let e = dev.synchronize().expect_err("chunk 1 is never set");
    set_wait_timeout_ms(None);
    assert!(
        matches!(
            e,
            tilefuse::Error::WaitTimeout {
                index: 1,
                seen: 0,
                ..
            }
        ),
        "{e}"
    );
    // The device is usable again.
    let flags = Tensor::<u32>::full([chunks], 1).unwrap();
    range_gated_matmul(&a, &b, &flags, chunk, &out).unwrap();
    dev.synchronize().unwrap();
    assert!(err_vs(&out, &reference) <= 1e-2);
}

/// `leaving_sms`: a grid that is not persistent and more than the GPU holds
/// cannot leave SMs to a producer, so the launch is refused with a message; a
/// persistent grid shrinks to the SMs left and still computes every tile.
#[test]
fn leaving_sms_shrinks_persistent_grids_and_refuses_full_ones() {
    let Some(dev) = crate::common::gpu() else {
        return;
    };
    let (m, n, k, chunk) = (4096, 2048, 128, 4096);
    let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);
    let flags = Tensor::<u32>::from_slice(&[1], [1]).unwrap();
    let out = poisoned::<bf16>([m, n]).unwrap();
    let portable = Config::new(&[64, 128, 32]).num_warps(4).num_stages(3);
    let e = gated_matmul::kernel()
        .with_config(portable, || {
            tilefuse::runtime::kernel::leaving_sms(8, || gated_matmul(&a, &b, &flags, chunk, &out))
        })
        .expect_err("1024 blocks of a grid that is not persistent cannot leave 8 SMs free");
    assert!(e.to_string().contains("cannot leave 8 SMs free"), "{e}");
    if dev.compute_capability().0 != 9 {
        return;
    }
    let persistent = Config::new(&[128, 128, 64])
        .num_warps(8)
        .num_stages(4)
        .wgmma(true)
        .persistent(true);
    let left = dev.sm_count() - 2;
    gated_matmul::kernel().with_config(persistent, || {
        tilefuse::runtime::kernel::leaving_sms(left, || {
            gated_matmul(&a, &b, &flags, chunk, &out).unwrap()
        })
    });
    dev.synchronize().unwrap();
    let err = err_vs(&out, &reference);
    assert!(err <= 1e-2, "rel err {err} with the grid on 2 SMs");
}
