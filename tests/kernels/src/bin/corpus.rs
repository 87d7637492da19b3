//! The corpus as a program: `corpus` checks every case on the current device
//! against float64; `corpus --bench` times each at its benchmark shape on the
//! GPU (CUDA events, warm-up, median of 50, L2 flushed) and prints one line
//! per case: milliseconds, GB/s and the share of the device-to-device copy
//! bandwidth (a 1 GiB copy's, and a copy of the case's own bytes'), untuned
//! (`TILEFUSE_AUTOTUNE=off`) or as the environment says (then with the config
//! each kernel ran at, tuned or the default).
//! A name filter may follow (`corpus --bench softmax`; several, comma-separated:
//! `corpus --bench add,rope`, a case matching any). `--config JSON` (repeatable)
//! times the case's first kernel at each config given instead
//! (`corpus --bench col_sum --config '{"block_sizes":[128,16],"num_warps":1,"num_stages":3,"group_m":8,"split":64}'`).
//! `corpus --source` prints each kernel's CUDA C at its untuned default for an
//! H100/H200 (no GPU needed), or the case's first kernel at the first `--config`
//! given. `--extents` fits the default to a launch's extents as the runtime
//! does (`corpus --source col_sum --extents 8192,16384`: the tile dimensions'
//! extents in the kernel's order, here `tn` then `tm`); without it the blocks
//! are the shape-blind default's. `--ptxas` adds ptxas's report for `sm_90a`
//! (registers, spills; NVRTC needed, no GPU).
//!
//! ```text
//! cargo run --release -p tilefuse-kernels --bin corpus -- [--bench|--source [--extents E,..] [--ptxas]] [--config JSON]... [FILTER]
//! ```

use clap::Parser;
use std::process::ExitCode;
use tilefuse::{time_gpu, Config, Device};

/// The corpus: checked against float64, or timed.
#[derive(Parser)]
struct Args {
    /// Time each case at its benchmark shape (else check it against float64).
    #[arg(long)]
    bench: bool,
    /// Print each kernel's CUDA C at its untuned default, or the first
    /// kernel's at the first --config (no GPU needed).
    #[arg(long)]
    source: bool,
    /// With --bench: time the case's first kernel at this config (JSON, as
    /// `Config` serializes: block_sizes, num_warps, num_stages, group_m, and
    /// optional fields such as split), not the default or tuned one. Repeatable.
    /// With --source: print the case's first kernel at the first one.
    #[arg(long, value_parser = tilefuse_testkit::config_json)]
    config: Vec<Config>,
    /// With --source: the extents of the kernels' tile dimensions at a launch,
    /// comma-separated in the kernel's order, to fit the default to as the
    /// runtime does (`_` for one not known).
    #[arg(long, value_parser = extents_arg)]
    extents: Option<Extents>,
    /// With --source: add ptxas's resource report for sm_90a (registers,
    /// spills) after each kernel's source.
    #[arg(long)]
    ptxas: bool,
    /// Only the cases whose name contains one of these comma-separated parts.
    filter: Option<String>,
}

fn main() -> ExitCode {
    let args: Args = match tilefuse_testkit::args("corpus") {
        Ok(a) => a,
        Err(code) => return code,
    };
    let (bench, filter) = (args.bench, args.filter.clone());
    if args.source {
        let shown = Shown {
            config: args.config.first(),
            extents: args.extents.as_ref().map_or(&[][..], |e| &e.0[..]),
            ptxas: args.ptxas,
        };
        return print_sources(filter.as_deref(), &shown);
    }
    if args.extents.is_some() || args.ptxas {
        eprintln!("error: --extents and --ptxas shape what --source prints: they need --source");
        return ExitCode::from(2);
    }
    if !args.config.is_empty() && !bench {
        eprintln!("error: --config times or prints configs: it needs --bench or --source");
        return ExitCode::from(2);
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
    // The default (or tuned) config, or each one given.
    let configs: Vec<Option<Config>> = match args.config.is_empty() {
        true => vec![None],
        false => args.config.iter().cloned().map(Some).collect(),
    };
    for case in cases {
        for cfg in &configs {
            let run = (case.bench)(&dev).and_then(|mut b| {
                let t = match cfg {
                    Some(c) => (case.kernels)()[0]
                        .with_config(c.clone(), || time_gpu(&dev, 5, 50, true, &mut b.run))?,
                    None => time_gpu(&dev, 5, 50, true, &mut b.run)?,
                };
                Ok((b.shape, b.bytes, t))
            });
            // A given config is named in the line (which the table script skips).
            let at = cfg.as_ref().map(|c| format!(" at {c}")).unwrap_or_default();
            let chosen = match cfg {
                Some(_) => String::new(),
                None => chosen_configs(&(case.kernels)()),
            };
            // Beside the 1 GiB copy's rate, a copy of the case's own bytes (half
            // read, half written), timed the same way: a kernel of ~70 µs pays
            // its launch and its ramp up and down as a copy that short does.
            let run = run.and_then(|(shape, bytes, t)| {
                let same = tilefuse::runtime::timing::copy_bandwidth_gbs(&dev, (bytes / 2).max(1))?;
                Ok((shape, bytes, t, same))
            });
            match run {
                Ok((shape, bytes, t, same)) => {
                    let gbs = bytes as f64 / t.median_ms / 1e6;
                    println!(
                        "bench {} {shape}{at}: {:.4} ms, {gbs:.0} GB/s, {:.1}% of copy, {:.1}% of a copy of its bytes{chosen}",
                        case.name,
                        t.median_ms,
                        100.0 * gbs / copy,
                        100.0 * gbs / same
                    );
                }
                Err(e) => {
                    ok = false;
                    println!("bench {}{at}: error: {e}", case.name);
                }
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The configs the autotuner chose for a case's kernels, as ` [name: config,
/// tuned|default; …]`: `default` where a tuning gave none (under
/// `TILEFUSE_AUTOTUNE=cached`, none in the cache; the table script then
/// leaves the case's tuned cell empty). Empty with tuning off.
fn chosen_configs(kernels: &[&tilefuse::KernelDef]) -> String {
    use tilefuse::runtime::autotune::{last_choice, last_was_tuned};
    let parts: Vec<String> = kernels
        .iter()
        .filter_map(|k| {
            let (c, tuned) = (last_choice(k.name())?, last_was_tuned(k.name())?);
            Some(format!(
                "{}: {c}, {}",
                k.name(),
                if tuned { "tuned" } else { "default" }
            ))
        })
        .collect();
    match parts.is_empty() {
        true => String::new(),
        false => format!(" [{}]", parts.join("; ")),
    }
}

/// The extents `--extents` gives, per tile dimension (`None`: not known).
#[derive(Clone)]
struct Extents(Vec<Option<usize>>);

fn extents_arg(s: &str) -> Result<Extents, String> {
    s.split(',')
        .map(|e| match e.trim() {
            "_" => Ok(None),
            n => n
                .parse::<usize>()
                .map(Some)
                .map_err(|_| format!("`{n}`: an extent is a whole number or `_`")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Extents)
}

/// What `--source` prints each kernel at: the first `--config`, else the
/// untuned default fitted to `extents`; `ptxas` adds the resource report.
struct Shown<'a> {
    config: Option<&'a Config>,
    extents: &'a [Option<usize>],
    ptxas: bool,
}

/// Prints the CUDA C of every kernel of the cases `filter` matches, at the
/// untuned default for a Hopper GPU with 132 SMs, fitted to `shown.extents`
/// as a launch at those extents fits it (with none, the shape-blind default:
/// a launch of col_sum at 16384×8192 takes `[128, 16]` where that is
/// `[1024, 2]`); with a config, only each case's first kernel, at that config.
fn print_sources(filter: Option<&str>, shown: &Shown) -> ExitCode {
    use tilefuse::codegen::{default_config_at, fit_default, fit_whole_dims, Target};
    let target = Target {
        shared_limit: 227 * 1024,
        wgmma: true,
        sms: 132,
    };
    let ext = shown.extents;
    let mut seen = std::collections::HashSet::new();
    for case in tilefuse_kernels::cases() {
        if filter.is_some_and(|f| !matches(f, case.name)) {
            continue;
        }
        let kernels = (case.kernels)();
        let take = if shown.config.is_some() {
            1
        } else {
            kernels.len()
        };
        for def in kernels.into_iter().take(take) {
            if !seen.insert(def.name()) {
                continue;
            }
            let lowered = def.declared_spec().and_then(|spec| {
                let cfg = match shown.config {
                    Some(c) => c.clone(),
                    None => {
                        let ir = def.ir()?;
                        let default = default_config_at(ir, &spec, target, ext);
                        fit_whole_dims(ir, fit_default(ir, default, ext), ext)
                    }
                };
                let l = def.lower(&spec, &cfg)?;
                let report = match shown.ptxas {
                    true => Some(tilefuse::jit::resource_report(
                        def.name(),
                        &l.source,
                        "sm_90a",
                    )?),
                    false => None,
                };
                Ok((l, cfg, report))
            });
            match lowered {
                Ok((l, cfg, report)) => {
                    println!("// kernel `{}`, config {cfg}\n{}", def.name(), l.source);
                    if let Some(r) = report {
                        for line in r.lines().filter(|x| !x.trim().is_empty()) {
                            println!("// {}", line.trim());
                        }
                    }
                }
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
