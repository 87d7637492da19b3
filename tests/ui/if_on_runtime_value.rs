use tilefuse::prelude::*;

#[fused_kernel]
fn scale_or_copy(x: &Tensor<f32>, out: &Tensor<f32>, factor: usize) {
    let [m] = x.shape();
    for tm in tile([m]) {
        if factor == 1 {
            out[tm] = x[tm];
        } else {
            out[tm] = x[tm] * 2.0;
        }
    }
}

fn main() {}
