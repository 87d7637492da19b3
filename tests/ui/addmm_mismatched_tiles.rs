use tilefuse::prelude::*;

/// `addmm(acc, a, b)` contracts over the tile `a` and `b` share and `acc` lacks: here none.
#[fused_kernel]
fn matmul_wrong(a: &Tensor<bf16>, b: &Tensor<bf16>) -> Tensor<bf16> {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    let mut out = Tensor::<bf16>::empty([m, n])?;
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tm, tn)]);
        }
        out[(tm, tn)] = acc.cast();
    }
    out
}

fn main() {}
