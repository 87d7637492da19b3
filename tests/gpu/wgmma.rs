//! The Hopper path (TMA + wgmma, `Config::wgmma`) against cuBLAS on an sm_90 GPU:
//! bf16 and f16, ragged M, N and K (rows stay 16-byte aligned, as TMA needs),
//! a fused epilogue, and a clear error for rows TMA cannot load.

use crate::common::examples::bias_gelu::matmul_bias_gelu;
use crate::common::{err_vs, gpu, gpu_alone, host, Gpu};
use crate::common::{pingpong_configs, tma_store_configs, wgmma_configs as configs};
use crate::matmul::{mm_bf16, mm_f16};
use tilefuse::prelude::*;
use tilefuse_testkit::{poisoned, random_tensor};

/// The GPU, shared with other tests, when it is an sm_90 one; else the test
/// says it skipped.
pub(crate) fn hopper() -> Option<Gpu> {
    on_hopper(gpu()?)
}

/// Like [`hopper`], with no other test on the GPU meanwhile.
pub(crate) fn hopper_alone() -> Option<Gpu> {
    on_hopper(gpu_alone()?)
}

fn on_hopper(dev: Gpu) -> Option<Gpu> {
    if dev.compute_capability().0 != 9 {
        eprintln!(
            "SKIPPED: the wgmma path needs an sm_90 GPU, this is {} ({})",
            dev.name(),
            dev.arch()
        );
        return None;
    }
    Some(dev)
}

pub(crate) const SHAPES: [(usize, usize, usize); 7] = [
    (1, 8, 8),
    (127, 264, 72),
    (1000, 520, 336),
    (1024, 1024, 1024),
    // More tiles than SMs at small blocks: persistent blocks loop, the ring's
    // phases carry from tile to tile.
    (2000, 1544, 200),
    // Fewer tiles than SMs and 32 K tiles, the last one partial: the last
    // (only) wave is split along K (parts keep at least 16), the parts meet in
    // scratch.
    (1000, 1544, 2000),
    (4096, 6656, 16384),
];

#[test]
fn wgmma_gemm_matches_cublas_on_ragged_shapes() {
    let Some(_dev) = hopper() else { return };
    for (m, n, k) in SHAPES {
        let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);
        for cfg in configs()
            .into_iter()
            .chain(tma_store_configs())
            .chain(pingpong_configs())
        {
            let out = poisoned::<bf16>([m, n]).unwrap();
            mm_bf16::kernel()
                .with_config(cfg.clone(), || mm_bf16(&a, &b, &out))
                .unwrap_or_else(|e| panic!("{m}x{n}x{k} {cfg}: {e}"));
            let err = err_vs(&out, &reference);
            assert!(err <= 1e-2, "{m}x{n}x{k} {cfg}: rel err {err}");
        }
    }
    let (m, n, k) = (333, 392, 264);
    let (a, b, reference) = crate::common::gemm_operands::<f16>(m, n, k);
    for cfg in configs()
        .into_iter()
        .chain(tma_store_configs())
        .chain(pingpong_configs())
    {
        let out = poisoned::<f16>([m, n]).unwrap();
        mm_f16::kernel()
            .with_config(cfg.clone(), || mm_f16(&a, &b, &out))
            .unwrap();
        let err = err_vs(&out, &reference);
        assert!(err <= 1e-2, "f16 {cfg}: rel err {err}");
    }
}

/// The untuned default fits its tiles to the SMs (`tilefuse::codegen::hopper_tiles`):
/// 128×128 tiles where they fit one wave, single 128×256 blocks where those
/// do, pairs of them beyond; each through the launch path, against cuBLAS.
#[test]
fn the_untuned_default_fits_its_tiles_to_the_sms() {
    use tilefuse::codegen::{emit::GemmShape, HopperTiles};
    let Some(dev) = hopper() else { return };
    let sms = dev.sm_count();
    let ir = mm_bf16::kernel().ir().unwrap();
    let Some(g) = ir.plan::<GemmShape>() else {
        panic!("mm_bf16 is a matmul")
    };
    // Ragged: 8 × sms/8 tiles of 128×256 (more than a wave of 128×128 ones).
    let wide_n = 256 * (sms / 8) - 40;
    let cases = [
        ((1000, 1000, 1000), HopperTiles::Narrow, (128, 128, 1)),
        ((1000, wide_n, 520), HopperTiles::Wide, (128, 256, 1)),
        ((3000, 4100, 300), HopperTiles::Pairs, (128, 256, 2)),
    ];
    for ((m, n, k), tiles, (bm, bn, cl)) in cases {
        let mut ext = vec![None; ir.dims.len()];
        (ext[g.m], ext[g.n], ext[g.k]) = (Some(m), Some(n), Some(k));
        assert_eq!(
            tilefuse::codegen::hopper_tiles(ir, &ext, sms),
            tiles,
            "{m}x{n}"
        );
        let spec = mm_bf16::kernel().declared_spec().unwrap();
        let d = mm_bf16::kernel().default_at(&dev, &spec, &ext).unwrap();
        assert_eq!(
            (d.block_sizes[g.m], d.block_sizes[g.n], d.cluster_m),
            (bm, bn, cl),
            "{m}x{n}x{k}: {d}"
        );
        let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);
        let out = poisoned::<bf16>([m, n]).unwrap();
        mm_bf16(&a, &b, &out).unwrap_or_else(|e| panic!("{m}x{n}x{k} default {d}: {e}"));
        let err = err_vs(&out, &reference);
        assert!(err <= 1e-2, "{m}x{n}x{k} default {d}: rel err {err}");
    }
}

#[test]
fn wgmma_gemm_runs_the_fused_epilogue() {
    let Some(_dev) = hopper() else { return };
    let (m, n, k) = (1000, 776, 520);
    let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
    let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
    let bias = random_tensor::<bf16>([n], 1.0).unwrap();
    let base = matmul_bias_gelu::kernel()
        .with_config(Config::new(&[128, 128, 32]).num_warps(4), || {
            matmul_bias_gelu(&a, &b, &bias)
        })
        .unwrap();
    let reference = host(&base);
    for cfg in configs()
        .into_iter()
        .chain(tma_store_configs())
        .chain(pingpong_configs())
    {
        let out = matmul_bias_gelu::kernel()
            .with_config(cfg.clone(), || matmul_bias_gelu(&a, &b, &bias))
            .unwrap();
        let err = err_vs(&out, &reference);
        assert!(
            err <= 1e-2,
            "{cfg}: rel err {err} against the portable path"
        );
    }
}

#[test]
fn rows_tma_cannot_load_are_an_error_naming_the_operand() {
    let Some(_dev) = hopper() else { return };
    // K = 333: rows of 666 bytes, not a multiple of 16.
    let a = random_tensor::<bf16>([64, 333], 1.0).unwrap();
    let b = random_tensor::<bf16>([333, 64], 1.0).unwrap();
    let out = poisoned::<bf16>([64, 64]).unwrap();
    let e = mm_bf16::kernel()
        .with_config(configs()[0].clone(), || mm_bf16(&a, &b, &out))
        .expect_err("unaligned rows");
    let msg = e.to_string();
    assert!(msg.contains("`a`") && msg.contains("16-byte"), "{msg}");
}

/// Operands whose rows TMA cannot load as they are (K or N odd, an offset view)
/// are copied into aligned rows first (`Config::stage`): by default on Hopper, and
/// for any config that asks, on either path.
#[test]
fn staged_unaligned_operands_match_cublas() {
    let Some(dev) = hopper() else { return };
    // K odd, N even but not a multiple of 8: rows 2- and 4-byte aligned.
    let mut spec = mm_bf16::kernel().declared_spec().unwrap();
    for (t, align) in [2, 4, 4].into_iter().enumerate() {
        spec.tensors[t].align = align;
    }
    let d = mm_bf16::kernel().default_for(&dev, &spec).unwrap();
    assert!(d.wgmma && d.stage, "the untuned Hopper default stages: {d}");
    let mut cfgs: Vec<Option<Config>> = vec![None];
    cfgs.extend(configs().into_iter().map(|c| Some(c.stage(true))));
    cfgs.push(Some(Config::new(&[128, 128, 32]).num_warps(4).stage(true)));
    cfgs.push(Some(Config::new(&[128, 128, 32]).num_warps(4)));
    for (m, n, k) in [(777, 2222, 3333), (3000, 520, 700), (1, 9, 7), (130, 66, 1)] {
        let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);
        for cfg in &cfgs {
            let out = poisoned::<bf16>([m, n]).unwrap();
            let label = cfg.as_ref().map_or("default".into(), |c| c.to_string());
            match cfg {
                Some(c) => mm_bf16::kernel().with_config(c.clone(), || mm_bf16(&a, &b, &out)),
                None => mm_bf16(&a, &b, &out),
            }
            .unwrap_or_else(|e| panic!("{m}x{n}x{k} {label}: {e}"));
            let err = err_vs(&out, &reference);
            assert!(err <= 1e-2, "{m}x{n}x{k} {label}: rel err {err}");
        }
    }
    // An offset view (base 2 bytes past a 16-byte boundary) of a wider tensor.
    let (m, n, k) = (500, 264, 136);
    let wide = random_tensor::<bf16>([m, k + 8], 1.0).unwrap();
    let a = wide.narrow(1, 1, k).unwrap();
    let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
    let a_dense = Tensor::from_slice(&a.to_vec().unwrap(), [m, k]).unwrap();
    let reference = host(&tilefuse::cublas::matmul(&a_dense, &b).unwrap());
    for cfg in configs().into_iter().take(3) {
        let out = poisoned::<bf16>([m, n]).unwrap();
        mm_bf16::kernel()
            .with_config(cfg.clone().stage(true), || mm_bf16(&a, &b, &out))
            .unwrap();
        let err = err_vs(&out, &reference);
        assert!(err <= 1e-2, "offset view, {cfg}, stage: rel err {err}");
    }
}
