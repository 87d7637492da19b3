//! `signal(counters, index, value)`: after a tile's stores, one thread of the
//! threads that stored adds to a counter, behind a barrier over them and a
//! system-scope fence (no GPU needed: the lowering is checked).

use tilefuse::codegen::Spec;
use tilefuse::prelude::*;

/// A matmul whose tiles count their area per band of `rows_per_band` rows.
#[fused_kernel]
fn counted_matmul(
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    out: &Tensor<bf16>,
    done: &Tensor<u32>,
    rows_per_band: usize,
) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = acc.cast();
        signal(
            done,
            tm.begin() / rows_per_band,
            (tm.end() - tm.begin()) * (tn.end() - tn.begin()),
        );
    }
}

/// Counts per row of a pointwise kernel.
#[fused_kernel]
fn counted_copy(x: &Tensor<f32>, out: &Tensor<f32>, done: &Tensor<u32>) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = x[(tm, tn)];
        signal(done, tm.begin(), tn.end() - tn.begin());
    }
}

fn lowered(def: &tilefuse::KernelDef, config: &Config) -> String {
    let spec: Spec = def.declared_spec().expect("declared dtypes");
    def.lower(&spec, config).expect("lowers").source
}

/// The signal comes after the last store, behind `barrier`, with the fence.
fn assert_signal_after_stores(src: &str, barrier: &str) {
    let at = src.find("atomicAdd_system").expect("the signal's atomic");
    let store = src.rfind("] = ").expect("a store");
    let bar = src[..at]
        .rfind(barrier)
        .expect("a barrier before the atomic");
    let fence = src[..at]
        .rfind("__threadfence_system()")
        .expect("a fence before the atomic");
    assert!(
        store < bar && bar < fence,
        "order: store, barrier, fence, atomic\n{src}"
    );
}

#[test]
fn matmul_signals_after_its_stores_on_both_paths() {
    let def = counted_matmul::kernel();
    let portable = Config::new(&[128, 128, 32]).num_warps(8).num_stages(3);
    assert_signal_after_stores(&lowered(def, &portable), "__syncthreads()");
    let mut hopper = Config::new(&[128, 256, 64]).num_warps(8).num_stages(4);
    hopper.wgmma = true;
    hopper.persistent = true;
    hopper.cluster_m = 2;
    // Only the consumer warpgroups store: a named barrier over them (2 × 128 threads).
    let src = lowered(def, &hopper);
    assert_signal_after_stores(&src, "bar.sync 1, 256;");
    // A cluster's second block past M (its tile starts beyond the rows) stores
    // nothing, and must count nothing.
    let at = src
        .find("const long long tf_si")
        .expect("the signal's index");
    let guard = &src[src[..at].rfind("if (").expect("the signal's guard")..at];
    assert!(
        guard.contains("&& tb0 < s") && guard.contains("&& tb1 < s"),
        "the signal is not guarded by the grid's extents:\n{guard}"
    );
}

#[test]
fn pointwise_kernels_signal_too() {
    let def = counted_copy::kernel();
    let src = lowered(def, &def.config().expect("default config"));
    assert_signal_after_stores(&src, "__syncthreads()");
}
