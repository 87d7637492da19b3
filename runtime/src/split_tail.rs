//! Splitting the last wave of a GEMM along K.
//!
//! A GEMM grid of `T` output tiles on `S` resident program slots (SMs × blocks per
//! SM) runs `ceil(T / S)` waves; when the last wave is partial, most SMs idle
//! through it (4096×6656 in 128×256 tiles: 832 tiles, 6.3 waves of 132, so 10% of
//! the time is lost). Two ways to share that last wave's tiles, both leaving the
//! whole waves untouched (see `tilefuse_codegen::emit::SplitTail`):
//!
//! - [`plan`], the split tail: when the tiles left fill at most half the slots,
//!   each is shared by `ways` programs, each taking a contiguous range of its K
//!   tiles;
//! - [`stream_k_plan`] (Hopper path, `Config::stream_k`): the tiles left share
//!   their K iterations evenly among one wave of programs, program `q` taking
//!   iterations `[q·I/P, (q+1)·I/P)` of all `I`, tile after tile, so a program
//!   may finish one tile and start the next. Every slot gets the same work
//!   however few tiles are left.
//!
//! Either way the last program to finish a tile adds the parts in order and runs
//! the epilogue, so results do not depend on timing.

#![warn(clippy::arithmetic_side_effects)] // extents from user scalars: checked

use crate::device::Device;
use crate::error::{driver, Error, Result};
use cudarc::driver::{CudaSlice, DevicePtr};
use std::sync::atomic::{AtomicU8, Ordering};

/// At most this many programs share a tile: more adds scratch traffic and a
/// longer serial fix-up for little gain.
const MAX_WAYS: u64 = 4;
/// Each stream-K program keeps at least this many K tiles, so the pipeline
/// still fills. (The split tail takes its minimum from the lowering, which
/// knows its pipeline: `SplitTail::min_part_k_tiles`.)
const MIN_K_TILES_PER_PART: u64 = 4;

/// How a launch splits its tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    /// Tiles computed by one program each (the first ones in tile order).
    pub whole: u64,
    /// The most programs that share one split tile (the scratch holds this many
    /// partial tiles per split tile); 1 means nothing is split.
    pub ways: u64,
    /// Tiles after `whole`, split along K.
    pub split: u64,
    /// Programs sharing the split tiles' K iterations, evenly and in order:
    /// `split × ways` for the split tail, one wave for stream-K.
    pub parts: u64,
}

impl SplitPlan {
    /// Nothing split: one program per tile.
    pub fn none(tiles: u64) -> SplitPlan {
        SplitPlan {
            whole: tiles,
            ways: 1,
            split: 0,
            parts: 0,
        }
    }

    /// Programs to launch.
    pub fn programs(&self) -> u64 {
        self.whole.saturating_add(self.parts)
    }

    /// The K tiles of a program's share, as the kernel walks them:
    /// `(tile, k_lo, k_hi, part, parts of the tile)` in order, split tiles
    /// numbered from 0. For tests and tools; the kernel computes the same.
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "in u128, of u64 values: products of two cannot overflow; \
                  `it < end <= iters` bounds the rest, and divisors are checked nonzero"
    )]
    pub fn segments(&self, program: u64, k_tiles: u64) -> Vec<Segment> {
        if program < self.whole {
            return vec![Segment {
                tile: program,
                k: (0, k_tiles),
                part: 0,
                of: 1,
            }];
        }
        let k = u128::from(k_tiles);
        let (q, iters, p) = (
            u128::from(program - self.whole),
            u128::from(self.split) * k,
            u128::from(self.parts),
        );
        if iters == 0 || p == 0 || q >= p {
            return Vec::new();
        }
        // The program holding iteration x: the last q with q·I/P <= x.
        let owner = |x: u128| ((x + 1) * p).div_ceil(iters) - 1;
        let (mut it, end) = (q * iters / p, (q + 1) * iters / p);
        let narrow = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        let mut out = Vec::new();
        while it < end {
            let t = it / k;
            let lo = it - t * k;
            let hi = k.min(lo + end - it);
            let (q0, q1) = (owner(t * k), owner((t + 1) * k - 1));
            out.push(Segment {
                tile: narrow(t),
                k: (narrow(lo), narrow(hi)),
                part: narrow(q - q0),
                of: narrow(q1 - q0 + 1),
            });
            it += hi - lo;
        }
        out
    }
}

/// One program's work on one tile (see [`SplitPlan::segments`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The tile: among the whole ones, or among the split ones.
    pub tile: u64,
    /// Its K tiles `[lo, hi)`.
    pub k: (u64, u64),
    /// This part's rank among the tile's parts, in K order.
    pub part: u64,
    /// How many parts the tile has.
    pub of: u64,
}

/// The split for `tiles` output tiles of `k_tiles` K tiles each on `slots`
/// concurrently resident programs, each part keeping at least `min_part`
/// K tiles.
///
/// ```
/// use tilefuse_runtime::split_tail::plan;
/// // 832 tiles on 132 SMs: 6 whole waves, the 40 left over split 3 ways.
/// let p = plan(832, 256, 132, 4);
/// assert_eq!((p.whole, p.ways, p.split, p.parts), (792, 3, 40, 120));
/// // 16 tiles of 16 K tiles: four parts of 4, or none where parts keep 16.
/// assert_eq!(plan(16, 16, 66, 4).ways, 4);
/// assert_eq!(plan(16, 16, 66, 16).ways, 1);
/// ```
pub fn plan(tiles: u64, k_tiles: u64, slots: u64, min_part: u64) -> SplitPlan {
    let tail = tiles.checked_rem(slots).unwrap_or(0);
    if tail == 0 || !enabled() {
        return SplitPlan::none(tiles);
    }
    let ways = (slots.checked_div(tail).unwrap_or(0))
        .min(MAX_WAYS)
        .min(k_tiles.checked_div(min_part.max(1)).unwrap_or(0));
    if ways < 2 {
        return SplitPlan::none(tiles);
    }
    SplitPlan {
        // `tail < slots` and `ways <= MAX_WAYS`: neither saturates.
        whole: tiles.saturating_sub(tail),
        ways,
        split: tail,
        parts: tail.saturating_mul(ways),
    }
}

/// Stream-K for the tiles of the last, partial wave: one wave of `slots`
/// programs (fewer where a program would get under `MIN_K_TILES_PER_PART` K
/// tiles) shares their K iterations evenly.
///
/// ```
/// use tilefuse_runtime::split_tail::stream_k_plan;
/// // 4096³ in 128×256 tiles: 512 tiles on 132 SMs, 3 waves and 116 tiles of 64
/// // K tiles left: 132 programs of 56 or 57 K tiles, at most 3 on one tile.
/// let p = stream_k_plan(512, 64, 132);
/// assert_eq!((p.whole, p.split, p.parts, p.ways), (396, 116, 132, 3));
/// ```
pub fn stream_k_plan(tiles: u64, k_tiles: u64, slots: u64) -> SplitPlan {
    let tail = tiles.checked_rem(slots).unwrap_or(0);
    // A K extent no tensor has (a scalar argument) could overflow the count of
    // iterations: nothing is split then.
    let iters = tail.checked_mul(k_tiles).unwrap_or(0);
    if tail == 0 || iters == 0 || !enabled() {
        return SplitPlan::none(tiles);
    }
    let parts = slots.min(iters / MIN_K_TILES_PER_PART);
    if parts <= tail {
        // No program would get less than a tile: nothing gained over whole tiles.
        return SplitPlan::none(tiles);
    }
    SplitPlan {
        whole: tiles.saturating_sub(tail),
        ways: most_parts_on_a_tile(tail, k_tiles, parts),
        split: tail,
        parts,
    }
}

/// The most of `parts` programs, sharing the `tail · k_tiles` iterations
/// evenly and in order, that hold iterations of one tile: those holding its
/// first and last iterations and every one between.
#[allow(
    clippy::arithmetic_side_effects,
    reason = "in u128, of u64 values: products of two cannot overflow; \
              `x < iters` and `iters = tail · k_tiles > 0` bound the rest"
)]
fn most_parts_on_a_tile(tail: u64, k_tiles: u64, parts: u64) -> u64 {
    let (k, p) = (u128::from(k_tiles), u128::from(parts));
    let iters = u128::from(tail) * k;
    let owner = |x: u128| ((x + 1) * p).div_ceil(iters) - 1;
    let most = (0..u128::from(tail))
        .map(|t| owner((t + 1) * k - 1) - owner(t * k) + 1)
        .max()
        .unwrap_or(1);
    u64::try_from(most).unwrap_or(u64::MAX)
}

// 0: not read yet, 1: off, 2: on.
static ENABLED: AtomicU8 = AtomicU8::new(0);

/// Whether launches split their last wave: on, unless `TILEFUSE_SPLIT_TAIL=0` or
/// [`set_enabled`]`(false)`.
pub fn enabled() -> bool {
    match ENABLED.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var("TILEFUSE_SPLIT_TAIL").map_or(true, |v| v != "0");
            ENABLED.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
        v => v == 2,
    }
}

/// Turns the split of the last wave on or off for this process (benchmarks
/// compare both).
pub fn set_enabled(on: bool) {
    ENABLED.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// A device's scratch for split tiles: partial sums and arrival counters. Grown
/// on demand and reused; launches are ordered on the device's stream, so one
/// scratch serves them all.
#[derive(Default)]
pub(crate) struct Scratch {
    partials: Option<CudaSlice<f32>>,
    counters: Option<CudaSlice<u32>>,
    /// Bumped when either buffer is replaced: a CUDA graph captured before
    /// holds the old addresses (see [`crate::graph`]).
    generation: u64,
}

impl Device {
    /// How many times the split-K scratch was reallocated.
    pub(crate) fn split_scratch_generation(&self) -> u64 {
        self.split
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .generation
    }

    /// Device addresses of scratch for `floats` partial sums and `counters`
    /// counters. The counters are zero between launches: allocated zeroed, and
    /// the last program to arrive at one wraps it back to 0 (`tf_arrive_last`),
    /// so no memset precedes each launch. A program that gave up on a `wait`
    /// leaves its count behind; [`Device::zero_split_counters`] clears them when
    /// the status block reports that.
    pub(crate) fn split_scratch(&self, floats: usize, counters: usize) -> Result<(u64, u64)> {
        let mut s = self.split.lock().unwrap_or_else(|p| p.into_inner());
        let grows = s.partials.as_ref().is_none_or(|p| p.len() < floats)
            || s.counters.as_ref().is_none_or(|c| c.len() < counters);
        // Inside a graph capture an allocation on the stream would belong to
        // the graph, and the scratch kept here would be invalid outside it.
        if grows && self.is_capturing()? {
            return Err(Error::Driver {
                context: "growing the split-K scratch".into(),
                message: "the launch stream is capturing a CUDA graph; queue the work once outside the capture first, so the scratch has its size before".into(),
            });
        }
        let stream = &self.gpu("split-K scratch")?.stream;
        if s.partials.as_ref().is_none_or(|p| p.len() < floats) {
            // The old buffer is freed in stream order, after the launches using it.
            s.generation = s.generation.wrapping_add(1);
            s.partials = Some(
                stream
                    .alloc_zeros::<f32>(floats.checked_next_power_of_two().unwrap_or(floats))
                    .map_err(driver("allocating split-K scratch"))?,
            );
        }
        if s.counters.as_ref().is_none_or(|c| c.len() < counters) {
            s.generation = s.generation.wrapping_add(1);
            s.counters = Some(
                stream
                    .alloc_zeros::<u32>(counters.checked_next_power_of_two().unwrap_or(counters))
                    .map_err(driver("allocating split-K counters"))?,
            );
        }
        let Scratch {
            partials: Some(p),
            counters: Some(c),
            ..
        } = &mut *s
        else {
            unreachable!("both buffers were just allocated");
        };
        let (pp, g1) = p.device_ptr(stream);
        let (cp, g2) = c.device_ptr(stream);
        drop((g1, g2));
        Ok((pp, cp))
    }

    /// Zeroes the split counters on the launch stream: after a launch whose
    /// programs may not all have arrived (one gave up on a `wait`), a count
    /// left behind would make the wrong program the last at the next launch.
    pub(crate) fn zero_split_counters(&self) -> Result<()> {
        let mut s = self.split.lock().unwrap_or_else(|p| p.into_inner());
        let Some(c) = s.counters.as_mut() else {
            return Ok(());
        };
        let stream = &self.gpu("split-K counters")?.stream;
        stream
            .memset_zeros(c)
            .map_err(driver("zeroing split-K counters"))
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, reason = "tests: small known values")]
mod tests {
    use super::*;

    #[test]
    fn whole_waves_are_not_split() {
        set_enabled(true);
        assert_eq!(plan(264, 128, 132, 4).ways, 1);
        assert_eq!(plan(0, 128, 132, 4).ways, 1);
    }

    #[test]
    fn a_large_last_wave_is_left_alone() {
        set_enabled(true);
        // 2048 tiles: 15 waves + 68, and 132 / 68 = 1 way.
        let p = plan(2048, 128, 132, 4);
        assert_eq!((p.whole, p.ways, p.split), (2048, 1, 0));
    }

    #[test]
    fn the_last_wave_is_split_within_limits() {
        set_enabled(true);
        let p = plan(832, 256, 132, 4);
        assert_eq!((p.whole, p.ways, p.split, p.programs()), (792, 3, 40, 912));
        // A single small wave: split-K, at most MAX_WAYS ways.
        let p = plan(8, 256, 132, 4);
        assert_eq!((p.whole, p.ways, p.split), (0, 4, 8));
        // Short K keeps `min_part` tiles per part.
        assert_eq!(plan(8, 8, 132, 4).ways, 2);
        assert_eq!(plan(8, 7, 132, 4).ways, 1);
        assert_eq!(plan(8, 32, 132, 16).ways, 2);
        assert_eq!(plan(8, 31, 132, 16).ways, 1);
    }

    /// Every K tile of every split tile is computed by exactly one program, a
    /// tile's parts are numbered 0.. in K order, its programs agree on their
    /// count, and the plan's `ways` bounds it.
    fn assert_covers(p: &SplitPlan, tiles: u64, k_tiles: u64) {
        assert_eq!(p.whole + p.split, tiles);
        let mut seen = vec![Vec::new(); p.split as usize];
        for q in p.whole..p.programs() {
            let segs = p.segments(q, k_tiles);
            assert!(!segs.is_empty(), "program {q} has no work");
            for s in segs {
                assert!(s.k.0 < s.k.1 && s.k.1 <= k_tiles && s.part < s.of && s.of <= p.ways);
                seen[s.tile as usize].push(s);
            }
        }
        for (t, parts) in seen.iter().enumerate() {
            let w = parts[0].of;
            assert_eq!(parts.len() as u64, w, "tile {t}");
            let mut k = 0;
            for (i, s) in parts.iter().enumerate() {
                assert_eq!((s.k.0, s.part, s.of), (k, i as u64, w), "tile {t}");
                k = s.k.1;
            }
            assert_eq!(k, k_tiles, "tile {t}");
        }
    }

    #[test]
    fn the_split_tail_covers_each_k_tile_once() {
        set_enabled(true);
        for (tiles, k_tiles) in [(832, 256), (8, 256), (8, 8), (133, 17), (50, 9)] {
            let p = plan(tiles, k_tiles, 132, 4);
            if p.ways > 1 {
                assert_covers(&p, tiles, k_tiles);
            }
        }
    }

    #[test]
    fn stream_k_shares_the_last_wave_evenly() {
        set_enabled(true);
        for (tiles, k_tiles, slots) in [
            (512, 64, 132),
            (448, 64, 66),
            (256, 172, 132),
            (2048, 128, 132),
            (7, 1000, 132),
            (131, 5, 132),
            (1, 4, 132),
            (100, 3, 7),
        ] {
            let p = stream_k_plan(tiles, k_tiles, slots);
            if p.parts == 0 {
                continue;
            }
            assert!(p.parts <= slots);
            assert_covers(&p, tiles, k_tiles);
            // Even: the programs' shares differ by at most one K tile.
            let shares: Vec<u64> = (p.whole..p.programs())
                .map(|q| p.segments(q, k_tiles).iter().map(|s| s.k.1 - s.k.0).sum())
                .collect();
            let (lo, hi) = (shares.iter().min(), shares.iter().max());
            let (Some(&lo), Some(&hi)) = (lo, hi) else {
                unreachable!("a plan with parts has programs");
            };
            assert!(
                hi - lo <= 1 && lo >= MIN_K_TILES_PER_PART,
                "{tiles} {k_tiles}: {lo}..{hi}"
            );
        }
        // Whole waves, or too little K to share, are left alone.
        assert_eq!(stream_k_plan(264, 64, 132).parts, 0);
        assert_eq!(stream_k_plan(100, 2, 132).parts, 0);
    }
}
