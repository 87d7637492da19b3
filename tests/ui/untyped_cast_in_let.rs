use tilefuse::prelude::*;

#[fused_kernel]
fn to_bf16(x: &Tensor<f32>) -> Tensor<bf16> {
    let [n] = x.shape();
    let mut out = Tensor::<bf16>::empty([n])?;
    for ti in tile(n) {
        let y = x[ti].cast();
        out[ti] = y;
    }
    out
}

fn main() {}
