//! Distributed matmul plans (`tilefuse::ops::plan`): the tensor-parallel pair
//! of linears of a transformer MLP, each planned once and executed many times,
//! each checked against the same plan on the unfused NCCL + cuBLAS path.
//!
//! ```text
//! cargo build --release --workspace --examples --bins
//! target/release/tilefuse-run --nproc-per-node 2 target/release/examples/matmul_plan [M N K] [--bench] [--blocking]
//! ```
//!
//! - column-parallel up-projection with sequence parallelism: `x[M/w, K]` row
//!   slabs (A: Rows), `w1[K, N/w]` (B: Cols), `h = gelu(x·w1 + b1)` column slabs,
//!   the pre-activation kept as aux (`GeluAuxBias`);
//! - row-parallel down-projection: `h[M, N/w]` (A: Cols), `w2[N/w, K]` (B: Rows),
//!   `y = h·w2 + b2` reduce-scattered to row slabs (D: Rows), or all-reduced (D:
//!   Replicated);
//! - the backward's `dh = (dy·w2ᵀ) · gelu'(aux)` (`DGelu`, B transposed).
//!
//! `--blocking` makes every `execute()` end with a barrier (as `MatmulOptions::blocking`);
//! `--only TEXT` runs the layers whose name contains TEXT.
//! `--bench` times `execute()` fused and unfused (median, CUDA events, every
//! rank timing the same variant at once) and the host time of one `execute()`
//! on a tiny problem against one bare launch of the GEMM kernel it runs.

use std::process::ExitCode;
use std::time::Instant;
use tilefuse::ops::plan::{
    DistributedMatmul, Distribution, EpilogueInputs, MatmulEpilogue, MatmulOptions,
};
use tilefuse::ops::Algorithm;
use tilefuse::prelude::*;
use tilefuse::runtime::dist::ProcessGroup;
use tilefuse_testkit::{exit_code, poisoned, random_vec, rel_error, Rng};
use Distribution::*;

struct Layer {
    name: &'static str,
    dists: [Distribution; 3],
    epilogue: MatmulEpilogue,
    transpose_b: bool,
    a: Tensor<bf16>,
    b: Tensor<bf16>,
    bias: Option<Tensor<bf16>>,
    aux: Option<Tensor<bf16>>,
}

fn random(rng: &mut Rng, shape: [usize; 2], scale: f64) -> tilefuse::Result<Tensor<bf16>> {
    Tensor::from_slice(&random_vec::<bf16>(rng, shape[0] * shape[1], scale), shape)
}

fn layers(pg: &ProcessGroup, [m, n, k]: [usize; 3], rng: &mut Rng) -> tilefuse::Result<Vec<Layer>> {
    let w = pg.world_size();
    let s = 1.0 / (k as f64).sqrt();
    let bias =
        |rng: &mut Rng, len: usize| Tensor::from_slice(&random_vec::<bf16>(rng, len, 0.5), [len]);
    Ok(vec![
        Layer {
            name: "up: all-gather + GEMM, gelu(+bias) with aux",
            dists: [Rows, Cols, Cols],
            epilogue: MatmulEpilogue::GeluAuxBias,
            transpose_b: false,
            a: random(rng, [m / w, k], 1.0)?,
            b: random(rng, [k, n / w], s)?,
            bias: Some(bias(rng, n / w)?),
            aux: None,
        },
        Layer {
            name: "down: GEMM + reduce-scatter, +bias",
            dists: [Cols, Rows, Rows],
            epilogue: MatmulEpilogue::Bias,
            transpose_b: false,
            a: random(rng, [m, n / w], 1.0)?,
            b: random(rng, [n / w, k], s)?,
            bias: Some(bias(rng, k)?),
            aux: None,
        },
        Layer {
            name: "down: GEMM + all-reduce, +bias",
            dists: [Cols, Rows, Replicated],
            epilogue: MatmulEpilogue::Bias,
            transpose_b: false,
            a: random(rng, [m, n / w], 1.0)?,
            b: random(rng, [n / w, k], s)?,
            // D is replicated, and so is its bias: the same on every rank.
            bias: Some(bias(&mut Rng::new(0xb1a5), k)?),
            aux: None,
        },
        Layer {
            name: "backward: dy·w2ᵀ, dgelu from aux",
            dists: [Rows, Cols, Cols],
            epilogue: MatmulEpilogue::DGelu,
            transpose_b: true,
            a: random(rng, [m / w, k], 1.0)?,
            b: random(rng, [n / w, k], s)?,
            bias: None,
            aux: Some(random(rng, [m, n / w], 1.5)?),
        },
    ])
}

fn plan<'pg>(
    pg: &'pg ProcessGroup,
    l: &Layer,
    algorithm: Algorithm,
    blocking: bool,
) -> tilefuse::Result<DistributedMatmul<'pg>> {
    let options = MatmulOptions {
        transpose_b: l.transpose_b,
        algorithm,
        blocking,
        ..MatmulOptions::default()
    };
    let mut mm = DistributedMatmul::new(pg, &l.a, &l.b, None, l.dists, options)?;
    let inputs = EpilogueInputs {
        bias: l.bias.as_ref(),
        aux: l.aux.as_ref(),
    };
    mm.plan(l.epilogue, inputs)?;
    Ok(mm)
}

/// matmul_plan's command line (each rank parses it).
#[derive(clap::Parser)]
#[command(
    about = "Distributed matmul plans (plan once, execute, reset operands) for a few layers, fused and unfused, checked against NCCL + cuBLAS"
)]
struct Args {
    /// M, N and K (all three, or none for the defaults).
    #[arg(num_args = 3, value_names = ["M", "N", "K"])]
    mnk: Vec<usize>,
    /// Time the fused and unfused plans.
    #[arg(long)]
    bench: bool,
    /// Plans that synchronize after each execute (`MatmulOptions::blocking`).
    #[arg(long)]
    blocking: bool,
    /// Only the layers whose name contains this text.
    #[arg(long)]
    only: Option<String>,
}

impl Args {
    /// M, N and K: as given, or the defaults (smaller in interpret mode).
    fn sizes(&self) -> [usize; 3] {
        tilefuse_testkit::sizes(&self.mnk, [4096, 6656, 16384], [240, 168, 136])
    }
}

fn run(args: Args) -> tilefuse::Result<bool> {
    let mnk = args.sizes();
    let Args {
        bench,
        blocking,
        only,
        ..
    } = args;
    let pg = ProcessGroup::init()?;
    let (r, w) = (pg.rank(), pg.world_size());
    if mnk.iter().any(|x| x % w != 0) {
        return Err(tilefuse::Error::Argument {
            context: "matmul_plan".into(),
            arg: "M N K".into(),
            message: format!("{mnk:?} must split evenly over {w} ranks"),
        });
    }
    let mut rng = Rng::new(0x5eed ^ r as u64);
    let mut ok = true;
    let layers: Vec<Layer> = layers(&pg, mnk, &mut rng)?
        .into_iter()
        .filter(|l| only.as_ref().is_none_or(|o| l.name.contains(o.as_str())))
        .collect();
    if layers.is_empty() {
        return Err(tilefuse::Error::Argument {
            context: "matmul_plan".into(),
            arg: "--only".into(),
            message: format!("{only:?} matches no layer (up, down, all-reduce, backward, …)"),
        });
    }
    for l in layers {
        let mut fused = plan(&pg, &l, Algorithm::Fused, blocking)?;
        let mut unfused = plan(&pg, &l, Algorithm::Unfused, blocking)?;
        // Poisoned, so that elements a path leaves unwritten show.
        for mm in [&fused, &unfused] {
            mm.result().copy_from(&poisoned(mm.result().dims())?)?;
        }
        let got = fused.execute()?;
        let want = unfused.execute()?;
        pg.synchronize("plans")?;
        let (got, want, cols) = (got.to_vec()?, want.to_vec()?, got.size(1));
        let err = rel_error(&got, &want, bf16::to_f64, bf16::to_f64);
        let good = err.is_finite() && err < 2e-2;
        let all = pg.all_gather_bytes("check", &err.to_le_bytes())?;
        let errs: Vec<f64> = all
            .iter()
            .filter_map(|b| Some(f64::from_le_bytes(b.get(..8)?.try_into().ok()?)))
            .collect();
        ok &= good;
        if !good {
            eprintln!(
                "rank {r}, {}: {}",
                l.name,
                where_differs(&got, &want, cols, w)
            );
        }
        if r == 0 {
            let fmt: Vec<String> = errs.iter().map(|e| format!("{e:.2e}")).collect();
            println!(
                "{}: fused vs NCCL + cuBLAS rel error {} (per rank) {}",
                l.name,
                fmt.join(" "),
                if errs.iter().all(|e| e.is_finite() && *e < 2e-2) {
                    "ok"
                } else {
                    "FAILED"
                }
            );
        }
        if bench {
            let dev = pg.device().clone();
            let mut t = [0f64; 2];
            for (i, mm) in [&mut fused, &mut unfused].into_iter().enumerate() {
                pg.barrier("bench")?;
                t[i] =
                    tilefuse::time_gpu(&dev, 2, 10, true, || mm.execute().map(|_| ()))?.median_ms;
            }
            let slowest = pg.max_over_ranks("bench-times", &t)?;
            let (f, u) = (slowest[0], slowest[1]);
            // Collective: every rank plans the Auto variant.
            let auto = plan(&pg, &l, Algorithm::Auto, blocking)?.path();
            let [m, n, k] = mnk;
            // Flops of the whole problem, per GPU.
            let shape = if l.dists[0] == Rows && l.dists[1] == Cols {
                (m, n, k)
            } else {
                (m, k, n)
            };
            let tf = |ms: f64| {
                2.0 * (shape.0 * shape.1 * shape.2) as f64 / w as f64 / (ms * 1e-3) / 1e12
            };
            if r == 0 {
                println!(
                    "| plan: {} | {m}×{n}×{k} | {w} | {f:.3} ms ({:.0}) | {u:.3} ms ({:.0}) | {:.2} | {:?} |",
                    l.name,
                    tf(f),
                    tf(u),
                    u / f,
                    auto
                );
            }
        }
    }
    if bench {
        host_overhead(&pg)?;
    }
    Ok(ok)
}

/// Where `got` (`[rows, cols]`, row-major) differs from `want`: the error of
/// each of `w` row slabs, unwritten (NaN) elements, and the box that holds the
/// elements off by more than a tenth of the reference's RMS.
fn where_differs(got: &[bf16], want: &[bf16], cols: usize, w: usize) -> String {
    let rows = got.len() / cols.max(1);
    let rms =
        (want.iter().map(|x| x.to_f64().powi(2)).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let mut out = Vec::new();
    for j in 0..w {
        let (lo, hi) = (j * rows / w * cols, (j + 1) * rows / w * cols);
        let e = rel_error(&got[lo..hi], &want[lo..hi], bf16::to_f64, bf16::to_f64);
        out.push(format!("row slab {j}: {e:.2e}"));
    }
    let nan = got.iter().filter(|x| x.to_f64().is_nan()).count();
    let (mut lo, mut hi, mut bad) = ([usize::MAX; 2], [0usize; 2], 0usize);
    for (i, (g, x)) in got.iter().zip(want).enumerate() {
        if (g.to_f64() - x.to_f64()).abs() > 0.1 * rms || g.to_f64().is_nan() {
            let at = [i / cols, i % cols];
            for d in 0..2 {
                lo[d] = lo[d].min(at[d]);
                hi[d] = hi[d].max(at[d]);
            }
            bad += 1;
        }
    }
    out.push(format!("{nan} unwritten (NaN) of {}", got.len()));
    if bad > 0 {
        out.push(format!(
            "{bad} off by > 0.1·rms in rows {}..={}, cols {}..={}",
            lo[0], hi[0], lo[1], hi[1]
        ));
    }
    out.join(", ")
}

/// Host time of `execute()` on a tiny problem, against a bare launch of the
/// kernel it runs (the local plan: one GEMM), and of the fused all-reduce plan.
fn host_overhead(pg: &ProcessGroup) -> tilefuse::Result<()> {
    let mut rng = Rng::new(7);
    let (a, b) = (
        random(&mut rng, [64, 64], 1.0)?,
        random(&mut rng, [64, 64], 1.0)?,
    );
    let bias = Tensor::from_slice(&random_vec::<bf16>(&mut rng, 64, 0.5), [64])?;
    let options = MatmulOptions {
        algorithm: Algorithm::Fused,
        ..MatmulOptions::default()
    };
    let per_call = |f: &mut dyn FnMut() -> tilefuse::Result<()>| -> tilefuse::Result<f64> {
        for _ in 0..50 {
            f()?;
        }
        pg.synchronize("warm")?;
        let mut samples = Vec::new();
        for _ in 0..20 {
            let t = Instant::now();
            for _ in 0..100 {
                f()?;
            }
            samples.push(t.elapsed().as_secs_f64() * 1e6 / 100.0);
            // Drain the queue between batches: host time, not a full queue.
            pg.synchronize("drain")?;
        }
        samples.sort_by(f64::total_cmp);
        Ok(samples[samples.len() / 2])
    };
    // Each plan replayed from its CUDA graphs (the default), then queued anew.
    let mut times = Vec::new();
    for graph in [true, false] {
        let options = MatmulOptions {
            graph,
            ..options.clone()
        };
        let mut local = DistributedMatmul::new(pg, &a, &b, None, [Replicated; 3], options.clone())?;
        local.plan(
            MatmulEpilogue::Bias,
            EpilogueInputs {
                bias: Some(&bias),
                aux: None,
            },
        )?;
        let local_us = per_call(&mut || local.execute().map(|_| ()))?;
        // a[64, K/w] · b[K/w, 64], K = 64·w: all-reduced.
        let mut ar = DistributedMatmul::new(pg, &a, &b, None, [Cols, Rows, Replicated], options)?;
        ar.plan(MatmulEpilogue::None, EpilogueInputs::default())?;
        let ar_us = per_call(&mut || ar.execute().map(|_| ()))?;
        times.push((local_us, ar_us));
    }
    // The local plan's GEMM kernel, launched bare with the plan's specialization.
    let out = Tensor::<bf16>::empty([64, 64])?;
    let (one, flags) = (Tensor::<bf16>::zeros([1, 1])?, Tensor::<u32>::zeros([1])?);
    let launch_us = per_call(&mut || {
        tilefuse::ops::kernels::gemm_fused(
            &a, &b, &out, &one, &one, &one, &one, &one, &one, &bias, &bias, &flags, &flags, 64, 1,
            64, 1, 1, 0, 0, 1.0, 0.0, false, false, 0, false, false, false, 0,
        )
    })?;
    if pg.rank() == 0 {
        let [(local, ar), (local_q, ar_q)] = [times[0], times[1]];
        println!(
            "host time per call, 64×64×64: bare launch of the local GEMM {launch_us:.1} µs; local plan execute() {local:.1} µs replayed, {local_q:.1} µs queued; all-reduce plan execute() (2 GEMMs, copies, flags, barrier) {ar:.1} µs replayed, {ar_q:.1} µs queued"
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    match tilefuse_testkit::args::<Args>("matmul_plan") {
        Ok(args) => exit_code(run(args)),
        Err(code) => code,
    }
}
