//! `tilefuse-run` end to end, with shell scripts as ranks (no GPU needed).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const LAUNCHER: &str = env!("CARGO_BIN_EXE_tilefuse-run");

/// Runs the launcher on any free master port (node 0's launcher binds it, and
/// the tests run at once), unless the arguments name one.
fn launch(args: &[&str]) -> Output {
    let mut cmd = Command::new(LAUNCHER);
    if !args.contains(&"--master-port") {
        cmd.args(["--master-port", "0"]);
    }
    cmd.args(args).output().expect("running tilefuse-run")
}

/// The launcher with its default master port (one test only: the port is bound).
fn launch_default_port(args: &[&str]) -> Output {
    Command::new(LAUNCHER)
        .args(args)
        .output()
        .expect("running tilefuse-run")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tilefuse-launcher-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Running, not a zombie (a killed orphan may wait long for a reaper that is
/// slow to come in a container).
fn alive(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the parenthesized command name.
    let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
    !matches!(state, Some(Some('Z')) | Some(Some('X')))
}

/// Waits for `n` pid files named `pid<rank>` under `dir`; returns the pids.
fn pids(dir: &Path, n: usize) -> Vec<i32> {
    let t = Instant::now();
    loop {
        let got: Vec<i32> = (0..n)
            .filter_map(|r| std::fs::read_to_string(dir.join(format!("pid{r}"))).ok())
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        if got.len() == n {
            return got;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `sig` to the launcher we started and waits (at most 20 s) for it to end.
fn signal_and_wait(launcher: &mut std::process::Child, sig: i32) -> std::process::ExitStatus {
    // SAFETY: signals the launcher this test started.
    unsafe { libc::kill(launcher.id() as i32, sig) };
    let t = Instant::now();
    loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            return s;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "launcher did not end"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn every_rank_gets_torchrun_variables_and_a_prefix() {
    let out = launch_default_port(&[
        "--nproc-per-node",
        "3",
        "--",
        "sh",
        "-c",
        "echo \"$RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$GROUP_RANK/$MASTER_ADDR/$MASTER_PORT\"; echo oops >&2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    for r in 0..3 {
        let line = format!("[rank{r}]: {r}/3/{r}/3/0/127.0.0.1/29500");
        assert!(
            stdout.lines().any(|l| l == line),
            "missing `{line}` in:\n{stdout}"
        );
        assert!(text(&out.stderr).contains(&format!("[rank{r}]: oops")));
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_is_named() {
    let t = Instant::now();
    let out = launch(&[
        "--nproc-per-node",
        "3",
        "sh",
        "-c",
        "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60",
    ]);
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("rank 1") && err.contains("exit status 3"),
        "{err}"
    );
}

#[test]
fn a_rank_killed_by_a_signal_is_reported() {
    let out = launch(&[
        "--nproc-per-node",
        "2",
        "sh",
        "-c",
        "if [ \"$RANK\" = 0 ]; then kill -9 $$; fi; sleep 60",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("rank 0") && err.contains("signal 9"), "{err}");
}

#[test]
fn a_rank_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let dir = scratch("stubborn");
    // Rank 1 ignores SIGTERM before it says it started; rank 0 fails once it has.
    let script = format!(
        "if [ \"$RANK\" = 0 ]; then echo $$ > {d}/pid0; while [ ! -f {d}/pid1 ]; do sleep 0.05; done; exit 1; fi; \
         trap '' TERM; echo $$ > {d}/pid1; while true; do sleep 1; done",
        d = dir.display()
    );
    let t = Instant::now();
    let out = launch(&[
        "--nproc-per-node",
        "2",
        "--grace-period-s",
        "1",
        "sh",
        "-c",
        &script,
    ]);
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(out.status.code(), Some(1));
    for pid in pids(&dir, 2) {
        assert!(!alive(pid), "rank process {pid} outlived the launcher");
    }
}

#[test]
fn sigterm_to_the_launcher_reaches_every_rank_and_its_children() {
    let dir = scratch("sigterm");
    // Each rank starts a grandchild (the background sleep) and records both pids.
    let script = format!(
        "sleep 60 & echo $! > {d}/child$RANK; echo $$ > {d}/pid$RANK; wait",
        d = dir.display()
    );
    let mut launcher = Command::new(LAUNCHER)
        .args(["--nproc-per-node", "2", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ranks = pids(&dir, 2);
    let status = signal_and_wait(&mut launcher, libc::SIGTERM);
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    let children: Vec<i32> = (0..2)
        .filter_map(|r| std::fs::read_to_string(dir.join(format!("child{r}"))).ok())
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    for pid in ranks.into_iter().chain(children) {
        assert!(!alive(pid), "process {pid} is an orphan");
    }
}

#[test]
fn two_launchers_make_a_two_node_world() {
    let script = "echo \"$RANK/$WORLD_SIZE/$LOCAL_RANK/$GROUP_RANK\"";
    let node = |r: &str| {
        Command::new(LAUNCHER)
            .args([
                "--nnodes",
                "2",
                "--node-rank",
                r,
                "--nproc-per-node",
                "1",
                "--master-port",
                "29611",
            ])
            .args(["sh", "-c", script])
            .output()
            .unwrap()
    };
    let (a, b) = (node("0"), node("1"));
    assert!(
        text(&a.stdout).contains("[rank0]: 0/2/0/0"),
        "{}",
        text(&a.stdout)
    );
    assert!(
        text(&b.stdout).contains("[rank1]: 1/2/0/1"),
        "{}",
        text(&b.stdout)
    );
}

#[test]
fn port_zero_picks_a_free_port() {
    let out = launch(&[
        "--nproc-per-node",
        "1",
        "--master-port",
        "0",
        "sh",
        "-c",
        "echo $MASTER_PORT",
    ]);
    let port: u32 = text(&out.stdout)
        .trim()
        .trim_start_matches("[rank0]: ")
        .parse()
        .expect("a port number");
    assert!(port > 0 && port < 65536);
}

#[test]
fn rank_0_inherits_the_store_socket_the_launcher_bound() {
    // Rank 0 gets an open socket (no window for another process to take the
    // port); the other ranks only the port number.
    let script = r#"if [ -n "$TILEFUSE_STORE_FD" ]; then
  echo "fd: $(readlink /proc/self/fd/$TILEFUSE_STORE_FD)"
else
  echo "no fd"
fi"#;
    let out = launch(&[
        "--nproc-per-node",
        "2",
        "--master-port",
        "0",
        "sh",
        "-c",
        script,
    ]);
    let o = text(&out.stdout);
    assert!(out.status.success(), "{o}{}", text(&out.stderr));
    assert!(o.contains("[rank0]: fd: socket:["), "{o}");
    assert!(o.contains("[rank1]: no fd"), "{o}");
}

#[test]
fn a_taken_master_port_fails_before_any_rank_starts() {
    let held = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let port = held.local_addr().unwrap().port().to_string();
    let dir = scratch("taken");
    let marker = dir.join("started");
    let script = format!("touch {}", marker.display());
    let out = launch(&[
        "--nproc-per-node",
        "1",
        "--master-port",
        &port,
        "sh",
        "-c",
        &script,
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("could not listen on the master port {port}")),
        "{err}"
    );
    assert!(!marker.exists(), "a rank started anyway");
}

#[test]
fn bad_arguments_print_the_usage() {
    let out = launch(&["--nproc-per-node", "zero", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("invalid value 'zero' for '--nproc-per-node") && err.contains("--help"),
        "{err}"
    );
    // A typo is an error that names the option meant, not a program to run.
    let out = launch(&["--nprc-per-node", "2", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("a similar argument exists: '--nproc-per-node'"),
        "{err}"
    );
    let out = launch(&["--help"]);
    assert!(out.status.success() && text(&out.stdout).contains("--grace-period-s"));
    let out = launch(&["--nproc-per-node", "1", "/nonexistent/program"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("could not start"));
}

/// A cluster's preemption notice (USR1) reaches every rank, which goes on: a
/// rank that traps it writes a checkpoint marker and ends normally, and the
/// launcher ends with success, not stopping anyone.
#[test]
fn usr1_reaches_every_rank_and_the_ranks_go_on() {
    let dir = scratch("usr1");
    let script = format!(
        "trap 'echo got > {d}/usr1$RANK; exit 0' USR1; echo $$ > {d}/pid$RANK; while :; do sleep 0.05; done",
        d = dir.display()
    );
    let mut launcher = Command::new(LAUNCHER)
        .args([
            "--nproc-per-node",
            "2",
            "--master-port",
            "0",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    pids(&dir, 2);
    let status = signal_and_wait(&mut launcher, libc::SIGUSR1);
    assert!(status.success(), "{status:?}");
    for r in 0..2 {
        assert!(
            dir.join(format!("usr1{r}")).exists(),
            "rank {r} did not get USR1"
        );
    }
}

/// The distinct values of `var` the two ranks of a one-node job see, with `var`
/// set to `value` in the launcher's environment, or unset.
fn seen_by_ranks(var: &str, value: Option<&str>) -> Vec<String> {
    let mut cmd = Command::new(LAUNCHER);
    cmd.args(["--nproc-per-node", "2", "--master-port", "0"])
        .args(["sh", "-c", &format!("echo seen=${var}")]);
    match value {
        Some(v) => cmd.env(var, v),
        None => cmd.env_remove(var),
    };
    let out = cmd.output().expect("running tilefuse-run");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut got: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.split_once("seen=").map(|(_, s)| s.to_string()))
        .collect();
    assert_eq!(got.len(), 2, "{stdout}");
    got.sort();
    got.dedup();
    got
}

/// OMP_NUM_THREADS is 1 in every rank unless the user set it, as torchrun does.
#[test]
fn omp_num_threads_defaults_to_one() {
    assert_eq!(seen_by_ranks("OMP_NUM_THREADS", None), ["1"]);
    assert_eq!(seen_by_ranks("OMP_NUM_THREADS", Some("4")), ["4"]);
}

/// Every rank of a one-node job gets the same random store secret (a new one
/// per job); a secret the user set is passed on as it is.
#[test]
fn the_ranks_share_a_random_store_secret() {
    let var = "TILEFUSE_STORE_SECRET";
    let first = seen_by_ranks(var, None);
    assert_eq!(first.len(), 1, "ranks disagree: {first:?}");
    assert!(
        first[0].len() == 32 && first[0].chars().all(|c| c.is_ascii_hexdigit()),
        "{first:?}"
    );
    assert_ne!(
        seen_by_ranks(var, None),
        first,
        "the same secret for two jobs"
    );
    assert_eq!(seen_by_ranks(var, Some("mine")), ["mine"]);
}
