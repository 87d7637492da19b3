use tilefuse::prelude::*;

/// Signals into counters of the wrong dtype.
#[fused_kernel]
fn signal_into_floats(x: &Tensor<f32>, done: &Tensor<f32>) {
    let [m] = x.shape();
    for tm in tile(m) {
        x[tm] = x[tm] * 2.0;
        signal(done, 0, 1);
    }
}

fn main() {}
