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
/// writing a buffer larger than any L2). Returns the median and spread.
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
    let stream = dev.stream();
    let mut scratch: Option<CudaSlice<u8>> = if flush_l2 {
        Some(
            stream
                .alloc_zeros::<u8>(256 << 20)
                .map_err(driver("allocating the L2 flush buffer"))?,
        )
    } else {
        None
    };
    let ctx = dev.context();
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
