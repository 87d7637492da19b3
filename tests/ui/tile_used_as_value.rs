use tilefuse::prelude::*;

#[fused_kernel]
fn iota(x: &Tensor<f32>) -> Tensor<f32> {
    let [n] = x.shape();
    let mut out = Tensor::<f32>::empty([n])?;
    for ti in tile(n) {
        out[ti] = x[ti] + ti;
    }
    out
}

fn main() {}
