//! Every case of the corpus on the GPU: against its float64 reference, and
//! against interpret mode on the same inputs (the same seed makes the same
//! inputs on both devices), so the generated code and the interpreter's
//! semantics are checked one against the other. Skips without a GPU and says
//! so; `TILEFUSE_REQUIRE_GPU=1` makes that a failure.

use tilefuse::Device;

/// GPU vs interpret mode: f32 arithmetic in other orders (shuffles, atomics)
/// and the fast exponential, rounded to bf16 at most once more.
const AGREE: f64 = 1e-2;

/// The GPU, or `None` after saying why the test is skipped
/// (`TILEFUSE_REQUIRE_GPU=1`: a failure instead).
fn gpu_or_skip() -> Option<std::sync::Arc<Device>> {
    match Device::current() {
        Ok(d) if !d.is_host() => Some(d),
        other => {
            if std::env::var("TILEFUSE_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!(
                    "TILEFUSE_REQUIRE_GPU=1 but no GPU is usable: {:?}",
                    other.err()
                );
            }
            eprintln!("SKIPPED (no GPU: this process runs in interpret mode)");
            None
        }
    }
}

fn fresh_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

#[test]
fn every_case_matches_float64_and_interpret_mode_on_the_gpu() {
    let Some(dev) = gpu_or_skip() else { return };
    // The default configs, as an untuned launch runs them.
    tilefuse::runtime::autotune::set_effort(Some(tilefuse::runtime::autotune::Effort::Off));
    let host = Device::interpreter();
    let seed = fresh_seed();
    let only = std::env::var("CORPUS_ONLY").ok();
    let mut failed = Vec::new();
    for case in tilefuse_kernels::cases() {
        if only.as_deref().is_some_and(|o| !case.name.contains(o)) {
            continue;
        }
        let gpu = (case.check)(&dev, seed).and_then(|o| dev.synchronize().map(|()| o));
        let cpu = (case.check)(&host, seed);
        match (gpu, cpu) {
            (Ok(g), Ok(c)) => {
                for (o, i) in g.iter().zip(&c) {
                    let (err, diff) = (o.err(), tilefuse_kernels::harness::rel(&o.got, &i.got));
                    let ok = err <= o.tol && diff <= AGREE.max(o.tol);
                    eprintln!(
                        "{} `{}`: rel err {err:.2e} (tol {:.0e}), GPU vs interpret {diff:.2e}{}",
                        case.name,
                        o.name,
                        o.tol,
                        if ok { "" } else { "  FAILED" }
                    );
                    if !ok {
                        failed.push(format!(
                            "{} `{}` (seed {seed}): err {err:e}, vs interpret {diff:e}",
                            case.name, o.name
                        ));
                    }
                }
            }
            (g, c) => failed.push(format!(
                "{} (seed {seed}): GPU {:?}, interpret {:?}",
                case.name,
                g.err().map(|e| e.to_string()),
                c.err().map(|e| e.to_string())
            )),
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

/// The column walks at eight warps down the rows, their walk shared among
/// programs (the tall shapes of the checks): every warp ends with the
/// column's sums, only warp 0 reads the other programs' shares, and the
/// others take the result from it through shared memory.
#[test]
fn column_walks_of_eight_warps_match_float64_on_the_gpu() {
    let Some(dev) = gpu_or_skip() else { return };
    let seed = fresh_seed();
    for stages in [1, 2] {
        let cfg = tilefuse::Config::new(&[256, 64])
            .num_warps(8)
            .num_stages(stages)
            .split(16);
        for name in ["col_sum", "col_max_count", "col_argmin", "layer_norm_dwdb"] {
            let case = tilefuse_kernels::cases()
                .into_iter()
                .find(|c| c.name == name)
                .unwrap_or_else(|| panic!("no case `{name}`"));
            let kernel = (case.kernels)()[0];
            let outs = kernel
                .with_config(cfg.clone(), || (case.check)(&dev, seed))
                .unwrap_or_else(|e| panic!("{name} at {cfg}: {e}"));
            for o in outs {
                let err = o.err();
                assert!(
                    err <= o.tol,
                    "{name} `{}` at {cfg} (seed {seed}): rel err {err:e} over {:e}",
                    o.name,
                    o.tol
                );
            }
        }
    }
}
