//! Gathers through computed indices on the general lowering: rows staged in
//! shared memory (their copies in flight while the indices load), a staged
//! gather inside another's index (both use the one staging region), and
//! narrow types kept several to a register. Pure data movement: the outputs
//! equal the reference exactly.

use crate::common::{gpu, host};
use tilefuse::prelude::*;
use tilefuse_testkit::{poisoned, random_vec, Rng};

/// `out[(tm, tn)] = x[(tm, idx[(tm, sel[tn])])]`: the inner gather's rows (of
/// `idx`) staged and read before the outer one stages `x`'s.
#[fused_kernel]
pub(crate) fn gather_of_gather(
    x: &Tensor<bf16>,
    idx: &Tensor<i32>,
    sel: &Tensor<i32>,
    out: &Tensor<bf16>,
) {
    let [m, _] = x.shape();
    let [n] = sel.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = x[(tm, idx[(tm, sel[tn])])];
    }
}

/// Columns of an i8 tensor gathered (four values to a register).
#[fused_kernel]
pub(crate) fn select_columns_i8(x: &Tensor<i8>, idx: &Tensor<i32>, out: &Tensor<i8>) {
    let [m, _] = x.shape();
    let [n] = idx.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = x[(tm, idx[tn])];
    }
}

/// `n` indices below `below`, fresh.
fn indices(rng: &mut Rng, n: usize, below: usize) -> Vec<i32> {
    (0..n)
        .map(|_| (rng.next_u64() % below as u64) as i32)
        .collect()
}

#[test]
fn a_staged_gather_inside_another_gathers_the_right_elements() {
    let Some(_dev) = gpu() else { return };
    let mut rng = Rng::fresh();
    // Ragged: rows, the gathered widths and the output's columns are not
    // multiples of any block; x's rows have an odd length (staged element by
    // element, not in 16-byte pieces).
    for (m, w, k, n) in [(77, 1001, 301, 130), (5, 64, 40, 333)] {
        let xv: Vec<bf16> = random_vec(&mut rng, m * w, 1.0);
        let iv = indices(&mut rng, m * k, w);
        let sv = indices(&mut rng, n, k);
        let x = Tensor::from_slice(&xv, [m, w]).unwrap();
        let idx = Tensor::from_slice(&iv, [m, k]).unwrap();
        let sel = Tensor::from_slice(&sv, [n]).unwrap();
        let out = poisoned::<bf16>([m, n]).unwrap();
        gather_of_gather(&x, &idx, &sel, &out).unwrap();
        let want: Vec<f64> = (0..m * n)
            .map(|e| {
                let (r, c) = (e / n, e % n);
                f64::from(xv[r * w + iv[r * k + sv[c] as usize] as usize])
            })
            .collect();
        assert_eq!(host(&out), want, "{m}x{w}, {k} indices a row, {n} columns");
    }
}

#[test]
fn narrow_gathered_values_pack_four_to_a_register() {
    let Some(_dev) = gpu() else { return };
    let mut rng = Rng::fresh();
    // Staged (dense reads of each row) and read from global memory (a long
    // row of which the program reads too little to stage it).
    for (m, w, n) in [(33, 999, 517), (3, 50000, 70)] {
        let xv: Vec<i8> = (0..m * w).map(|_| rng.next_u64() as i8).collect();
        let iv = indices(&mut rng, n, w);
        let x = Tensor::from_slice(&xv, [m, w]).unwrap();
        let idx = Tensor::from_slice(&iv, [n]).unwrap();
        let out = poisoned::<i8>([m, n]).unwrap();
        select_columns_i8(&x, &idx, &out).unwrap();
        let want: Vec<f64> = (0..m * n)
            .map(|e| f64::from(xv[(e / n) * w + iv[e % n] as usize]))
            .collect();
        assert_eq!(host(&out), want, "{m}x{w} -> {n}");
    }
}
