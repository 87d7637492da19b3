//! Who this process is among its peers, read from torchrun's variables (which
//! `tilefuse-run` sets).

use crate::error::{Error, Result};

/// A rank's place in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    /// The port of tilefuse's store: `MASTER_PORT`, but under torchrun (whose
    /// agent hosts its own store there) `TILEFUSE_STORE_PORT`, by default
    /// `MASTER_PORT + 1`. 0 when single-process without a launcher: the store
    /// picks a port.
    pub master_port: u16,
}

const VARS: [&str; 6] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
];

impl DistEnv {
    /// Reads `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`
    /// and `MASTER_PORT`. With none of them set, a single process (rank 0 of 1);
    /// with only some set, an error naming the missing ones.
    pub fn from_env() -> Result<DistEnv> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`DistEnv::from_env`], reading variables through `get`.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<DistEnv> {
        let values: Vec<Option<String>> = VARS.iter().map(|v| get(v)).collect();
        if values.iter().all(Option::is_none) {
            return Ok(DistEnv::single());
        }
        let missing: Vec<&str> = VARS
            .iter()
            .zip(&values)
            .filter(|(_, v)| v.is_none())
            .map(|(k, _)| *k)
            .collect();
        if !missing.is_empty() {
            return Err(Error::Distributed {
                context: "reading the launcher's environment".into(),
                message: format!(
                    "{} not set while {} are; run under tilefuse-run (or torchrun), which sets them all",
                    missing.join(", "),
                    VARS.iter()
                        .zip(&values)
                        .filter(|(_, v)| v.is_some())
                        .map(|(k, _)| *k)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            });
        }
        let num = |i: usize| -> Result<usize> {
            let v = values[i].as_deref().unwrap_or_default();
            v.trim().parse().map_err(|_| Error::Distributed {
                context: "reading the launcher's environment".into(),
                message: format!("{} must be a non-negative integer, got `{v}`", VARS[i]),
            })
        };
        let master_port: u16 = num(5)?.try_into().map_err(|_| Error::Distributed {
            context: "reading the launcher's environment".into(),
            message: "MASTER_PORT must be at most 65535".into(),
        })?;
        let store_port = match (get("TILEFUSE_STORE_PORT"), get("TORCHELASTIC_RUN_ID")) {
            (Some(p), _) => p.trim().parse::<u16>().map_err(|_| Error::Distributed {
                context: "reading the launcher's environment".into(),
                message: format!("TILEFUSE_STORE_PORT must be a port number (0-65535), got `{p}`"),
            })?,
            // torchrun's agent listens on MASTER_PORT: the next one is ours.
            (None, Some(_)) => master_port.checked_add(1).ok_or_else(|| Error::Distributed {
                context: "reading the launcher's environment".into(),
                message: "under torchrun the store takes MASTER_PORT + 1, and MASTER_PORT is 65535: set TILEFUSE_STORE_PORT".into(),
            })?,
            (None, None) => master_port,
        };
        let env = DistEnv {
            rank: num(0)?,
            world_size: num(1)?,
            local_rank: num(2)?,
            local_world_size: num(3)?,
            master_addr: values[4].clone().unwrap_or_default(),
            master_port: store_port,
        };
        let bad = |m: String| {
            Err(Error::Distributed {
                context: "reading the launcher's environment".into(),
                message: m,
            })
        };
        if env.world_size == 0 || env.rank >= env.world_size {
            return bad(format!(
                "RANK ({}) must be below WORLD_SIZE ({})",
                env.rank, env.world_size
            ));
        }
        if env.local_world_size == 0
            || env.local_rank >= env.local_world_size
            || env.world_size % env.local_world_size != 0
        {
            return bad(format!(
                "LOCAL_RANK ({}) must be below LOCAL_WORLD_SIZE ({}), which must divide WORLD_SIZE ({})",
                env.local_rank, env.local_world_size, env.world_size
            ));
        }
        Ok(env)
    }

    /// One process alone.
    pub fn single() -> DistEnv {
        DistEnv {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port: 0,
        }
    }

    /// Whether every rank runs on this node (symmetric memory spans one node).
    pub fn single_node(&self) -> bool {
        self.local_world_size == self.world_size
    }

    /// The node this rank runs on (ranks are numbered node by node).
    pub fn node(&self) -> usize {
        self.rank / self.local_world_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<DistEnv> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        DistEnv::from_lookup(|k| m.get(k).cloned())
    }

    const FULL: [(&str, &str); 6] = [
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "10.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];

    /// Under torchrun (its agent's store is on MASTER_PORT) the store takes the
    /// next port, or TILEFUSE_STORE_PORT.
    #[test]
    fn under_torchrun_the_store_takes_another_port() {
        assert_eq!(env(&FULL).unwrap().master_port, 29500);
        let mut v = FULL.to_vec();
        v.push(("TORCHELASTIC_RUN_ID", "none"));
        assert_eq!(env(&v).unwrap().master_port, 29501);
        v.push(("TILEFUSE_STORE_PORT", "29700"));
        assert_eq!(env(&v).unwrap().master_port, 29700);
        v.pop();
        v.push(("TILEFUSE_STORE_PORT", "lots"));
        let e = env(&v).unwrap_err().to_string();
        assert!(
            e.contains("TILEFUSE_STORE_PORT") && e.contains("`lots`"),
            "{e}"
        );
    }

    #[test]
    fn reads_torchrun_variables() {
        let e = env(&FULL).unwrap();
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.local_world_size),
            (3, 4, 1, 2)
        );
        assert_eq!((e.node(), e.single_node()), (1, false));
        assert_eq!(env(&[]).unwrap(), DistEnv::single());
    }

    #[test]
    fn errors_name_the_variable() {
        let e = env(&FULL[..4]).unwrap_err().to_string();
        assert!(e.contains("MASTER_ADDR, MASTER_PORT not set"), "{e}");
        let mut bad = FULL;
        bad[0] = ("RANK", "4");
        assert!(env(&bad).unwrap_err().to_string().contains("RANK (4)"));
        bad[0] = ("RANK", "x");
        assert!(env(&bad).unwrap_err().to_string().contains("RANK must be"));
        let mut bad = FULL;
        bad[3] = ("LOCAL_WORLD_SIZE", "3");
        assert!(env(&bad)
            .unwrap_err()
            .to_string()
            .contains("LOCAL_WORLD_SIZE (3)"));
    }
}
