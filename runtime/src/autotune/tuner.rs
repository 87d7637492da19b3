//! One tuning run: the space from the kernel's IR, the seeds, the pattern search;
//! candidates compile on several CPU threads while the GPU benchmarks the ones
//! already compiled. A candidate that fails to compile, to launch or the output
//! check is dropped with its reason, never fails the tuning.

use super::progress::Progress;
use super::search::{pattern_search, Measured};
use super::trial::Trial;
use super::{Effort, Launch};
use crate::cache::tuned::Tuned;
use crate::kernel::{compile_variant, load_variant, KernelDef, Variant};
use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tilefuse_codegen::{Config, ConfigSpace};

/// A winner must beat the default config by this fraction at the median.
const MIN_GAIN: f64 = 0.01;
/// The confirmation's rounds: finalists and the default timed in turns.
const PASSES: usize = 6;
/// Each confirmation timing runs its candidate this long first, so the
/// finalists are compared at sustained clocks (a config that wins short runs
/// lost under sustained load at 8192³ and 2048×4096×11008 on an H200).
const SETTLE: Duration = Duration::from_millis(200);
/// A winner must also be faster than the default in this share of the rounds
/// (five of six in the confirmation, seven of eight in the duel): a median gain inside the noise of large GEMMs (±2% on an
/// H200 under sustained load) seldom wins this often.
const MIN_WIN_SHARE: f64 = 0.8;
/// The duel that decides between the confirmation's winner and the default:
/// this many rounds of the two alone, in turns ([`time_in_turns`]). At 4096³
/// on an H200 a config that read 1-4% faster among the finalists read 2-3%
/// slower in the benchmark that followed (docs/perf-history.md, "the tuner's duel with the default").
const DUEL_ROUNDS: usize = 8;

/// Tunes one launch; `None` when it cannot be tuned (said at debug level).
pub(crate) fn tune(
    def: &KernelDef,
    launch: &Launch,
    effort: Effort,
    budget: Duration,
    explicit: Option<Vec<Config>>,
) -> Option<Tuned> {
    let started = Instant::now();
    let k = launch.kernel;
    let space = ConfigSpace::new(k, launch.spec, launch.dev.target())
        .with_extents(&super::extents(k, launch.scalars));
    let mut trial = match Trial::new(launch) {
        Ok(t) => t,
        Err(why) => {
            tracing::debug!(kernel = %k.name, "not tuned: {why}");
            return None;
        }
    };
    let default = space.default_config().clone();
    let default_v = match def.variant_for(launch.dev, k, launch.spec, &default) {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!(kernel = %k.name, "not tuned: the default config fails: {e}");
            return None;
        }
    };
    if let Err(e) = trial.set_reference(&default_v) {
        tracing::debug!(kernel = %k.name, "not tuned: the default config's run failed: {e}");
        return None;
    }
    let (seeds, rounds) = match explicit {
        Some(c) => {
            let mut c: Vec<Config> = c.into_iter().filter(|c| *c != default).collect();
            c.insert(0, default.clone());
            (c, 0)
        }
        None => (
            space.seeds(launch.spec, effort == Effort::Quick),
            if effort == Effort::Quick { 1 } else { 8 },
        ),
    };
    let deadline = started + budget;
    let progress = Progress::start(&k.name, effort.name());
    let mut variants: HashMap<Config, Arc<Variant>> = HashMap::new();
    variants.insert(default.clone(), default_v);
    let mut best_ms: Option<f64> = None;
    let found = pattern_search(
        seeds,
        |c| space.neighbors(c, launch.spec),
        |batch| {
            progress.plan(batch.len());
            measure_batch(
                launch,
                &trial,
                batch,
                &mut variants,
                &progress,
                &mut best_ms,
            )
        },
        rounds,
        deadline,
    );
    let tried = found.tried.len();
    let dropped: Vec<&(Config, Measured)> = found
        .tried
        .iter()
        .filter(|t| matches!(t.1, Measured::Dropped(_)))
        .collect();
    for (c, m) in &dropped {
        if let Measured::Dropped(why) = m {
            tracing::info!(kernel = %k.name, config = %c, "candidate dropped: {why}");
        }
    }
    let timed: Vec<(Config, f64)> = found
        .tried
        .iter()
        .filter_map(|(c, m)| match m {
            Measured::Time(t) => Some((c.clone(), *t)),
            Measured::Dropped(_) => None,
        })
        .collect();
    let confirmed = confirm(&trial, &variants, &timed, &default, &progress);
    let default_run = confirmed.iter().find(|c| c.config == default).cloned();
    let best = confirmed
        .iter()
        .min_by(|a, b| a.ms.total_cmp(&b.ms))
        .cloned();
    let (Some(mut best), Some(mut default_run)) = (best, default_run) else {
        progress.finish("no candidate could be measured; using the default config");
        return None;
    };
    if best.beats(&default_run) {
        // A duel on fresh rounds: among several finalists each pair's
        // neighbours in time differ from round to round.
        let mut pair = [best, default_run].map(|c| Confirmed {
            rounds: Vec::new(),
            ..c
        });
        time_in_turns(&trial, &variants, &mut pair, DUEL_ROUNDS, &progress);
        [best, default_run] = pair;
    }
    let default_ms = default_run.ms;
    // Within timing noise of the default, keep the default.
    let (config, ms) = if best.beats(&default_run) {
        (best.config, best.ms)
    } else {
        (default.clone(), default_ms)
    };
    let seconds = started.elapsed().as_secs_f64();
    progress.finish(&format!(
        "{config}: {ms:.3} ms, {:.2}x the default config ({default_ms:.3} ms); {tried} candidates ({} dropped) in {seconds:.1} s{}",
        default_ms / ms,
        dropped.len(),
        if found.out_of_time { ", stopped at the time budget" } else { "" }
    ));
    if let Some(v) = variants.remove(&config) {
        def.keep_variant(launch.dev, launch.spec, &config, v);
    }
    Some(Tuned {
        config,
        ms,
        default_ms,
        effort: effort.name().into(),
        candidates: tried,
        seconds,
    })
}

/// A finalist of the confirmation: its median time and its time in each round.
#[derive(Clone)]
struct Confirmed {
    config: Config,
    ms: f64,
    rounds: Vec<f64>,
}

impl Confirmed {
    /// Faster than `default` by [`MIN_GAIN`] at the median, and in at least
    /// [`MIN_WIN_SHARE`] of the rounds (both timed in every round).
    fn beats(&self, default: &Confirmed) -> bool {
        if self.rounds.len() != default.rounds.len() {
            return false;
        }
        let wins = self
            .rounds
            .iter()
            .zip(&default.rounds)
            .filter(|(a, b)| a < b)
            .count();
        self.ms <= default.ms * (1.0 - MIN_GAIN)
            && wins as f64 >= MIN_WIN_SHARE * self.rounds.len() as f64
    }
}

/// The fastest few (and the default) timed again, in turns, [`PASSES`] times
/// each ([`time_in_turns`]): the GPU's clocks drift with the load before a
/// candidate, so a single short timing per candidate can rank two close
/// configs wrongly. A finalist that misses a round is left out.
fn confirm(
    trial: &Trial,
    variants: &HashMap<Config, Arc<Variant>>,
    timed: &[(Config, f64)],
    default: &Config,
    progress: &Progress,
) -> Vec<Confirmed> {
    const FINALISTS: usize = 3;
    let mut by_time = timed.to_vec();
    by_time.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut finalists: Vec<Confirmed> = by_time
        .iter()
        .take(FINALISTS)
        .map(|c| c.0.clone())
        .chain(
            (!by_time.iter().take(FINALISTS).any(|c| c.0 == *default)
                && timed.iter().any(|c| c.0 == *default))
            .then(|| default.clone()),
        )
        .map(|config| Confirmed {
            config,
            ms: f64::NAN,
            rounds: Vec::new(),
        })
        .collect();
    time_in_turns(trial, variants, &mut finalists, PASSES, progress);
    finalists.retain(|f| f.rounds.len() == PASSES);
    finalists
}

/// `rounds` more rounds of `finalists`, each timing after [`SETTLE`] of
/// running its config, in the order of [`crate::timing::turn_order`] (the
/// clocks drift within a round); each finalist's median updated over all its
/// rounds.
fn time_in_turns(
    trial: &Trial,
    variants: &HashMap<Config, Arc<Variant>>,
    finalists: &mut [Confirmed],
    rounds: usize,
    progress: &Progress,
) {
    progress.plan(finalists.len() * rounds);
    for round in 0..rounds {
        for i in crate::timing::turn_order(finalists.len(), round) {
            let f = &mut finalists[i];
            let timed = variants
                .get(&f.config)
                .map(|v| trial.time_settled(v, SETTLE));
            if let Some(Ok(Measured::Time(t))) = timed {
                f.rounds.push(t);
            }
            progress.done_one(None);
        }
    }
    for f in finalists.iter_mut() {
        let mut s = f.rounds.clone();
        s.sort_by(f64::total_cmp);
        f.ms = s.get(s.len() / 2).copied().unwrap_or(f64::NAN);
    }
}

/// Compiles the batch's new configs on worker threads and measures each as soon as
/// it is ready (in the order they finish); returns outcomes in batch order.
fn measure_batch(
    launch: &Launch,
    trial: &Trial,
    batch: &[Config],
    variants: &mut HashMap<Config, Arc<Variant>>,
    progress: &Progress,
    best_ms: &mut Option<f64>,
) -> Vec<Measured> {
    let mut out: Vec<Option<Measured>> = vec![None; batch.len()];
    let mut record = |i: usize, m: Measured, best: &mut Option<f64>| {
        if let Measured::Time(t) = m {
            if best.is_none_or(|b| t < b) {
                *best = Some(t);
            }
        }
        progress.done_one(*best);
        out[i] = Some(m);
    };
    let todo: Vec<usize> = (0..batch.len())
        .filter(|&i| !variants.contains_key(&batch[i]))
        .collect();
    for i in (0..batch.len()).filter(|i| !todo.contains(i)) {
        let m = trial.measure(&variants[&batch[i]]);
        record(i, m, best_ms);
    }
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8)
        .min(todo.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let tx = tx.clone();
            let (todo, next) = (&todo, &next);
            s.spawn(move || loop {
                let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&i) = todo.get(j) else { break };
                let r = compile_variant(launch.kernel, launch.spec, &batch[i], launch.dev);
                if tx.send((i, r)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (i, compiled) in rx {
            let m = match compiled
                .and_then(|(l, c)| load_variant(launch.dev, &launch.kernel.name, l, c))
            {
                Ok(v) => {
                    let v = Arc::new(v);
                    let m = trial.measure(&v);
                    variants.insert(batch[i].clone(), v);
                    m
                }
                Err(e) => Measured::Dropped(format!("does not compile or load: {e}")),
            };
            record(i, m, best_ms);
        }
    });
    out.into_iter()
        .map(|m| m.unwrap_or_else(|| Measured::Dropped("not measured".into())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(ms: f64, rounds: &[f64]) -> Confirmed {
        Confirmed {
            config: Config::new(&[64, 64, 32]),
            ms,
            rounds: rounds.to_vec(),
        }
    }

    #[test]
    fn a_winner_is_faster_at_the_median_and_in_most_rounds() {
        let default = run(1.00, &[1.00, 1.02, 0.99, 1.00, 1.01]);
        // 3% faster, every round: a winner.
        assert!(run(0.97, &[0.97, 0.98, 0.96, 0.97, 0.99]).beats(&default));
        // Faster at the median, but in only three rounds: noise.
        assert!(!run(0.985, &[0.985, 1.03, 0.98, 1.01, 0.97]).beats(&default));
        // Faster in every round, by less than the margin: kept out.
        assert!(!run(0.995, &[0.995, 1.01, 0.985, 0.995, 1.005]).beats(&default));
        // A round missing from either side: not compared round by round.
        assert!(!run(0.97, &[0.97, 0.98, 0.96, 0.97]).beats(&default));
    }

    #[test]
    fn a_winner_must_hold_over_a_longer_duel() {
        // Ten rounds: eight wins hold, seven do not.
        let default = run(1.00, &[1.0; 10]);
        let eight = [0.98, 0.98, 0.98, 0.98, 0.98, 0.98, 0.98, 0.98, 1.01, 1.01];
        assert!(run(0.98, &eight).beats(&default));
        let seven = [0.98, 0.98, 0.98, 0.98, 0.98, 0.98, 0.98, 1.01, 1.01, 1.01];
        assert!(!run(0.98, &seven).beats(&default));
    }
}
