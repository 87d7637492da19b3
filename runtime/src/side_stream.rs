//! A second stream on a device, for producers that signal kernels through flags:
//! it writes flags with `cuStreamWriteValue32` (no SM needed, so it progresses even
//! while a kernel that waits on it fills the GPU) and joins back into the launch
//! stream with an event.

use crate::device::Device;
use crate::error::{argument, driver, Error, Result};
use crate::tensor::Tensor;
use cudarc::driver::sys;
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// A stream beside the device's launch stream.
pub struct SideStream {
    dev: Arc<Device>,
    stream: Arc<CudaStream>,
}

impl SideStream {
    /// A new stream on `dev`; `high_priority` puts it ahead of the launch stream's
    /// work when both have blocks waiting to run.
    pub fn new(dev: &Arc<Device>, high_priority: bool) -> Result<SideStream> {
        let ctx = dev.context()?;
        let stream = if high_priority {
            let (_, greatest) = cudarc::driver::result::stream::get_priority_range()
                .map_err(driver("reading stream priorities"))?;
            ctx.new_stream_with_priority(greatest)
        } else {
            ctx.new_stream()
        }
        .map_err(driver("creating a side stream"))?;
        Ok(SideStream {
            dev: dev.clone(),
            stream,
        })
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Queues `flags[index] = value` (a 32-bit stream memory write, ordered after the
    /// stream's earlier work, with the driver's memory barrier before it).
    pub fn write_flag(&self, flags: &Tensor<u32>, index: usize, value: u32) -> Result<()> {
        if flags.rank() != 1 || index >= flags.size(0) {
            return Err(argument(
                "SideStream::write_flag",
                "index",
                format!(
                    "{index} is outside the 1-D flag tensor of shape {:?}",
                    flags.dims()
                ),
            ));
        }
        if flags.memory() == crate::Memory::Pooled {
            // Measured on H200 / driver 580: the driver answers CUDA_ERROR_INVALID_VALUE.
            return Err(argument(
                "SideStream::write_flag",
                "flags",
                "is in the stream-ordered pool, which stream memory operations reject; allocate flags with Tensor::flags",
            ));
        }
        if flags.device().ordinal() != self.dev.ordinal() {
            return Err(argument(
                "SideStream::write_flag",
                "flags",
                "is on another GPU",
            ));
        }
        let addr = flags.device_ptr() + (index as isize * flags.strides()[0] * 4) as u64;
        self.dev
            .context()?
            .bind_to_thread()
            .map_err(driver("binding the GPU context"))?;
        // SAFETY: `addr` is a 4-byte aligned element of a live u32 tensor on this device.
        unsafe {
            sys::cuStreamWriteValue32_v2(
                self.stream.cu_stream(),
                addr,
                value,
                sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
            )
        }
        .result()
        .map_err(driver("cuStreamWriteValue32"))
    }

    /// Makes the device's launch stream wait for everything queued here so far.
    pub fn join_into_launch_stream(&self) -> Result<()> {
        self.dev
            .stream()?
            .join(&self.stream)
            .map_err(driver("joining a side stream"))
    }

    /// Waits for this stream's work on the host.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|e| Error::Driver {
            context: "synchronizing a side stream".into(),
            message: e.to_string(),
        })
    }
}
