use tilefuse::prelude::*;

#[fused_kernel]
fn spin(x: &Tensor<f32>) -> Tensor<f32> {
    let [n] = x.shape();
    let mut out = Tensor::<f32>::empty([n])?;
    for ti in tile(n) {
        let mut y = x[ti];
        while 1 < 2 {
            y = y * 2.0;
        }
        out[ti] = y;
    }
    out
}

fn main() {}
