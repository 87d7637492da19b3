//! The generated GEMM against cuBLAS: bf16 and f16, ragged and aligned shapes,
//! several configs, outputs poisoned beforehand.

use crate::common::{err_vs, gpu, host};
use tilefuse::prelude::*;
use tilefuse_testkit::{poisoned, random_tensor};

#[fused_kernel]
pub(crate) fn mm_bf16(a: &Tensor<bf16>, b: &Tensor<bf16>, out: &Tensor<bf16>) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = acc.cast();
    }
}

#[fused_kernel]
pub(crate) fn mm_f16(a: &Tensor<f16>, b: &Tensor<f16>, out: &Tensor<f16>) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = acc.cast();
    }
}

/// The same product with the tile order starting at row `first_row`.
#[fused_kernel]
fn mm_from_row(a: &Tensor<bf16>, b: &Tensor<bf16>, out: &Tensor<bf16>, first_row: usize) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]).starting_at([first_row, 0]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = acc.cast();
    }
}

#[test]
fn tile_order_starting_at_any_row_gives_the_same_product() {
    let Some(_dev) = gpu() else { return };
    let (m, n, k) = (1000, 520, 333);
    let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);
    for first_row in [0, 1, 128, 500, 999, 5000] {
        let out = poisoned::<bf16>([m, n]).unwrap();
        mm_from_row(&a, &b, &out, first_row).unwrap();
        let err = err_vs(&out, &reference);
        assert!(err <= 1e-2, "starting at row {first_row}: rel err {err}");
    }
}

pub(crate) const SHAPES: [[usize; 3]; 5] = [
    [1, 1, 1],
    [127, 255, 63],
    [1000, 1000, 1000],
    [333, 520, 1048],
    [4096, 6656, 16384],
];

pub(crate) fn configs(shape: [usize; 3]) -> Vec<Option<Config>> {
    if shape[0] * shape[1] * shape[2] > 1 << 30 {
        return vec![None];
    }
    vec![
        None,
        Some(Config::new(&[128, 256, 64]).num_warps(8).num_stages(3)),
        Some(Config::new(&[64, 64, 32]).num_warps(4).num_stages(2)),
        Some(Config::new(&[32, 32, 16]).num_warps(1).num_stages(3)),
        Some(
            Config::new(&[128, 128, 32])
                .num_warps(4)
                .num_stages(4)
                .group_m(1),
        ),
    ]
}

macro_rules! check_dtype {
    ($name:ident, $t:ty, $kernel:ident) => {
        #[test]
        fn $name() {
            let Some(_dev) = gpu() else { return };
            for shape @ [m, n, k] in SHAPES {
                let a = random_tensor::<$t>([m, k], 1.0).unwrap();
                let b = random_tensor::<$t>([k, n], 1.0).unwrap();
                let reference = tilefuse::cublas::matmul(&a, &b).unwrap();
                let reference = host(&reference);
                for cfg in configs(shape) {
                    let out = poisoned::<$t>([m, n]).unwrap();
                    let label = cfg
                        .as_ref()
                        .map(|c| c.to_string())
                        .unwrap_or_else(|| "default".into());
                    match cfg {
                        Some(c) => $kernel::kernel().with_config(c, || $kernel(&a, &b, &out)),
                        None => $kernel(&a, &b, &out),
                    }
                    .unwrap();
                    let err = err_vs(&out, &reference);
                    eprintln!("{} {m}x{n}x{k} {label}: rel err {err:.2e}", stringify!($t));
                    assert!(
                        err <= 1e-2,
                        "{} {m}x{n}x{k} with {label}: rel err {err}",
                        stringify!($t)
                    );
                }
            }
        }
    };
}

check_dtype!(bf16_matches_cublas, bf16, mm_bf16);
check_dtype!(f16_matches_cublas, f16, mm_f16);

/// A view whose rows are not 16-byte aligned takes the element-load path.
#[test]
fn unaligned_views_match_cublas() {
    let Some(_dev) = gpu() else { return };
    let (m, n, k) = (200, 136, 96);
    let big_a = random_tensor::<bf16>([m, k + 3], 1.0).unwrap();
    let a = big_a.narrow(1, 1, k).unwrap();
    let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
    // cuBLAS needs a dense A: make one from the same values.
    let a_dense = Tensor::from_slice(&a.to_vec().unwrap(), [m, k]).unwrap();
    let reference = host(&tilefuse::cublas::matmul(&a_dense, &b).unwrap());
    let out = poisoned::<bf16>([m, n]).unwrap();
    mm_bf16(&a, &b, &out).unwrap();
    let err = err_vs(&out, &reference);
    assert!(err <= 1e-2, "rel err {err}");
}

/// Independent of cuBLAS: a float64 reference computed on the host.
#[test]
fn bf16_matches_f64_reference() {
    let Some(_dev) = gpu() else { return };
    let (m, n, k) = (333, 520, 1048);
    let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
    let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
    let reference = tilefuse_testkit::matmul_f64(&host(&a), &host(&b), m, k, n);
    let out = poisoned::<bf16>([m, n]).unwrap();
    mm_bf16(&a, &b, &out).unwrap();
    let err = err_vs(&out, &reference);
    eprintln!("bf16 {m}x{n}x{k} vs f64 host: rel err {err:.2e}");
    // Rounding the output to bf16 alone gives about 2e-3.
    assert!(err <= 5e-3, "rel err {err}");
}
