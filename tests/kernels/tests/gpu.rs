//! Every case of the corpus on the GPU: against its float64 reference, and
//! against interpret mode on the same inputs (the same seed makes the same
//! inputs on both devices), so the generated code and the interpreter's
//! semantics are checked one against the other. Skips without a GPU and says
//! so; `TILEFUSE_REQUIRE_GPU=1` makes that a failure.

use tilefuse::Device;

/// GPU vs interpret mode: f32 arithmetic in other orders (shuffles, atomics)
/// and the fast exponential, rounded to bf16 at most once more.
const AGREE: f64 = 1e-2;

#[test]
fn every_case_matches_float64_and_interpret_mode_on_the_gpu() {
    let dev = match Device::current() {
        Ok(d) if !d.is_host() => d,
        other => {
            if std::env::var("TILEFUSE_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!(
                    "TILEFUSE_REQUIRE_GPU=1 but no GPU is usable: {:?}",
                    other.err()
                );
            }
            eprintln!("SKIPPED (no GPU: this process runs in interpret mode)");
            return;
        }
    };
    // The default configs, as an untuned launch runs them.
    tilefuse::runtime::autotune::set_effort(Some(tilefuse::runtime::autotune::Effort::Off));
    let host = Device::interpreter();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
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
