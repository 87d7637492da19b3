//! Splitting the last wave of a GEMM along K.
//!
//! A GEMM grid of `T` output tiles on `S` resident program slots (SMs × blocks per
//! SM) runs `ceil(T / S)` waves; when the last wave is partial, most SMs idle
//! through it (4096×6656 in 128×256 tiles: 832 tiles, 6.3 waves of 132, so 10% of
//! the time is lost). Here the tiles of that last wave are shared by `ways`
//! programs each, each taking a contiguous range of K tiles; the last of them to
//! finish adds the parts in order and runs the epilogue (see
//! `tilefuse_codegen::emit::SplitTail`). The whole waves are untouched.

use crate::device::Device;
use crate::error::{driver, Error, Result};
use cudarc::driver::{CudaSlice, DevicePtr};
use std::sync::atomic::{AtomicU8, Ordering};

/// At most this many programs share a tile: more adds scratch traffic and a
/// longer serial fix-up for little gain.
const MAX_WAYS: u64 = 4;
/// Each part keeps at least this many K tiles, so the pipeline still fills.
const MIN_K_TILES_PER_PART: u64 = 4;

/// How a launch splits its tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    /// Tiles computed by one program each (the first ones in tile order).
    pub whole: u64,
    /// Programs per split tile; 1 means nothing is split.
    pub ways: u64,
    /// Tiles after `whole`, each split `ways` ways.
    pub split: u64,
}

impl SplitPlan {
    /// Programs to launch.
    pub fn programs(&self) -> u64 {
        self.whole + self.split * self.ways
    }
}

/// The split for `tiles` output tiles of `k_tiles` K tiles each on `slots`
/// concurrently resident programs.
///
/// ```
/// use tilefuse_runtime::split_tail::plan;
/// // 832 tiles on 132 SMs: 6 whole waves, the 40 left over split 3 ways.
/// let p = plan(832, 256, 132);
/// assert_eq!((p.whole, p.ways, p.split), (792, 3, 40));
/// ```
pub fn plan(tiles: u64, k_tiles: u64, slots: u64) -> SplitPlan {
    let none = SplitPlan {
        whole: tiles,
        ways: 1,
        split: 0,
    };
    let tail = if slots == 0 { 0 } else { tiles % slots };
    if tail == 0 || !enabled() {
        return none;
    }
    let ways = (slots / tail)
        .min(MAX_WAYS)
        .min(k_tiles / MIN_K_TILES_PER_PART);
    if ways < 2 {
        return none;
    }
    SplitPlan {
        whole: tiles - tail,
        ways,
        split: tail,
    }
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
    /// counters, the counters zeroed on the launch stream (so a program that gave
    /// up on a `wait` cannot leave a count behind for the next launch).
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
        if s.partials.as_ref().is_none_or(|p| p.len() < floats) {
            // The old buffer is freed in stream order, after the launches using it.
            s.generation += 1;
            s.partials = Some(
                self.stream
                    .alloc_zeros::<f32>(floats.next_power_of_two())
                    .map_err(driver("allocating split-K scratch"))?,
            );
        }
        if s.counters.as_ref().is_none_or(|c| c.len() < counters) {
            s.generation += 1;
            s.counters = Some(
                self.stream
                    .alloc_zeros::<u32>(counters.next_power_of_two())
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
        self.stream
            .memset_zeros(c)
            .map_err(driver("zeroing split-K counters"))?;
        let (pp, g1) = p.device_ptr(&self.stream);
        let (cp, g2) = c.device_ptr(&self.stream);
        drop((g1, g2));
        Ok((pp, cp))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_waves_are_not_split() {
        set_enabled(true);
        assert_eq!(plan(264, 128, 132).ways, 1);
        assert_eq!(plan(0, 128, 132).ways, 1);
    }

    #[test]
    fn a_large_last_wave_is_left_alone() {
        set_enabled(true);
        // 2048 tiles: 15 waves + 68, and 132 / 68 = 1 way.
        let p = plan(2048, 128, 132);
        assert_eq!((p.whole, p.ways, p.split), (2048, 1, 0));
    }

    #[test]
    fn the_last_wave_is_split_within_limits() {
        set_enabled(true);
        let p = plan(832, 256, 132);
        assert_eq!((p.whole, p.ways, p.split, p.programs()), (792, 3, 40, 912));
        // A single small wave: split-K, at most MAX_WAYS ways.
        let p = plan(8, 256, 132);
        assert_eq!((p.whole, p.ways, p.split), (0, 4, 8));
        // Short K keeps MIN_K_TILES_PER_PART tiles per part.
        assert_eq!(plan(8, 8, 132).ways, 2);
        assert_eq!(plan(8, 7, 132).ways, 1);
    }
}
