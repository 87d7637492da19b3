use tilefuse::prelude::*;

/// An `if` branches the whole program: its condition cannot be per element.
#[fused_kernel]
fn relu_by_hand(x: &Tensor<f32>, out: &Tensor<f32>) {
    let [m] = x.shape();
    for tm in tile([m]) {
        if x[tm] > 0.0 {
            out[tm] = x[tm];
        } else {
            out[tm] = x[tm] * 0.0;
        }
    }
}

fn main() {}
