//! The `corpus` program's command line, without a GPU: `--source` prints a
//! kernel at the default a launch at the given extents takes, and refuses
//! what it cannot read.

use std::process::Command;

fn corpus(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_corpus"))
        .args(args)
        .output()
        .expect("the corpus program runs")
}

/// The shape-blind default and the one fitted to 8192 columns × 16384 rows
/// (col_sum's tile dimensions in order: `tn`, then `tm`), as a launch fits it.
#[test]
fn source_prints_the_default_fitted_to_the_extents() {
    let first_line = |args: &[&str]| {
        let out = corpus(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().next().unwrap_or_default().to_owned()
    };
    let blind = first_line(&["--source", "col_sum"]);
    let fitted = first_line(&["--source", "col_sum", "--extents", "8192,16384"]);
    assert!(
        blind.starts_with("// kernel `col_sum`, config block_sizes="),
        "{blind}"
    );
    assert_ne!(blind, fitted, "the extents changed nothing");
    assert!(fitted.contains("block_sizes=[128, 16]"), "{fitted}");
    // An unknown extent leaves that dimension as the shape-blind default has it.
    let half = first_line(&["--source", "col_sum", "--extents", "8192,_"]);
    assert!(half.starts_with("// kernel `col_sum`"), "{half}");
}

#[test]
fn extents_that_are_not_numbers_or_without_source_are_refused() {
    let out = corpus(&["--source", "col_sum", "--extents", "8192,x"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`x`: an extent is a whole number or `_`"),
        "{err}"
    );
    let out = corpus(&["--extents", "8192", "col_sum"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("they need --source"));
}

/// `--ptxas` adds ptxas's report after the source (NVRTC needed: skipped
/// without it, unless the run requires it).
#[test]
fn ptxas_reports_the_registers_after_the_source() {
    if !tilefuse_testkit::nvrtc_or_skip() {
        return;
    }
    let out = corpus(&["--source", "col_sum", "--extents", "8192,16384", "--ptxas"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let kernel = text.find("__global__").expect("the kernel's source");
    let report = text
        .find("// ptxas info    : Used ")
        .expect("the registers");
    assert!(kernel < report, "{text}");
    assert!(text.contains("spill stores"), "{text}");
}
