//! Integer atomics that the general lowering keeps in private copies in
//! shared memory while the programs walk the grid, checked exactly against
//! the host's sums.

use crate::common::gpu;
use tilefuse::prelude::*;
use tilefuse_testkit::Rng;

/// `out[ids[i], c] += values[i, c]`: a copy of every segment by the
/// program's columns, kept while its programs walk the rows.
#[fused_kernel]
pub(crate) fn segment_counts(values: &Tensor<i32>, ids: &Tensor<i32>, out: &Tensor<i32>) {
    let [n, d] = values.shape();
    for (tn, td) in tile([n, d]) {
        atomic_add(out[(ids[tn], td)], values[(tn, td)]);
    }
}

/// Exact sums at shapes that take the private copies and walk the grid
/// (many rows a program, columns ragged against the tile) and at one that
/// keeps the atomics global (few rows: a program's elements do not outweigh
/// its copy).
#[test]
fn segment_counts_in_private_copies_are_exact() {
    let Some(_dev) = gpu() else { return };
    let mut rng = Rng::new(7);
    for (n, d, nseg) in [(200_003, 100, 7), (50_001, 300, 13), (301, 77, 200)] {
        let ids: Vec<i32> = (0..n)
            .map(|_| (rng.next_u64() % nseg as u64) as i32)
            .collect();
        let values: Vec<i32> = (0..n * d)
            .map(|_| (rng.next_u64() % 201) as i32 - 100)
            .collect();
        let mut want = vec![0i64; nseg * d];
        for (i, &s) in ids.iter().enumerate() {
            for c in 0..d {
                want[s as usize * d + c] += i64::from(values[i * d + c]);
            }
        }
        let out = Tensor::<i32>::zeros([nseg, d]).unwrap();
        segment_counts(
            &Tensor::from_slice(&values, [n, d]).unwrap(),
            &Tensor::from_slice(&ids, [n]).unwrap(),
            &out,
        )
        .unwrap();
        let got = out.to_vec().unwrap();
        let wrong = got
            .iter()
            .zip(&want)
            .filter(|(g, w)| i64::from(**g) != **w)
            .count();
        assert_eq!(wrong, 0, "{n}x{d} into {nseg}: {wrong} sums differ");
    }
}
