//! Every kernel of the corpus compiles with NVRTC for sm_90a and sm_80, at its
//! default config and the first tuning seeds, with no warning (NVRTC's or
//! ptxas's). Needs libnvrtc only (no GPU): without it the test skips and says
//! so, unless `TILEFUSE_REQUIRE_NVRTC=1` (CI) or `TILEFUSE_REQUIRE_GPU=1`.

use tilefuse::codegen::{ConfigSpace, Target};

#[test]
fn every_kernel_compiles_for_sm_90a_and_sm_80() {
    if !tilefuse_testkit::nvrtc_or_skip() {
        return;
    }
    // Compile for real: cubins cached by an earlier run would not test NVRTC.
    std::env::set_var("TILEFUSE_SKIP_CACHE", "1");
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
            for e in [4096, 77] {
                let c = tilefuse::codegen::fit_default(
                    ir,
                    configs[0].clone(),
                    &vec![Some(e); ir.dims.len()],
                );
                if !configs.contains(&c) {
                    configs.push(c);
                }
            }
            for cfg in &configs {
                for arch in ["sm_90a", "sm_80"] {
                    let t = std::time::Instant::now();
                    match def.compile(&spec, cfg, arch) {
                        Ok(c) if c.log.lines().any(|l| l.contains("warning")) => failed
                            .push(format!("{} {cfg} {arch}: warnings:\n{}", def.name(), c.log)),
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
