use tilefuse::prelude::*;

#[fused_kernel]
fn add_one(x: &Tensor<f32>, out: &Tensor<f32>) {
    let [n] = x.shape();
    for tn in tile(n).rev() {
        out[tn] = x[tn] + 1.0;
    }
}

fn main() {}
