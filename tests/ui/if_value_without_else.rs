use tilefuse::prelude::*;

#[fused_kernel]
fn maybe_relu(x: &Tensor<f32>, out: &Tensor<f32>, #[constexpr] act: bool) {
    let [m] = x.shape();
    for tm in tile([m]) {
        let y = if act { relu(x[tm]) };
        out[tm] = y;
    }
}

fn main() {}
