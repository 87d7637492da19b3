//! Every kernel of the corpus compiles with NVRTC for sm_90a and sm_80, at its
//! default config and the first tuning seeds, with no warning (NVRTC's or
//! ptxas's), and on the general lowering its untuned default for sm_90a spills
//! no registers (a spill under a launch bound's register cap cost index_select
//! 19%; the row lowering has its own test at its seeds). Needs libnvrtc
//! only (no GPU): without it the test skips and says so, unless
//! `TILEFUSE_REQUIRE_NVRTC=1` (CI) or `TILEFUSE_REQUIRE_GPU=1`.

use tilefuse::codegen::{ConfigSpace, Target};

#[test]
fn every_kernel_compiles_for_sm_90a_and_sm_80() {
    if !tilefuse_testkit::nvrtc_or_skip() {
        return;
    }
    // Compile for real: cubins cached by an earlier run would not test NVRTC.
    std::env::set_var("TILEFUSE_SKIP_CACHE", "1");
    // ptxas's report comes only from a compile the CUDA compute cache did not serve.
    std::env::set_var("CUDA_CACHE_DISABLE", "1");
    let mut seen = std::collections::HashSet::new();
    let mut failed = Vec::new();
    for case in tilefuse_kernels::cases() {
        for def in (case.kernels)() {
            if !seen.insert(def.name()) {
                continue;
            }
            let spec = def.declared_spec().expect("the corpus declares its dtypes");
            let ir = def.ir().expect("IR");
            let target = Target {
                shared_limit: 227 * 1024,
                wgmma: true,
                sms: 132,
            };
            let space = ConfigSpace::new(ir, &spec, target);
            let mut configs: Vec<_> = space.seeds(&spec, true).into_iter().take(2).collect();
            // The untuned default fitted to a launch's extents (square tiles
            // for a transpose, more warps where programs are few), at a large
            // and a ragged size of every dimension.
            let mut defaults = Vec::new();
            for e in [4096, 77] {
                let c = tilefuse::codegen::fit_default(
                    ir,
                    configs[0].clone(),
                    &vec![Some(e); ir.dims.len()],
                );
                defaults.push(c.clone());
                if !configs.contains(&c) {
                    configs.push(c);
                }
            }
            for cfg in &configs {
                for arch in ["sm_90a", "sm_80"] {
                    let t = std::time::Instant::now();
                    // ptxas's report where the spill check reads it.
                    let mut checked = false;
                    let log = def.lower(&spec, cfg).and_then(|l| {
                        checked = arch == "sm_90a" && l.path == "general" && defaults.contains(cfg);
                        match checked {
                            true => {
                                tilefuse::runtime::jit::resource_report(def.name(), &l.source, arch)
                            }
                            false => {
                                tilefuse::runtime::jit::compile_cubin(def.name(), &l.source, arch)
                                    .map(|c| c.log)
                            }
                        }
                    });
                    match log {
                        Ok(log) if log.lines().any(|l| l.contains("warning")) => {
                            failed.push(format!("{} {cfg} {arch}: warnings:\n{log}", def.name()))
                        }
                        Ok(log)
                            if checked
                                && tilefuse_testkit::kernel_spill_stores(&log) != Some(0) =>
                        {
                            failed.push(format!("{} {cfg} {arch}: spills:\n{log}", def.name()))
                        }
                        Ok(_) => eprintln!(
                            "{} {cfg} {arch}: {:.0} ms",
                            def.name(),
                            t.elapsed().as_secs_f64() * 1e3
                        ),
                        Err(e) => failed.push(format!("{} {cfg} {arch}: {e}", def.name())),
                    }
                }
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
