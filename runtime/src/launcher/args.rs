//! The launcher's command line, in torchrun's words.

use std::ffi::OsString;

/// What `tilefuse-run` was asked to do.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchArgs {
    /// Processes on this node; `None`: one per GPU, or 1 without any.
    pub nproc_per_node: Option<usize>,
    pub nnodes: usize,
    pub node_rank: usize,
    pub master_addr: String,
    /// 0 picks a free port (one node only).
    pub master_port: u16,
    /// How long ranks get to exit after SIGTERM before SIGKILL.
    pub grace_period_s: f64,
    pub program: OsString,
    pub program_args: Vec<OsString>,
}

/// What `--help` says after the options.
const AFTER_HELP: &str = "\
Starts N copies of `program` (default: one per GPU, 1 without any) with RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT
set as torchrun sets them. Output lines carry a `[rankN]: ` prefix. When a rank
fails, the others get SIGTERM, then SIGKILL after the grace period, and
tilefuse-run exits non-zero naming the rank. INT, TERM, HUP and QUIT are passed
on to every rank and stop them; USR1 and USR2 are passed on and the ranks go on.
Each option also reads torchrun's environment variable (PET_NPROC_PER_NODE, …).";

/// The command line, as clap reads it (torchrun's names, with `_` or `-`).
#[derive(clap::Parser, Debug)]
#[command(
    name = "tilefuse-run",
    about = "Runs a program on several GPUs, one process per rank, as torchrun does",
    after_help = AFTER_HELP
)]
struct Cli {
    /// Processes on this node [default: one per GPU, 1 without any]
    #[arg(long = "nproc-per-node", visible_alias = "nproc_per_node", env = "PET_NPROC_PER_NODE",
          value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    nproc_per_node: Option<u32>,
    /// Nodes of the job
    #[arg(long, env = "PET_NNODES", default_value_t = 1, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..))]
    nnodes: u32,
    /// This node's place among them
    #[arg(
        long = "node-rank",
        visible_alias = "node_rank",
        env = "PET_NODE_RANK",
        default_value_t = 0,
        value_name = "R"
    )]
    node_rank: u32,
    /// Where node 0 listens (rank 0's store)
    #[arg(
        long = "master-addr",
        visible_alias = "master_addr",
        env = "PET_MASTER_ADDR",
        default_value = "127.0.0.1",
        value_name = "A"
    )]
    master_addr: String,
    /// The store's port; 0 picks a free one (one node only)
    #[arg(
        long = "master-port",
        visible_alias = "master_port",
        env = "PET_MASTER_PORT",
        default_value_t = 29500,
        value_name = "P"
    )]
    master_port: u16,
    /// Seconds ranks get to exit after SIGTERM before SIGKILL (at most a week)
    #[arg(long = "grace-period-s", default_value_t = 5.0, value_name = "S",
          value_parser = grace_period)]
    grace_period_s: f64,
    /// The program to run on every rank, and its arguments
    #[arg(required = true, trailing_var_arg = true,
          num_args = 1.., value_name = "PROGRAM [ARGS]...")]
    command: Vec<OsString>,
}

/// A number of seconds, not negative, at most a week (longer ones overflow the
/// deadline arithmetic).
fn grace_period(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|g| g.is_finite() && *g >= 0.0)
        .map(|g| g.min(crate::settings::LONGEST.as_secs_f64()))
        .ok_or_else(|| format!("`{v}` is not a number of seconds"))
}

/// Parses the arguments after the program name. `--help` is an `Err` of kind
/// `DisplayHelp` (print it: `e.exit()` does, with exit code 0); any other
/// error says what was wrong and suggests a close option name for a typo.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<LaunchArgs, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let name = std::iter::once(OsString::from("tilefuse-run"));
    let mut cmd = Cli::command();
    let matches = cmd.try_get_matches_from_mut(name.chain(args))?;
    let cli = Cli::from_arg_matches(&matches)?;
    let conflict = |msg: String| {
        cmd.clone()
            .error(clap::error::ErrorKind::ArgumentConflict, msg)
    };
    if cli.node_rank >= cli.nnodes {
        return Err(conflict(format!(
            "`--node-rank` ({}) must be less than `--nnodes` ({})",
            cli.node_rank, cli.nnodes
        )));
    }
    if cli.master_port == 0 && cli.nnodes > 1 {
        return Err(conflict(
            "`--master-port 0` (pick a free port) works on one node only: the other nodes could not know the port".into(),
        ));
    }
    let mut command = cli.command.into_iter();
    let program = command.next().unwrap_or_default();
    Ok(LaunchArgs {
        nproc_per_node: cli.nproc_per_node.map(|n| n as usize),
        nnodes: cli.nnodes as usize,
        node_rank: cli.node_rank as usize,
        master_addr: cli.master_addr,
        master_port: cli.master_port,
        grace_period_s: cli.grace_period_s,
        program,
        program_args: command.collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<LaunchArgs, clap::Error> {
        parse(args.iter().map(OsString::from))
    }

    fn err(args: &[&str]) -> String {
        p(args).expect_err("an error").to_string()
    }

    #[test]
    fn options_then_program_and_its_args() {
        let a = p(&[
            "--nproc-per-node",
            "2",
            "--master-port=0",
            "prog",
            "--x",
            "1",
        ])
        .unwrap();
        assert_eq!(a.nproc_per_node, Some(2));
        assert_eq!(a.master_port, 0);
        assert_eq!(a.program, "prog");
        assert_eq!(a.program_args, vec![OsString::from("--x"), "1".into()]);
        let a = p(&["--nnodes", "2", "--node_rank", "1", "--", "--weird-name"]).unwrap();
        assert_eq!((a.nnodes, a.node_rank), (2, 1));
        assert_eq!(a.program, "--weird-name");
    }

    #[test]
    fn errors_name_the_argument() {
        assert!(err(&[]).contains("PROGRAM"), "{}", err(&[]));
        assert!(err(&["--nproc-per-node", "two", "x"]).contains("--nproc-per-node"));
        assert!(err(&["--nproc-per-node", "0", "x"]).contains("--nproc-per-node"));
        assert!(err(&["--node-rank", "1", "x"]).contains("--nnodes"));
        assert!(err(&["--frobnicate", "1", "x"]).contains("--frobnicate"));
        assert!(err(&["--nnodes", "2", "--master-port", "0", "x"]).contains("one node"));
        assert!(err(&["--master-port"]).contains("--master-port"));
        assert!(err(&["--grace-period-s", "never", "x"]).contains("`never`"));
        // A typo is an error that suggests the option meant.
        let e = err(&["--nprc-per-node", "2", "x"]);
        assert!(
            e.contains("--nprc-per-node") && e.contains("--nproc-per-node"),
            "{e}"
        );
        assert_eq!(
            p(&["--help"]).unwrap_err().kind(),
            clap::error::ErrorKind::DisplayHelp
        );
    }
}
