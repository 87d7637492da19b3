use tilefuse::prelude::*;

/// `b` takes one index at a time: there is nothing to reduce along it.
#[fused_kernel]
fn batch_max(x: &Tensor<f32>, out: &Tensor<f32>, nb: usize) {
    let [_, n] = x.shape();
    for (b, tn) in tile([each(nb), n]) {
        out[tn] = x[(b, tn)].max(b);
    }
}

fn main() {}
