use tilefuse::prelude::*;

/// A histogram in bytes: there is no atomic add on 8-bit integers.
#[fused_kernel]
fn histogram(ids: &Tensor<i64>, counts: &Tensor<u8>) {
    let [n] = ids.shape();
    for tn in tile(n) {
        atomic_add(counts[ids[tn]], 1);
    }
}

fn main() {}
