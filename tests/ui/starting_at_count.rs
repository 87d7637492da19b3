use tilefuse::prelude::*;

#[fused_kernel]
fn add_one(x: &Tensor<f32>, out: &Tensor<f32>, first: usize) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]).starting_at([first]) {
        out[(tm, tn)] = x[(tm, tn)] + 1.0;
    }
}

fn main() {}
