//! Work queued on a device's launch stream, captured once as a CUDA graph and
//! replayed: a plan issues its kernels, stream memory operations and copies
//! for the host cost of one graph launch.
//!
//! Capture records what the closure queues on the launch stream, and on every
//! stream that joins it through an event (a backend stream that follows the
//! launch stream and is joined back before the end); nothing runs until
//! [`Replay::launch`]. The graph keeps the addresses, sizes and kernel
//! arguments of the capture, so the caller recaptures when they change: new
//! operands, or a device scratch buffer that was reallocated since
//! ([`Replay::is_stale`]). Run the work once outside a capture first, so that
//! compiling, tuning and allocating happen there rather than inside it.

use crate::device::Device;
use crate::error::{driver, Error, Result};
use cudarc::driver::sys;
use cudarc::driver::CudaGraph;
use std::sync::Arc;

/// A captured, instantiated graph of a device's launch-stream work.
pub struct Replay {
    graph: CudaGraph,
    dev: Arc<Device>,
    scratch_generation: u64,
}

// SAFETY: CUDA graph objects are not internally synchronized: calls on one must
// not run concurrently from several threads. A `Replay` moved to another thread
// is used from that thread alone; it is not `Sync`, so no two threads can launch
// it at once. Its other fields (an `Arc<Device>`, the stream inside the graph)
// are `Send` already.
unsafe impl Send for Replay {}

impl std::fmt::Debug for Replay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replay")
            .field("device", &self.dev.ordinal())
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Whether the launch stream is capturing a graph now.
    pub(crate) fn is_capturing(&self) -> Result<bool> {
        let status = self
            .stream()?
            .capture_status()
            .map_err(driver("asking whether the launch stream is capturing"))?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
}

impl Replay {
    /// Captures what `work` queues on `dev`'s launch stream (and the streams
    /// that join it). The capture is relaxed: `work` may call APIs that are not
    /// stream operations (they run now, once). If `work` fails, the capture is
    /// ended and discarded, and its error returned.
    pub fn capture(dev: &Arc<Device>, work: impl FnOnce() -> Result<()>) -> Result<Replay> {
        let stream = dev.stream()?;
        let scratch_generation = dev.scratch_generation();
        stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
            .map_err(driver("beginning a graph capture on the launch stream"))?;
        let queued = work();
        // Always end the capture, so the stream works again whatever happened.
        let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
        queued?;
        let graph = ended
            .map_err(driver("ending a graph capture on the launch stream"))?
            .ok_or_else(|| Error::Driver {
                context: "ending a graph capture on the launch stream".into(),
                message: "the capture recorded nothing".into(),
            })?;
        // Upload now: the first replay then costs what the others do.
        graph
            .upload()
            .map_err(driver("uploading a captured graph"))?;
        Ok(Replay {
            graph,
            dev: dev.clone(),
            scratch_generation,
        })
    }

    /// Queues the captured work on the launch stream.
    pub fn launch(&self) -> Result<()> {
        self.graph
            .launch()
            .map_err(driver("launching a captured graph"))
    }

    /// Whether a buffer the captured kernels use was reallocated since the
    /// capture (the graph would read freed memory): capture again.
    pub fn is_stale(&self) -> bool {
        self.dev.scratch_generation() != self.scratch_generation
    }
}
