//! The autotuner: picks a kernel's config (block sizes, warps, stages, tile-order
//! grouping) by measuring candidates on the launch's own arguments, once per
//! kernel, specialization, shape bucket and GPU; results persist in the tuning
//! cache ([`crate::cache::tuned`]), so later processes launch at once.
//!
//! - `TILEFUSE_AUTOTUNE=off|cached|quick|full` (default `quick`): `off` uses the
//!   default config; `cached` a result already tuned (in this process, the
//!   tuning cache or on rank 0; any effort), else the default, and never tunes
//!   (a deployment that tuned ahead of time, or timings that must not wait on a
//!   tuning); a config pinned on the attribute or set with
//!   [`KernelDef::with_config`] is never tuned.
//! - `quick` measures a few proven configs and one round of their neighbours
//!   within 20 s; `full` more seeds and rounds, within 300 s
//!   (`TILEFUSE_AUTOTUNE_BUDGET_S` overrides either budget).
//! - `TILEFUSE_FORCE_AUTOTUNE=1` tunes again even when a result is cached.
//! - [`KernelDef::tune_over`] gives the candidates explicitly.
//! - With several ranks ([`set_coordinator`], done by `dist::ProcessGroup`), rank 0
//!   tunes and every rank uses its winner: ranks that picked different configs
//!   could deadlock a collective kernel.
//!
//! Shapes are bucketed: each tile extent rounds up to a power of two, so ragged
//! sizes near one another share a result.

mod progress;
pub mod search;
mod trial;
mod tuner;

use crate::args::{ScalarArg, TensorArg};
use crate::cache::tuned::{self, Tuned};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernel::KernelDef;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tilefuse_codegen::ir::Kernel;
use tilefuse_codegen::Planned;
use tilefuse_codegen::{Config, Spec};

/// How hard to tune.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Effort {
    Off,
    /// Tuned results only: from this process or the cache, never a tuning.
    Cached,
    Quick,
    Full,
}

impl Effort {
    pub fn name(self) -> &'static str {
        match self {
            Effort::Off => "off",
            Effort::Cached => "cached",
            Effort::Quick => "quick",
            Effort::Full => "full",
        }
    }

    /// The wall-clock budget of one tuning run: `TILEFUSE_AUTOTUNE_BUDGET_S`
    /// (seconds, positive, at most a week) where set, else the level's. A value
    /// that is not a positive number is an error naming the variable, not
    /// silently ignored.
    pub fn budget(self) -> Result<Duration> {
        let level = match self {
            Effort::Full => Duration::from_secs(300),
            _ => Duration::from_secs(20),
        };
        crate::settings::from_env(
            "TILEFUSE_AUTOTUNE_BUDGET_S",
            level,
            crate::settings::parse_seconds,
        )
    }

    fn parse(v: &str) -> Option<Effort> {
        match v.trim().to_ascii_lowercase().as_str() {
            "off" | "0" | "none" => Some(Effort::Off),
            "cached" => Some(Effort::Cached),
            "quick" | "1" => Some(Effort::Quick),
            "full" | "2" => Some(Effort::Full),
            _ => None,
        }
    }
}

static EFFORT: Mutex<Option<Effort>> = Mutex::new(None);

/// Sets the effort for this process (over `TILEFUSE_AUTOTUNE`); `None` goes back
/// to the variable.
pub fn set_effort(e: Option<Effort>) {
    *EFFORT.lock().unwrap_or_else(|p| p.into_inner()) = e;
}

/// The effort in force: [`set_effort`], else `TILEFUSE_AUTOTUNE`, else quick.
pub fn effort() -> Result<Effort> {
    if let Some(e) = *EFFORT.lock().unwrap_or_else(|p| p.into_inner()) {
        return Ok(e);
    }
    match std::env::var("TILEFUSE_AUTOTUNE") {
        Err(_) => Ok(Effort::Quick),
        Ok(v) => Effort::parse(&v).ok_or_else(|| Error::Argument {
            context: "environment".into(),
            arg: "TILEFUSE_AUTOTUNE".into(),
            message: format!("`{v}`: expected off, cached, quick or full"),
        }),
    }
}

static BENCH_RUNS: AtomicU64 = AtomicU64::new(0);

/// Candidates this process has benchmarked (each a warm-up and timed repeats).
pub fn bench_runs() -> u64 {
    BENCH_RUNS.load(Ordering::Relaxed)
}

pub(crate) fn count_bench_run() {
    BENCH_RUNS.fetch_add(1, Ordering::Relaxed);
}

/// What this process has compiled and benchmarked so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counters {
    /// NVRTC compiles run ([`crate::jit::compile_count`]).
    pub nvrtc_compiles: u64,
    /// Cubins loaded from the disk cache instead.
    pub cubin_cache_hits: u64,
    /// Candidates benchmarked by the autotuner.
    pub bench_runs: u64,
}

/// The counters now (also logged at debug level after each tuning).
///
/// ```
/// let c = tilefuse_runtime::autotune::counters();
/// println!("{c}"); // "0 NVRTC compiles, 0 cubins from the cache, 0 benchmark runs"
/// ```
pub fn counters() -> Counters {
    Counters {
        nvrtc_compiles: crate::jit::compile_count(),
        cubin_cache_hits: crate::cache::cubins::hits(),
        bench_runs: bench_runs(),
    }
}

impl std::fmt::Display for Counters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} NVRTC compiles, {} cubins from the cache, {} benchmark runs",
            self.nvrtc_compiles, self.cubin_cache_hits, self.bench_runs
        )
    }
}

static TUNED_HERE: Mutex<Vec<(String, Tuned)>> = Mutex::new(Vec::new());

/// The tuning runs this process did (kernel name, result), in order; results
/// taken from the cache or from rank 0 are not listed.
pub fn tuned_in_process() -> Vec<(String, Tuned)> {
    TUNED_HERE.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// One launch, as the tuner needs it.
pub(crate) struct Launch<'a> {
    pub dev: &'a Arc<Device>,
    pub kernel: &'a Planned,
    pub spec: &'a Spec,
    pub tensors: &'a [TensorArg],
    pub scalars: &'a [ScalarArg],
}

/// Shares tuning results between ranks: rank 0 publishes, the others fetch.
pub trait Coordinator: Send + Sync {
    fn rank(&self) -> usize;
    /// Rank 0: makes `value` available under `key`.
    fn publish(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Other ranks: waits (at most `timeout`) for rank 0's value under `key`.
    fn fetch(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
}

static COORDINATOR: Mutex<Option<Arc<dyn Coordinator>>> = Mutex::new(None);

/// Installs (or removes) the coordinator of this process's ranks.
pub fn set_coordinator(c: Option<Arc<dyn Coordinator>>) {
    *COORDINATOR.lock().unwrap_or_else(|p| p.into_inner()) = c;
}

type Candidates = HashMap<String, Vec<Config>>;
static CANDIDATES: Mutex<Option<Candidates>> = Mutex::new(None);

/// The explicit candidates of kernel `name`, if given.
fn candidates_of(name: &str) -> Option<Vec<Config>> {
    CANDIDATES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|m| m.get(name).cloned())
}

/// Sets kernel `name`'s candidates; an empty list goes back to its derived space.
pub(crate) fn set_candidates(name: &str, configs: Vec<Config>) {
    let mut all = CANDIDATES.lock().unwrap_or_else(|p| p.into_inner());
    let all = all.get_or_insert_with(HashMap::new);
    if configs.is_empty() {
        all.remove(name);
    } else {
        all.insert(name.to_string(), configs);
    }
}

/// The config each kernel got when the autotuner last chose one (tuned now, from
/// the cache, or from rank 0), by kernel name, and whether it was a tuning's
/// result (else the default: none cached under `cached`, or a tuning failed).
static LAST: Mutex<Option<HashMap<String, (Config, bool)>>> = Mutex::new(None);

/// The config the autotuner last chose for kernel `name` in this process (a
/// launch answered from this process's memo does not change it).
pub fn last_choice(name: &str) -> Option<Config> {
    last(name).map(|(c, _)| c)
}

/// Whether [`last_choice`] for kernel `name` was a tuning's result (now, from
/// the cache or from rank 0; `false`: the default, as when `cached` found
/// none). `None` where the autotuner has not chosen for it (tuning off).
///
/// ```
/// assert_eq!(tilefuse_runtime::autotune::last_was_tuned("never_launched"), None);
/// ```
pub fn last_was_tuned(name: &str) -> Option<bool> {
    last(name).map(|(_, tuned)| tuned)
}

fn last(name: &str) -> Option<(Config, bool)> {
    LAST.lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|m| m.get(name).cloned())
}

/// What decides a launch's tuned config within this process; cheap to hash, so a
/// launch after the first costs no key string (the full key, with the IR and the
/// versions, is built only to look up the caches).
#[derive(Clone, PartialEq, Eq, Hash)]
struct Memo {
    kernel: String,
    spec: Spec,
    buckets: Vec<u64>,
    device: usize,
    effort: Effort,
    explicit: Option<Vec<Config>>,
}

/// Winners found or loaded in this process.
static CHOSEN: Mutex<Option<HashMap<Memo, Config>>> = Mutex::new(None);

/// Each dimension's extent at a launch (`None` where its scalar is not an integer).
pub(crate) fn extents(kernel: &Kernel, scalars: &[ScalarArg]) -> Vec<Option<usize>> {
    kernel
        .dims
        .iter()
        .map(|d| match d.extent.and_then(|e| scalars.get(e)) {
            Some(s) if s.int().is_some() => s.int().and_then(|x| usize::try_from(x).ok()),
            _ => None,
        })
        .collect()
}

/// Each tile extent rounded up to a power of two.
fn shape_buckets(launch: &Launch) -> Vec<u64> {
    launch
        .kernel
        .dims
        .iter()
        .map(|d| match d.extent.map(|e| launch.scalars[e]) {
            Some(s) if s.int().is_some() => {
                (s.int().unwrap_or(1).max(1) as u64).next_power_of_two()
            }
            // Bounds the program computes: not a shape of the launch.
            _ => 0,
        })
        .collect()
}

fn driver_version() -> i32 {
    let mut v = 0;
    // SAFETY: a valid out-pointer; the driver is loaded (a device is open).
    let _ = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    v
}

/// A digest of the code a tuning would time on `target` at these extents: the
/// CUDA C of the default config and of each quick seed (or of each `explicit`
/// candidate), an error's text where one does not lower. Tuning results are
/// keyed by it: a tilefuse build that generates other code for a kernel tunes
/// it again, one that changed only other kernels' code keeps their winners (a
/// digest of the codegen crate's sources tuned every kernel again after any
/// change to it). About 20 lowerings, once a process per kernel and shape
/// bucket, before the cache is read.
pub fn code_digest(
    k: &Planned,
    spec: &Spec,
    target: tilefuse_codegen::Target,
    extents: &[Option<usize>],
    explicit: Option<&[Config]>,
) -> u64 {
    let configs: Vec<Config> = match explicit {
        Some(c) => c.to_vec(),
        None => {
            let space = tilefuse_codegen::ConfigSpace::new(k, spec, target).with_extents(extents);
            let mut c = vec![space.default_config().clone()];
            c.extend(space.seeds(spec, true));
            c
        }
    };
    let mut text = String::new();
    for c in &configs {
        text.push_str(&c.to_string());
        text.push('\n');
        match tilefuse_codegen::lower(k, spec, c) {
            Ok(l) => text.push_str(&l.source),
            Err(e) => text.push_str(&e.to_string()),
        }
    }
    tilefuse_codegen::hash::fnv1a64(text.as_bytes())
}

/// The tuning key of a launch: everything a winner depends on (the generated
/// code through [`code_digest`]).
fn key(launch: &Launch, buckets: &[u64], explicit: Option<&[Config]>) -> Result<String> {
    let k = launch.kernel;
    let (cc, nvrtc) = (
        launch.dev.compute_capability(),
        crate::jit::nvrtc_version()?,
    );
    let ir = serde_json::to_string(k.kernel()).unwrap_or_default();
    let spec = serde_json::to_string(launch.spec).unwrap_or_default();
    let cands = explicit.map(|c| {
        c.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    });
    Ok(format!(
        "tune\nkernel {}\nir {ir}\nspec {spec}\nshape buckets {buckets:?}\ndevice {} sm_{}{}\ndriver {}\nnvrtc {}.{}\ntilefuse {} (code {:016x})\ncandidates {}",
        k.name,
        launch.dev.name(),
        cc.0,
        cc.1,
        driver_version(),
        nvrtc.0,
        nvrtc.1,
        env!("CARGO_PKG_VERSION"),
        code_digest(
            launch.kernel,
            launch.spec,
            launch.dev.target(),
            &extents(launch.kernel, launch.scalars),
            explicit
        ),
        cands.as_deref().unwrap_or("(the space)")
    ))
}

/// The config a launch without a pinned config uses: tuned (from this process,
/// the cache, rank 0, or tuned now), or the default when tuning is off or fails.
pub(crate) fn config_for(def: &KernelDef, launch: &Launch) -> Result<Config> {
    let ext = extents(launch.kernel, launch.scalars);
    let default = tilefuse_codegen::fit_default(
        launch.kernel,
        def.default_at(launch.dev, launch.spec, &ext)?,
        &ext,
    );
    let default = tilefuse_codegen::fit_whole_dims(launch.kernel, default, &ext);
    let effort = effort()?;
    if effort == Effort::Off {
        return Ok(default);
    }
    let explicit = candidates_of(&launch.kernel.name);
    let memo = Memo {
        kernel: launch.kernel.name.clone(),
        spec: launch.spec.clone(),
        buckets: shape_buckets(launch),
        device: launch.dev.ordinal(),
        effort,
        explicit: explicit.clone(),
    };
    if let Some(c) = CHOSEN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|m| m.get(&memo))
    {
        return Ok(c.clone());
    }
    // Read only when a launch may tune or wait for a tuning, not on every launch.
    let budget = effort.budget()?;
    let key = key(launch, &memo.buckets, explicit.as_deref())?;
    let coordinator = COORDINATOR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let store_key = format!(
        "tilefuse/tuned/{:016x}",
        tilefuse_codegen::hash::fnv1a64(key.as_bytes())
    );
    let tuned = match &coordinator {
        Some(c) if c.rank() != 0 => {
            // Rank 0 may be tuning: wait its budget and then some.
            let wait = budget + Duration::from_secs(120);
            let bytes = c.fetch(&store_key, wait)?;
            serde_json::from_slice::<Option<Tuned>>(&bytes)
                .ok()
                .flatten()
        }
        _ => {
            let t = find_or_tune(def, launch, effort, budget, explicit, &key);
            if let Some(c) = &coordinator {
                c.publish(&store_key, &serde_json::to_vec(&t).unwrap_or_default())?;
            }
            t
        }
    };
    let was_tuned = tuned.is_some();
    let config = tuned.map_or(default, |t| t.config);
    LAST.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(launch.kernel.name.clone(), (config.clone(), was_tuned));
    CHOSEN
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(memo, config.clone());
    Ok(config)
}

/// A cached result good enough for `effort`, or a fresh tuning (then cached);
/// under [`Effort::Cached`] a cached result of any effort or none.
fn find_or_tune(
    def: &KernelDef,
    launch: &Launch,
    effort: Effort,
    budget: Duration,
    explicit: Option<Vec<Config>>,
    key: &str,
) -> Option<Tuned> {
    let force = std::env::var("TILEFUSE_FORCE_AUTOTUNE").is_ok_and(|v| v == "1");
    if effort == Effort::Cached {
        let t = tuned::load(key);
        if t.is_none() {
            tracing::info!(kernel = %launch.kernel.name, "no tuned config cached (TILEFUSE_AUTOTUNE=cached): the default");
        }
        return t;
    }
    if !force {
        if let Some(t) = tuned::load(key) {
            // A quick result does not answer a request for full effort.
            if !(effort == Effort::Full && t.effort == "quick") {
                tracing::debug!(kernel = %launch.kernel.name, config = %t.config, "tuned config from the cache");
                return Some(t);
            }
        }
    }
    let t = tuner::tune(def, launch, effort, budget, explicit)?;
    tuned::store(key, &t);
    TUNED_HERE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((launch.kernel.name.clone(), t.clone()));
    tracing::debug!("after tuning `{}`: {}", launch.kernel.name, counters());
    Some(t)
}
