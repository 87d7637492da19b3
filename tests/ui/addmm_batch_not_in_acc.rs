use tilefuse::prelude::*;

#[fused_kernel]
fn bmm(a: &Tensor<bf16>, b: &Tensor<bf16>, c: &Tensor<bf16>) {
    let [nb, m, k] = a.shape();
    let [_, _, n] = b.shape();
    for (tb, tm, tn) in tile([nb, m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tb, tm, tk)], b[(tb, tk, tn)]);
        }
        c[(tb, tm, tn)] = acc.cast();
    }
}

fn main() {}
