use tilefuse::prelude::*;

/// A gather whose indices are floats.
#[fused_kernel]
fn lookup(table: &Tensor<f32>, pos: &Tensor<f32>, out: &Tensor<f32>) {
    let [n] = pos.shape();
    for tn in tile(n) {
        out[tn] = table[pos[tn]];
    }
}

fn main() {}
