//! The examples' command lines: a misspelled flag or a malformed value is an
//! error that names it, before any GPU work, so a typo never runs the default
//! silently. Runs the examples as built by `cargo test` (or from
//! `TILEFUSE_EXAMPLES_DIR`); no GPU needed.

#[path = "common/launcher.rs"]
mod launcher;
use std::process::Command;

fn bench_matmul(args: &[&str]) -> (Option<i32>, String) {
    example("bench_matmul", args)
}

fn example(name: &str, args: &[&str]) -> (Option<i32>, String) {
    let bin = launcher::example(name);
    let out = Command::new(&bin)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", bin.display()));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_misspelled_flag_is_an_error_that_names_the_right_one() {
    let (code, err) = bench_matmul(&["--shape", "1x2x3"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("unexpected argument '--shape'"), "{err}");
    assert!(err.contains("'--shapes'"), "{err}");
}

#[test]
fn a_malformed_shape_is_an_error_that_says_what_was_expected() {
    let (code, err) = bench_matmul(&["--tune-only", "--shapes", "1x2,3x0x4"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("`1x2`: expected MxNxK"), "{err}");
}

/// Every example refuses an argument it does not know with a usage error
/// (status 2) naming it; none ignores it and runs. All but `mma_peak` (which
/// takes no argument) parse through clap.
#[test]
fn every_example_refuses_an_unknown_flag() {
    for name in [
        "matmul",
        "matmul_bias_gelu",
        "mma_peak",
        "softmax",
        "rms_norm",
        "layer_norm",
        "cross_entropy",
        "attention",
        "attention_backward",
        "all_gather_matmul",
        "fused_ops",
        "matmul_plan",
        "all_reduce_bias_rms_norm",
    ] {
        let (code, err) = example(name, &["--bogus"]);
        assert_eq!(code, Some(2), "{name}: {err}");
        assert!(err.contains("--bogus"), "{name}: {err}");
    }
}

/// The row and GEMM examples share one command line (`tilefuse_testkit`'s
/// `rows_main`, `mnk_main`): `--help` prints it, and a partial set of sizes is
/// an error rather than a silent default.
#[test]
fn the_shared_command_lines_have_help_and_take_all_sizes_or_none() {
    let bin = launcher::example("softmax");
    let help = Command::new(&bin)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", bin.display()));
    let text = String::from_utf8_lossy(&help.stdout);
    assert_eq!(help.status.code(), Some(0), "{text}");
    assert!(
        text.contains("Usage: softmax") && text.contains("--bench"),
        "{text}"
    );
    let (code, err) = example("softmax", &["1000"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("<N>"), "{err}");
    let (code, err) = example("matmul", &["64", "64"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("<K>"), "{err}");
}

/// Attention's key/value head count must divide the query heads: another is
/// a usage error that names the flag, not a silent multi-head run.
#[test]
fn attention_refuses_kv_heads_that_do_not_divide_the_heads() {
    for bad in ["3", "0"] {
        let (code, err) = example("attention", &["1", "4", "60", "32", "--kv-heads", bad]);
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains(&format!(
                "--kv-heads {bad}: expected a divisor of the 4 query heads"
            )),
            "{err}"
        );
    }
}

/// Attention's `--config` takes a `Config` as JSON: malformed JSON is a usage
/// error that shows it and says what was wrong.
#[test]
fn attention_refuses_a_malformed_config() {
    let (code, err) = example("attention", &["--config", "{\"block_sizes\": [1, 1"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--config <JSON>") && err.contains("block_sizes"),
        "{err}"
    );
}
