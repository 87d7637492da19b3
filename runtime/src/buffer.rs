//! Device memory owned by tilefuse: where it comes from decides what it can be used
//! for, so the choice is explicit.
//!
//! - Pooled (the default): the stream-ordered allocator (`cuMemAllocAsync`), cheap to
//!   allocate and free per call; freed in stream order.
//! - Plain (`cuMemAlloc`): for memory that stream memory operations
//!   (`cuStreamWriteValue32`) or CUDA IPC must accept: flags and symmetric buffers.
//! - Host: in interpret mode, every tensor's memory (the interpreter's
//!   [`HostMemory`]), whatever was asked for.

use crate::device::Device;
use crate::error::{argument, driver, Error, Result};
use cudarc::driver::result as cu;
use std::sync::Arc;
use tilefuse_interpret::HostMemory;

/// Where a buffer's memory comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// The stream-ordered pool of the device's launch stream.
    Pooled,
    /// A plain `cuMemAlloc` allocation.
    Plain,
    /// Another rank's plain allocation, mapped here through CUDA IPC (owned, and
    /// freed, by that rank; the mapping by a `SymmetricMemory`).
    Peer,
    /// Host memory, in interpret mode.
    Host,
}

/// A device allocation, freed on drop; or, on the host device of interpret mode,
/// host memory (`ptr` its address).
pub(crate) struct Buffer {
    pub ptr: u64,
    pub bytes: usize,
    pub memory: Memory,
    pub dev: Arc<Device>,
    /// What keeps a `Peer` mapping open while this buffer lives.
    pub _keep_alive: Option<Arc<dyn Send + Sync>>,
    /// The memory of a host buffer.
    pub host: Option<Arc<HostMemory>>,
}

impl Buffer {
    /// Allocates `bytes` (at least 1) of uninitialized memory on `dev` (on the
    /// host, bytes of 0xFF).
    pub fn alloc(dev: &Arc<Device>, bytes: usize, memory: Memory) -> Result<Buffer> {
        let n = bytes.max(1);
        if dev.is_host() {
            // Uninitialized on a GPU; poisoned here (NaN floats, all-ones integers)
            // so that elements a kernel forgets to write show.
            let mem = HostMemory::zeroed(n);
            mem.fill(0xFF);
            return Ok(Buffer {
                ptr: mem.addr() as u64,
                bytes: n,
                memory: Memory::Host,
                dev: dev.clone(),
                _keep_alive: None,
                host: Some(mem),
            });
        }
        dev.context()?
            .bind_to_thread()
            .map_err(driver("binding the GPU context"))?;
        let ptr = match memory {
            // SAFETY: the context is current and the stream belongs to it.
            Memory::Pooled if dev.context()?.has_async_alloc() => unsafe {
                cu::malloc_async(dev.stream()?.cu_stream(), n)
            },
            // SAFETY: the context is current.
            _ => unsafe { cu::malloc_sync(n) },
        }
        .map_err(driver(format!(
            "allocating {n} bytes on GPU {}",
            dev.ordinal()
        )))?;
        let memory = if memory == Memory::Pooled && !dev.context()?.has_async_alloc() {
            Memory::Plain
        } else {
            memory
        };
        Ok(Buffer {
            ptr,
            bytes: n,
            memory,
            dev: dev.clone(),
            _keep_alive: None,
            host: None,
        })
    }

    /// Queues a fill of `len` bytes from byte `at` with `byte` on the launch
    /// stream (errors if the range leaves the buffer).
    pub fn fill_range(&self, at: usize, len: usize, byte: u8) -> Result<()> {
        if at.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(argument(
                "filling memory",
                "range",
                format!("bytes {at}..{at}+{len} leave the buffer of {}", self.bytes),
            ));
        }
        if let Some(mem) = &self.host {
            return mem
                .write_bytes(at, &vec![byte; len])
                .map_err(|e| Error::Interpret(Box::new(e)));
        }
        // SAFETY: `ptr + at..ptr + at + len` lies in this live allocation (checked above).
        unsafe {
            cu::memset_d8_async(
                self.ptr + at as u64,
                byte,
                len,
                self.dev.stream()?.cu_stream(),
            )
        }
        .map_err(driver("filling device memory"))
    }

    /// Queues a byte fill of the whole buffer on the launch stream.
    pub fn fill_bytes(&self, byte: u8) -> Result<()> {
        if let Some(mem) = &self.host {
            mem.fill(byte);
            return Ok(());
        }
        // SAFETY: `ptr..ptr + bytes` is this live allocation.
        unsafe { cu::memset_d8_async(self.ptr, byte, self.bytes, self.dev.stream()?.cu_stream()) }
            .map_err(driver("filling device memory"))
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if matches!(self.memory, Memory::Peer | Memory::Host) {
            // A peer's memory: the owner frees it, `keep_alive` unmaps it. Host
            // memory: `host` frees it.
        }
        if self.dev.is_wedged() {
            // cuMemFree would wait for work that never ends; the process is on its
            // way out (see `Device::mark_wedged`).
            return;
        }
        let Ok(gpu) = self.dev.gpu("freeing device memory") else {
            return; // host memory is never a `Buffer` with a device pointer to free
        };
        let _ = gpu.ctx.bind_to_thread();
        // SAFETY: `ptr` was allocated by `alloc` and is freed once. A pooled buffer is
        // freed in stream order after the work already queued on the launch stream
        // (the only stream tilefuse queues tensor work on); plain memory is freed by
        // cuMemFree, which waits for the device's work to finish using it.
        let r = unsafe {
            match self.memory {
                Memory::Pooled => cu::free_async(self.ptr, gpu.stream.cu_stream()),
                Memory::Plain => cu::free_sync(self.ptr),
                Memory::Peer | Memory::Host => Ok(()), // returned above: never freed here
            }
        };
        if let Err(e) = r {
            crate::log::warn(format_args!(
                "freeing {} bytes on GPU {}: {e}",
                self.bytes,
                self.dev.ordinal()
            ));
        }
    }
}
