use tilefuse::prelude::*;

#[fused_kernel]
fn first_row(a: &Tensor<f32>) -> Tensor<f32> {
    let [_, n] = a.shape();
    let mut out = Tensor::<f32>::empty([n])?;
    for tn in tile(n) {
        out[tn] = a[(0, tn)];
    }
    out
}

fn main() {}
