//! Command lines of the examples: `clap` parses them, so `--help` works and a
//! mistyped flag or a stray argument is an error (exit status 2) naming it,
//! never silently ignored.

use clap::Parser;
use std::process::ExitCode;
use tilefuse_runtime::Result;

/// A config given as JSON on a command line (`--config`, a `clap`
/// `value_parser`), as `Config` serializes: a malformed one is a usage error
/// that shows the text and what was wrong.
///
/// ```
/// let c = tilefuse_testkit::config_json(r#"{"block_sizes":[128,16],"num_warps":1,"num_stages":1,"group_m":8}"#).unwrap();
/// assert_eq!(c.num_warps, 1);
/// assert!(tilefuse_testkit::config_json("{bad").unwrap_err().contains("{bad"));
/// ```
pub fn config_json(s: &str) -> std::result::Result<tilefuse_codegen::Config, String> {
    serde_json::from_str(s).map_err(|e| format!("`{s}`: {e}"))
}

/// Parses this program's arguments into `A` (a `clap` derive), named `program`
/// in messages; `Err` holds the exit code after printing the help (0) or the
/// error and usage (2).
///
/// ```no_run
/// #[derive(clap::Parser)]
/// struct Args {
///     /// Sequence length.
///     #[arg(default_value_t = 4096)]
///     seq: usize,
///     #[arg(long)]
///     bench: bool,
/// }
/// let args: Args = match tilefuse_testkit::args("attention") {
///     Ok(a) => a,
///     Err(code) => std::process::exit(if code == std::process::ExitCode::SUCCESS { 0 } else { 2 }),
/// };
/// # let _ = args.seq;
/// ```
pub fn args<A: Parser>(program: &'static str) -> std::result::Result<A, ExitCode> {
    let parsed = A::command()
        .name(program)
        .try_get_matches()
        .and_then(|m| A::from_arg_matches(&m));
    parsed.map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// The exit code of a self-checking program: success only when it ran and its
/// check passed; errors are printed.
pub fn exit_code(outcome: Result<bool>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("check FAILED");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The default sizes of a GEMM example in interpret mode: ragged against
/// every block size, and a few seconds on one CPU core.
pub const INTERPRET_MNK: [usize; 3] = [200, 168, 136];

/// The default sizes of a row-kernel example in interpret mode.
pub const INTERPRET_ROWS: [usize; 2] = [100, 1000];

/// The sizes a command line gave (`given`, all `N` of them), else `default`,
/// or in interpret mode `cpu` (with a line saying so).
pub fn sizes<const N: usize>(given: &[usize], default: [usize; N], cpu: [usize; N]) -> [usize; N] {
    match <[usize; N]>::try_from(given) {
        Ok(s) => s,
        Err(_) => default_sizes(default, cpu),
    }
}

/// `default`, or in interpret mode `cpu` (with a line saying so).
fn default_sizes<const N: usize>(default: [usize; N], cpu: [usize; N]) -> [usize; N] {
    if !tilefuse_runtime::mode::interpreting() {
        return default;
    }
    println!("interpret mode: default sizes {cpu:?} for the CPU (the GPU's are {default:?})");
    cpu
}

/// A GEMM example's command line.
#[derive(Parser)]
#[command(about = "Runs the kernel at M×N×K, checks it against a reference and times it")]
struct Mnk {
    /// Rows of A and C (give M, N and K, or none for the defaults).
    #[arg(requires_all = ["n", "k"])]
    m: Option<usize>,
    /// Columns of B and C.
    n: Option<usize>,
    /// The contracted dimension.
    k: Option<usize>,
}

/// A row-kernel example's command line.
#[derive(Parser)]
#[command(
    about = "Runs the kernel on M rows of N, checks it against float64 and optionally times it"
)]
struct Rows {
    /// Rows (give M and N, or neither for the defaults).
    #[arg(requires = "n")]
    m: Option<usize>,
    /// Row length.
    n: Option<usize>,
    /// Time it against the device's copy bandwidth.
    #[arg(long)]
    bench: bool,
}

/// The `main` of a self-checking `[M N K]` example: parses the sizes (or takes
/// `default`; in interpret mode [`INTERPRET_MNK`]), runs `run`, and turns its
/// outcome into the exit code.
pub fn mnk_main(
    program: &'static str,
    default: [usize; 3],
    run: impl FnOnce(usize, usize, usize) -> Result<bool>,
) -> ExitCode {
    let a: Mnk = match args(program) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let [m, n, k] = match (a.m, a.n, a.k) {
        (Some(m), Some(n), Some(k)) => [m, n, k],
        _ => default_sizes(default, INTERPRET_MNK),
    };
    exit_code(run(m, n, k))
}

/// The `main` of a self-checking row-kernel example (`[M N] [--bench]`): parses the
/// sizes (or takes `default`; in interpret mode [`INTERPRET_ROWS`]), runs
/// `run(m, n, bench)`, and turns its outcome into the exit code.
pub fn rows_main(
    program: &'static str,
    default: [usize; 2],
    run: impl FnOnce(usize, usize, bool) -> Result<bool>,
) -> ExitCode {
    let a: Rows = match args(program) {
        Ok(a) => a,
        Err(code) => return code,
    };
    let [m, n] = match (a.m, a.n) {
        (Some(m), Some(n)) => [m, n],
        _ => default_sizes(default, INTERPRET_ROWS),
    };
    exit_code(run(m, n, a.bench))
}
