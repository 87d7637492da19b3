//! The split of a GEMM's last wave along K: the split runs give cuBLAS's result,
//! the same bits every run (parts are added in a fixed order), and the same
//! result as the unsplit kernel up to rounding.

use crate::common::{err_vs, gpu_alone};
use crate::matmul::mm_bf16;
use tilefuse::prelude::*;
use tilefuse::runtime::split_tail;
use tilefuse_testkit::poisoned;

/// Shapes whose last wave the portable default config splits on a 132-SM H100/H200
/// (the test pins that config: the Hopper path does not split):
/// 1000³ is one wave of 32 tiles (split 4 ways), the seed's shape leaves 40
/// tiles over 6 whole waves (split 3 ways), and 700×2000×1000 (48 tiles, split
/// 2 ways) has ragged M, N and K, the last K tile landing in the last part.
const SHAPES: [[usize; 3]; 3] = [[1000, 1000, 1000], [4096, 6656, 16384], [700, 2000, 1000]];

#[test]
fn split_last_wave_matches_cublas_and_is_deterministic() {
    let Some(dev) = gpu_alone() else { return };
    let cfg = mm_bf16::kernel().config_on(&dev).unwrap();
    assert!(!cfg.wgmma);
    mm_bf16::kernel().with_config(cfg.clone(), || split_runs(&dev, &cfg));
}

fn split_runs(dev: &tilefuse::Device, cfg: &Config) {
    let mut splits = 0;
    let (bm, bn, bk) = (cfg.block_sizes[0], cfg.block_sizes[1], cfg.block_sizes[2]);
    for [m, n, k] in SHAPES {
        let tiles = (m.div_ceil(bm) * n.div_ceil(bn)) as u64;
        // Only claim a split where the plan makes one (an SM count off by
        // occupancy only changes how many ways).
        split_tail::set_enabled(true);
        let planned = split_tail::plan(
            tiles,
            k.div_ceil(bk) as u64,
            dev.sm_count() as u64,
            tilefuse::codegen::emit::PORTABLE_MIN_PART_K_TILES as u64,
        );
        let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);

        let split1 = poisoned::<bf16>([m, n]).unwrap();
        mm_bf16(&a, &b, &split1).unwrap();
        let split2 = poisoned::<bf16>([m, n]).unwrap();
        mm_bf16(&a, &b, &split2).unwrap();
        split_tail::set_enabled(false);
        let whole = poisoned::<bf16>([m, n]).unwrap();
        let unsplit = mm_bf16(&a, &b, &whole);
        split_tail::set_enabled(true);
        unsplit.unwrap();

        let err = err_vs(&split1, &reference);
        assert!(err <= 1e-2, "{m}x{n}x{k} split {planned:?}: rel err {err}");
        assert_eq!(
            split1.to_vec().unwrap(),
            split2.to_vec().unwrap(),
            "{m}x{n}x{k}: two split runs differ"
        );
        let err = err_vs(&whole, &reference);
        assert!(err <= 1e-2, "{m}x{n}x{k} unsplit: rel err {err}");
        eprintln!("{m}x{n}x{k}: {planned:?}, ok");
        splits += usize::from(planned.ways > 1);
    }
    assert!(
        splits > 0,
        "no shape was split: the test checked nothing split"
    );
}

/// Stream-K on the Hopper path: units that cross from one tile into the next
/// (4096³ and a ragged 700×2000×1000, whose last K tile is partial), a single
/// small wave shared by a whole wave of units (1000×1000×1000), each against
/// cuBLAS, the same bits on a second run, and close to the unsplit kernel.
#[test]
fn stream_k_matches_cublas_and_is_deterministic() {
    let Some(dev) = crate::wgmma::hopper_alone() else {
        return;
    };
    let base = Config::new(&[128, 256, 64])
        .num_warps(8)
        .num_stages(4)
        .wgmma(true);
    let configs = [
        base.clone().persistent(true).cluster_m(2).stream_k(true),
        base.clone().stream_k(true),
    ];
    let mut shared = 0;
    for [m, n, k] in [[4096, 4096, 4096], [700, 2000, 1000], [1000, 1000, 1000]] {
        let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);
        for cfg in &configs {
            let cl = cfg.cluster_m;
            let tiles = (m.div_ceil(128 * cl) * n.div_ceil(256)) as u64;
            let slots = (dev.sm_count() / cl) as u64;
            split_tail::set_enabled(true);
            let planned = split_tail::stream_k_plan(tiles, k.div_ceil(64) as u64, slots);
            let run = || {
                let out = poisoned::<bf16>([m, n]).unwrap();
                mm_bf16::kernel()
                    .with_config(cfg.clone(), || mm_bf16(&a, &b, &out))
                    .unwrap_or_else(|e| panic!("{m}x{n}x{k} {cfg}: {e}"));
                out
            };
            let (first, second) = (run(), run());
            split_tail::set_enabled(false);
            let whole = poisoned::<bf16>([m, n]).unwrap();
            let unsplit = mm_bf16::kernel().with_config(cfg.clone(), || mm_bf16(&a, &b, &whole));
            split_tail::set_enabled(true);
            unsplit.unwrap();

            let err = err_vs(&first, &reference);
            assert!(err <= 1e-2, "{m}x{n}x{k} {cfg} {planned:?}: rel err {err}");
            assert_eq!(
                first.to_vec().unwrap(),
                second.to_vec().unwrap(),
                "{m}x{n}x{k} {cfg}: two stream-K runs differ"
            );
            let err = err_vs(&whole, &reference);
            assert!(err <= 1e-2, "{m}x{n}x{k} {cfg} unsplit: rel err {err}");
            eprintln!("{m}x{n}x{k} {cfg}: {planned:?}, ok");
            shared += usize::from(planned.parts > planned.split);
        }
    }
    assert!(
        shared >= 4,
        "stream-K shared the last wave at {shared} of 6 runs"
    );
}

/// Column sums: the walk down a tall matrix's rows is shared by several
/// programs (a split loop), which meet at a counter per column tile.
#[fused_kernel]
fn tall_col_sum(x: &Tensor<f32>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for tn in tile(n) {
        let mut acc = zeros::<f32>([tn]);
        for tm in tile(m) {
            acc = acc + x[(tm, tn)].sum(tm);
        }
        out[tn] = acc;
    }
}

/// No memset zeroes the meeting counters before a launch: the last program
/// at each wraps it back to 0. Launches one after another, with fresh inputs
/// (a count left behind would make an early program the last, which would add
/// stale shares of the launch before) and grids of different sizes (other
/// counters in use), each give the float64 sums.
#[test]
fn shared_loops_find_their_counters_at_zero_launch_after_launch() {
    let Some(_dev) = gpu_alone() else { return };
    let cfg = Config::new(&[128, 16]).num_warps(1).split(64);
    let mut rng = tilefuse_testkit::Rng::new(33);
    for (round, (m, n)) in [(4096, 256), (4096, 256), (3001, 1000), (4096, 256)]
        .into_iter()
        .enumerate()
    {
        let xs: Vec<f32> = tilefuse_testkit::random_vec(&mut rng, m * n, 1.0);
        let x = Tensor::from_slice(&xs, [m, n]).unwrap();
        let out = poisoned::<f32>([n]).unwrap();
        tall_col_sum::kernel()
            .with_config(cfg.clone(), || tall_col_sum(&x, &out))
            .unwrap();
        let want: Vec<f64> = (0..n)
            .map(|j| (0..m).map(|i| f64::from(xs[i * n + j])).sum())
            .collect();
        let err = err_vs(&out, &want);
        assert!(err <= 1e-5, "launch {round} ({m}x{n}): rel err {err}");
    }
}
