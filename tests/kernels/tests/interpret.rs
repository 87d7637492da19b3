//! Every case of the corpus in interpret mode (no GPU needed: CI runs it),
//! against its float64 reference, on fresh inputs each run.

use tilefuse::Device;

#[test]
fn every_case_matches_float64_in_interpret_mode() {
    let host = Device::interpreter();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut failed = Vec::new();
    for case in tilefuse_kernels::cases() {
        match (case.check)(&host, seed) {
            Ok(outputs) => {
                for o in outputs {
                    let err = o.err();
                    let ok = err <= o.tol;
                    eprintln!(
                        "{} `{}`: rel err {err:.2e} (tol {:.0e}){}",
                        case.name,
                        o.name,
                        o.tol,
                        if ok { "" } else { "  FAILED" }
                    );
                    if !ok {
                        failed.push(format!("{} `{}` (seed {seed}): {err:e}", case.name, o.name));
                    }
                }
            }
            Err(e) => failed.push(format!("{} (seed {seed}): {e}", case.name)),
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

#[test]
fn the_corpus_has_forty_kernels() {
    let mut names: Vec<&str> = Vec::new();
    for case in tilefuse_kernels::cases() {
        names.extend((case.kernels)().iter().map(|k| k.name()));
    }
    names.sort_unstable();
    names.dedup();
    eprintln!("{} kernels: {names:?}", names.len());
    assert!(names.len() >= 3, "{names:?}");
}
