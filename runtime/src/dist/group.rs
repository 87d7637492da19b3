//! The process group: this rank's place (from the launcher's environment), the
//! store every rank meets at, this rank's GPU, and NCCL on demand.

use super::env::DistEnv;
use super::nccl::Nccl;
use super::store::{secret_from_env, Store, StoreServer};
use crate::device::Device;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long rendezvous and cross-rank waits take before they fail:
/// `TILEFUSE_DIST_TIMEOUT_S` (positive seconds, at most a week), default 120 s.
pub fn default_timeout() -> crate::Result<Duration> {
    crate::settings::from_env(
        "TILEFUSE_DIST_TIMEOUT_S",
        Duration::from_secs(120),
        crate::settings::parse_seconds,
    )
}

/// The ranks of one job, as seen from one of them.
///
/// ```no_run
/// # fn main() -> tilefuse_runtime::Result<()> {
/// // Under `tilefuse-run --nproc-per-node 2 prog`:
/// let pg = tilefuse_runtime::dist::ProcessGroup::init()?;
/// println!("rank {} of {} on GPU {}", pg.rank(), pg.world_size(), pg.device().ordinal());
/// pg.barrier("ready")?;
/// # Ok(()) }
/// ```
pub struct ProcessGroup {
    env: DistEnv,
    store: Arc<Store>,
    device: Arc<Device>,
    timeout: Duration,
    seq: AtomicU64,
    nccl: OnceLock<Arc<Nccl>>,
    /// Last, so this rank's own connections (the store, NCCL's stand-in on the
    /// host) close before the server waits for the others to.
    _server: Option<StoreServer>,
}

impl ProcessGroup {
    /// Joins the job described by the launcher's environment ([`DistEnv::from_env`]),
    /// waiting at most [`default_timeout`] for every rank.
    pub fn init() -> Result<ProcessGroup> {
        ProcessGroup::init_with(DistEnv::from_env()?, default_timeout()?)
    }

    /// Joins the job `env` describes. Rank 0 hosts the store; everyone connects,
    /// takes GPU `LOCAL_RANK` and waits for all ranks (an error names the ranks
    /// that never arrived).
    pub fn init_with(env: DistEnv, timeout: Duration) -> Result<ProcessGroup> {
        let server = if env.rank == 0 {
            let ip = super::store::bind_address(&env.master_addr, env.single_node())?;
            Some(StoreServer::start(ip, env.master_port, &secret_from_env())?)
        } else {
            None
        };
        let port = server.as_ref().map_or(env.master_port, StoreServer::port);
        let host = if env.rank == 0 {
            "127.0.0.1"
        } else {
            env.master_addr.as_str()
        };
        let store = Arc::new(Store::connect(
            host,
            port,
            env.rank,
            timeout,
            &secret_from_env(),
        )?);
        let interpret = crate::mode::mode()? == crate::mode::Mode::Interpret;
        let gpus = if interpret {
            usize::MAX
        } else {
            Device::count()?
        };
        if env.local_rank >= gpus {
            return Err(Error::Distributed {
                context: format!("rank {}", env.rank),
                message: format!(
                    "LOCAL_RANK is {} but this node has {gpus} GPU(s); start at most {gpus} process(es) per node",
                    env.local_rank
                ),
            });
        }
        let device = Device::set_current(env.local_rank)?;
        let pg = ProcessGroup {
            env,
            store,
            _server: server,
            device,
            timeout,
            seq: AtomicU64::new(0),
            nccl: OnceLock::new(),
        };
        pg.barrier("init")?;
        if pg.world_size() > 1 {
            // One rank tunes; every rank launches its winner.
            crate::autotune::set_coordinator(Some(Arc::new(TuneCoordinator {
                store: pg.store.clone(),
                rank: pg.rank(),
            })));
        }
        Ok(pg)
    }

    pub fn rank(&self) -> usize {
        self.env.rank
    }

    pub fn world_size(&self) -> usize {
        self.env.world_size
    }

    pub fn local_rank(&self) -> usize {
        self.env.local_rank
    }

    pub fn env(&self) -> &DistEnv {
        &self.env
    }

    /// This rank's GPU (`LOCAL_RANK`).
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A name no earlier collective call of this group used (every rank makes the
    /// same calls in the same order, so the names match across ranks).
    fn next(&self, label: &str) -> String {
        format!("{label}#{}", self.seq.fetch_add(1, Ordering::Relaxed))
    }

    /// Waits on the host until every rank reaches the same barrier.
    pub fn barrier(&self, label: &str) -> Result<()> {
        let name = self.next(label);
        self.store.barrier(&name, self.world_size(), self.timeout)
    }

    /// Every rank's `value` (small host data: shapes, handles), in rank order.
    pub fn all_gather_bytes(&self, label: &str, value: &[u8]) -> Result<Vec<Vec<u8>>> {
        let name = self.next(label);
        self.store.set(&format!("{name}/{}", self.rank()), value)?;
        (0..self.world_size())
            .map(|r| {
                self.store.get(
                    &format!("{name}/{r}"),
                    self.timeout,
                    &format!("rank {r}'s `{label}`"),
                )
            })
            .collect()
    }

    /// The largest of every rank's `values[i]`, for each `i` (every rank passes
    /// as many): e.g. a collective's time is its slowest rank's.
    pub fn max_over_ranks(&self, label: &str, values: &[f64]) -> Result<Vec<f64>> {
        let mine: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.all_gather_bytes(label, &mine)?;
        Ok((0..values.len())
            .map(|i| {
                all.iter()
                    .filter_map(|b| b.get(i * 8..i * 8 + 8)?.try_into().ok())
                    .map(f64::from_le_bytes)
                    .fold(f64::NEG_INFINITY, f64::max)
            })
            .collect())
    }

    /// The NCCL communicator of this group, created on first use (by every rank).
    pub fn nccl(&self) -> Result<Arc<Nccl>> {
        if let Some(n) = self.nccl.get() {
            return Ok(n.clone());
        }
        if self.device.is_host() {
            let n = Arc::new(Nccl::on_host(
                &self.device,
                self.store.clone(),
                self.timeout,
                self.rank(),
                self.world_size(),
            ));
            return Ok(self.nccl.get_or_init(|| n).clone());
        }
        let name = self.next("nccl-id");
        let id = if self.rank() == 0 {
            let id = super::nccl::new_id()?;
            self.store.set(&name, &id)?;
            id
        } else {
            self.store.get(&name, self.timeout, "rank 0's NCCL id")?
        };
        // Everyone has the id: joining cannot wait on a rank that is not there.
        self.barrier("nccl-join")?;
        let n = Arc::new(Nccl::join(
            &self.device,
            &id,
            self.rank(),
            self.world_size(),
            self.timeout,
        )?);
        Ok(self.nccl.get_or_init(|| n).clone())
    }

    /// Waits for this rank's queued GPU work, at most the group's timeout: past it,
    /// NCCL is aborted and the error says a peer probably failed (a collective with
    /// a dead peer would otherwise never finish).
    pub fn synchronize(&self, what: &str) -> Result<()> {
        if self.device.is_host() {
            return Ok(()); // interpret mode: work ran when it was called
        }
        let start = Instant::now();
        let stream = self.device.stream()?;
        loop {
            // SAFETY: queries a live stream of this device.
            match unsafe { cudarc::driver::sys::cuStreamQuery(stream.cu_stream()) } {
                cudarc::driver::sys::CUresult::CUDA_SUCCESS => return self.device.synchronize(),
                cudarc::driver::sys::CUresult::CUDA_ERROR_NOT_READY => {}
                e => {
                    return Err(Error::Driver {
                        context: format!("waiting for {what}"),
                        message: format!("{e:?}"),
                    })
                }
            }
            if start.elapsed() >= self.timeout {
                if let Some(n) = self.nccl.get() {
                    n.abort();
                }
                self.device.mark_wedged();
                return Err(Error::Timeout {
                    rank: self.rank(),
                    what: format!("its GPU work ({what})"),
                    waited_ms: start.elapsed().as_millis() as u64,
                    hint: "a peer rank probably failed or hung mid-collective; see the other ranks' output"
                        .into(),
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.world_size() > 1 {
            crate::autotune::set_coordinator(None);
        }
    }
}

/// Tuning results through the store: rank 0 publishes, the others wait for them.
struct TuneCoordinator {
    store: Arc<Store>,
    rank: usize,
}

impl crate::autotune::Coordinator for TuneCoordinator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn publish(&self, key: &str, value: &[u8]) -> Result<()> {
        self.store.set(key, value)
    }

    fn fetch(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.store
            .get(key, timeout, "rank 0's autotuning result for a kernel")
    }
}
