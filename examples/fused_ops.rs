//! The four fused GEMM + collective ops of `tilefuse::ops`, each checked against
//! its unfused NCCL + cuBLAS path and, with `--bench`, timed against it.
//!
//! ```text
//! cargo build --release --workspace --examples --bins
//! target/release/tilefuse-run --nproc-per-node 2 target/release/examples/fused_ops [M N K]
//!     [--op NAME] [--bench] [--chunks C]
//! ```
//!
//! M N K is the whole problem; each op takes its natural sharding over the w ranks:
//! - `all_gather_matmul` (`ag_rows`): A's rows sharded, `[M/w, K]`; `ag_cols`: A's
//!   columns, `[M, K/w]`; B `[K, N]` whole; C `[M, N]` on every rank;
//! - `matmul_all_gather`: `a[M/w, K]` per rank, C `[M, N]` gathered (the copy
//!   engine pulls each chunk as the GEMM finishes it); `mag_stores`: the same
//!   with the GEMM storing into the peers' memory (`GatherVariant::PeerStores`);
//! - `matmul_reduce_scatter`: K sharded (`a[M, K/w]`, `b[K/w, N]`), C's columns scattered;
//! - `matmul_all_reduce`: K sharded, C `[M, N]` summed on every rank (the ring
//!   variant, the default); `ar_one_shot`: the same with the one-shot variant.
//!
//! Every op gets fresh random inputs and a random bias, writes into a poisoned
//! output, and must match the unfused path within bf16 tolerance on every rank.
//! `--bench` times both paths in interleaved rounds (median of the rounds'
//! medians, every rank timing the same variant at once), with cuBLAS on the
//! product each rank computes (no communication: the floor), and prints a table
//! row: op, shape, ranks, floor, fused, unfused (ms, TFLOP/s per GPU), unfused ÷
//! fused, fused ÷ floor, what `Algorithm::Auto` picks.

use std::process::ExitCode;
use tilefuse::ops::{
    self, Algorithm, AllReduceVariant, Bias, GatherDim, GatherVariant, OpOptions, ScatterDim,
    Workspace,
};
use tilefuse::prelude::*;
use tilefuse::runtime::dist::ProcessGroup;
use tilefuse_testkit::{exit_code, poisoned, random_vec, rel_error_tensors, Rng};

const OPS: [&str; 8] = [
    "ag_rows",
    "ag_cols",
    "matmul_all_gather",
    "mag_stores",
    "matmul_reduce_scatter",
    "rs_rows",
    "matmul_all_reduce",
    "ar_one_shot",
];

struct Args {
    mnk: [usize; 3],
    ops: Vec<&'static str>,
    bench: bool,
    chunks: Option<usize>,
}

/// fused_ops's command line (each rank parses it).
#[derive(clap::Parser)]
#[command(
    about = "Every fused GEMM + collective op on every rank, checked against NCCL + cuBLAS, optionally timed against them"
)]
struct Cli {
    /// M, N and K of the GEMM (all three, or none for the defaults).
    #[arg(num_args = 3, value_names = ["M", "N", "K"])]
    mnk: Vec<usize>,
    /// Time each op against NCCL + cuBLAS.
    #[arg(long)]
    bench: bool,
    /// One op, or `all`.
    #[arg(long, default_value = "all", value_parser = op_name)]
    op: String,
    /// Chunks each rank's part is cut into (the op's default otherwise).
    #[arg(long, value_parser = positive)]
    chunks: Option<usize>,
}

fn op_name(s: &str) -> Result<String, String> {
    if s == "all" || OPS.contains(&s) {
        Ok(s.to_string())
    } else {
        Err(format!("`{s}`: one of {OPS:?} or `all`"))
    }
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(format!("`{s}`: expected a positive integer")),
    }
}

impl From<Cli> for Args {
    fn from(cli: Cli) -> Args {
        // Interpret mode: a size the CPU runs in a moment, ragged against
        // the block sizes.
        let mnk = tilefuse_testkit::sizes(&cli.mnk, [4096, 6656, 16384], [240, 168, 136]);
        let ops = match OPS.iter().find(|o| **o == cli.op) {
            Some(o) => vec![*o],
            None => OPS.to_vec(),
        };
        Args {
            mnk,
            ops,
            bench: cli.bench,
            chunks: cli.chunks,
        }
    }
}

/// One op's inputs on this rank, and how to call it.
struct Problem {
    name: &'static str,
    a: Tensor<bf16>,
    b: Tensor<bf16>,
    out_shape: [usize; 2],
    /// A's shape in the product this rank computes (the cuBLAS floor).
    floor_a: [usize; 2],
    bias: Tensor<bf16>,
    bias_rows: bool,
}

impl Problem {
    fn call(
        &self,
        pg: &ProcessGroup,
        out: &Tensor<bf16>,
        opts: &OpOptions<'_>,
        ws: Option<Workspace>,
    ) -> tilefuse::Result<Workspace> {
        let bias = if self.bias_rows {
            Bias::Rows(&self.bias)
        } else {
            Bias::Cols(&self.bias)
        };
        let opts = opts.clone().bias(bias);
        match self.name {
            "ag_rows" => {
                ops::all_gather_matmul(pg, out, &self.a, &self.b, GatherDim::Rows, &opts, ws)
            }
            "ag_cols" => {
                ops::all_gather_matmul(pg, out, &self.a, &self.b, GatherDim::Cols, &opts, ws)
            }
            "matmul_all_gather" => ops::matmul_all_gather(pg, out, &self.a, &self.b, &opts, ws),
            "mag_stores" => {
                let opts = opts.gather(GatherVariant::PeerStores);
                ops::matmul_all_gather(pg, out, &self.a, &self.b, &opts, ws)
            }
            "matmul_reduce_scatter" => {
                ops::matmul_reduce_scatter(pg, out, &self.a, &self.b, ScatterDim::Cols, &opts, ws)
            }
            "rs_rows" => {
                ops::matmul_reduce_scatter(pg, out, &self.a, &self.b, ScatterDim::Rows, &opts, ws)
            }
            "ar_one_shot" => {
                let opts = opts.all_reduce(AllReduceVariant::OneShot);
                ops::matmul_all_reduce(pg, out, &self.a, &self.b, &opts, ws)
            }
            _ => ops::matmul_all_reduce(pg, out, &self.a, &self.b, &opts, ws),
        }
    }
}

fn problem(
    name: &'static str,
    [m, n, k]: [usize; 3],
    w: usize,
    rng: &mut Rng,
    shared: u64,
) -> tilefuse::Result<Problem> {
    let t = |shape: [usize; 2], rng: &mut Rng| {
        Tensor::from_slice(&random_vec::<bf16>(rng, shape[0] * shape[1], 1.0), shape)
    };
    // B is the same on every rank where the op wants it whole.
    let mut b_rng = Rng::new(shared);
    // And the product each rank computes (the benchmark's cuBLAS floor): A's rows
    // and columns as the GEMM sees them, after a gather of A.
    let (a, b, out_shape, floor_a) = match name {
        "ag_rows" => (t([m / w, k], rng)?, t([k, n], &mut b_rng)?, [m, n], [m, k]),
        "ag_cols" => (t([m, k / w], rng)?, t([k, n], &mut b_rng)?, [m, n], [m, k]),
        "matmul_all_gather" | "mag_stores" => (
            t([m / w, k], rng)?,
            t([k, n], &mut b_rng)?,
            [m, n],
            [m / w, k],
        ),
        "matmul_reduce_scatter" => (
            t([m, k / w], rng)?,
            t([k / w, n], rng)?,
            [m, n / w],
            [m, k / w],
        ),
        "rs_rows" => (
            t([m, k / w], rng)?,
            t([k / w, n], rng)?,
            [m / w, n],
            [m, k / w],
        ),
        _ => (t([m, k / w], rng)?, t([k / w, n], rng)?, [m, n], [m, k / w]),
    };
    // Rows for the gathers (a per-row bias of the rows each rank computes), columns otherwise.
    let bias_rows = matches!(name, "ag_rows" | "matmul_all_gather" | "mag_stores");
    let bias_len = match name {
        "ag_rows" => m,
        "matmul_all_gather" | "mag_stores" => m / w,
        _ => n,
    };
    let bias = Tensor::from_slice(&random_vec::<bf16>(rng, bias_len, 0.5), [bias_len])?;
    Ok(Problem {
        name,
        a,
        b,
        out_shape,
        floor_a,
        bias,
        bias_rows,
    })
}

fn run(args: Args) -> tilefuse::Result<bool> {
    let pg = ProcessGroup::init()?;
    let (rank, w) = (pg.rank(), pg.world_size());
    let [m, n, k] = args.mnk;
    if m % w != 0 || n % w != 0 || k % w != 0 {
        return Err(tilefuse::Error::Argument {
            context: "fused_ops".into(),
            arg: "M N K".into(),
            message: format!("{m} {n} {k} must each split evenly over {w} ranks"),
        });
    }
    let seed = Rng::fresh().next_u64();
    let seeds = pg.all_gather_bytes("seed", &seed.to_le_bytes())?;
    let shared = u64::from_le_bytes(seeds[0][..8].try_into().unwrap_or([0; 8]));
    let mut rng = Rng::new(seed ^ (rank as u64 + 1));
    let mut all_ok = true;
    for name in &args.ops {
        let p = problem(name, args.mnk, w, &mut rng, shared)?;
        let mut opts = OpOptions::default();
        opts.config.chunks = args.chunks;
        let fused_out = poisoned::<bf16>(p.out_shape)?;
        let unfused_out = poisoned::<bf16>(p.out_shape)?;
        let fused_ws = p.call(
            &pg,
            &fused_out,
            &opts.clone().algorithm(Algorithm::Fused),
            None,
        )?;
        let unfused_ws = p.call(
            &pg,
            &unfused_out,
            &opts.clone().algorithm(Algorithm::Unfused),
            None,
        )?;
        pg.synchronize(name)?;
        let err = rel_error_tensors(&fused_out, &unfused_out)?;
        let ok = err <= 1e-2;
        let oks = pg.all_gather_bytes("ok", &[u8::from(ok)])?;
        let everyone = oks.iter().all(|v| v.first() == Some(&1));
        println!(
            "rank {rank}: {name} {m}x{n}x{k} over {w}: ‖fused − NCCL+cuBLAS‖/‖NCCL+cuBLAS‖ = {err:.2e} ({})",
            if ok { "ok" } else { "FAILED" }
        );
        all_ok &= everyone;
        if args.bench && everyone {
            bench(&pg, &p, &opts, fused_ws, unfused_ws, args.mnk)?;
        }
    }
    Ok(all_ok)
}

fn bench(
    pg: &ProcessGroup,
    p: &Problem,
    opts: &OpOptions<'_>,
    fused_ws: Workspace,
    unfused_ws: Workspace,
    [m, n, k]: [usize; 3],
) -> tilefuse::Result<()> {
    let dev = pg.device().clone();
    let out = Tensor::<bf16>::empty(p.out_shape)?;
    // The floor: cuBLAS on the product this rank computes, with no communication.
    let [fm, fk] = p.floor_a;
    let fb = &p.b;
    let fa = tilefuse_testkit::random_tensor::<bf16>([fm, fk], 1.0)?;
    let mut fc = Tensor::<bf16>::empty([fm, fb.size(1)])?;
    let mut wss = [Some(fused_ws), Some(unfused_ws)];
    let algs = [Algorithm::Fused, Algorithm::Unfused];
    let (rounds, reps) = (6, 5);
    let mut medians = vec![Vec::new(); 3];
    for _ in 0..rounds {
        for i in 0..3 {
            pg.barrier("bench")?;
            let t = if i == 2 {
                tilefuse::time_gpu(&dev, 2, reps, true, || {
                    tilefuse::cublas::matmul_into(&mut fc, &fa, fb)
                })?
            } else {
                let o = opts.clone().algorithm(algs[i]).async_op(true);
                tilefuse::time_gpu(&dev, 2, reps, true, || {
                    wss[i] = Some(p.call(pg, &out, &o, wss[i].take())?);
                    Ok(())
                })?
            };
            medians[i].push(t.median_ms);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|x, y| x.total_cmp(y));
        v[v.len() / 2]
    };
    let (fused, unfused, floor) = (
        med(&mut medians[0]),
        med(&mut medians[1]),
        med(&mut medians[2]),
    );
    // The slowest rank's time is the op's.
    let worst = pg.max_over_ranks("bench-times", &[fused, unfused, floor])?;
    let (fused, unfused, floor) = (worst[0], worst[1], worst[2]);
    // What Auto picks, on a workspace of its own.
    let auto = p
        .call(pg, &out, &opts.clone().async_op(true), None)?
        .algorithm();
    if pg.rank() == 0 {
        let tf = |ms: f64| 2.0 * (m * n * k) as f64 / pg.world_size() as f64 / ms / 1e9;
        println!(
            "| {} | {m}×{n}×{k} | {} | {floor:.3} | {fused:.3} ({:.0}) | {unfused:.3} ({:.0}) | {:.3} | {:.3} | {auto:?} |",
            p.name,
            pg.world_size(),
            tf(fused),
            tf(unfused),
            unfused / fused,
            fused / floor
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    match tilefuse_testkit::args::<Cli>("fused_ops") {
        Ok(cli) => exit_code(run(cli.into())),
        Err(code) => code,
    }
}
