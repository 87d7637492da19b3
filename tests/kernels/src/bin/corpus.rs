//! The corpus as a program: `corpus` checks every case on the current device
//! against float64; `corpus --bench` times each at its benchmark shape on the
//! GPU (CUDA events, warm-up, median of 50, L2 flushed) and prints one line
//! per case: milliseconds, GB/s and the share of the device-to-device copy
//! bandwidth, untuned (`TILEFUSE_AUTOTUNE=off`) or as the environment says.
//! A name filter may follow (`corpus --bench softmax`; several, comma-separated:
//! `corpus --bench add,rope`, a case matching any). `corpus --source`
//! prints each kernel's CUDA C at its untuned default for an H100/H200 (no
//! GPU needed; extents unknown, so blocks not fitted to a launch).
//!
//! ```text
//! cargo run --release -p tilefuse-kernels --bin corpus -- [--bench|--source] [FILTER]
//! ```

use std::process::ExitCode;
use tilefuse::{time_gpu, Device};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let bench = args.iter().any(|a| a == "--bench");
    let filter = args.iter().find(|a| !a.starts_with("--")).cloned();
    if args.iter().any(|a| a == "--source") {
        return print_sources(filter.as_deref());
    }
    let dev = match Device::current() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut ok = true;
    let cases = tilefuse_kernels::cases()
        .into_iter()
        .filter(|c| filter.as_deref().is_none_or(|f| matches(f, c.name)));
    if !bench {
        for case in cases {
            match (case.check)(&dev, 7) {
                Ok(outs) => {
                    for o in outs {
                        let err = o.err();
                        let pass = err <= o.tol;
                        ok &= pass;
                        println!(
                            "check {} `{}`: rel err {err:.2e} ({})",
                            case.name,
                            o.name,
                            if pass { "ok" } else { "FAILED" }
                        );
                    }
                }
                Err(e) => {
                    ok = false;
                    println!("check {}: error: {e}", case.name);
                }
            }
        }
        return if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    if let Err(e) = dev.require_gpu("the corpus benchmark") {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let copy = match tilefuse::runtime::timing::copy_bandwidth_gbs(&dev, 1 << 30) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "device: {}; device-to-device copy {copy:.0} GB/s",
        dev.name()
    );
    for case in cases {
        let run = (case.bench)(&dev).and_then(|mut b| {
            let t = time_gpu(&dev, 5, 50, true, &mut b.run)?;
            Ok((b.shape, b.bytes, t))
        });
        match run {
            Ok((shape, bytes, t)) => {
                let gbs = bytes as f64 / t.median_ms / 1e6;
                println!(
                    "bench {} {shape}: {:.4} ms, {gbs:.0} GB/s, {:.1}% of copy",
                    case.name,
                    t.median_ms,
                    100.0 * gbs / copy
                );
            }
            Err(e) => {
                ok = false;
                println!("bench {}: error: {e}", case.name);
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints the CUDA C of every kernel of the cases `filter` matches, at the
/// untuned default for a Hopper GPU with 132 SMs.
fn print_sources(filter: Option<&str>) -> ExitCode {
    use tilefuse::codegen::{default_config_at, Target};
    let target = Target {
        shared_limit: 227 * 1024,
        wgmma: true,
        sms: 132,
    };
    let mut seen = std::collections::HashSet::new();
    for case in tilefuse_kernels::cases() {
        if filter.is_some_and(|f| !matches(f, case.name)) {
            continue;
        }
        for def in (case.kernels)() {
            if !seen.insert(def.name()) {
                continue;
            }
            let lowered = def.declared_spec().and_then(|spec| {
                let cfg = default_config_at(def.ir()?, &spec, target, &[]);
                Ok((def.lower(&spec, &cfg)?, cfg))
            });
            match lowered {
                Ok((l, cfg)) => println!("// kernel `{}`, config {cfg}\n{}", def.name(), l.source),
                Err(e) => {
                    eprintln!("error: kernel `{}`: {e}", def.name());
                    return ExitCode::FAILURE;
                }
            }
        }
    }
    ExitCode::SUCCESS
}

/// Whether a case's name contains one of the filter's comma-separated parts.
fn matches(filter: &str, name: &str) -> bool {
    filter
        .split(',')
        .any(|part| !part.is_empty() && name.contains(part))
}
