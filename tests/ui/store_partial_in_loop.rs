use tilefuse::prelude::*;

/// Row sums stored inside the column loop: each step overwrites the last.
#[fused_kernel]
fn row_sums(x: &Tensor<f32>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        for tn in tile(n) {
            out[tm] = x[(tm, tn)].sum(tn);
        }
    }
}

fn main() {}
