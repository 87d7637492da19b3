//! A second stream on a device, for producers that signal kernels through flags:
//! it can delay, write a flag with `cuStreamWriteValue32`, and be joined back into
//! the launch stream with an event.

use crate::device::Device;
use crate::error::{argument, driver, Error, Result};
use crate::jit;
use crate::tensor::Tensor;
use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// A stream beside the device's launch stream.
pub struct SideStream {
    dev: Arc<Device>,
    stream: Arc<CudaStream>,
}

const SLEEP_SRC: &str = r#"
extern "C" __global__ void tf_sleep(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("nanosleep.u32 1000;");
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
"#;

fn sleep_kernel(dev: &Device) -> Result<CudaFunction> {
    static CACHE: OnceLock<Mutex<HashMap<usize, CudaFunction>>> = OnceLock::new();
    let mut map = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(f) = map.get(&dev.ordinal()) {
        return Ok(f.clone());
    }
    let cubin = jit::compile_cubin("tf_sleep", SLEEP_SRC, &dev.arch())?;
    let module = dev
        .context()
        .load_module(Ptx::from_binary(cubin.image))
        .map_err(driver("loading the sleep kernel"))?;
    let f = module
        .load_function("tf_sleep")
        .map_err(driver("loading the sleep kernel"))?;
    map.insert(dev.ordinal(), f.clone());
    Ok(f)
}

impl SideStream {
    /// A new stream on `dev`; `high_priority` puts it ahead of the launch stream's
    /// work when both have blocks waiting to run.
    pub fn new(dev: &Arc<Device>, high_priority: bool) -> Result<SideStream> {
        let ctx = dev.context();
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

    /// Queues a kernel that idles for `d` (one block, one thread).
    pub fn sleep(&self, d: Duration) -> Result<()> {
        let f = sleep_kernel(&self.dev)?;
        let mut ns: u64 = d.as_nanos().min(u128::from(u64::MAX)) as u64;
        let mut params = [&mut ns as *mut u64 as *mut c_void];
        self.dev
            .context()
            .bind_to_thread()
            .map_err(driver("binding the GPU context"))?;
        // SAFETY: `tf_sleep` takes one `unsigned long long`, which `params` points to.
        unsafe {
            cudarc::driver::result::launch_kernel(
                f.cu_function(),
                (1, 1, 1),
                (1, 1, 1),
                0,
                self.stream.cu_stream(),
                &mut params,
            )
        }
        .map_err(driver("launching the sleep kernel"))
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
        if flags.device().ordinal() != self.dev.ordinal() {
            return Err(argument(
                "SideStream::write_flag",
                "flags",
                "is on another GPU",
            ));
        }
        let addr = flags.device_ptr() + (index as isize * flags.strides()[0] * 4) as u64;
        self.dev
            .context()
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
            .stream()
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
