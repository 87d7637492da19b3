//! The distributed runtime on real GPUs, as ranks under `tilefuse-run`: the store,
//! symmetric memory, the GPU-side barrier and the copy-engine all-gather (several
//! calls, fresh data each, flags reused by epoch), bad input on every rank, and a
//! rank that dies. Run as a plain test it launches itself on every GPU it sees;
//! without a GPU it skips and says so (it fails instead with TILEFUSE_REQUIRE_GPU=1).

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};
use tilefuse_runtime::dist::{AllGather, ProcessGroup};
use tilefuse_runtime::{Device, Tensor};

fn launcher() -> String {
    std::env::var("TILEFUSE_RUN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_tilefuse-run").to_string())
}

fn value(rank: usize, call: u32, i: usize) -> f32 {
    (rank * 1_000_000 + call as usize * 10_000 + i % 9_973) as f32
}

/// A survivor's end of an NCCL fault run: `outcome` (of `what`, with a dead
/// rank) must be an error; then the tensors, communicator and group are
/// dropped (which must neither hang nor free twice) and the error is
/// reported as the expected failure.
fn dropped_after(
    rank: usize,
    outcome: tilefuse_runtime::Result<()>,
    what: &str,
    drop_all: impl FnOnce(),
) -> Result<(), String> {
    let Err(err) = outcome else {
        return Err(format!("{what} passed with a dead rank"));
    };
    drop_all();
    println!("rank {rank}: the group was dropped after: {err}");
    Err(format!("expected failure: {err}"))
}

/// What one rank checks; `Err` describes the first failure.
fn rank_main() -> Result<(), String> {
    let e = |x: tilefuse_runtime::Error| x.to_string();
    let pg = ProcessGroup::init().map_err(e)?;
    let (rank, world) = (pg.rank(), pg.world_size());
    if std::env::args().any(|a| a == "--fault-mid") {
        // Rank 1 dies in the middle of an all-gather (after queuing it, before
        // finishing); the others keep going and must each get an error of their
        // own, not hang: they ignore the launcher's SIGTERM to show that their
        // wait on the GPU is bounded.
        if rank != 1 {
            // SAFETY: sets a signal disposition; no handler code runs.
            unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        }
        let mut ag = AllGather::<f32>::new(&pg, 256, 1000, 4).map_err(e)?;
        for call in 0..50 {
            ag.start().map_err(e)?;
            if rank == 1 && call == 3 {
                std::process::exit(3);
            }
            ag.finish().map_err(e)?;
            pg.synchronize("an all-gather").map_err(e)?;
        }
        return Err("50 all-gathers passed with a dead rank".into());
    }
    if std::env::args().any(|a| a == "--fault-nccl") {
        // Rank 1 dies after joining NCCL; the others' all-reduce never completes.
        // Their bounded synchronize must abort the communicator, and dropping the
        // group afterwards must not free it again (it did once: a double free).
        // They ignore the launcher's SIGTERM to show the wait ends on its own.
        if rank != 1 {
            // SAFETY: sets a signal disposition; no handler code runs.
            unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        }
        let nccl = pg.nccl().map_err(e)?;
        let x = Tensor::<f32>::from_slice(&vec![1.0; 1 << 20], [1 << 20]).map_err(e)?;
        let y = Tensor::<f32>::empty([1 << 20]).map_err(e)?;
        // One all-reduce with everyone: NCCL connects its peers on a
        // communicator's first collective, and a connect to a dead rank waits
        // inside NCCL's enqueue (`--fault-nccl-connect` tests that it ends).
        nccl.all_reduce(&x, &y).map_err(e)?;
        pg.synchronize("the first NCCL all-reduce").map_err(e)?;
        pg.barrier("nccl-connected").map_err(e)?;
        if rank == 1 {
            std::process::exit(3);
        }
        let outcome = nccl
            .all_reduce(&x, &y)
            .and_then(|()| pg.synchronize("an NCCL all-reduce"));
        return dropped_after(rank, outcome, "an all-reduce", move || {
            drop((x, y, nccl, pg))
        });
    }
    if std::env::args().any(|a| a == "--fault-nccl-init") {
        // Rank 1 dies instead of joining NCCL: the survivors' join (the store
        // barrier that hands out the id, then the non-blocking init, polled)
        // must end on its own with an error, not wait for it forever.
        if rank != 1 {
            // SAFETY: sets a signal disposition; no handler code runs.
            unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        }
        pg.barrier("before-nccl").map_err(e)?;
        if rank == 1 {
            std::process::exit(3);
        }
        let outcome = pg.nccl().map(drop);
        return dropped_after(rank, outcome, "joining NCCL", move || drop(pg));
    }
    if std::env::args().any(|a| a == "--fault-nccl-connect") {
        // Rank 1 joins NCCL and dies before the first collective, in which NCCL
        // connects the peers: the survivors' enqueue (a non-blocking
        // communicator, polled) must end on its own, not hang in the connect.
        if rank != 1 {
            // SAFETY: sets a signal disposition; no handler code runs.
            unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        }
        let nccl = pg.nccl().map_err(e)?;
        pg.barrier("nccl-joined").map_err(e)?;
        if rank == 1 {
            std::process::exit(3);
        }
        let x = Tensor::<f32>::from_slice(&vec![1.0; 1 << 20], [1 << 20]).map_err(e)?;
        let y = Tensor::<f32>::empty([1 << 20]).map_err(e)?;
        let outcome = nccl
            .all_reduce(&x, &y)
            .and_then(|()| pg.synchronize("the first NCCL all-reduce"));
        return dropped_after(rank, outcome, "a first all-reduce", move || {
            drop((x, y, nccl, pg))
        });
    }
    if std::env::args().any(|a| a == "--fault") {
        // Rank 1 dies; rank 0 must not hang: the launcher stops it, or its barrier
        // times out naming rank 1.
        if rank == 1 {
            std::process::exit(3);
        }
        return match pg.barrier("after-fault") {
            Ok(()) => Err("a barrier passed with a dead rank".into()),
            Err(err) => {
                println!("rank {rank}: barrier failed as it should: {err}");
                Err(format!("expected failure: {err}"))
            }
        };
    }

    // The store: every rank's value, in rank order.
    let got = pg.all_gather_bytes("ids", &[rank as u8]).map_err(e)?;
    if got != (0..world).map(|r| vec![r as u8]).collect::<Vec<_>>() {
        return Err(format!("store all-gather gave {got:?}"));
    }

    // The all-gather, three calls with fresh data each.
    let (rows, cols, splits) = (256, 1000, 4);
    let mut ag = AllGather::<f32>::new(&pg, rows, cols, splits).map_err(e)?;
    for call in 1..=3u32 {
        let mine: Vec<f32> = (0..rows * cols).map(|i| value(rank, call, i)).collect();
        ag.shard().clone().copy_from_slice(&mine).map_err(e)?;
        let epoch = ag.start().map_err(e)?;
        ag.finish().map_err(e)?;
        pg.synchronize("the all-gather").map_err(e)?;
        let g = ag.gathered().to_vec().map_err(e)?;
        for r in 0..world {
            for i in [0, 1, rows * cols / 2, rows * cols - 1] {
                let (want, have) = (value(r, call, i), g[r * rows * cols + i]);
                if want != have {
                    return Err(format!(
                        "call {call}: gathered[{r}][{i}] = {have}, want {want}"
                    ));
                }
            }
        }
        let flags = ag.progress().to_vec().map_err(e)?;
        if flags.iter().any(|&f| f != epoch) {
            return Err(format!("call {call}: flags {flags:?}, want all {epoch}"));
        }
    }
    // Bad input: a tensor outside symmetric memory; shards that disagree.
    let plain = Tensor::<f32>::empty([rows, cols]).map_err(e)?;
    let msg = ag
        .check_shard(&plain)
        .err()
        .ok_or("a plain tensor passed as the shard")?;
    if !msg.to_string().contains("symmetric memory") {
        return Err(format!("unclear error: {msg}"));
    }
    let wrong_rows = if rank == 0 { 128 } else { 64 };
    let msg = match AllGather::<f32>::new(&pg, wrong_rows, cols, 4) {
        Ok(_) if world > 1 => return Err("shards of different shapes were accepted".into()),
        Ok(_) => String::from("same shape"),
        Err(m) => m.to_string(),
    };
    if world > 1 && !msg.contains("same shape") {
        return Err(format!("unclear error: {msg}"));
    }
    // Same shape, another dtype on rank 0.
    let msg = if rank == 0 {
        AllGather::<half::bf16>::new(&pg, rows, cols, 4).map(|_| ())
    } else {
        AllGather::<f32>::new(&pg, rows, cols, 4).map(|_| ())
    };
    match msg {
        Ok(()) if world > 1 => return Err("shards of different dtypes were accepted".into()),
        Err(m) if !m.to_string().contains("dtype") => {
            return Err(format!("unclear error for mixed dtypes: {m}"))
        }
        _ => {}
    }
    let msg = AllGather::<f32>::new(&pg, 100, cols, 3)
        .err()
        .ok_or("3 splits of 100 rows accepted")?;
    if !msg.to_string().contains("splits_per_rank") {
        return Err(format!("unclear error: {msg}"));
    }
    pg.barrier("done").map_err(e)?;
    println!("rank {rank}/{world}: store, symmetric memory, barrier, all-gather: ok");
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
    let gpus = Device::count().unwrap_or(0);
    if gpus == 0 {
        if require {
            eprintln!("dist_gpu: no GPU, and TILEFUSE_REQUIRE_GPU=1");
            return ExitCode::FAILURE;
        }
        println!("dist_gpu: skipped (no GPU)");
        return ExitCode::SUCCESS;
    }
    let me = std::env::current_exe().expect("own path");
    let run_with = |launcher_args: &[&str], extra: &[&str], timeout_s: &str| {
        Command::new(launcher())
            .args(["--nproc-per-node", &gpus.to_string(), "--master-port", "0"])
            .args(launcher_args)
            .arg("--")
            .arg(&me)
            .args(extra)
            .env("TILEFUSE_DIST_TIMEOUT_S", timeout_s)
            .output()
            .expect("running tilefuse-run")
    };
    let run = |extra: &[&str]| run_with(&[], extra, "20");
    let out = run(&[]);
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        eprintln!("dist_gpu: the ranks failed");
        return ExitCode::FAILURE;
    }
    if gpus >= 2 {
        let t = Instant::now();
        let out = run(&["--fault"]);
        let err = String::from_utf8_lossy(&out.stderr);
        println!(
            "dist_gpu fault run ({:.1} s): {}",
            t.elapsed().as_secs_f64(),
            err.trim()
        );
        if out.status.success() || !err.contains("rank 1") || t.elapsed() > Duration::from_secs(60)
        {
            eprintln!("dist_gpu: a dead rank was not reported within bounds");
            return ExitCode::FAILURE;
        }
    }
    if gpus >= 2 {
        // A rank dies with an all-gather in flight. The survivors ignore SIGTERM and
        // the launcher waits 60 s before SIGKILL: each must end on its own bounded
        // wait (5 s here), naming what it waited for.
        let t = Instant::now();
        let out = run_with(&["--grace-period-s", "60"], &["--fault-mid"], "5");
        let (o, err) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let took = t.elapsed();
        println!(
            "dist_gpu fault-mid run ({:.1} s): {}",
            took.as_secs_f64(),
            err.trim()
        );
        // A timeout naming the wait, or a driver error if the dead rank's memory
        // went away under a copy: either way the rank's own error.
        let survivors_failed_alone = (0..gpus)
            .filter(|&r| r != 1)
            .all(|r| err.contains(&format!("[rank{r}]: FAILED: ")));
        if out.status.success()
            || !err.contains("rank 1")
            || !survivors_failed_alone
            || took > Duration::from_secs(40)
        {
            eprintln!(
                "dist_gpu: a rank dead mid-all-gather was not handled within bounds:\n{o}\n{err}"
            );
            return ExitCode::FAILURE;
        }
    }
    // A rank dies instead of joining NCCL (the survivors' join ends on its
    // own), or after joining: in a collective (the survivors' synchronize
    // times out after 5 s and aborts the communicator), or before the first
    // one (the survivors' enqueue, connecting to it, ends on its own). Either
    // way the group then drops cleanly.
    for (flag, when) in [
        ("--fault-nccl-init", "instead of joining NCCL"),
        ("--fault-nccl", "in an NCCL collective"),
        ("--fault-nccl-connect", "before NCCL's first connect"),
    ] {
        if gpus < 2 {
            break;
        }
        let t = Instant::now();
        let out = run_with(&["--grace-period-s", "60"], &[flag], "5");
        let (o, err) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        let took = t.elapsed();
        println!(
            "dist_gpu {flag} run ({:.1} s): {}",
            took.as_secs_f64(),
            err.trim()
        );
        let survivors_dropped = (0..gpus).filter(|&r| r != 1).all(|r| {
            err.contains(&format!("[rank{r}]: FAILED: "))
                && o.contains(&format!("rank {r}: the group was dropped after: "))
        });
        if out.status.success()
            || !survivors_dropped
            || err.contains("SIGSEGV")
            || err.contains("SIGABRT")
            || took > Duration::from_secs(45)
        {
            eprintln!("dist_gpu: a rank dead {when} was not handled within bounds:\n{o}\n{err}");
            return ExitCode::FAILURE;
        }
    }
    println!("dist_gpu: ok ({gpus} rank(s))");
    ExitCode::SUCCESS
}
