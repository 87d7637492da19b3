//! Benchmark: the generated bf16 GEMM against cuBLAS, same run, same GPU.
//!
//! ```text
//! cargo run --release --example bench_matmul [-- --sweep] [--tune]
//! cargo run --release --example bench_matmul -- --tune-only [--shapes MxNxK,...]
//! cargo run --release --example bench_matmul -- --epilogue [--shapes MxNxK,...]
//! cargo run --release --example bench_matmul -- --pingpong [--shapes MxNxK,...]
//! cargo run --release --example bench_matmul -- --fill [--shapes MxNxK,...]
//! ```
//!
//! `--epilogue` times the Hopper default with and without the TMA-store
//! epilogue (`Config::tma_store`) at the same shapes.
//!
//! `--pingpong` times the Hopper default (two consumer warpgroups sharing each
//! tile) against ping-pong configs (`Config::pingpong`: each warpgroup its own
//! tiles, taken in turn) at the same shapes.
//!
//! `--fill` times the Hopper default against configs of smaller tiles, for
//! shapes whose default tiles do not fill the GPU.
//!
//! `--tune-only` compares the autotuner's pick with the config an untuned launch
//! uses on this GPU (the Hopper path's default on an H100/H200), at the large
//! shapes above and at LLM layer shapes (prefill-sized M, ragged sizes), each
//! timed sustained in interleaved rounds (median of 6), with cuBLAS for scale.
//!
//! For each shape it times, sustained (each after 300 ms of running it) in
//! interleaved rounds (median of 6), cuBLAS, the config an untuned launch uses
//! there (`KernelDef::default_at`: on an sm_90 GPU the Hopper path, TMA +
//! wgmma; elsewhere the portable `mma.sync` path) and that default with its
//! last wave not split along K (`tilefuse::runtime::split_tail`);
//! then cuBLAS and the default in a burst from an idle GPU; with `--sweep`, also
//! a fixed list of portable configs (each checked against cuBLAS before it is
//! timed), keeping the best; with `--tune`, the autotuner's pick for each shape
//! (`TILEFUSE_AUTOTUNE`'s level, quick when unset or off), timed the same way;
//! on an sm_90 GPU, the configs of `other_configs` (the portable default, and
//! Hopper configs with one block per tile or persistent, clusters of one or two
//! blocks), sustained and burst.
//! CUDA events, L2 flushed before each timed run, median of repeats. Ends with a
//! markdown table of times, ratios and TFLOP/s.

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse::runtime::autotune::{self, Effort};
use tilefuse::runtime::split_tail;
use tilefuse_testkit::{exit_code, random_tensor, rel_error_tensors};

#[fused_kernel]
fn matmul(a: &Tensor<bf16>, b: &Tensor<bf16>) -> Tensor<bf16> {
    let [m, k] = a.shape();
    let [_, n] = b.shape();
    let mut out = Tensor::<bf16>::empty([m, n])?;
    for (tm, tn) in tile([m, n]) {
        let mut acc = zeros::<f32>([tm, tn]);
        for tk in tile(k) {
            acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]);
        }
        out[(tm, tn)] = acc.cast();
    }
    out
}

const SHAPES: [[usize; 3]; 4] = [
    [4096, 6656, 16384],
    [8192, 8192, 8192],
    [4096, 4096, 4096],
    [1000, 1000, 1000],
];

/// `--tune-only`'s shapes: the ones above, then linear layers of LLMs at
/// prefill-sized token counts (Llama-style 4096 → 11008 / 14336 and back,
/// attention projections) and ragged sizes.
const TUNE_SHAPES: [[usize; 3]; 10] = [
    [4096, 6656, 16384],
    [8192, 8192, 8192],
    [4096, 4096, 4096],
    [1000, 1000, 1000],
    [512, 4096, 4096],
    [1024, 14336, 4096],
    [2048, 4096, 11008],
    [1024, 1024, 8192],
    [3000, 5000, 700],
    [777, 2222, 3333],
];

fn sweep_configs() -> Vec<Config> {
    vec![
        Config::new(&[128, 256, 32]).num_warps(8).num_stages(4),
        Config::new(&[128, 256, 64]).num_warps(8).num_stages(3),
        Config::new(&[128, 256, 32]).num_warps(8).num_stages(3),
        Config::new(&[256, 128, 32]).num_warps(8).num_stages(4),
        Config::new(&[256, 128, 64]).num_warps(8).num_stages(3),
        Config::new(&[128, 128, 32]).num_warps(4).num_stages(4),
        Config::new(&[128, 128, 64]).num_warps(4).num_stages(3),
        Config::new(&[128, 128, 32]).num_warps(8).num_stages(4),
        Config::new(&[64, 128, 64]).num_warps(4).num_stages(4),
        Config::new(&[128, 128, 32]).num_warps(4).num_stages(3),
        Config::new(&[128, 256, 32]).num_warps(8).num_stages(5),
        Config::new(&[128, 128, 32]).num_warps(4).num_stages(5),
        Config::new(&[128, 256, 64]).num_warps(8).num_stages(4),
        Config::new(&[256, 128, 64]).num_warps(8).num_stages(4),
    ]
}

/// The configs timed beside the default on sm_90, each with whether its last
/// wave is split along K: the portable path's default (`portable`), then Hopper
/// configs (M block, N block, stages, persistent, blocks per cluster, split);
/// the default itself is left out.
fn other_configs(default: &Config, portable: Config) -> Vec<(Config, bool)> {
    let hopper = [
        (128, 256, 4, true, 2, true),
        (128, 256, 4, true, 2, false),
        (128, 256, 4, false, 2, true),
        (128, 256, 4, true, 1, true),
        (128, 256, 4, false, 1, true),
        (128, 192, 4, true, 1, true),
    ]
    .iter()
    .map(|&(bm, bn, s, p, cl, split)| {
        let c = Config::new(&[bm, bn, 64])
            .num_warps(8)
            .num_stages(s)
            .wgmma(true)
            .persistent(p)
            .cluster_m(cl);
        (c, split)
    });
    std::iter::once((portable, true))
        .chain(hopper)
        .filter(|(c, split)| !(*split && c == default))
        .collect()
}

struct Row {
    shape: [usize; 3],
    /// (default, cuBLAS) from an idle GPU.
    burst: (f64, f64),
    /// The config an untuned launch uses, and its time.
    default_cfg: String,
    default_ms: f64,
    /// The default config with the last wave not split along K.
    unsplit_ms: f64,
    best_ms: f64,
    best_cfg: String,
    cublas_ms: f64,
    /// With `--tune`: the tuned config, its time and the seconds tuning took.
    tuned: Option<(String, f64, f64)>,
    /// On sm_90: the other configs and their times (sustained, burst).
    others: Vec<(String, f64, f64)>,
}

/// The command line: `--help` lists it; an unknown or misspelled flag is an
/// error that names the flag it resembles (`--shape` → `--shapes`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "bench_matmul",
    about = "The generated bf16 GEMM against cuBLAS, same run, same GPU"
)]
struct Cli {
    /// Also time 14 fixed configs at each shape.
    #[arg(long)]
    sweep: bool,
    /// Also tune each shape (TILEFUSE_AUTOTUNE's level; quick if off) and time the winner.
    #[arg(long)]
    tune: bool,
    /// The autotuner's pick against the untuned default, at large and LLM shapes.
    #[arg(long)]
    tune_only: bool,
    /// The Hopper default with and without the TMA-store epilogue.
    #[arg(long)]
    epilogue: bool,
    /// The Hopper default against ping-pong configs.
    #[arg(long)]
    pingpong: bool,
    /// The Hopper default against smaller tiles, where its tiles do not fill the GPU.
    #[arg(long)]
    fill: bool,
    /// Shapes for --tune-only, --epilogue, --pingpong and --fill: MxNxK[,MxNxK...].
    #[arg(long, value_parser = parse_shapes)]
    shapes: Option<Shapes>,
}

/// `--shapes`' value.
#[derive(Clone, Debug)]
struct Shapes(Vec<[usize; 3]>);

/// `MxNxK[,MxNxK...]` with positive sizes.
fn parse_shapes(list: &str) -> Result<Shapes, String> {
    list.split(',')
        .map(|s| {
            s.split('x')
                .map(|x| x.parse().ok().filter(|&x: &usize| x > 0))
                .collect::<Option<Vec<usize>>>()
                .and_then(|v| <[usize; 3]>::try_from(v).ok())
                .ok_or_else(|| format!("`{s}`: expected MxNxK[,MxNxK...] with positive sizes"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Shapes)
}

/// The command line, parsed once in `main`.
static CLI: std::sync::OnceLock<Cli> = std::sync::OnceLock::new();

fn cli() -> &'static Cli {
    CLI.get_or_init(<Cli as clap::Parser>::parse)
}

/// `--shapes MxNxK,...`, if given.
fn shapes_arg() -> tilefuse::Result<Option<Vec<[usize; 3]>>> {
    Ok(cli().shapes.clone().map(|s| s.0))
}

/// `--tune-only`: the tuned config against the one an untuned launch uses.
/// The specialization a launch of `matmul` at `m`×`n`×`k` sees: fresh tensors,
/// whose rows are 16-byte aligned unless K or N is odd in 16-byte terms.
fn spec_at(n: usize, k: usize) -> tilefuse::Result<tilefuse::codegen::Spec> {
    use tilefuse::codegen::{DType, TensorSpec};
    let mut spec = matmul::kernel().declared_spec()?;
    let align = |cols: usize| TensorSpec::alignment_of(0, &[cols as i64, 1], DType::BF16);
    spec.tensors[0].align = align(k);
    spec.tensors[1].align = align(n);
    spec.tensors[2].align = align(n);
    Ok(spec)
}

/// The config an untuned launch of `matmul` at `m`×`n`×`k` uses
/// ([`KernelDef::default_at`]: on an sm_90 GPU the Hopper path, its tiles
/// fitted to the SMs).
fn default_at(dev: &Device, m: usize, n: usize, k: usize) -> tilefuse::Result<Config> {
    use tilefuse::codegen::emit::GemmShape;
    let def = matmul::kernel();
    let mut extents = vec![None; def.ir()?.dims.len()];
    if let Some(g) = def.ir()?.plan::<GemmShape>() {
        (extents[g.m], extents[g.n], extents[g.k]) = (Some(m), Some(n), Some(k));
    }
    def.default_at(dev, &spec_at(n, k)?, &extents)
}

fn tune_only(dev: &std::sync::Arc<Device>, level: Effort) -> tilefuse::Result<bool> {
    let shapes = shapes_arg()?.unwrap_or(TUNE_SHAPES.to_vec());
    let mut ok = true;
    let mut rows = Vec::new();
    let mut unstaged = Vec::new();
    for [m, n, k] in shapes {
        let default = default_at(dev, m, n, k)?;
        let a = random_tensor::<bf16>([m, k], 1.0)?;
        let b = random_tensor::<bf16>([k, n], 1.0)?;
        let mut reference = Tensor::<bf16>::empty([m, n])?;
        tilefuse::cublas::matmul_into(&mut reference, &a, &b)?;
        let reps = if m * n * k > 1 << 32 { 20 } else { 50 };
        // Untuned: the default this launch resolves (autotuning is off here).
        let c = matmul(&a, &b)?;
        ok &= rel_error_tensors(&c, &reference)? <= 1e-2;
        if default.stage {
            // What the default was before operands were staged: the portable path
            // loading the unaligned rows as they are.
            let before = tilefuse::codegen::default_config_within(
                matmul::kernel().ir()?,
                dev.max_shared_per_block(),
            );
            let ms = matmul::kernel().with_config(before.clone(), || {
                settled(dev, reps, &mut || matmul(&a, &b).map(drop))
            })?;
            let default_ms = settled(dev, reps, &mut || matmul(&a, &b).map(drop))?.median_ms;
            println!(
                "  {m}x{n}x{k}: unstaged portable default {before} {:.4} ms; staged default {default} {default_ms:.4} ms",
                ms.median_ms
            );
            unstaged.push(([m, n, k], ms.median_ms, default_ms));
        }
        // The default with stream-K instead of the split tail, for the record
        // (the tuner weighs it as one of its moves).
        let stream_k = default.wgmma.then(|| default.clone().stream_k(true));
        if let Some(sk) = &stream_k {
            let c = matmul::kernel().with_config(sk.clone(), || matmul(&a, &b))?;
            ok &= rel_error_tensors(&c, &reference)? <= 1e-2;
        }
        let (cfg, secs, right) = tune(dev, level, [&a, &b, &reference], &default)?;
        ok &= right;
        // Interleaved rounds: every variant timed once per round (sustained),
        // so drifting clocks weigh on all alike; the median of the rounds. A
        // tuned config equal to the default is not timed again: its ratio is 1.
        let mut variants = vec![Some(default.clone()), stream_k.clone()];
        variants.push((cfg != default).then(|| cfg.clone()));
        let med = interleaved(dev, reps, &variants, &a, &b)?;
        let default_ms = med[0].unwrap_or(f64::NAN);
        let stream_k_ms = med[1];
        let tuned_ms = med[2].unwrap_or(default_ms);
        let cublas_ms = med[3].unwrap_or(f64::NAN);
        println!(
            "  {m}x{n}x{k}: default {default_ms:.4} ms, tuned ({secs:.1} s) {cfg} {tuned_ms:.4} ms, {:.3}x; cuBLAS {cublas_ms:.4} ms ({ROUNDS} interleaved rounds)",
            default_ms / tuned_ms
        );
        let cfg = if cfg == default {
            "the default".to_string()
        } else {
            cfg.to_string()
        };
        rows.push((
            [m, n, k],
            default_ms,
            tuned_ms,
            cublas_ms,
            secs,
            cfg,
            stream_k_ms,
        ));
    }
    if !unstaged.is_empty() {
        println!("\nUnaligned operands: the default before and after staging (`Config::stage`):");
        println!("\n| M×N×K | unstaged ms | staged ms | unstaged/staged |");
        println!("|---|---|---|---|");
        for ([m, n, k], u, s) in &unstaged {
            println!("| {m}×{n}×{k} | {u:.4} | {s:.4} | {:.2} |", u / s);
        }
    }
    println!(
        "\nTuned ({}) against the untuned launch's config (the default for each shape's specialization); all timed sustained, same method:",
        level.name()
    );
    println!("\n| M×N×K | default ms | default, stream-K ms | tuned ms | default/tuned | tuned/cuBLAS | tuning s | tuned config |");
    println!("|---|---|---|---|---|---|---|---|");
    for ([m, n, k], d, t, c, secs, cfg, sk) in &rows {
        let sk = sk.map_or("-".to_string(), |ms| format!("{ms:.4}"));
        println!(
            "| {m}×{n}×{k} | {d:.4} | {sk} | {t:.4} | {:.3} | {:.0}% | {secs:.1} | {cfg} |",
            d / t,
            100.0 * c / t
        );
    }
    // Where the tuner kept the default there is one kernel, timed once.
    let picked: Vec<_> = rows.iter().filter(|r| r.5 != "the default").collect();
    let faster = picked.iter().filter(|r| r.1 / r.2 > 1.01).count();
    let slower = picked.iter().filter(|r| r.1 / r.2 < 0.99).count();
    println!(
        "\ntuned faster than the default by over 1% at {faster} of {} shapes, slower by over 1% at {slower} (the default kept at {})",
        rows.len(),
        rows.len() - picked.len()
    );
    Ok(ok)
}

/// `--epilogue` (sm_90): the Hopper default storing fragments against the
/// same config with the TMA-store epilogue (`Config::tma_store`, the default
/// where the output allows it), in interleaved rounds with cuBLAS, each
/// checked first.
fn epilogue_ab(dev: &std::sync::Arc<Device>) -> tilefuse::Result<bool> {
    let shapes = shapes_arg()?.unwrap_or(TUNE_SHAPES.to_vec());
    let mut ok = true;
    println!("\n| M×N×K | fragment stores ms | TMA store ms | fragments / TMA store | TMA store / cuBLAS |");
    println!("|---|---|---|---|---|");
    for [m, n, k] in shapes {
        let default = default_at(dev, m, n, k)?.tma_store(false);
        let tma = default.clone().tma_store(true);
        if !default.wgmma || matmul::kernel().lower(&spec_at(n, k)?, &tma).is_err() {
            println!("| {m}×{n}×{k} | {default} cannot take the TMA store: skipped | | | |");
            continue;
        }
        let a = random_tensor::<bf16>([m, k], 1.0)?;
        let b = random_tensor::<bf16>([k, n], 1.0)?;
        let mut out = Tensor::<bf16>::empty([m, n])?;
        tilefuse::cublas::matmul_into(&mut out, &a, &b)?;
        let variants = [default, tma];
        for c in &variants {
            let got = matmul::kernel().with_config(c.clone(), || matmul(&a, &b))?;
            let err = rel_error_tensors(&got, &out)?;
            if err > 1e-2 {
                println!("  {m}x{n}x{k} {c}: rel err {err:.2e} FAILED");
                ok = false;
            }
        }
        let reps = if m * n * k > 1 << 32 { 20 } else { 50 };
        let variants = variants.map(Some);
        let med: Vec<f64> = interleaved(dev, reps, &variants, &a, &b)?
            .into_iter()
            .map(|t| t.unwrap_or(f64::NAN))
            .collect();
        println!(
            "| {m}×{n}×{k} | {:.4} | {:.4} | {:.3} | {:.0}% |",
            med[0],
            med[1],
            med[0] / med[1],
            100.0 * med[2] / med[1]
        );
    }
    Ok(ok)
}

/// `--pingpong` (sm_90): the Hopper default against ping-pong configs.
fn pingpong_ab(dev: &std::sync::Arc<Device>) -> tilefuse::Result<bool> {
    let pp = |bm: usize, bn: usize, stages: usize, cl: usize, tma: bool| {
        Config::new(&[bm, bn, 64])
            .num_warps(8)
            .num_stages(stages)
            .wgmma(true)
            .persistent(true)
            .cluster_m(cl)
            .tma_store(tma)
            .pingpong(true)
    };
    candidates_ab(
        dev,
        &[
            pp(128, 128, 5, 2, true),
            pp(128, 128, 5, 1, true),
            pp(64, 256, 4, 2, true),
            pp(128, 128, 6, 2, false),
        ],
    )
}

/// `--fill` (sm_90): the Hopper default against configs of smaller tiles, for
/// launches whose default tiles leave SMs idle (M block, N block, consumer
/// warps, stages, persistent, blocks per cluster; all with the TMA store).
fn fill_ab(dev: &std::sync::Arc<Device>) -> tilefuse::Result<bool> {
    let candidates: Vec<Config> = [
        (128, 128, 8, 6, true, 1),
        (128, 128, 8, 5, false, 1),
        (128, 128, 8, 6, true, 2),
        (128, 256, 8, 4, false, 1),
        (128, 256, 8, 4, true, 1),
        (64, 256, 4, 4, false, 1),
        (128, 192, 8, 4, true, 1),
    ]
    .iter()
    .map(|&(bm, bn, w, s, p, cl)| {
        Config::new(&[bm, bn, 64])
            .num_warps(w)
            .num_stages(s)
            .wgmma(true)
            .persistent(p)
            .cluster_m(cl)
            .tma_store(true)
    })
    .collect();
    candidates_ab(dev, &candidates)
}

/// The Hopper default against `candidates` at `--shapes` (else the tuner's),
/// in interleaved rounds with cuBLAS, each checked against cuBLAS first; a
/// config the shape cannot take (the TMA store of an unaligned output) is
/// skipped.
fn candidates_ab(dev: &std::sync::Arc<Device>, candidates: &[Config]) -> tilefuse::Result<bool> {
    let shapes = shapes_arg()?.unwrap_or(TUNE_SHAPES.to_vec());
    let mut ok = true;
    print!("\n| M×N×K | default ms |");
    for c in candidates {
        print!(" {c} ms (default/it) |");
    }
    println!(" cuBLAS ms | best / cuBLAS |");
    println!("|---|---|{}---|---|", "---|".repeat(candidates.len()));
    for [m, n, k] in shapes {
        let spec = spec_at(n, k)?;
        let default = default_at(dev, m, n, k)?;
        if !default.wgmma {
            println!("| {m}×{n}×{k} | {default} is not the Hopper path: skipped |");
            continue;
        }
        let a = random_tensor::<bf16>([m, k], 1.0)?;
        let b = random_tensor::<bf16>([k, n], 1.0)?;
        let mut reference = Tensor::<bf16>::empty([m, n])?;
        tilefuse::cublas::matmul_into(&mut reference, &a, &b)?;
        let mut variants = vec![Some(default.clone())];
        for c in candidates {
            let c = c.clone().stage(default.stage);
            variants.push(matmul::kernel().lower(&spec, &c).is_ok().then_some(c));
        }
        for c in variants.iter().flatten() {
            let got = matmul::kernel().with_config(c.clone(), || matmul(&a, &b))?;
            let err = rel_error_tensors(&got, &reference)?;
            if err > 1e-2 {
                println!("  {m}x{n}x{k} {c}: rel err {err:.2e} FAILED");
                ok = false;
            }
        }
        let reps = if m * n * k > 1 << 32 { 20 } else { 50 };
        let med = interleaved(dev, reps, &variants, &a, &b)?;
        let d = med[0].unwrap_or(f64::NAN);
        let cublas = med[variants.len()].unwrap_or(f64::NAN);
        print!("| {m}×{n}×{k} | {d:.4} |");
        let mut best = d;
        for t in &med[1..variants.len()] {
            match t {
                Some(t) => {
                    best = best.min(*t);
                    print!(" {t:.4} ({:.3}) |", d / t)
                }
                None => print!(" - |"),
            }
        }
        println!(" {cublas:.4} | {:.0}% |", 100.0 * cublas / best);
    }
    Ok(ok)
}

/// Each config of `variants` (`None`: skipped) and then cuBLAS timed once per
/// round (sustained) for `ROUNDS` rounds, so drifting clocks weigh on all
/// alike: the median of each's rounds, cuBLAS's last.
fn interleaved(
    dev: &std::sync::Arc<Device>,
    reps: usize,
    variants: &[Option<Config>],
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
) -> tilefuse::Result<Vec<Option<f64>>> {
    let ([m, _], [_, n]) = (a.shape::<2>(), b.shape::<2>());
    let mut out = Tensor::<bf16>::empty([m, n])?;
    let mut runs: Vec<Option<Run>> = variants
        .iter()
        .map(|v| {
            v.clone().map(|c| {
                Box::new(move || matmul::kernel().with_config(c.clone(), || matmul(a, b).map(drop)))
                    as Run
            })
        })
        .collect();
    runs.push(Some(Box::new(|| {
        tilefuse::cublas::matmul_into(&mut out, a, b)
    })));
    interleaved_runs(dev, reps, &mut runs)
}

/// A run to time.
type Run<'a> = Box<dyn FnMut() -> tilefuse::Result<()> + 'a>;

/// Each of `runs` (`None`: skipped) timed sustained once per round for `ROUNDS`
/// rounds, so drifting clocks weigh on all alike, every other round in reverse
/// (`turn_order`: a variant timed later in a row reads slower): the median of
/// each's rounds.
fn interleaved_runs(
    dev: &Device,
    reps: usize,
    runs: &mut [Option<Run>],
) -> tilefuse::Result<Vec<Option<f64>>> {
    let n = runs.len();
    let mut rounds: Vec<Vec<f64>> = vec![Vec::new(); n];
    for round in 0..ROUNDS {
        for i in tilefuse::runtime::timing::turn_order(n, round) {
            if let Some(f) = &mut runs[i] {
                rounds[i].push(settled(dev, reps, f.as_mut())?.median_ms);
            }
        }
    }
    Ok(rounds.iter().map(|r| median(r)).collect())
}

fn run() -> tilefuse::Result<bool> {
    let sweep = cli().sweep;
    // --tune: also tune each shape (TILEFUSE_AUTOTUNE's level; quick if off) and
    // time the winner the same way as the default.
    let tune = cli().tune;
    let level = match autotune::effort()? {
        Effort::Off => Effort::Quick,
        e => e,
    };
    // Everything else runs the configs it names.
    autotune::set_effort(Some(Effort::Off));
    let dev = Device::current()?;
    dev.require_gpu("bench_matmul (it times GEMMs against cuBLAS)")?;
    println!(
        "device: {} ({}, {} SMs)",
        dev.name(),
        dev.arch(),
        dev.sm_count()
    );
    if cli().tune_only {
        return tune_only(&dev, level);
    }
    if cli().epilogue {
        return epilogue_ab(&dev);
    }
    if cli().pingpong {
        return pingpong_ab(&dev);
    }
    if cli().fill {
        return fill_ab(&dev);
    }
    let mut rows = Vec::new();
    let mut all_ok = true;
    for shape @ [m, n, k] in SHAPES {
        let a = random_tensor::<bf16>([m, k], 1.0)?;
        let b = random_tensor::<bf16>([k, n], 1.0)?;
        let mut reference = Tensor::<bf16>::empty([m, n])?;
        tilefuse::cublas::matmul_into(&mut reference, &a, &b)?;
        let reps = if m * n * k > 1 << 32 { 20 } else { 50 };

        // The headline numbers: cuBLAS, the default config (what an untuned launch
        // of this shape uses) and the default with its last wave not split, in
        // interleaved rounds, each run for a while before it is timed (see
        // `settled`). (Timed one after another, the third read 5-20% slow where
        // it ran the same kernel as the second.)
        let default = default_at(&dev, m, n, k)?;
        let pinned = |f: &mut dyn FnMut() -> tilefuse::Result<()>| {
            matmul::kernel().with_config(default.clone(), f)
        };
        let c = matmul::kernel().with_config(default.clone(), || matmul(&a, &b))?;
        let err = rel_error_tensors(&c, &reference)?;
        all_ok &= err <= 1e-2;
        let mut reference_out = Tensor::<bf16>::empty([m, n])?;
        let mut cublas_run = || tilefuse::cublas::matmul_into(&mut reference_out, &a, &b);
        let mut default_run = || pinned(&mut || matmul(&a, &b).map(drop));
        let mut unsplit_run = || {
            split_tail::set_enabled(false);
            let r = pinned(&mut || matmul(&a, &b).map(drop));
            split_tail::set_enabled(true);
            r
        };
        let timed = interleaved_runs(
            &dev,
            reps,
            &mut [
                Some(Box::new(&mut cublas_run) as Run),
                Some(Box::new(&mut default_run)),
                Some(Box::new(&mut unsplit_run)),
            ],
        )?;
        let [Some(c), Some(d), Some(u)] = timed[..] else {
            unreachable!("every run is timed");
        };
        let t = [c, d, u];
        // Burst: each from an idle GPU at full boost, a short run.
        let burst_cublas = burst(&dev, reps, &mut cublas_run)?.median_ms;
        let burst_default = burst(&dev, reps, &mut default_run)?.median_ms;
        println!(
            "  {m}x{n}x{k} burst from idle: cuBLAS {burst_cublas:.3} ms ({:.0} TFLOP/s), default {burst_default:.3} ms ({:.0} TFLOP/s), {:.0}%",
            2.0 * (m * n * k) as f64 / burst_cublas / 1e9,
            2.0 * (m * n * k) as f64 / burst_default / 1e9,
            100.0 * burst_cublas / burst_default
        );
        let [cublas_ms, default_ms, unsplit_ms] = t;
        let tf = |ms: f64| 2.0 * (m * n * k) as f64 / ms / 1e9;
        println!(
            "  {m}x{n}x{k} cuBLAS {cublas_ms:.3} ms ({:.0} TFLOP/s); default {default} {default_ms:.3} ms ({:.0} TFLOP/s, rel err {err:.1e}); last wave not split {unsplit_ms:.3} ms ({:.0} TFLOP/s)",
            tf(cublas_ms),
            tf(default_ms),
            tf(unsplit_ms)
        );

        // The sweep: exploratory, one config after another.
        let mut best = (default_ms, default.to_string());
        let candidates: Vec<Config> = if sweep {
            sweep_configs()
                .into_iter()
                .filter(|c| *c != default)
                .collect()
        } else {
            Vec::new()
        };
        for cfg in candidates {
            let label = cfg.to_string();
            let outcome =
                matmul::kernel().with_config(cfg.clone(), || -> tilefuse::Result<(f64, f64)> {
                    let c = matmul(&a, &b)?;
                    let err = rel_error_tensors(&c, &reference)?;
                    let t = settled(&dev, reps, &mut || matmul(&a, &b).map(drop))?;
                    Ok((err, t.median_ms))
                });
            match outcome {
                Ok((err, ms)) => {
                    let ok = err <= 1e-2;
                    println!(
                        "  {m}x{n}x{k} {label}: {ms:.3} ms, {:.0} TFLOP/s, rel err {err:.1e}{}",
                        tf(ms),
                        if ok { "" } else { "  WRONG RESULT, excluded" }
                    );
                    if ok && ms < best.0 {
                        best = (ms, label);
                    }
                }
                Err(e) => println!("  {m}x{n}x{k} {label}: skipped ({e})"),
            }
        }
        let tuned = if tune {
            let (cfg, t, secs, right) =
                tune_and_time(&dev, level, [&a, &b, &reference], reps, &default)?;
            all_ok &= right;
            println!(
                "  {m}x{n}x{k} tuned ({}, {secs:.1} s): {cfg} {:.3} ms ({:.0} TFLOP/s), {:.3}x the default",
                level.name(),
                t,
                tf(t),
                default_ms / t
            );
            Some((cfg.to_string(), t, secs))
        } else {
            None
        };
        // Beside the default on sm_90: the portable path, and Hopper configs
        // (persistent or one block per tile, clusters of two blocks or one, the
        // last wave split along K or not, a narrower N block).
        let mut others = Vec::new();
        if dev.compute_capability().0 == 9 {
            for (cfg, split) in other_configs(&default, matmul::kernel().config_on(&dev)?) {
                split_tail::set_enabled(split);
                let r = matmul::kernel().with_config(cfg.clone(), || -> tilefuse::Result<_> {
                    let c = matmul(&a, &b)?;
                    let err = rel_error_tensors(&c, &reference)?;
                    let mut run = || matmul(&a, &b).map(drop);
                    let t = settled(&dev, reps, &mut run)?.median_ms;
                    let b_ms = burst(&dev, reps, &mut run)?.median_ms;
                    Ok((err, t, b_ms))
                });
                split_tail::set_enabled(true);
                let cfg = if split {
                    cfg.to_string()
                } else {
                    format!("{cfg}, last wave not split")
                };
                match r {
                    Ok((err, t, b_ms)) => {
                        all_ok &= err <= 1e-2;
                        println!(
                            "  {m}x{n}x{k} {cfg}: {t:.3} ms ({:.0} TFLOP/s, {:.0}% of cuBLAS; burst {b_ms:.3} ms, {:.0}% of cuBLAS's burst), rel err {err:.1e}",
                            tf(t),
                            100.0 * cublas_ms / t,
                            100.0 * burst_cublas / b_ms
                        );
                        others.push((cfg, t, b_ms));
                    }
                    Err(e) => {
                        println!("  {m}x{n}x{k} {cfg}: FAILED ({e})");
                        all_ok = false;
                    }
                }
            }
        }
        rows.push(Row {
            others,
            default_cfg: default.to_string(),
            tuned,
            shape,
            burst: (burst_default, burst_cublas),
            default_ms,
            unsplit_ms,
            best_ms: best.0,
            best_cfg: best.1,
            cublas_ms,
        });
    }
    let tflops = |s: [usize; 3], ms: f64| 2.0 * (s[0] * s[1] * s[2]) as f64 / ms / 1e9;
    println!("\nSustained (each timed after 300 ms of running):");
    println!("\n| M×N×K | default ms | cuBLAS ms | default/cuBLAS | TFLOP/s (tilefuse / cuBLAS) | default, no split ms | best swept ms | best/cuBLAS | best config | default config |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {}×{}×{} | {:.3} | {:.3} | {:.0}% | {:.0} / {:.0} | {:.3} | {:.3} | {:.0}% | {} | {} |",
            r.shape[0],
            r.shape[1],
            r.shape[2],
            r.default_ms,
            r.cublas_ms,
            100.0 * r.cublas_ms / r.default_ms,
            tflops(r.shape, r.default_ms),
            tflops(r.shape, r.cublas_ms),
            r.unsplit_ms,
            r.best_ms,
            100.0 * r.cublas_ms / r.best_ms,
            r.best_cfg,
            r.default_cfg
        );
    }
    if rows.iter().any(|r| r.tuned.is_some()) {
        println!(
            "\nTuned ({}; both timed sustained, same method):",
            level.name()
        );
        println!("\n| M×N×K | default ms | tuned ms | default/tuned | tuned/cuBLAS | tuning s | tuned config |");
        println!("|---|---|---|---|---|---|---|");
        for r in &rows {
            if let Some((cfg, ms, secs)) = &r.tuned {
                println!(
                    "| {}×{}×{} | {:.3} | {ms:.3} | {:.3} | {:.0}% | {secs:.1} | {cfg} |",
                    r.shape[0],
                    r.shape[1],
                    r.shape[2],
                    r.default_ms,
                    r.default_ms / ms,
                    100.0 * r.cublas_ms / ms
                );
            }
        }
    }
    if rows.iter().any(|r| !r.others.is_empty()) {
        println!("\nOther configs (the portable path's default, Hopper configs), same run:");
        println!("\n| M×N×K | config ms | cuBLAS ms | config/cuBLAS | burst: config ms | cuBLAS ms | config/cuBLAS | config |");
        println!("|---|---|---|---|---|---|---|---|");
        for r in &rows {
            for (cfg, t, b) in &r.others {
                println!(
                    "| {}×{}×{} | {t:.3} | {:.3} | {:.0}% | {b:.3} | {:.3} | {:.0}% | {cfg} |",
                    r.shape[0],
                    r.shape[1],
                    r.shape[2],
                    r.cublas_ms,
                    100.0 * r.cublas_ms / t,
                    r.burst.1,
                    100.0 * r.burst.1 / b
                );
            }
        }
    }
    println!("\nBurst (each timed from an idle GPU):");
    println!("\n| M×N×K | default ms | cuBLAS ms | default/cuBLAS | TFLOP/s (tilefuse / cuBLAS) |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        let (d, c) = r.burst;
        println!(
            "| {}×{}×{} | {d:.3} | {c:.3} | {:.0}% | {:.0} / {:.0} |",
            r.shape[0],
            r.shape[1],
            r.shape[2],
            100.0 * c / d,
            tflops(r.shape, d),
            tflops(r.shape, c),
        );
    }
    Ok(all_ok)
}

/// Tunes `a · b` at `level` and times the winner like the default: its
/// config, its median ms, the seconds tuning took, and whether the tuned
/// launch's result matched `reference`.
/// Tunes `matmul` for `a`·`b` at `level`: the pick (the default when nothing
/// beat it), the seconds tuning took, and whether its output matched.
fn tune(
    dev: &Device,
    level: Effort,
    [a, b, reference]: [&Tensor<bf16>; 3],
    default: &Config,
) -> tilefuse::Result<(Config, f64, bool)> {
    autotune::set_effort(Some(level));
    let t0 = std::time::Instant::now();
    let c = matmul(a, b);
    dev.synchronize()?;
    let secs = t0.elapsed().as_secs_f64();
    autotune::set_effort(Some(Effort::Off));
    let right = rel_error_tensors(&c?, reference)? <= 1e-2;
    let cfg = autotune::last_choice("matmul").unwrap_or_else(|| default.clone());
    Ok((cfg, secs, right))
}

/// [`tune`], then the pick timed sustained.
fn tune_and_time(
    dev: &Device,
    level: Effort,
    operands: [&Tensor<bf16>; 3],
    reps: usize,
    default: &Config,
) -> tilefuse::Result<(Config, f64, f64, bool)> {
    let (cfg, secs, right) = tune(dev, level, operands, default)?;
    let [a, b, _] = operands;
    let t = matmul::kernel().with_config(cfg.clone(), || {
        settled(dev, reps, &mut || matmul(a, b).map(drop))
    })?;
    Ok((cfg, t.median_ms, secs, right))
}

/// The median of `v`, `None` when empty.
fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (!s.is_empty()).then(|| s[s.len() / 2])
}

/// `--tune-only` times its variants in this many interleaved rounds.
const ROUNDS: usize = 6;

/// Times `f` (median of `reps`, L2 flushed) after running it for 300 ms: the
/// GPU's clocks follow the power draw of the kernel before, and a kernel timed
/// right after cuBLAS ran at the clocks cuBLAS left (417 against 476 TFLOP/s at
/// 8192³ on an H200, with only five warm-up runs).
fn settled(
    dev: &Device,
    reps: usize,
    f: &mut dyn FnMut() -> tilefuse::Result<()>,
) -> tilefuse::Result<tilefuse::Timing> {
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_millis(300) {
        for _ in 0..8 {
            f()?;
        }
        dev.synchronize()?;
    }
    tilefuse::time_gpu(dev, 2, reps, true, f)
}

/// Times `f` (median of `reps`, L2 flushed, 3 warm-up runs) after the GPU has
/// idled for half a second: the clocks a short job starts with.
fn burst(
    dev: &Device,
    reps: usize,
    f: &mut dyn FnMut() -> tilefuse::Result<()>,
) -> tilefuse::Result<tilefuse::Timing> {
    dev.synchronize()?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    tilefuse::time_gpu(dev, 3, reps, true, f)
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    // Bad flags are reported before any GPU work (clap exits with status 2).
    let _ = cli();
    exit_code(run())
}
