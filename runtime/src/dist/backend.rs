//! Where an [`super::Exchange`]'s work runs. On a GPU: a high-priority backend
//! stream, whose front end writes and waits on 32-bit flags and whose copy
//! engine moves the data. In interpret mode: a host thread doing the same on the
//! ranks' shared memory, in the same order ([`crate::host_queue`]); kernels run
//! to completion when launched there, so "after the launch stream's work so far"
//! always holds, and "the launch stream waits for the backend" is the caller
//! waiting for the thread.
//!
//! Words are addressed by owner rank and byte offset into that rank's
//! symmetric buffer, so the exchange's layout is written once for both.

use super::stream_ops;
use super::symmetric::{shm_error, HostPad, SymmetricMemory};
use crate::error::{driver, Error, Result};
use crate::host_queue::HostQueue;
use crate::side_stream::SideStream;
use std::sync::Arc;
use std::time::Duration;
use tilefuse_interpret::HostMemory;

/// A strided run of rows on this rank, outside the symmetric buffer's regions:
/// `rows` rows of `width` bytes, `pitch` bytes apart, from device address `ptr`
/// (its host address in interpret mode, where `host` holds its memory and the
/// byte offset of its first row).
pub(super) struct LocalRows {
    pub ptr: u64,
    pub host: Option<(Arc<HostMemory>, usize)>,
    pub pitch: usize,
    pub width: usize,
    pub rows: usize,
}

/// Which way a row copy goes.
#[derive(Clone, Copy)]
pub(super) enum Way {
    /// From the peer's region into local rows.
    Pull,
    /// From local rows into the peer's region.
    Push,
}

pub(super) enum Backend {
    Gpu(SideStream),
    Host {
        queue: HostQueue,
        pad: HostPad,
        timeout: Duration,
    },
}

impl Backend {
    /// The backend for `sym`'s ranks: a stream on its GPU, or a host thread
    /// whose waits give up after `timeout`.
    pub fn new(sym: &SymmetricMemory, timeout: Duration) -> Result<Backend> {
        match sym.host_pad() {
            None => Ok(Backend::Gpu(SideStream::new(sym.device(), true)?)),
            Some(pad) => Ok(Backend::Host {
                queue: HostQueue::new(&format!("tilefuse-exchange-{}", pad.rank))?,
                pad,
                timeout,
            }),
        }
    }

    /// The backend's next work waits for the launch stream's work so far.
    pub fn follow_launch(&self, sym: &SymmetricMemory) -> Result<()> {
        match self {
            Backend::Gpu(s) => s.stream().join(sym.device().stream()?).map_err(driver(
                "ordering the backend stream after the launch stream",
            )),
            // Launches ran to completion when they were made.
            Backend::Host { .. } => Ok(()),
        }
    }

    /// The launch stream's next work waits for the backend's work so far; in
    /// interpret mode the caller waits, and gets the first error of that work.
    pub fn launch_follows(&self) -> Result<()> {
        match self {
            Backend::Gpu(s) => s.join_into_launch_stream(),
            Backend::Host { queue, .. } => queue.drain(),
        }
    }

    /// Sets rank `owner`'s word at `byte` to `value`, after the backend's
    /// earlier work (which it makes visible first).
    pub fn write_word(
        &self,
        sym: &SymmetricMemory,
        owner: usize,
        byte: usize,
        value: u32,
    ) -> Result<()> {
        match self {
            Backend::Gpu(s) => {
                let raw = bind(sym, s)?;
                // SAFETY: a 4-byte word inside rank `owner`'s live symmetric
                // allocation (the caller keeps `byte` in its flag area), mapped here.
                unsafe { stream_ops::write_value(raw, sym.data_ptr(owner) + byte as u64, value) }
            }
            Backend::Host { queue, pad, .. } => {
                let mem = pad.mems[owner].clone();
                queue.push(move || {
                    mem.store_flag(byte / 4, value)
                        .map_err(shm_error("setting a peer's flag"))
                })
            }
        }
    }

    /// [`Backend::write_word`] for each `(owner, byte)` of `words`, in order, as
    /// one batch (a step of the stream's front end, not one per word).
    pub fn write_words(
        &self,
        sym: &SymmetricMemory,
        words: &[(usize, usize)],
        value: u32,
    ) -> Result<()> {
        match self {
            Backend::Gpu(s) => {
                let raw = bind(sym, s)?;
                let addrs: Vec<u64> = words
                    .iter()
                    .map(|&(owner, byte)| sym.data_ptr(owner) + byte as u64)
                    .collect();
                // SAFETY: 4-byte words inside the owners' live symmetric
                // allocations (the caller keeps each byte in its flag area),
                // mapped here.
                unsafe { stream_ops::write_values(raw, &addrs, value) }
            }
            Backend::Host { .. } => words
                .iter()
                .try_for_each(|&(owner, byte)| self.write_word(sym, owner, byte, value)),
        }
    }

    /// The backend waits until this rank's word at `byte` holds at least
    /// `value`; `what` names the word for a timeout (interpret mode: the GPU's
    /// waits are bounded by `ProcessGroup::synchronize` on the host).
    pub fn wait_word(
        &self,
        sym: &SymmetricMemory,
        byte: usize,
        value: u32,
        what: String,
    ) -> Result<()> {
        match self {
            Backend::Gpu(s) => {
                let raw = bind(sym, s)?;
                let at = sym.data_ptr(sym.rank()) + byte as u64;
                // SAFETY: a 4-byte word inside this rank's live symmetric allocation.
                unsafe { stream_ops::wait_value_geq(raw, at, value) }
            }
            Backend::Host {
                queue,
                pad,
                timeout,
            } => {
                let (pad, timeout) = (pad.clone(), *timeout);
                queue.push(move || {
                    pad.wait_word(byte / 4, value, timeout, || {
                        (
                            format!("{what} to reach {value}"),
                            "the rank that sets it probably died, hangs or skipped this call; see its output".into(),
                        )
                    })
                })
            }
        }
    }

    /// Zeroes `len` words of this rank's buffer from `byte`.
    pub fn zero_words(&self, sym: &SymmetricMemory, byte: usize, len: usize) -> Result<()> {
        match self {
            Backend::Gpu(s) => {
                let raw = bind(sym, s)?;
                let at = sym.data_ptr(sym.rank()) + byte as u64;
                // SAFETY: `len` words of this rank's live symmetric allocation (the
                // caller keeps them in its flag area).
                unsafe { stream_ops::zero_words(raw, at, len) }
            }
            Backend::Host { queue, pad, .. } => {
                let mem = pad.mems[pad.rank].clone();
                queue.push(move || {
                    (byte / 4..byte / 4 + len).try_for_each(|w| {
                        mem.store_flag(w, 0)
                            .map_err(shm_error("zeroing this rank's flags"))
                    })
                })
            }
        }
    }

    /// Copies `local`'s rows from or to rank `peer`'s region at `byte`, whose
    /// rows are `pitch` bytes apart. The caller checked both ranges.
    pub fn copy_rows(
        &self,
        sym: &SymmetricMemory,
        peer: usize,
        byte: usize,
        pitch: usize,
        local: LocalRows,
        way: Way,
    ) -> Result<()> {
        let (queue, pad) = match self {
            Backend::Host { queue, pad, .. } => (queue, pad),
            Backend::Gpu(s) => {
                let raw = bind(sym, s)?;
                let region = (sym.data_ptr(peer) + byte as u64, pitch);
                let view = (local.ptr, local.pitch);
                let ((dst, dst_pitch), (src, src_pitch)) = match way {
                    Way::Pull => (view, region),
                    Way::Push => (region, view),
                };
                // SAFETY: the region's rows lie inside rank `peer`'s live symmetric
                // allocation, mapped here; the local rows are a live view on this GPU
                // (both checked by the caller).
                return unsafe {
                    stream_ops::copy_2d(
                        raw,
                        dst,
                        dst_pitch,
                        src,
                        src_pitch,
                        local.width,
                        local.rows,
                    )
                };
            }
        };
        let Some((mem, first)) = local.host else {
            return Err(Error::Distributed {
                context: "Exchange (interpret mode)".into(),
                message: "the local tensor is not in host memory".into(),
            });
        };
        let region = pad.mems[peer].clone();
        queue.push(move || {
            let err = shm_error("an exchange copy (interpret mode)");
            let mut row = vec![0u8; local.width];
            for i in 0..local.rows {
                let (at_region, at_local) = (byte + i * pitch, first + i * local.pitch);
                match way {
                    Way::Pull => {
                        region.read_bytes(at_region, &mut row).map_err(&err)?;
                        mem.write_bytes(at_local, &row).map_err(&err)?;
                    }
                    Way::Push => {
                        mem.read_bytes(at_local, &mut row).map_err(&err)?;
                        region.write_bytes(at_region, &row).map_err(&err)?;
                    }
                }
            }
            Ok(())
        })
    }
}

/// The backend stream, with the GPU's context bound to this thread (the raw
/// stream operations need it).
fn bind(sym: &SymmetricMemory, s: &SideStream) -> Result<cudarc::driver::sys::CUstream> {
    sym.device()
        .context()?
        .bind_to_thread()
        .map_err(driver("binding the GPU context"))?;
    Ok(s.stream().cu_stream())
}
