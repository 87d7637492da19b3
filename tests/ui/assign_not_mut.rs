use tilefuse::prelude::*;

#[fused_kernel]
fn add_one(x: &Tensor<f32>) -> Tensor<f32> {
    let [n] = x.shape();
    let mut out = Tensor::<f32>::empty([n])?;
    for ti in tile(n) {
        let y = x[ti];
        y = y + 1.0;
        out[ti] = y;
    }
    out
}

fn main() {}
