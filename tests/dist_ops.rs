//! The fused op library on real GPUs, as ranks under `tilefuse-run`: every op,
//! fused, unfused and auto, with each kind of bias, on shapes that are not
//! multiples of any block size, two calls each through one workspace with fresh
//! inputs, against a float64 reference built from every rank's inputs; then
//! bad input on every rank. Run as a plain test it launches itself on every GPU
//! it sees. Without a GPU it runs the same checks as two CPU ranks in interpret
//! mode (shared memory, the exchange's host thread; no CUDA graphs), as it
//! does with TILEFUSE_INTERPRET=1; without a GPU, TILEFUSE_REQUIRE_GPU=1 fails
//! it and TILEFUSE_INTERPRET=0 skips it.

#[path = "dist_ops/plans.rs"]
mod plans;

#[path = "common/launcher.rs"]
mod launcher;
use launcher::launcher;
use std::process::{Command, ExitCode};
use tilefuse::ops::{
    self, Algorithm, AllReduceVariant, Bias, GatherDim, GatherVariant, OpOptions, ScatterDim,
    Workspace,
};
use tilefuse::prelude::*;
use tilefuse::runtime::dist::ProcessGroup;
use tilefuse::runtime::mode::{self, Mode};
use tilefuse_testkit::{matmul_f64, poisoned, random_vec, rel_error, Rng};

type R<T> = Result<T, String>;

fn e(x: tilefuse::Error) -> String {
    x.to_string()
}

/// Every rank's host vector, in rank order.
fn gather(pg: &ProcessGroup, label: &str, v: &[bf16]) -> R<Vec<Vec<f64>>> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    Ok(pg
        .all_gather_bytes(label, &bytes)
        .map_err(e)?
        .into_iter()
        .map(|b| {
            b.chunks_exact(2)
                .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f64())
                .collect()
        })
        .collect())
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    AgRows,
    /// Rows gathered in bands of columns, waited for per k-tile.
    AgRowsAlongK,
    AgCols,
    MatmulAllGather,
    /// The GEMM stores into the peers' memory (the default: the copy engine pulls).
    MatmulAllGatherStores,
    ReduceScatterCols,
    ReduceScatterRows,
    AllReduce,
    AllReduceOneShot,
}

/// Sizes of the whole problem: M, N, K (each a multiple of the world size).
fn sizes(w: usize) -> [usize; 3] {
    [150 * w, 92 * w, 104 * w]
}

struct Inputs {
    a: Vec<bf16>,
    a_shape: [usize; 2],
    b: Vec<bf16>,
    b_shape: [usize; 2],
    out_shape: [usize; 2],
}

fn inputs(op: Op, w: usize, rng: &mut Rng, shared: &mut Rng) -> Inputs {
    let [m, n, k] = sizes(w);
    let (a_shape, b_shape, out_shape, b_shared) = match op {
        Op::AgRows | Op::AgRowsAlongK => ([m / w, k], [k, n], [m, n], true),
        Op::AgCols => ([m, k / w], [k, n], [m, n], true),
        Op::MatmulAllGather | Op::MatmulAllGatherStores => ([m / w, k], [k, n], [m, n], true),
        Op::ReduceScatterCols => ([m, k / w], [k / w, n], [m, n / w], false),
        Op::ReduceScatterRows => ([m, k / w], [k / w, n], [m / w, n], false),
        Op::AllReduce | Op::AllReduceOneShot => ([m, k / w], [k / w, n], [m, n], false),
    };
    let a = random_vec::<bf16>(rng, a_shape[0] * a_shape[1], 1.0);
    let b = random_vec::<bf16>(
        if b_shared { shared } else { rng },
        b_shape[0] * b_shape[1],
        1.0,
    );
    Inputs {
        a,
        a_shape,
        b,
        b_shape,
        out_shape,
    }
}

/// The bias for `variant` (0 none, 1 rows, 2 columns) of the product this rank computes.
fn bias_len(op: Op, variant: usize, w: usize) -> usize {
    let [m, n, _] = sizes(w);
    match (variant, op) {
        (1, Op::MatmulAllGather | Op::MatmulAllGatherStores) => m / w,
        (1, _) => m,
        _ => n,
    }
}

/// This rank's expected output, in float64.
fn reference(op: Op, pg: &ProcessGroup, i: &Inputs, bias: &[bf16], variant: usize) -> R<Vec<f64>> {
    let (r, w) = (pg.rank(), pg.world_size());
    let [m, n, k] = sizes(w);
    let a = gather(pg, "ref-a", &i.a)?;
    let b = gather(pg, "ref-b", &i.b)?;
    let bias = gather(pg, "ref-bias", bias)?;
    let add_bias = |c: &mut [f64], bias: &[f64]| {
        for (idx, v) in c.iter_mut().enumerate() {
            *v += match variant {
                1 => bias[idx / n],
                2 => bias[idx % n],
                _ => 0.0,
            };
        }
    };
    Ok(match op {
        Op::AgRows | Op::AgRowsAlongK | Op::AgCols => {
            let mut full = vec![0.0; m * k];
            for (p, ap) in a.iter().enumerate() {
                let [sr, sc] = i.a_shape;
                for row in 0..sr {
                    for col in 0..sc {
                        let (fr, fc) = if op != Op::AgCols {
                            (p * sr + row, col)
                        } else {
                            (row, p * sc + col)
                        };
                        full[fr * k + fc] = ap[row * sc + col];
                    }
                }
            }
            let mut c = matmul_f64(&full, &b[0], m, k, n);
            add_bias(&mut c, &bias[r]);
            c
        }
        Op::MatmulAllGather | Op::MatmulAllGatherStores => {
            let mut out = Vec::with_capacity(m * n);
            for p in 0..w {
                let mut c = matmul_f64(&a[p], &b[0], m / w, k, n);
                add_bias(&mut c, &bias[p]);
                out.extend(c);
            }
            out
        }
        Op::ReduceScatterCols | Op::ReduceScatterRows | Op::AllReduce | Op::AllReduceOneShot => {
            let mut sum = vec![0.0; m * n];
            for p in 0..w {
                let mut c = matmul_f64(&a[p], &b[p], m, k / w, n);
                add_bias(&mut c, &bias[p]);
                for (s, v) in sum.iter_mut().zip(c) {
                    *s += v;
                }
            }
            match op {
                Op::AllReduce | Op::AllReduceOneShot => sum,
                Op::ReduceScatterRows => sum[r * (m / w) * n..(r + 1) * (m / w) * n].to_vec(),
                _ => (0..m)
                    .flat_map(|row| {
                        sum[row * n + r * (n / w)..row * n + (r + 1) * (n / w)].to_vec()
                    })
                    .collect(),
            }
        }
    })
}

#[allow(clippy::too_many_arguments)]
fn call(
    op: Op,
    pg: &ProcessGroup,
    out: &Tensor<bf16>,
    a: &Tensor<bf16>,
    b: &Tensor<bf16>,
    opts: &OpOptions<'_>,
    ws: Option<Workspace>,
) -> tilefuse::Result<Workspace> {
    match op {
        Op::AgRows => {
            let opts = opts.clone().chunks_along_k(false);
            ops::all_gather_matmul(pg, out, a, b, GatherDim::Rows, &opts, ws)
        }
        Op::AgRowsAlongK => {
            let opts = opts.clone().chunks_along_k(true);
            ops::all_gather_matmul(pg, out, a, b, GatherDim::Rows, &opts, ws)
        }
        Op::AgCols => ops::all_gather_matmul(pg, out, a, b, GatherDim::Cols, opts, ws),
        Op::MatmulAllGather => ops::matmul_all_gather(pg, out, a, b, opts, ws),
        Op::MatmulAllGatherStores => {
            let opts = opts.clone().gather(GatherVariant::PeerStores);
            ops::matmul_all_gather(pg, out, a, b, &opts, ws)
        }
        Op::ReduceScatterCols => {
            ops::matmul_reduce_scatter(pg, out, a, b, ScatterDim::Cols, opts, ws)
        }
        Op::ReduceScatterRows => {
            ops::matmul_reduce_scatter(pg, out, a, b, ScatterDim::Rows, opts, ws)
        }
        Op::AllReduce => ops::matmul_all_reduce(pg, out, a, b, opts, ws),
        Op::AllReduceOneShot => {
            let opts = opts.clone().all_reduce(AllReduceVariant::OneShot);
            ops::matmul_all_reduce(pg, out, a, b, &opts, ws)
        }
    }
}

const ALL_OPS: [Op; 9] = [
    Op::AgRows,
    Op::AgRowsAlongK,
    Op::AgCols,
    Op::MatmulAllGather,
    Op::MatmulAllGatherStores,
    Op::ReduceScatterCols,
    Op::ReduceScatterRows,
    Op::AllReduce,
    Op::AllReduceOneShot,
];

fn check_ops(pg: &ProcessGroup) -> R<()> {
    let (rank, w) = (pg.rank(), pg.world_size());
    let seed = Rng::fresh().next_u64();
    let seeds = pg
        .all_gather_bytes("seed", &seed.to_le_bytes())
        .map_err(e)?;
    let mut shared = Rng::new(u64::from_le_bytes(
        seeds[0][..8].try_into().map_err(|_| "seed")?,
    ));
    let mut rng = Rng::new(seed ^ (rank as u64 + 1));
    for op in ALL_OPS {
        for (v, alg) in [Algorithm::Fused, Algorithm::Unfused, Algorithm::Auto]
            .into_iter()
            .enumerate()
        {
            let variant = (v + 1) % 3;
            let mut ws = None;
            for round in 0..2 {
                let i = inputs(op, w, &mut rng, &mut shared);
                let a = Tensor::from_slice(&i.a, i.a_shape).map_err(e)?;
                let b = Tensor::from_slice(&i.b, i.b_shape).map_err(e)?;
                let blen = bias_len(op, variant, w);
                let bias_host = random_vec::<bf16>(&mut rng, blen, 0.5);
                let bias_t = Tensor::from_slice(&bias_host, [blen]).map_err(e)?;
                let bias = match variant {
                    1 => Bias::Rows(&bias_t),
                    2 => Bias::Cols(&bias_t),
                    _ => Bias::None,
                };
                let out = poisoned::<bf16>(i.out_shape).map_err(e)?;
                let opts = OpOptions::default()
                    .bias(bias)
                    .algorithm(alg)
                    .chunks(3)
                    .async_op(round == 1);
                let got = call(op, pg, &out, &a, &b, &opts, ws.take())
                    .map_err(|x| format!("{op:?} {alg:?} round {round}: {x}"))?;
                ws = Some(got);
                pg.synchronize("an op").map_err(e)?;
                let want = reference(op, pg, &i, &bias_host, variant)?;
                let have = out.to_vec().map_err(e)?;
                let err = rel_error(&have, &want, |x| x.to_f64(), |x| x);
                println!(
                    "rank {rank}: {op:?} {alg:?} bias {variant} round {round}: rel error {err:.2e}"
                );
                if err.is_nan() || err > 1e-2 {
                    return Err(format!(
                        "{op:?} {alg:?} bias {variant} round {round}: rel error {err:.2e}"
                    ));
                }
            }
            if alg == Algorithm::Auto && ws.as_ref().and_then(|w| w.algorithm()).is_none() {
                return Err(format!("{op:?}: Auto did not settle on a path"));
            }
        }
    }
    Ok(())
}

fn expect_error(what: &str, r: tilefuse::Result<Workspace>, needle: &str) -> R<()> {
    match r {
        Ok(_) => Err(format!("{what}: accepted")),
        Err(x) if x.to_string().contains(needle) => {
            println!("{what}: {x}");
            Ok(())
        }
        Err(x) => Err(format!("{what}: unclear error (wanted `{needle}`): {x}")),
    }
}

fn check_bad_input(pg: &ProcessGroup) -> R<()> {
    let w = pg.world_size();
    let t = |r: usize, c: usize| Tensor::<bf16>::full([r, c], bf16::ONE).map_err(e);
    let v = |n: usize| Tensor::<bf16>::full([n], bf16::ONE).map_err(e);
    let o = OpOptions::default();
    let (a, b) = (t(64, 32)?, t(32, 48 * w)?);
    expect_error(
        "all_gather_matmul with a wrong out",
        ops::all_gather_matmul(pg, &t(64, 48 * w)?, &a, &b, GatherDim::Rows, &o, None),
        "argument `out`",
    )?;
    expect_error(
        "all_gather_matmul with b of the wrong height",
        ops::all_gather_matmul(
            pg,
            &t(64 * w, 48)?,
            &a,
            &t(31, 48)?,
            GatherDim::Rows,
            &o,
            None,
        ),
        "argument `b`",
    )?;
    expect_error(
        "matmul_all_reduce with a bias of the wrong length",
        ops::matmul_all_reduce(
            pg,
            &t(64, 48 * w)?,
            &a,
            &b,
            &o.clone().bias(Bias::Cols(&v(7)?)),
            None,
        ),
        "argument `bias`",
    )?;
    expect_error(
        "matmul_reduce_scatter with an all-reduce variant",
        ops::matmul_reduce_scatter(
            pg,
            &t(64, 48)?,
            &a,
            &b,
            ScatterDim::Cols,
            &o.clone().all_reduce(AllReduceVariant::Ring),
            None,
        ),
        "config.all_reduce",
    )?;
    expect_error(
        "matmul_all_reduce with zero chunks",
        ops::matmul_all_reduce(pg, &t(64, 48 * w)?, &a, &b, &o.clone().chunks(0), None),
        "config.chunks",
    )?;
    expect_error(
        "matmul_all_gather with a 1-D a",
        ops::matmul_all_gather(pg, &t(64 * w, 48)?, &v(5)?, &b, &o, None),
        "argument `a`",
    )?;
    if w > 1 {
        expect_error(
            "matmul_reduce_scatter with N that does not split",
            ops::matmul_reduce_scatter(
                pg,
                &t(64, 1)?,
                &a,
                &t(32, 48 * w + 1)?,
                ScatterDim::Cols,
                &o,
                None,
            ),
            "argument `b`",
        )?;
    }
    if w > 1 {
        expect_error(
            "matmul_all_reduce with fewer rows than ranks",
            ops::matmul_all_reduce(pg, &t(1, 48 * w)?, &t(1, 32)?, &b, &o, None),
            "argument `a`",
        )?;
    }
    // A workspace built for the unfused path only serves a fused call by being
    // rebuilt (it has no symmetric buffers).
    let out = Tensor::<bf16>::empty([64, 48 * w]).map_err(e)?;
    let unfused = o.clone().algorithm(Algorithm::Unfused);
    let ws = ops::matmul_all_reduce(pg, &out, &a, &b, &unfused, None).map_err(e)?;
    let fused = o.clone().algorithm(Algorithm::Fused);
    let ws = ops::matmul_all_reduce(pg, &out, &a, &b, &fused, Some(ws)).map_err(e)?;
    drop(ws);
    if out
        .to_vec()
        .map_err(e)?
        .iter()
        .any(|x| x.to_f32() != (32 * w) as f32)
    {
        return Err("a fused call on an unfused workspace gave wrong sums".into());
    }
    // A workspace built for another shape, then another op, is rebuilt, not reused.
    let out = Tensor::<bf16>::empty([64, 48 * w]).map_err(e)?;
    let ws = ops::matmul_all_reduce(pg, &out, &a, &b, &o, None).map_err(e)?;
    let first = ws.key().to_string();
    let (a2, out2) = (t(40, 32)?, Tensor::<bf16>::empty([40, 48 * w]).map_err(e)?);
    let ws = ops::matmul_all_reduce(pg, &out2, &a2, &b, &o, Some(ws)).map_err(e)?;
    if ws.key() == first {
        return Err("a workspace for 64 rows was reused for 40".into());
    }
    let got = out2.to_vec().map_err(e)?;
    let want = (32 * w) as f32;
    if got.iter().any(|x| x.to_f32() != want) {
        return Err(format!(
            "after rebuilding, all-reduce of ones gave {:?}, want {want}",
            &got[..4]
        ));
    }
    let out3 = Tensor::<bf16>::empty([40 * w, 48 * w]).map_err(e)?;
    let ws = ops::matmul_all_gather(pg, &out3, &a2, &b, &o, Some(ws)).map_err(e)?;
    if !ws.key().starts_with("matmul_all_gather") {
        return Err(format!(
            "a matmul_all_reduce workspace was used for matmul_all_gather: {}",
            ws.key()
        ));
    }
    Ok(())
}

/// Rank 1 dies between two calls of a fused reduce-scatter (its exchange's
/// flags are then never set); the others' second call must end on its own
/// bounded wait with an error naming the op, not hang: they ignore the
/// launcher's SIGTERM to show it.
fn fault_in_exchange(pg: &ProcessGroup) -> R<()> {
    let (rank, w) = (pg.rank(), pg.world_size());
    if rank != 1 {
        // SAFETY: sets a signal disposition; no handler code runs.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    let a = Tensor::<bf16>::full([256 * w, 64], bf16::ONE).map_err(e)?;
    let b = Tensor::<bf16>::full([64, 128], bf16::ONE).map_err(e)?;
    let out = Tensor::<bf16>::empty([256, 128]).map_err(e)?;
    let opts = OpOptions::default().algorithm(Algorithm::Fused);
    let ws =
        ops::matmul_reduce_scatter(pg, &out, &a, &b, ScatterDim::Rows, &opts, None).map_err(e)?;
    pg.barrier("one call done").map_err(e)?;
    if rank == 1 {
        std::process::exit(3);
    }
    match ops::matmul_reduce_scatter(pg, &out, &a, &b, ScatterDim::Rows, &opts, Some(ws)) {
        Ok(_) => Err("a reduce-scatter passed with a dead rank".into()),
        Err(x) => Err(format!("expected failure: {x}")),
    }
}

fn rank_main() -> R<()> {
    let pg = ProcessGroup::init().map_err(e)?;
    if std::env::args().any(|a| a == "--fault-exchange") {
        return fault_in_exchange(&pg);
    }
    check_ops(&pg)?;
    check_bad_input(&pg)?;
    plans::check_plans(&pg)?;
    pg.barrier("done").map_err(e)?;
    println!("rank {}/{}: every op ok", pg.rank(), pg.world_size());
    Ok(())
}

fn main() -> ExitCode {
    if std::env::var_os("RANK").is_some() {
        return match rank_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(m) => {
                eprintln!("FAILED: {m}");
                ExitCode::FAILURE
            }
        };
    }
    let require = std::env::var("TILEFUSE_REQUIRE_GPU").is_ok_and(|v| v == "1");
    let gpus = tilefuse::Device::count().unwrap_or(0);
    let asked = match mode::asked(std::env::var("TILEFUSE_INTERPRET").ok().as_deref()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("dist_ops: {e}");
            return ExitCode::FAILURE;
        }
    };
    let interpret = gpus == 0 || asked == Some(Mode::Interpret);
    if gpus == 0 {
        if require {
            eprintln!("dist_ops: no GPU, and TILEFUSE_REQUIRE_GPU=1");
            return ExitCode::FAILURE;
        }
        if asked == Some(Mode::Gpu) {
            println!("dist_ops: skipped (no GPU, and TILEFUSE_INTERPRET asks for one)");
            return ExitCode::SUCCESS;
        }
    }
    if interpret {
        println!("dist_ops: two CPU ranks in interpret mode");
    }
    let ranks = if interpret { 2 } else { gpus };
    let Ok(me) = std::env::current_exe() else {
        eprintln!("dist_ops: cannot find this test's own path");
        return ExitCode::FAILURE;
    };
    // The ranks under the launcher: `grace` seconds between SIGTERM and SIGKILL,
    // `args` for each rank, `timeout` for the group's waits (s) and the
    // kernels' (ms).
    let launch = |grace: &str, args: &[&str], (timeout, wait): (&str, &str)| {
        Command::new(launcher())
            .args(["--nproc-per-node", &ranks.to_string(), "--master-port", "0"])
            .args(["--grace-period-s", grace, "--"])
            .arg(&me)
            .args(args)
            .env("TILEFUSE_DIST_TIMEOUT_S", timeout)
            .env("TILEFUSE_WAIT_TIMEOUT_MS", wait)
            .env("TILEFUSE_INTERPRET", if interpret { "1" } else { "0" })
            .output()
    };
    let out = match launch("5", &[], ("60", "10000")) {
        Ok(o) => o,
        Err(x) => {
            eprintln!(
                "dist_ops: running {}: {x} (set TILEFUSE_RUN)",
                launcher().display()
            );
            return ExitCode::FAILURE;
        }
    };
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        eprintln!("dist_ops: the ranks failed");
        return ExitCode::FAILURE;
    }
    // A rank dies between two calls: the survivors' waits end within bounds.
    let started = std::time::Instant::now();
    let out = launch("60", &["--fault-exchange"], ("5", "3000"));
    let took = started.elapsed();
    let Ok(out) = out else {
        eprintln!("dist_ops: running the fault run failed");
        return ExitCode::FAILURE;
    };
    let err = String::from_utf8_lossy(&out.stderr);
    println!(
        "dist_ops fault-exchange run ({:.1} s): {}",
        took.as_secs_f64(),
        err.trim()
    );
    let survivors_failed_alone = (0..ranks)
        .filter(|&r| r != 1)
        .all(|r| err.contains(&format!("[rank{r}]: FAILED: expected failure: ")));
    if out.status.success()
        || !err.contains("rank 1")
        || !survivors_failed_alone
        || took > std::time::Duration::from_secs(45)
    {
        eprintln!("dist_ops: a rank dead between two exchanges was not handled within bounds");
        return ExitCode::FAILURE;
    }
    let mode = if interpret { "interpret mode" } else { "GPUs" };
    println!("dist_ops: ok ({ranks} rank(s), {mode})");
    ExitCode::SUCCESS
}
