//! The autotuner on the GPU: a quick tuning of the example matmul on a ragged
//! shape, its result and compiled cubins in the on-disk caches, explicit
//! candidates (one that cannot compile is dropped, not fatal), and a kernel that
//! `wait`s tuned with its flags unset (the tuner sets its own).

use crate::common::examples::matmul::matmul;
use crate::common::{err_vs, gpu_alone, host};
use tilefuse::prelude::*;
use tilefuse::runtime::autotune::{self, Effort};
use tilefuse_testkit::random_tensor;

fn files_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

#[test]
fn quick_tuning_picks_a_checked_config_and_caches_it() {
    let Some(_gpu) = gpu_alone() else { return };
    let cache = std::env::temp_dir().join(format!("tilefuse-autotune-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    std::env::set_var("TILEFUSE_CACHE_DIR", &cache);
    autotune::set_effort(Some(Effort::Quick));
    let result = std::panic::catch_unwind(|| {
        let (m, n, k) = (1000, 1500, 700);
        let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);

        let before = autotune::counters();
        let t0 = std::time::Instant::now();
        let c = matmul(&a, &b).unwrap();
        let took = t0.elapsed();
        assert!(err_vs(&c, &reference) <= 1e-2);
        let after = autotune::counters();
        assert!(
            after.bench_runs >= before.bench_runs + 4,
            "{before} -> {after}"
        );
        let runs = autotune::tuned_in_process();
        let (name, t) = runs.last().expect("a tuning run");
        assert_eq!(name, "matmul");
        assert!(t.ms <= t.default_ms, "{t:?}");
        assert!(took.as_secs_f64() < 30.0, "quick tuning took {took:?}");
        eprintln!("tuned in {took:?}: {t:?}");

        // The same shape bucket again: no tuning, no compile.
        let again = autotune::counters();
        let a2 = random_tensor::<bf16>([1020, k], 1.0).unwrap();
        let c2 = matmul(&a2, &b).unwrap();
        let r2 = host(&tilefuse::cublas::matmul(&a2, &b).unwrap());
        assert!(err_vs(&c2, &r2) <= 1e-2);
        assert_eq!(autotune::counters().bench_runs, again.bench_runs);
        assert!(files_under(&cache.join("tuned")) >= 1);
        assert!(files_under(&cache.join("cubins")) >= 4);

        // `cached`: the tuned bucket takes its result, an untuned one the
        // default; neither tunes.
        autotune::set_effort(Some(Effort::Cached));
        let before = autotune::counters();
        let c3 = matmul(&a2, &b).unwrap();
        assert!(err_vs(&c3, &r2) <= 1e-2);
        assert_eq!(autotune::last_was_tuned("matmul"), Some(true));
        assert_eq!(autotune::last_choice("matmul").as_ref(), Some(&t.config));
        let (a4, b4, r4) = crate::common::gemm_operands::<bf16>(300, 200, 100);
        let c4 = matmul(&a4, &b4).unwrap();
        assert!(err_vs(&c4, &r4) <= 1e-2);
        assert_eq!(autotune::last_was_tuned("matmul"), Some(false));
        assert_eq!(autotune::counters().bench_runs, before.bench_runs);
        autotune::set_effort(Some(Effort::Quick));

        // Explicit candidates, one of which cannot be lowered: dropped, not fatal.
        matmul::kernel().tune_over(vec![
            Config::new(&[64, 64, 32]).num_warps(4).num_stages(3),
            // An N block of 48 is not a shape the GEMM lowering takes.
            Config::new(&[64, 48, 32]).num_warps(4).num_stages(3),
        ]);
        let before = autotune::counters();
        let c3 = matmul(&a, &b).unwrap();
        assert!(err_vs(&c3, &reference) <= 1e-2);
        // The default and the valid candidate were benchmarked; the third was dropped.
        assert!(autotune::counters().bench_runs >= before.bench_runs + 2);
        let (_, t) = autotune::tuned_in_process().last().cloned().expect("tuned");
        assert_eq!(t.candidates, 3, "{t:?}");
        matmul::kernel().tune_over(Vec::new());
    });
    autotune::set_effort(Some(Effort::Off));
    let _ = std::fs::remove_dir_all(&cache);
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// Rows of A gated by flags (as in the all-gather matmul).
#[fused_kernel]
fn gated(a: &Tensor<bf16>, b: &Tensor<bf16>, flags: &Tensor<u32>, out: &Tensor<bf16>) {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    for (tm, tn) in tile([m, n]) {
        wait(flags, tm.begin() / 256, 1);
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = acc.cast();
    }
}

#[test]
fn a_waiting_kernel_is_tuned_on_set_flags_of_its_own() {
    let Some(_gpu) = gpu_alone() else { return };
    std::env::set_var("TILEFUSE_SKIP_CACHE", "1");
    autotune::set_effort(Some(Effort::Quick));
    let result = std::panic::catch_unwind(|| {
        let (m, n, k) = (512, 512, 256);
        let (a, b, reference) = crate::common::gemm_operands::<bf16>(m, n, k);
        // The flags are set: tuning must neither wait on nor change them.
        let flags = Tensor::<u32>::full([m / 256], 1).unwrap();
        let out = tilefuse_testkit::poisoned::<bf16>([m, n]).unwrap();
        let before = autotune::counters();
        gated(&a, &b, &flags, &out).unwrap();
        assert!(err_vs(&out, &reference) <= 1e-2);
        assert!(autotune::counters().bench_runs > before.bench_runs);
        assert_eq!(flags.to_vec().unwrap(), vec![1, 1]);
    });
    autotune::set_effort(Some(Effort::Off));
    std::env::remove_var("TILEFUSE_SKIP_CACHE");
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}
