//! Starting the ranks of one node, relaying their output, and stopping them all
//! when one fails or the launcher is told to stop.
//!
//! Each rank runs in its own process group (so a signal reaches whatever it
//! started too) and dies with the launcher (`PR_SET_PDEATHSIG`), so no rank is
//! left behind even if the launcher is killed outright.

use super::args::LaunchArgs;
use crate::dist::store::STORE_FD_ENV;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How the ranks of this node ended.
#[derive(Debug)]
pub enum Outcome {
    /// Every rank exited with status 0.
    Success,
    /// This rank failed first (exit status or signal); the others were stopped.
    RankFailed { rank: usize, status: ExitStatus },
    /// The launcher got this signal, passed it on, and the ranks were stopped.
    Interrupted { signal: i32 },
}

impl Outcome {
    /// The launcher's exit code: 0, 1 for a failed rank, 128 + signal.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Success => 0,
            Outcome::RankFailed { .. } => 1,
            Outcome::Interrupted { signal } => 128 + signal,
        }
    }
}

/// Describes an exit status the way a user reads it.
pub fn describe(status: &ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s} ({})", signal_name(s)),
        _ => "an unknown exit status".into(),
    }
}

fn signal_name(s: i32) -> &'static str {
    match s {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => "signal",
    }
}

struct Rank {
    rank: usize,
    child: Child,
    status: Option<ExitStatus>,
}

/// Sends `sig` to the process group of a running rank.
fn signal_group(r: &Rank, sig: i32) {
    if r.status.is_none() {
        // SAFETY: kill(2) with a negative pid signals that process group; the group
        // id is the rank's pid (it was made a group leader at spawn) and the rank
        // has not been reaped, so the id cannot have been reused.
        unsafe { libc::kill(-(r.child.id() as i32), sig) };
    }
}

/// Copies `from` to the launcher's stdout or stderr line by line, each line
/// prefixed with `[rankN]: `.
fn relay(from: impl Read + Send + 'static, rank: usize, to_stderr: bool) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(from);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            let prefix = format!("[rank{rank}]: ");
            // One write per line under the lock, so lines of ranks do not interleave.
            let _ = if to_stderr {
                let mut e = std::io::stderr().lock();
                e.write_all(prefix.as_bytes())
                    .and_then(|()| e.write_all(&line))
            } else {
                let mut o = std::io::stdout().lock();
                o.write_all(prefix.as_bytes())
                    .and_then(|()| o.write_all(&line))
                    .and_then(|()| o.flush())
            };
        }
    })
}

/// The store's port, bound by the launcher of node 0 before any rank starts and
/// handed to rank 0 as an open socket ([`STORE_FD_ENV`]): no window in which
/// another process (or a rank's own connect, which on loopback can connect a
/// socket to itself) takes the port. Other nodes only get the port number.
pub struct StorePort {
    pub port: u16,
    listener: Option<TcpListener>,
}

/// Binds the master port on node 0 (`--master-port 0`: any free port).
pub fn reserve_store_port(a: &LaunchArgs) -> std::io::Result<StorePort> {
    if a.node_rank != 0 {
        return Ok(StorePort {
            port: a.master_port,
            listener: None,
        });
    }
    // Where rank 0's store will listen: loopback for a job of one node.
    let ip = crate::dist::store::bind_address(&a.master_addr, a.nnodes == 1)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let listener = TcpListener::bind((ip, a.master_port)).map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!(
                "could not listen on the master port {}: {e} (is it taken? pick another, or 0 for any)",
                a.master_port
            ),
        )
    })?;
    Ok(StorePort {
        port: listener.local_addr()?.port(),
        listener: Some(listener),
    })
}

/// 128 random bits from the kernel, in hex.
fn random_secret() -> std::io::Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Runs the ranks of this node to the end. `nproc` is the resolved
/// `--nproc-per-node`; `store` the reserved master port.
pub fn run(a: &LaunchArgs, nproc: usize, store: StorePort) -> std::io::Result<Outcome> {
    let port = store.port;
    let store_fd = store.listener.as_ref().map(|l| l.as_raw_fd());
    // Signals to pass on: the handler only records the last one. USR1 and USR2
    // (a cluster's notice of preemption) are passed on and the ranks go on;
    // the others stop them.
    let got = Arc::new(AtomicUsize::new(0));
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        signal_hook::flag::register_usize(sig, got.clone(), sig as usize)?;
    }
    // The store's secret: the user's, else a random one for a job of one node
    // (its ranks are all ours); several nodes must share one the user sets.
    let secret = match std::env::var_os(crate::dist::store::SECRET_ENV) {
        Some(_) => None, // inherited by the ranks as it is
        None if a.nnodes == 1 => Some(random_secret()?),
        None => {
            eprintln!(
                "tilefuse-run: warning: {} is not set, so the store of this {}-node job accepts any client that reaches MASTER_ADDR; set the same value on every node",
                crate::dist::store::SECRET_ENV,
                a.nnodes
            );
            None
        }
    };
    // As torchrun: one thread per rank unless the user says otherwise, so that
    // several CPU ranks (interpret mode) do not oversubscribe the cores.
    let omp_default = std::env::var_os("OMP_NUM_THREADS").is_none() && nproc > 1;
    if omp_default {
        eprintln!(
            "tilefuse-run: setting OMP_NUM_THREADS=1 for each rank (set it to choose another value)"
        );
    }
    let world = a.nnodes * nproc;
    let mut ranks = Vec::with_capacity(nproc);
    let mut relays = Vec::new();
    for local in 0..nproc {
        let rank = a.node_rank * nproc + local;
        let mut cmd = Command::new(&a.program);
        cmd.args(&a.program_args)
            .env("RANK", rank.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("WORLD_SIZE", world.to_string())
            .env("LOCAL_WORLD_SIZE", nproc.to_string())
            .env("GROUP_RANK", a.node_rank.to_string())
            .env("MASTER_ADDR", &a.master_addr)
            .env("MASTER_PORT", port.to_string())
            .stdin(Stdio::null())
            .envs(omp_default.then_some(("OMP_NUM_THREADS", "1")))
            .envs(
                secret
                    .as_deref()
                    .map(|s| (crate::dist::store::SECRET_ENV, s)),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        // Rank 0 hosts the store on the launcher's socket.
        let inherit = store_fd.filter(|_| rank == 0);
        if let Some(fd) = inherit {
            cmd.env(STORE_FD_ENV, fd.to_string());
        }
        // SAFETY: the closure runs in the child between fork and exec and only makes
        // async-signal-safe system calls (on the child's own descriptor table).
        unsafe {
            cmd.pre_exec(move || {
                // Die with the launcher, whatever kills it.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                // Keep the store's socket open across exec (std opens it close-on-exec).
                if let Some(fd) = inherit {
                    if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                for r in &ranks {
                    signal_group(r, libc::SIGKILL);
                }
                for r in &mut ranks {
                    let _ = r.child.wait();
                }
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("could not start `{}`: {e}", a.program.to_string_lossy()),
                ));
            }
        };
        if let Some(o) = child.stdout.take() {
            relays.push(relay(o, rank, false));
        }
        if let Some(e) = child.stderr.take() {
            relays.push(relay(e, rank, true));
        }
        ranks.push(Rank {
            rank,
            child,
            status: None,
        });
    }
    // Rank 0 holds the socket now; were the launcher to keep it too, connects
    // after rank 0's death would wait in its backlog instead of being refused.
    drop(store);

    let grace = Duration::from_secs_f64(a.grace_period_s);
    let mut failed: Option<(usize, ExitStatus)> = None;
    let mut interrupted: Option<i32> = None;
    let mut stopping: Option<Instant> = None;
    let mut killed = false;
    loop {
        for r in ranks.iter_mut().filter(|r| r.status.is_none()) {
            if let Some(st) = r.child.try_wait()? {
                r.status = Some(st);
                if !st.success() && failed.is_none() && interrupted.is_none() {
                    failed = Some((r.rank, st));
                }
            }
        }
        if ranks.iter().all(|r| r.status.is_some()) {
            break;
        }
        let sig = got.swap(0, Ordering::Relaxed) as i32;
        if sig == libc::SIGUSR1 || sig == libc::SIGUSR2 {
            for r in &ranks {
                signal_group(r, sig);
            }
        } else if sig != 0 {
            interrupted.get_or_insert(sig);
            for r in &ranks {
                signal_group(r, sig);
            }
            stopping.get_or_insert_with(Instant::now);
        }
        if let (Some((rank, st)), None) = (failed, stopping) {
            eprintln!(
                "tilefuse-run: rank {rank} failed ({}); stopping the other ranks",
                describe(&st)
            );
            for r in &ranks {
                signal_group(r, libc::SIGTERM);
            }
            stopping = Some(Instant::now());
        }
        if let Some(t) = stopping {
            if !killed && t.elapsed() >= grace {
                for r in &ranks {
                    signal_group(r, libc::SIGKILL);
                }
                killed = true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Whatever a rank started in its group goes too, so the pipes close.
    for r in &ranks {
        // SAFETY: kill(2) on the rank's process group. The rank was reaped just
        // now; its group id stays taken while anything it started lives, and if
        // the group is empty the call fails with ESRCH (the id being recycled in
        // these few milliseconds is the accepted risk, as in any launcher).
        unsafe { libc::kill(-(r.child.id() as i32), libc::SIGKILL) };
    }
    for h in relays {
        let _ = h.join();
    }
    Ok(match (failed, interrupted) {
        (_, Some(signal)) => Outcome::Interrupted { signal },
        (Some((rank, status)), None) => Outcome::RankFailed { rank, status },
        (None, None) => Outcome::Success,
    })
}
