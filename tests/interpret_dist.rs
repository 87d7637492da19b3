//! The distributed path in interpret mode, no GPU needed: two CPU ranks under
//! `tilefuse-run` (`TILEFUSE_INTERPRET=1`), symmetric buffers in shared memory,
//! the all-gather's copies made by a background thread that sets the progress
//! flags, and the all-gather matmul kernel waiting on them in the interpreter.
//!
//! - `--ag`: three calls with fresh shards each (flags reused by epoch) with
//!   chunks of rows, then two with chunks of columns (3 bands of 14, 14 and 12
//!   columns; the kernel waits per k-tile); each rank checks the gathered A bit
//!   for bit against the host stand-in of NCCL's all-gather and C against f64.
//! - `--fault`: rank 1 dies before its shard is written; rank 0 ignores the
//!   launcher's SIGTERM, and its kernel's `wait` must time out on its own with
//!   the GPU's message, while the launcher names the dead rank.
//! - `examples/all_reduce_bias_rms_norm` on three ranks (a ragged shape): each
//!   reads every rank's partial from its symmetric buffer, and checks its
//!   output against float64 and the other ranks' bits.
//! - `examples/fused_ops --bench` on two ranks: every op checked against the
//!   unfused path, then timed with its cuBLAS floor (each op's own shapes).

mod common;

#[path = "common/launcher.rs"]
mod launcher;
use common::examples::all_gather_matmul::ag_matmul;
use launcher::{example, launcher};
use std::process::{Command, ExitCode, Output};
use std::time::{Duration, Instant};
use tilefuse::prelude::*;
use tilefuse::runtime::dist::{AllGather, Chunks, ProcessGroup};
use tilefuse_testkit::{matmul_f64, poisoned, random_vec, rel_error, Rng};

const ROWS: usize = 48; // per rank
const SPLITS: usize = 3;
const K: usize = 40;
const N: usize = 56;

fn rank_main(fault: bool) -> Result<(), String> {
    let e = |x: tilefuse::Error| x.to_string();
    let pg = ProcessGroup::init().map_err(e)?;
    let (rank, world) = (pg.rank(), pg.world_size());
    if !pg.device().is_host() {
        return Err("the rank does not run in interpret mode".into());
    }
    let m = ROWS * world;
    let mut ag = AllGather::<bf16>::new(&pg, ROWS, K, SPLITS).map_err(e)?;
    let b_host = random_vec::<bf16>(&mut Rng::new(7), K * N, 1.0);
    let b = Tensor::from_slice(&b_host, [K, N]).map_err(e)?;
    let cfg = Config::new(&[32, 32, 16]);
    if fault {
        if rank == 1 {
            std::process::exit(3);
        }
        // SAFETY: sets a signal disposition; no handler code runs.
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        tilefuse::runtime::status::set_wait_timeout_ms(Some(2000));
        ag.shard()
            .clone()
            .copy_from_slice(&random_vec::<bf16>(&mut Rng::fresh(), ROWS * K, 1.0))
            .map_err(e)?;
        let epoch = ag.start().map_err(e)?;
        let c = poisoned::<bf16>([m, N]).map_err(e)?;
        let rpc = ag.rows_per_chunk();
        let r = ag_matmul::kernel().with_config(cfg, || {
            ag_matmul(
                ag.gathered(),
                &b,
                &c,
                ag.progress(),
                rpc,
                K,
                world,
                epoch as usize,
                0,
                false,
            )
        });
        return match r {
            Err(err @ tilefuse::Error::WaitTimeout { .. }) => {
                println!("rank 0 timed out as expected: {err}");
                Ok(())
            }
            other => Err(format!("expected a wait timeout, got {other:?}")),
        };
    }
    let nccl = pg.nccl().map_err(e)?;
    let mut by_cols = AllGather::<bf16>::with_chunks(&pg, ROWS, K, Chunks::Cols(3)).map_err(e)?;
    for call in 0..5 {
        // Calls 3 and 4: chunks of columns, waited for inside the K loop.
        let ag = if call < 3 { &mut ag } else { &mut by_cols };
        let shard = random_vec::<bf16>(&mut Rng::fresh(), ROWS * K, 1.0);
        ag.shard().clone().copy_from_slice(&shard).map_err(e)?;
        let reference = Tensor::<bf16>::empty([m, K]).map_err(e)?;
        nccl.all_gather(
            &Tensor::from_slice(&shard, [ROWS, K]).map_err(e)?,
            &reference,
        )
        .map_err(e)?;
        let c = poisoned::<bf16>([m, N]).map_err(e)?;
        let epoch = ag.start().map_err(e)?;
        let (rpc, cpc) = (ag.rows_per_chunk(), ag.cols_per_chunk());
        let along_k = matches!(ag.chunks(), Chunks::Cols(_));
        ag_matmul::kernel()
            .with_config(cfg.clone(), || {
                ag_matmul(
                    ag.gathered(),
                    &b,
                    &c,
                    ag.progress(),
                    rpc,
                    cpc,
                    world,
                    epoch as usize,
                    rank * ROWS,
                    along_k,
                )
            })
            .map_err(e)?;
        ag.finish().map_err(e)?;
        let gathered = ag.gathered().to_vec().map_err(e)?;
        if gathered != reference.to_vec().map_err(e)? {
            return Err(format!("call {call}: the gathered A differs from NCCL's"));
        }
        let f = |v: Vec<bf16>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
        let want = matmul_f64(&f(gathered), &f(b_host.clone()), m, K, N);
        let err = rel_error(&f(c.to_vec().map_err(e)?), &want, |x| x, |x| x);
        if err > 1e-2 {
            return Err(format!("call {call}: ‖C − ref‖/‖ref‖ = {err:.2e}"));
        }
        println!("rank {rank}/{world} call {call} (epoch {epoch}): rel err {err:.1e}, ok");
    }
    pg.barrier("done").map_err(e)?;
    Ok(())
}

fn launch(launcher_args: &[&str], mode: &str) -> Output {
    let me = std::env::current_exe().expect("own path");
    Command::new(launcher())
        .args(["--nproc-per-node", "2", "--master-port", "0"])
        .args(launcher_args)
        .arg("--")
        .arg(me)
        .arg(mode)
        .env("TILEFUSE_INTERPRET", "1")
        .env("TILEFUSE_DIST_TIMEOUT_S", "20")
        .output()
        .expect("running tilefuse-run (build it: cargo build --bins)")
}

fn main() -> ExitCode {
    if std::env::var_os("RANK").is_some() {
        let fault = std::env::args().any(|a| a == "--fault");
        return match rank_main(fault) {
            Ok(()) => ExitCode::SUCCESS,
            Err(m) => {
                eprintln!("FAILED: {m}");
                ExitCode::FAILURE
            }
        };
    }
    let t = Instant::now();
    let out = launch(&[], "--ag");
    let (o, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!(
        "interpret_dist --ag ({:.1} s):\n{o}",
        t.elapsed().as_secs_f64()
    );
    if !out.status.success() || o.matches(", ok").count() != 10 {
        eprintln!("interpret_dist: the 2-rank all-gather matmul failed:\n{o}\n{err}");
        return ExitCode::FAILURE;
    }

    // Rank 1 dies; rank 0 ignores SIGTERM and the launcher waits 60 s before
    // SIGKILL, so rank 0 must end on its own 2 s wait timeout.
    let t = Instant::now();
    let out = launch(&["--grace-period-s", "60"], "--fault");
    let took = t.elapsed();
    let (o, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!(
        "interpret_dist --fault ({:.1} s):\n{o}{err}",
        took.as_secs_f64()
    );
    let timed_out = o.contains(
        "rank 0 timed out as expected: kernel `ag_matmul` stopped waiting at `wait(progress",
    ) && o.contains("after 2000 ms: flag index");
    let named = err.contains("rank 1 failed (exit status 3)");
    if out.status.success() || !timed_out || !named || took > Duration::from_secs(30) {
        eprintln!("interpret_dist: the dead rank was not handled as it should be");
        return ExitCode::FAILURE;
    }
    // The one-shot all-reduce + bias + RMSNorm example, three ranks.
    let bin = example("all_reduce_bias_rms_norm");
    let t = Instant::now();
    let out = Command::new(launcher())
        .args(["--nproc-per-node", "3", "--master-port", "0", "--"])
        .arg(&bin)
        .args(["45", "130"])
        .env("TILEFUSE_INTERPRET", "1")
        .env("TILEFUSE_DIST_TIMEOUT_S", "20")
        .output();
    let Ok(out) = out else {
        eprintln!(
            "interpret_dist: could not run {} (built by `cargo test`, or set TILEFUSE_EXAMPLES_DIR)",
            bin.display()
        );
        return ExitCode::FAILURE;
    };
    let o = String::from_utf8_lossy(&out.stdout);
    println!(
        "interpret_dist all_reduce_bias_rms_norm ({:.1} s):\n{o}",
        t.elapsed().as_secs_f64()
    );
    if !out.status.success() || o.matches("the same bits on every rank (ok)").count() != 3 {
        eprintln!(
            "interpret_dist: all_reduce_bias_rms_norm failed:\n{o}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return ExitCode::FAILURE;
    }
    // The op library's example with its benchmark (every op, both paths, its
    // cuBLAS floor on the product a rank computes), two ranks, a ragged shape.
    let bin = example("fused_ops");
    let t = Instant::now();
    let out = Command::new(launcher())
        .args(["--nproc-per-node", "2", "--master-port", "0", "--"])
        .arg(&bin)
        .args(["64", "96", "128", "--bench"])
        .env("TILEFUSE_INTERPRET", "1")
        .env("TILEFUSE_DIST_TIMEOUT_S", "20")
        .output();
    let Ok(out) = out else {
        eprintln!("interpret_dist: could not run {}", bin.display());
        return ExitCode::FAILURE;
    };
    let o = String::from_utf8_lossy(&out.stdout);
    println!(
        "interpret_dist fused_ops --bench ({:.1} s):\n{o}",
        t.elapsed().as_secs_f64()
    );
    // Each op checked on both ranks, and one table row each from rank 0.
    let ops = 8;
    if !out.status.success()
        || o.matches(": ‖fused − NCCL+cuBLAS‖").count() != 2 * ops
        || o.matches("(ok)").count() != 2 * ops
        || o.lines().filter(|l| l.starts_with("[rank0]: | ")).count() != ops
    {
        eprintln!(
            "interpret_dist: fused_ops --bench failed:\n{o}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return ExitCode::FAILURE;
    }
    println!("interpret_dist: ok");
    ExitCode::SUCCESS
}
