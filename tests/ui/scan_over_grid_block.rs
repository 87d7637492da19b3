use tilefuse::prelude::*;

#[fused_kernel]
fn prefix(x: &Tensor<f32>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = x[(tm, tn)].cumsum(tn);
    }
}

fn main() {}
