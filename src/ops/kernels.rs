//! The tilefuse kernels the fused ops launch: one GEMM with a waiting prologue
//! and a bias epilogue, in the variants the schedules need. Every variant takes
//! both bias vectors (`bias_m` along rows, `bias_n` along columns; the ops pass
//! zeros for the one not given), so that every rank launches the same kernels
//! whatever it passes, and the tuner's one-rank-tunes protocol holds.
//!
//! Each waits, before its tile's loads, for the flags of the row chunks its tile
//! covers: `flags[c * flags_per_chunk .. (c + 1) * flags_per_chunk]` for every
//! chunk `c` of `rows_per_chunk` rows. Passing `epoch` 0 makes the wait pass at
//! once (flags are unsigned).

use crate::prelude::*;

/// `out = a · b + bias_m + bias_n`, each tile after its rows' flags.
#[fused_kernel]
#[allow(clippy::too_many_arguments)]
pub fn gemm_wait(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    out: &Tensor<bf16>,
    bias_m: &Tensor<bf16>,
    bias_n: &Tensor<bf16>,
    flags: &Tensor<u32>,
    rows_per_chunk: usize,
    flags_per_chunk: usize,
    epoch: usize,
    first_row: usize,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]).starting_at([first_row, 0]) {
        wait(
            flags,
            tm.begin() / rows_per_chunk * flags_per_chunk
                ..((tm.end() - 1) / rows_per_chunk + 1) * flags_per_chunk,
            epoch,
        );
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = (acc + bias_m[tm] + bias_n[tn]).cast();
    }
}

/// `out = a · b + addend + bias_m + bias_n`, each tile after the flags of the
/// addend's rows (one flag per chunk).
#[fused_kernel]
#[allow(clippy::too_many_arguments)]
pub fn gemm_wait_add(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    addend: &Tensor<bf16>,
    out: &Tensor<bf16>,
    bias_m: &Tensor<bf16>,
    bias_n: &Tensor<bf16>,
    flags: &Tensor<u32>,
    rows_per_chunk: usize,
    epoch: usize,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        wait(
            flags,
            tm.begin() / rows_per_chunk..=(tm.end() - 1) / rows_per_chunk,
            epoch,
        );
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = (acc + addend[(tm, tn)] + bias_m[tm] + bias_n[tn]).cast();
    }
}

/// [`gemm_wait_add`] that also stores the result into `copy` (a symmetric
/// buffer peers pull from).
#[fused_kernel]
#[allow(clippy::too_many_arguments)]
pub fn gemm_wait_add_dual(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    addend: &Tensor<bf16>,
    out: &Tensor<bf16>,
    copy: &Tensor<bf16>,
    bias_m: &Tensor<bf16>,
    bias_n: &Tensor<bf16>,
    flags: &Tensor<u32>,
    rows_per_chunk: usize,
    epoch: usize,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        wait(
            flags,
            tm.begin() / rows_per_chunk..=(tm.end() - 1) / rows_per_chunk,
            epoch,
        );
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        let c = (acc + addend[(tm, tn)] + bias_m[tm] + bias_n[tn]).cast::<bf16>();
        out[(tm, tn)] = c;
        copy[(tm, tn)] = c;
    }
}

/// `out = copy = a · b + bias_m + bias_n`.
#[fused_kernel]
pub fn gemm_dual(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    out: &Tensor<bf16>,
    copy: &Tensor<bf16>,
    bias_m: &Tensor<bf16>,
    bias_n: &Tensor<bf16>,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        let c = (acc + bias_m[tm] + bias_n[tn]).cast::<bf16>();
        out[(tm, tn)] = c;
        copy[(tm, tn)] = c;
    }
}

/// `x += bias_m + bias_n` in place (the unfused path's bias after cuBLAS).
#[fused_kernel]
pub fn add_bias(x: &Tensor<bf16>, bias_m: &Tensor<bf16>, bias_n: &Tensor<bf16>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        x[(tm, tn)] = (x[(tm, tn)] + bias_m[tm] + bias_n[tn]).cast();
    }
}
