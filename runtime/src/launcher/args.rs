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

/// The usage text, printed with `--help` and after an argument error.
pub const USAGE: &str = "\
usage: tilefuse-run [--nproc-per-node N] [--nnodes K --node-rank R]
                    [--master-addr A] [--master-port P] [--grace-period-s S]
                    [--] program [args...]

Starts N copies of `program` (default: one per GPU, 1 without any) with RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR and MASTER_PORT
set as torchrun sets them. Output lines carry a `[rankN]: ` prefix. When a rank
fails, the others get SIGTERM, then SIGKILL after the grace period (default 5 s),
and tilefuse-run exits non-zero naming the rank. Ctrl-C and SIGTERM are passed on
to every rank. --master-port 0 picks a free port (single node only).
";

/// Parses the arguments after the program name. `Err` carries the message to
/// print before the usage; `Ok(None)` means `--help`.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Option<LaunchArgs>, String> {
    let mut it = args.into_iter().peekable();
    let mut a = LaunchArgs {
        nproc_per_node: None,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: 29500,
        grace_period_s: 5.0,
        program: OsString::new(),
        program_args: Vec::new(),
    };
    while let Some(arg) = it.next() {
        let Some(s) = arg.to_str().filter(|s| s.starts_with("--")) else {
            a.program = arg;
            break;
        };
        if s == "--" {
            a.program = it
                .next()
                .ok_or("`--` must be followed by the program to run")?;
            break;
        }
        if s == "--help" || s == "-h" {
            return Ok(None);
        }
        let (name, inline) = match s.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (s.to_string(), None),
        };
        let value = match inline {
            Some(v) => v,
            None => it
                .next()
                .and_then(|v| v.into_string().ok())
                .ok_or_else(|| format!("`{name}` needs a value"))?,
        };
        let number = |what: &str| -> Result<usize, String> {
            value
                .parse::<usize>()
                .map_err(|_| format!("`{what}` must be a non-negative integer, got `{value}`"))
        };
        match name.as_str() {
            "--nproc-per-node" | "--nproc_per_node" => {
                let n = number(&name)?;
                if n == 0 {
                    return Err(format!("`{name}` must be at least 1"));
                }
                a.nproc_per_node = Some(n);
            }
            "--nnodes" => {
                a.nnodes = number(&name)?;
                if a.nnodes == 0 {
                    return Err("`--nnodes` must be at least 1".into());
                }
            }
            "--node-rank" | "--node_rank" => a.node_rank = number(&name)?,
            "--master-addr" | "--master_addr" => a.master_addr = value,
            "--master-port" | "--master_port" => {
                a.master_port = value.parse().map_err(|_| {
                    format!("`{name}` must be a port number (0-65535), got `{value}`")
                })?
            }
            "--grace-period-s" => {
                // At most a week: longer ones overflow the deadline arithmetic.
                a.grace_period_s = value
                    .parse::<f64>()
                    .ok()
                    .filter(|g| g.is_finite() && *g >= 0.0)
                    .ok_or_else(|| format!("`{name}` must be a number of seconds, got `{value}`"))?
                    .min(crate::settings::LONGEST.as_secs_f64())
            }
            _ => return Err(format!("unknown option `{name}`")),
        }
    }
    if a.program.is_empty() {
        return Err("no program to run was given".into());
    }
    a.program_args = it.collect();
    if a.node_rank >= a.nnodes {
        return Err(format!(
            "`--node-rank` ({}) must be less than `--nnodes` ({})",
            a.node_rank, a.nnodes
        ));
    }
    if a.master_port == 0 && a.nnodes > 1 {
        return Err(
            "`--master-port 0` (pick a free port) works on one node only: the other nodes could not know the port"
                .into(),
        );
    }
    Ok(Some(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Option<LaunchArgs>, String> {
        parse(args.iter().map(OsString::from))
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
        .unwrap()
        .unwrap();
        assert_eq!(a.nproc_per_node, Some(2));
        assert_eq!(a.master_port, 0);
        assert_eq!(a.program, "prog");
        assert_eq!(a.program_args, vec![OsString::from("--x"), "1".into()]);
        let a = p(&["--nnodes", "2", "--node-rank", "1", "--", "--weird-name"])
            .unwrap()
            .unwrap();
        assert_eq!((a.nnodes, a.node_rank), (2, 1));
        assert_eq!(a.program, "--weird-name");
    }

    #[test]
    fn errors_name_the_argument() {
        assert!(p(&[]).unwrap_err().contains("no program"));
        assert!(p(&["--nproc-per-node", "two", "x"])
            .unwrap_err()
            .contains("--nproc-per-node"));
        assert!(p(&["--nproc-per-node", "0", "x"])
            .unwrap_err()
            .contains("at least 1"));
        assert!(p(&["--node-rank", "1", "x"])
            .unwrap_err()
            .contains("--nnodes"));
        assert!(p(&["--frobnicate", "1", "x"])
            .unwrap_err()
            .contains("--frobnicate"));
        assert!(p(&["--nnodes", "2", "--master-port", "0", "x"])
            .unwrap_err()
            .contains("one node"));
        assert!(p(&["--master-port"]).unwrap_err().contains("needs a value"));
        assert_eq!(p(&["--help"]), Ok(None));
    }
}
