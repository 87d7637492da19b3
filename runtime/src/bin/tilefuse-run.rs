//! `tilefuse-run`: see `tilefuse_runtime::launcher` and `tilefuse-run --help`.

use std::process::ExitCode;
use tilefuse_runtime::launcher::{self, Outcome};

fn main() -> ExitCode {
    // Its own messages and the library's, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse_runtime::log::init();
    // `--help` prints and exits 0; a bad command line says why (a typo gets the
    // option it resembles) and exits 2.
    let args = match launcher::parse(std::env::args_os().skip(1)) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    // One rank per GPU by default; a machine without GPUs (or without a driver)
    // runs one.
    let nproc = args.nproc_per_node.unwrap_or_else(|| {
        tilefuse_runtime::Device::count()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or(1)
    });
    let store = match launcher::reserve_store_port(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tilefuse-run: {e}");
            return ExitCode::from(1);
        }
    };
    match launcher::run(&args, nproc, store) {
        Ok(outcome) => {
            match &outcome {
                Outcome::Success => {}
                Outcome::RankFailed { rank, status } => eprintln!(
                    "tilefuse-run: failed: rank {rank} ended with {}",
                    launcher::describe(status)
                ),
                Outcome::Interrupted { signal } => {
                    eprintln!("tilefuse-run: stopped by signal {signal}; every rank was stopped")
                }
            }
            ExitCode::from(outcome.exit_code().clamp(0, 255) as u8)
        }
        Err(e) => {
            eprintln!("tilefuse-run: {e}");
            ExitCode::from(1)
        }
    }
}
