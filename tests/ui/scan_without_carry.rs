use tilefuse::prelude::*;

#[fused_kernel]
fn prefix(x: &Tensor<f32>, out: &Tensor<f32>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        for tn in tile(n) {
            out[(tm, tn)] = x[(tm, tn)].cummax(tn);
        }
    }
}

fn main() {}
