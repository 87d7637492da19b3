//! GPU timing with CUDA events: warm-up, repeats, median; optional L2 flush.

use crate::device::Device;
use crate::error::{driver, Result};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaSlice;

/// Times of one measured region, in milliseconds.
#[derive(Clone, Debug)]
pub struct Timing {
    pub median_ms: f64,
    pub min_ms: f64,
    pub max_ms: f64,
    pub reps: usize,
}

/// Runs `f` `warmup` times, then `reps` times between events on the device's
/// launch stream, flushing L2 before each timed run when `flush_l2` is set (by
/// writing a buffer larger than any L2). Returns the median and spread. On the
/// host of interpret mode, the wall-clock time of each call.
pub fn time_gpu(
    dev: &Device,
    warmup: usize,
    reps: usize,
    flush_l2: bool,
    f: impl FnMut() -> Result<()>,
) -> Result<Timing> {
    Ok(Timing::of(samples(dev, warmup, reps, flush_l2, f)?))
}

impl Timing {
    fn of(mut ms: Vec<f64>) -> Timing {
        ms.sort_by(|a, b| a.total_cmp(b));
        Timing {
            median_ms: ms[ms.len() / 2],
            min_ms: ms[0],
            max_ms: ms[ms.len() - 1],
            reps: ms.len(),
        }
    }
}

/// Milliseconds of each of `reps` timed runs of `f` (at least one).
fn samples(
    dev: &Device,
    warmup: usize,
    reps: usize,
    flush_l2: bool,
    mut f: impl FnMut() -> Result<()>,
) -> Result<Vec<f64>> {
    for _ in 0..warmup {
        f()?;
    }
    dev.synchronize()?;
    if dev.is_host() {
        // Interpret mode: the host's wall clock (work runs as it is called).
        return (0..reps.max(1))
            .map(|_| {
                let t = std::time::Instant::now();
                f().map(|()| t.elapsed().as_secs_f64() * 1e3)
            })
            .collect();
    }
    let stream = dev.stream()?;
    let mut scratch: Option<CudaSlice<u8>> = if flush_l2 {
        Some(
            stream
                .alloc_zeros::<u8>(256 << 20)
                .map_err(driver("allocating the L2 flush buffer"))?,
        )
    } else {
        None
    };
    let ctx = dev.context()?;
    let mut events = Vec::with_capacity(reps);
    for _ in 0..reps.max(1) {
        if let Some(s) = scratch.as_mut() {
            stream.memset_zeros(s).map_err(driver("flushing L2"))?;
        }
        let start = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        let end = ctx
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        start.record(stream).map_err(driver("recording an event"))?;
        f()?;
        end.record(stream).map_err(driver("recording an event"))?;
        events.push((start, end));
    }
    dev.synchronize()?;
    events
        .iter()
        .map(|(s, e)| {
            s.elapsed_ms(e)
                .map(f64::from)
                .map_err(driver("reading an event"))
        })
        .collect()
}

/// The order in which round `round` of an interleaved comparison times its `n`
/// variants: first to last in even rounds, last to first in odd ones. Under
/// load the clocks drift within a round (a variant timed later in a row of
/// sustained runs reads slower, by 5-20% on an H200); reversing every other
/// round gives each variant the same mean position, so a steady drift weighs
/// on all alike. Use an even number of rounds.
///
/// ```
/// use tilefuse_runtime::timing::turn_order;
/// assert_eq!(turn_order(3, 0), [0, 1, 2]);
/// assert_eq!(turn_order(3, 1), [2, 1, 0]);
/// ```
pub fn turn_order(n: usize, round: usize) -> Vec<usize> {
    match round % 2 {
        0 => (0..n).collect(),
        _ => (0..n).rev().collect(),
    }
}

/// The device-to-device copy bandwidth of `dev` in GB/s, counting each byte read
/// and each byte written (a copy of `bytes` moves `2 * bytes`): what a
/// memory-bound kernel that reads its inputs once and writes its outputs once is
/// measured against. Median of 20 copies after 3 warm-ups, L2 flushed before each.
pub fn copy_bandwidth_gbs(dev: &Device, bytes: usize) -> Result<f64> {
    let stream = dev.stream()?;
    let src = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(driver("allocating the copy benchmark's source"))?;
    let mut dst = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(driver("allocating the copy benchmark's destination"))?;
    let t = time_gpu(dev, 3, 20, true, || {
        stream
            .memcpy_dtod(&src, &mut dst)
            .map_err(driver("copying on the device"))
    })?;
    Ok(2.0 * bytes as f64 / t.median_ms / 1e6)
}

/// A timeline of a device's streams: named points, each an event recorded on
/// some stream, read as milliseconds after a base point on the launch stream.
/// For seeing when a producer on a side stream finished each piece of its work
/// next to the kernel that waits for it. Empty in interpret mode (no events).
///
/// ```no_run
/// # fn main() -> tilefuse_runtime::Result<()> {
/// use tilefuse_runtime::{timing::Timeline, Device};
/// let dev = Device::get(0)?;
/// let mut t = Timeline::begin(&dev)?;
/// // ... queue work ...
/// t.mark(dev.stream()?, "done")?;
/// dev.synchronize()?;
/// for (label, ms) in t.read()? {
///     println!("{label}: {ms:.3} ms");
/// }
/// # Ok(()) }
/// ```
pub struct Timeline {
    base: Option<cudarc::driver::CudaEvent>,
    points: Vec<(String, cudarc::driver::CudaEvent)>,
}

impl Timeline {
    /// Starts a timeline at the launch stream's current point.
    pub fn begin(dev: &Device) -> Result<Timeline> {
        if dev.is_host() {
            return Ok(Timeline {
                base: None,
                points: Vec::new(),
            });
        }
        let base = dev
            .context()?
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        base.record(dev.stream()?)
            .map_err(driver("recording an event"))?;
        Ok(Timeline {
            base: Some(base),
            points: Vec::new(),
        })
    }

    /// Records the point where `stream`'s work queued so far ends.
    pub fn mark(
        &mut self,
        stream: &cudarc::driver::CudaStream,
        label: impl Into<String>,
    ) -> Result<()> {
        if self.base.is_none() {
            return Ok(());
        }
        let e = stream
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(driver("creating an event"))?;
        e.record(stream).map_err(driver("recording an event"))?;
        self.points.push((label.into(), e));
        Ok(())
    }

    /// Each point's label and milliseconds after the base, in the order marked
    /// (call after the streams' work is done).
    pub fn read(&self) -> Result<Vec<(String, f64)>> {
        let Some(base) = &self.base else {
            return Ok(Vec::new());
        };
        self.points
            .iter()
            .map(|(l, e)| {
                base.elapsed_ms(e)
                    .map(|ms| (l.clone(), f64::from(ms)))
                    .map_err(driver("reading an event"))
            })
            .collect()
    }
}
