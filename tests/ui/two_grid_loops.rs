use tilefuse::prelude::*;

#[fused_kernel]
fn scale_twice(x: &Tensor<f32>) -> Tensor<f32> {
    let [n] = x.shape();
    let mut out = Tensor::<f32>::empty([n])?;
    for ti in tile(n) {
        out[ti] = x[ti] * 2.0;
    }
    for ti in tile(n) {
        out[ti] = out[ti] * 2.0;
    }
    out
}

fn main() {}
