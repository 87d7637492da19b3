//! The search strategy, apart from any GPU: measure a set of proven seeds, then a
//! pattern search around the best (its untried neighbours, one step along one axis
//! each), round after round while it improves and time remains.

use std::collections::HashSet;
use std::hash::Hash;
use std::time::Instant;

/// The outcome of measuring one candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum Measured {
    /// Median milliseconds.
    Time(f64),
    /// Dropped, and why (failed to compile, to launch, or the output check).
    Dropped(String),
}

/// What a search found.
#[derive(Clone, Debug)]
pub struct Found<C> {
    /// The fastest candidate and its time, if any candidate could be measured.
    pub best: Option<(C, f64)>,
    /// Every candidate measured, in order, with its outcome.
    pub tried: Vec<(C, Measured)>,
    /// Whether the deadline cut the search short.
    pub out_of_time: bool,
}

/// A neighbour must beat the best by this fraction to move the search (timing
/// noise is about 1%).
const MIN_GAIN: f64 = 0.01;

/// Runs the search. `measure` gets batches (so the caller can compile a batch in
/// parallel) and returns one outcome per candidate, in order; it is not called
/// after `deadline`. `rounds` bounds the local search (0: seeds only).
pub fn pattern_search<C: Clone + Eq + Hash>(
    seeds: Vec<C>,
    mut neighbors: impl FnMut(&C) -> Vec<C>,
    mut measure: impl FnMut(&[C]) -> Vec<Measured>,
    rounds: usize,
    deadline: Instant,
) -> Found<C> {
    let mut seen: HashSet<C> = HashSet::new();
    let mut found = Found {
        best: None,
        tried: Vec::new(),
        out_of_time: false,
    };
    let mut batch: Vec<C> = seeds
        .into_iter()
        .filter(|c| seen.insert(c.clone()))
        .collect();
    let mut round = 0;
    loop {
        if batch.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            found.out_of_time = true;
            break;
        }
        let before = found.best.as_ref().map(|b| b.1);
        let outcomes = measure(&batch);
        for (c, m) in batch.iter().zip(outcomes) {
            if let Measured::Time(t) = m {
                if found.best.as_ref().is_none_or(|b| t < b.1) {
                    found.best = Some((c.clone(), t));
                }
            }
            found.tried.push((c.clone(), m));
        }
        let improved = match (before, &found.best) {
            (None, Some(_)) => true,
            (Some(b), Some((_, t))) => *t < b * (1.0 - MIN_GAIN),
            _ => false,
        };
        // The seeds always get one round of neighbours; later rounds only while
        // the last one improved.
        if round >= rounds || (round > 0 && !improved) {
            break;
        }
        round += 1;
        let Some((center, _)) = found.best.clone() else {
            break;
        };
        batch = neighbors(&center)
            .into_iter()
            .filter(|c| seen.insert(c.clone()))
            .collect();
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A bowl with its minimum at (5, 3) on a 0..10 grid.
    fn cost(c: &(i32, i32)) -> f64 {
        1.0 + ((c.0 - 5).pow(2) + (c.1 - 3).pow(2)) as f64
    }

    fn steps(c: &(i32, i32)) -> Vec<(i32, i32)> {
        [(1, 0), (-1, 0), (0, 1), (0, -1)]
            .iter()
            .map(|d| (c.0 + d.0, c.1 + d.1))
            .filter(|p| (0..10).contains(&p.0) && (0..10).contains(&p.1))
            .collect()
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[test]
    fn walks_downhill_to_the_minimum_without_trying_everything() {
        let mut calls = 0;
        let f = pattern_search(
            vec![(0, 0), (9, 9)],
            steps,
            |b| {
                calls += b.len();
                b.iter().map(|c| Measured::Time(cost(c))).collect()
            },
            20,
            far(),
        );
        assert_eq!(f.best.unwrap().0, (5, 3));
        assert!(calls < 50, "measured {calls} of 100");
        // Nothing measured twice.
        let mut cs: Vec<_> = f.tried.iter().map(|t| t.0).collect();
        cs.sort();
        cs.dedup();
        assert_eq!(cs.len(), f.tried.len());
    }

    #[test]
    fn dropped_candidates_are_kept_with_their_reason_and_never_win() {
        let f = pattern_search(
            vec![(5, 3), (0, 0)],
            |_| vec![],
            |b| {
                b.iter()
                    .map(|c| {
                        if *c == (5, 3) {
                            Measured::Dropped("output differs".into())
                        } else {
                            Measured::Time(cost(c))
                        }
                    })
                    .collect()
            },
            3,
            far(),
        );
        assert_eq!(f.best.unwrap().0, (0, 0));
        assert!(f
            .tried
            .iter()
            .any(|t| t.1 == Measured::Dropped("output differs".into())));
    }

    #[test]
    fn quick_rounds_and_deadline_bound_the_search() {
        let f = pattern_search(
            vec![(0, 0)],
            steps,
            |b| b.iter().map(|c| Measured::Time(cost(c))).collect(),
            1,
            far(),
        );
        // Seeds, then one round of neighbours.
        assert_eq!(f.tried.len(), 1 + 2);
        let f = pattern_search(
            vec![(0, 0)],
            steps,
            |b| b.iter().map(|c| Measured::Time(cost(c))).collect(),
            20,
            Instant::now(),
        );
        assert!(f.out_of_time && f.tried.is_empty() && f.best.is_none());
    }
}
