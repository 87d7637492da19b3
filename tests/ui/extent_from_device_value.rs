use tilefuse::prelude::*;

/// A jagged loop whose length is computed in the program: `tile(n)` takes a host extent.
#[fused_kernel]
fn segment_sums(x: &Tensor<f32>, offsets: &Tensor<i64>, out: &Tensor<f32>, nb: usize) {
    for b in tile(each(nb)) {
        let len = offsets[b + 1] - offsets[b];
        let mut acc = zeros::<f32>([]);
        for tn in tile(len) {
            acc = acc + x[tn].sum(tn);
        }
        out[b] = acc;
    }
}

fn main() {}
