//! A tensor-parallel layer's tail in one kernel: the ranks' partial sums
//! all-reduced, a bias added, then RMSNorm with a weight,
//! `out = rms_norm(x_0 + … + x_{w-1} + bias) · weight`, on every rank.
//!
//! One-shot all-reduce over symmetric memory: each rank's partial stays in its
//! symmetric buffer (an `Exchange` region, where a row-parallel GEMM would
//! write it); once every peer's flag says its partial is there, the kernel
//! reads all of them where they live (the peers' over NVLink), sums them in f32
//! in rank order (so every rank gets the same bits), and normalizes each row
//! in the same pass. Nothing is copied and no reduced tensor is written: the
//! unfused path (NCCL's all-reduce, then the same kernel over the sum) writes
//! and reads the sum once more. Up to four ranks.
//!
//! ```text
//! cargo build --release --examples --bins
//! target/release/tilefuse-run --nproc-per-node 2 target/release/examples/all_reduce_bias_rms_norm [M N] [--bench]
//! ```
//!
//! Each rank checks its output against a float64 reference built from every
//! rank's partial (regenerated from the shared seed), and that all ranks hold
//! the same bits. `--bench` times the fused call against NCCL's all-reduce plus
//! the kernel, in interleaved rounds (the slowest rank's median).

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse::runtime::dist::{Exchange, ProcessGroup};
use tilefuse_testkit::{exit_code, poisoned, random_vec, rel_error, Rng};

/// The most ranks the kernel reads from (one tensor parameter each).
pub const MAX_WORLD: usize = 4;

/// `out[i, :] = y · rsqrt(mean(y²) + eps) · weight`, `y = x0[i, :] + … + bias`,
/// summing the first `world` partials. A partial past `world` is not read (pass
/// any tensor of the same rank).
#[fused_kernel]
#[allow(clippy::too_many_arguments)]
pub fn all_reduce_bias_rms_norm(
    x0: &Tensor<bf16>,
    x1: &Tensor<bf16>,
    x2: &Tensor<bf16>,
    x3: &Tensor<bf16>,
    bias: &Tensor<bf16>,
    weight: &Tensor<bf16>,
    out: &Tensor<bf16>,
    eps: f32,
    #[constexpr] world: usize,
) {
    let [m, n] = x0.shape();
    for tm in tile(m) {
        let mut sum_sq = zeros::<f32>([tm]);
        for tn in tile(n) {
            let y0 = x0[(tm, tn)].cast::<f32>();
            let y1 = if world > 1 {
                y0 + x1[(tm, tn)].cast::<f32>()
            } else {
                y0
            };
            let y2 = if world > 2 {
                y1 + x2[(tm, tn)].cast::<f32>()
            } else {
                y1
            };
            let y3 = if world > 3 {
                y2 + x3[(tm, tn)].cast::<f32>()
            } else {
                y2
            };
            let y = y3 + bias[tn].cast::<f32>();
            sum_sq = sum_sq + (y * y).sum(tn);
        }
        let rstd = rsqrt(sum_sq / (n as f32) + eps);
        // One pass when the column block covers the row: the loads above are
        // kept in registers, so the peers are read once.
        for tn in tile(n) {
            let y0 = x0[(tm, tn)].cast::<f32>();
            let y1 = if world > 1 {
                y0 + x1[(tm, tn)].cast::<f32>()
            } else {
                y0
            };
            let y2 = if world > 2 {
                y1 + x2[(tm, tn)].cast::<f32>()
            } else {
                y1
            };
            let y3 = if world > 3 {
                y2 + x3[(tm, tn)].cast::<f32>()
            } else {
                y2
            };
            let y = y3 + bias[tn].cast::<f32>();
            out[(tm, tn)] = (y * rstd * weight[tn].cast::<f32>()).cast();
        }
    }
}

/// The float64 result from every rank's partial (`parts[p]`, `m` × `n`).
pub fn reference(parts: &[Vec<f64>], bias: &[f64], w: &[f64], n: usize, eps: f64) -> Vec<f64> {
    let m = parts.first().map_or(0, |p| p.len() / n.max(1));
    let mut out = vec![0.0; m * n];
    let mut y = vec![0.0; n];
    for i in 0..m {
        for (j, v) in y.iter_mut().enumerate() {
            *v = parts.iter().map(|p| p[i * n + j]).sum::<f64>() + bias[j];
        }
        let rstd = 1.0 / (y.iter().map(|v| v * v).sum::<f64>() / n as f64 + eps).sqrt();
        for j in 0..n {
            out[i * n + j] = y[j] * rstd * w[j];
        }
    }
    out
}

/// Rank `p`'s partial for the run's `seed` (every rank can rebuild all of them).
fn partial(seed: u64, p: usize, m: usize, n: usize) -> Vec<bf16> {
    random_vec::<bf16>(&mut Rng::new(seed ^ (0x9e37 * (p as u64 + 1))), m * n, 1.0)
}

/// One rank's state: its exchange (this rank's partial is region 0, flag `p`
/// says rank `p`'s is ready), every rank's partial as mapped here, the layer's
/// bias and weight.
struct Layer {
    pg: ProcessGroup,
    ex: Exchange,
    parts: Vec<Tensor<bf16>>,
    bias: Tensor<bf16>,
    weight: Tensor<bf16>,
    eps: f32,
}

impl Layer {
    /// `out = rms_norm(Σ partials + bias) · weight`, fused: flags, then the kernel.
    fn fused(&mut self, out: &Tensor<bf16>) -> tilefuse::Result<()> {
        let (rank, world) = (self.pg.rank(), self.pg.world_size());
        let peers: Vec<usize> = (1..world).map(|d| (rank + d) % world).collect();
        self.ex.start()?;
        for &p in &peers {
            self.ex.notify(p, rank)?;
        }
        for &p in &peers {
            self.ex.await_slot(p)?;
        }
        self.ex.launch_follows()?;
        self.kernel(&self.parts, out)?;
        // Every peer done reading this rank's partial before it may change.
        self.ex.close()
    }

    /// The unfused path: NCCL's all-reduce into `sum`, then the kernel over it.
    fn unfused(&self, sum: &Tensor<bf16>, out: &Tensor<bf16>) -> tilefuse::Result<()> {
        self.pg
            .nccl()?
            .all_reduce(&self.parts[self.pg.rank()], sum)?;
        self.kernel(std::slice::from_ref(sum), out)
    }

    fn kernel(&self, parts: &[Tensor<bf16>], out: &Tensor<bf16>) -> tilefuse::Result<()> {
        let x = |p: usize| &parts[p.min(parts.len() - 1)];
        all_reduce_bias_rms_norm(
            x(0),
            x(1),
            x(2),
            x(3),
            &self.bias,
            &self.weight,
            out,
            self.eps,
            parts.len(),
        )
    }
}

/// all_reduce_bias_rms_norm's command line (each rank parses it).
#[derive(clap::Parser)]
#[command(
    about = "out = RMSNorm(Σ_ranks partial + bias) in one kernel reading every rank's partial; checked against float64, optionally timed against NCCL + the same kernel"
)]
struct Args {
    /// Rows and row length (both, or neither for the defaults).
    #[arg(num_args = 2, value_names = ["M", "N"], value_parser = positive)]
    mn: Vec<usize>,
    /// Time it against NCCL's all-reduce and the same kernel.
    #[arg(long)]
    bench: bool,
}

fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(v) if v > 0 => Ok(v),
        _ => Err(format!("`{s}`: expected a positive integer")),
    }
}

fn run(args: Args) -> tilefuse::Result<bool> {
    let bench = args.bench;
    let [m, n] = tilefuse_testkit::sizes(&args.mn, [1000, 3000], [37, 200]);
    let pg = ProcessGroup::init()?;
    let (rank, world) = (pg.rank(), pg.world_size());
    if world > MAX_WORLD {
        eprintln!("all_reduce_bias_rms_norm reads at most {MAX_WORLD} ranks' partials; run it on {MAX_WORLD} or fewer (got {world})");
        return Ok(false);
    }
    // A fresh seed, rank 0's, for every rank: each can rebuild all partials.
    let mine = Rng::fresh().next_u64().to_le_bytes();
    let seeds = pg.all_gather_bytes("seed", &mine)?;
    let seed = seeds
        .first()
        .and_then(|b| b.as_slice().try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(1);
    let ex = Exchange::new(&pg, m * n * 2, world)?;
    ex.data::<bf16>(0, &[m, n])?
        .copy_from_slice(&partial(seed, rank, m, n))?;
    let parts = (0..world)
        .map(|p| ex.peer_data::<bf16>(p, 0, &[m, n]))
        .collect::<tilefuse::Result<Vec<_>>>()?;
    let mut rng = Rng::new(seed ^ 0xb1a5);
    let bias_host = random_vec::<bf16>(&mut rng, n, 1.0);
    let w_host = random_vec::<bf16>(&mut rng, n, 1.0);
    let mut layer = Layer {
        bias: Tensor::from_slice(&bias_host, [n])?,
        weight: Tensor::from_slice(&w_host, [n])?,
        pg,
        ex,
        parts,
        eps: 1e-5,
    };
    let dev = layer.pg.device().clone();
    if rank == 0 {
        println!(
            "device: {} ({}), all-reduce + bias + RMSNorm of x[{m}x{n}] bf16 over {world} rank(s)",
            dev.name(),
            dev.arch()
        );
    }
    let out = poisoned::<bf16>([m, n])?;
    layer.fused(&out)?;
    layer.pg.synchronize("all_reduce_bias_rms_norm")?;
    let f64s = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
    let all: Vec<Vec<f64>> = (0..world).map(|p| f64s(&partial(seed, p, m, n))).collect();
    let expect = reference(&all, &f64s(&bias_host), &f64s(&w_host), n, 1e-5);
    let got = out.to_vec()?;
    let err = rel_error(&got, &expect, |v: bf16| v.to_f64(), |v| v);
    // Tensor parallelism needs every rank to hold the same activations.
    let digest = got
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3)
        })
        .to_le_bytes();
    let digests = layer.pg.all_gather_bytes("digest", &digest)?;
    let same = digests.iter().all(|d| d[..] == digest[..]);
    let ok = err <= 1e-2 && same;
    println!(
        "rank {rank}: ‖out − ref‖/‖ref‖ = {err:.2e}, {} ({})",
        if same {
            "the same bits on every rank"
        } else {
            "ranks DIFFER"
        },
        if ok { "ok" } else { "FAILED" }
    );
    let oks = layer.pg.all_gather_bytes("ok", &[u8::from(ok)])?;
    let everyone = oks.iter().all(|v| v.first() == Some(&1));
    if bench && everyone {
        bench_paths(&mut layer, &out, [m, n])?;
    }
    Ok(everyone)
}

/// Fused against NCCL + the kernel, interleaved rounds, the slowest rank's median.
fn bench_paths(layer: &mut Layer, out: &Tensor<bf16>, [m, n]: [usize; 2]) -> tilefuse::Result<()> {
    let dev = layer.pg.device().clone();
    let sum = Tensor::<bf16>::empty([m, n])?;
    let (rounds, reps) = (5, 20);
    let mut medians = [Vec::new(), Vec::new()];
    for _ in 0..rounds {
        for (i, times) in medians.iter_mut().enumerate() {
            layer.pg.barrier("bench")?;
            let t = match i {
                0 => tilefuse::time_gpu(&dev, 3, reps, true, || layer.fused(out))?,
                _ => tilefuse::time_gpu(&dev, 3, reps, true, || layer.unfused(&sum, out))?,
            };
            times.push(t.median_ms);
        }
    }
    let mine = medians.map(|mut v| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    });
    let worst = layer.pg.max_over_ranks("bench-times", &mine)?;
    let (fused, unfused) = (worst[0], worst[1]);
    if layer.pg.rank() == 0 {
        // Bytes the fused kernel moves: every partial read once, the output written.
        let world = layer.pg.world_size();
        let gbs = ((world + 1) * m * n * 2) as f64 / fused / 1e6;
        println!(
            "| all_reduce_bias_rms_norm | {m}×{n} | {world} | {fused:.4} ms ({gbs:.0} GB/s) | {unfused:.4} ms | {:.2} |",
            unfused / fused
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    match tilefuse_testkit::args::<Args>("all_reduce_bias_rms_norm") {
        Ok(args) => exit_code(run(args)),
        Err(code) => code,
    }
}
