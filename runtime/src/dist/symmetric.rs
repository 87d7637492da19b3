// The buffer's size comes from users: checked in `alloc`; offsets into it
// are checked where they enter (`tensor_at`) and allowed, with the bound
// that holds, where they index the pad `alloc` sized.
#![warn(clippy::arithmetic_side_effects)]
//! Symmetric memory on one node: the same-sized buffer on every rank, each mapped
//! into every other rank's address space through CUDA IPC, plus a small signal
//! pad per rank for barriers done on the GPU with stream memory operations.
//! In interpret mode the buffers are shared memory between the CPU ranks
//! (`super::shm`), and the barriers run on a host thread.

use super::group::ProcessGroup;
use super::shm;
use super::stream_ops;
use crate::buffer::{Buffer, Memory};
use crate::device::Device;
use crate::element::Element;
use crate::error::{argument, driver, Error, Result};
use crate::tensor::Tensor;
use cudarc::driver::sys;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tilefuse_interpret::HostMemory;

/// Signal slots per rank: `SLOTS_PER_PEER` for each peer.
const SLOTS_PER_PEER: usize = 2;

/// A buffer of the same size on every rank of a one-node group, each rank's
/// mapped into all the others.
pub struct SymmetricMemory {
    dev: Arc<Device>,
    local: Arc<Buffer>,
    /// Bytes of data (the signal pad follows, 256-byte aligned).
    bytes: usize,
    pad_offset: usize,
    /// Each rank's allocation as mapped here (this rank's own is `local`).
    bases: Vec<u64>,
    rank: usize,
    world: usize,
    /// In interpret mode, every rank's buffer as mapped here; empty on GPUs.
    host: Vec<Arc<HostMemory>>,
}

// SAFETY: the raw peer addresses are plain integers; all use goes through the
// device's context, which may be bound on any thread.
unsafe impl Send for SymmetricMemory {}
// SAFETY: as above; nothing here is mutated after construction.
unsafe impl Sync for SymmetricMemory {}

impl SymmetricMemory {
    /// Allocates `bytes` on every rank of `pg` (all must pass the same size) and
    /// maps each rank's buffer into every other. One node only.
    pub fn alloc(pg: &ProcessGroup, bytes: usize) -> Result<SymmetricMemory> {
        let ctx = "SymmetricMemory::alloc";
        if !pg.env().single_node() {
            return Err(Error::Distributed {
                context: ctx.into(),
                message: format!(
                    "symmetric memory spans one node, and these {} ranks run on {} nodes; use NCCL across nodes",
                    pg.world_size(),
                    pg.world_size().div_ceil(pg.env().local_world_size.max(1))
                ),
            });
        }
        let sizes = pg.all_gather_bytes("symm-size", &(bytes as u64).to_le_bytes())?;
        for (r, s) in sizes.iter().enumerate() {
            let theirs =
                u64::from_le_bytes(s.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
            if theirs != bytes as u64 {
                return Err(argument(
                    ctx,
                    "bytes",
                    format!(
                        "rank {} asks for {bytes} bytes but rank {r} for {theirs}: every rank must allocate the same size",
                        pg.rank()
                    ),
                ));
            }
        }
        let (rank, world) = (pg.rank(), pg.world_size());
        let dev = pg.device().clone();
        let (pad_offset, total) = pad_layout(ctx, bytes, world)?;
        if dev.is_host() {
            return SymmetricMemory::alloc_host(pg, bytes, total, pad_offset);
        }
        let local = Arc::new(Buffer::alloc(&dev, total, Memory::Plain)?);
        local.fill_bytes(0)?;
        dev.synchronize()?;
        let mut handle = sys::CUipcMemHandle_st { reserved: [0; 64] };
        // SAFETY: `local.ptr` is the base of a live cuMemAlloc allocation of this
        // context (bound by `Buffer::alloc`); `handle` is a valid out-pointer.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, local.ptr) }
            .result()
            .map_err(driver("cuIpcGetMemHandle"))?;
        let mine: Vec<u8> = handle.reserved.iter().map(|&c| c as u8).collect();
        let handles = pg.all_gather_bytes("symm-handle", &mine)?;
        let mut bases = vec![0u64; world];
        bases[rank] = local.ptr;
        let mut opened = Vec::new();
        for (r, h) in handles.iter().enumerate() {
            if r == rank {
                continue;
            }
            let mut theirs = sys::CUipcMemHandle_st { reserved: [0; 64] };
            for (d, s) in theirs.reserved.iter_mut().zip(h) {
                *d = *s as std::ffi::c_char;
            }
            let mut ptr = 0u64;
            // SAFETY: the handle was exported by rank `r`'s cuIpcGetMemHandle on a
            // live allocation (it stays alive until after the barrier below, and
            // then for as long as every rank holds its SymmetricMemory).
            let r_open = unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut ptr,
                    theirs,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            }
            .result();
            if let Err(e) = r_open {
                for p in opened {
                    // SAFETY: closes mappings opened above, once.
                    let _ = unsafe { sys::cuIpcCloseMemHandle(p) };
                }
                return Err(driver(format!(
                    "mapping rank {r}'s buffer (cuIpcOpenMemHandle)"
                ))(e));
            }
            bases[r] = ptr;
            opened.push(ptr);
        }
        pg.barrier("symm-mapped")?;
        Ok(SymmetricMemory {
            dev,
            local,
            bytes,
            pad_offset,
            bases,
            rank,
            world,
            host: Vec::new(),
        })
    }

    /// Interpret mode: this rank's buffer is a shared-memory file, which every
    /// other rank maps; the file is removed once all have.
    fn alloc_host(
        pg: &ProcessGroup,
        bytes: usize,
        total: usize,
        pad_offset: usize,
    ) -> Result<SymmetricMemory> {
        let (rank, world) = (pg.rank(), pg.world_size());
        let path = shm::new_path(rank);
        let mine = shm::map(&path, total, true)?;
        let paths = pg.all_gather_bytes("symm-shm", path.as_os_str().as_encoded_bytes());
        let mapped = paths.and_then(|paths| {
            paths
                .iter()
                .enumerate()
                .map(|(r, p)| match r == rank {
                    true => Ok(mine.clone()),
                    false => shm::map(Path::new(&*String::from_utf8_lossy(p)), total, false),
                })
                .collect::<Result<Vec<_>>>()
        });
        // Mapped everywhere (or failed): the name is no longer needed.
        let host = mapped.and_then(|h| pg.barrier("symm-mapped").map(|()| h));
        let _ = std::fs::remove_file(&path);
        let host = host?;
        let dev = pg.device().clone();
        let local = Arc::new(Buffer {
            ptr: mine.addr() as u64,
            bytes: total,
            memory: Memory::Host,
            dev: dev.clone(),
            _keep_alive: None,
            host: Some(mine),
        });
        Ok(SymmetricMemory {
            dev,
            local,
            bytes,
            pad_offset,
            bases: host.iter().map(|m| m.addr() as u64).collect(),
            rank,
            world,
            host,
        })
    }

    /// In interpret mode, every rank's buffer and the barrier over them, for a
    /// host thread; `None` on GPUs.
    pub(crate) fn host_pad(&self) -> Option<HostPad> {
        (!self.host.is_empty()).then(|| HostPad {
            mems: self.host.clone(),
            rank: self.rank,
            pad_offset: self.pad_offset,
        })
    }

    pub fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// This rank's data as a contiguous tensor of `shape` (it must fit).
    pub fn tensor<T: Element>(&self, shape: &[usize]) -> Result<Tensor<T>> {
        self.tensor_at(0, shape)
    }

    /// This rank's data from `byte_offset` on as a contiguous tensor of `shape`
    /// (it must fit, at an offset aligned to the element size).
    pub fn tensor_at<T: Element>(&self, byte_offset: usize, shape: &[usize]) -> Result<Tensor<T>> {
        let elem = std::mem::size_of::<T>();
        let need = crate::tensor::checked_bytes::<T>("SymmetricMemory::tensor_at", "shape", shape)?;
        if byte_offset.checked_rem(elem) != Some(0)
            || byte_offset.checked_add(need).is_none_or(|e| e > self.bytes)
        {
            return Err(argument(
                "SymmetricMemory::tensor_at",
                "byte_offset/shape",
                format!(
                    "{shape:?} at byte {byte_offset} does not fit the {}-byte buffer at {elem}-byte alignment",
                    self.bytes
                ),
            ));
        }
        Ok(Tensor::from_buffer_at(
            self.local.clone(),
            byte_offset,
            shape,
        ))
    }

    /// Rank `r`'s data, as mapped here, from `byte_offset` on as a contiguous
    /// tensor of `shape`: writes go over NVLink into rank `r`'s memory. The
    /// tensor keeps the mapping open.
    pub fn peer_tensor_at<T: Element>(
        self: &Arc<Self>,
        r: usize,
        byte_offset: usize,
        shape: &[usize],
    ) -> Result<Tensor<T>> {
        // Same checks as for this rank's own part (every rank's has the same size).
        self.tensor_at::<T>(byte_offset, shape)?;
        if r >= self.world {
            return Err(argument(
                "SymmetricMemory::peer_tensor_at",
                "r",
                format!("rank {r} is outside the {} ranks", self.world),
            ));
        }
        if r == self.rank {
            return self.tensor_at(byte_offset, shape);
        }
        let keep: Arc<dyn Send + Sync> = self.clone();
        let buf = Buffer {
            ptr: self.bases[r],
            bytes: self.bytes,
            memory: if self.host.is_empty() {
                Memory::Peer
            } else {
                Memory::Host
            },
            dev: self.dev.clone(),
            _keep_alive: Some(keep),
            host: self.host.get(r).cloned(),
        };
        Ok(Tensor::from_buffer_at(Arc::new(buf), byte_offset, shape))
    }

    /// This rank, in the group the buffer was allocated over.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Whether `t` lives in this buffer (this rank's part).
    pub fn holds<T: Element>(&self, t: &Tensor<T>) -> bool {
        t.is_in(&self.local)
    }

    /// The address of rank `r`'s data as mapped on this rank.
    pub fn data_ptr(&self, r: usize) -> u64 {
        self.bases[r]
    }

    /// Rank `owner`'s signal slot `slot` for messages from rank `from`, as mapped here.
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "inside the pad `alloc` sized: from < world, slot < SLOTS_PER_PEER"
    )]
    fn slot(&self, owner: usize, from: usize, slot: usize) -> u64 {
        self.bases[owner] + (self.pad_offset + (from * SLOTS_PER_PEER + slot) * 4) as u64
    }

    /// Queues on `stream` a barrier across all ranks, done by the stream's front
    /// end: write `epoch` into every peer's slot for this rank, then wait for every
    /// peer's write into this rank's pad. `slot` (0 or 1) keeps two barriers of one
    /// epoch apart. Epochs must grow from call to call.
    pub(crate) fn device_barrier(
        &self,
        stream: sys::CUstream,
        slot: usize,
        epoch: u32,
    ) -> Result<()> {
        debug_assert!(slot < SLOTS_PER_PEER);
        self.dev
            .context()?
            .bind_to_thread()
            .map_err(driver("binding the GPU context"))?;
        let peers: Vec<u64> = (0..self.world)
            .filter(|&p| p != self.rank)
            .map(|p| self.slot(p, self.rank, slot))
            .collect();
        // SAFETY: 4-byte slots inside the peers' live cuMemAlloc buffers, mapped here.
        unsafe { stream_ops::write_values(stream, &peers, epoch)? };
        for p in (0..self.world).filter(|&p| p != self.rank) {
            // SAFETY: a 4-byte slot inside this rank's own live buffer.
            unsafe { stream_ops::wait_value_geq(stream, self.slot(self.rank, p, slot), epoch)? };
        }
        Ok(())
    }
}

/// Interpret mode's view of a symmetric buffer from a host thread: every rank's
/// mapping, and barriers through their signal pads.
#[derive(Clone)]
pub(crate) struct HostPad {
    pub mems: Vec<Arc<HostMemory>>,
    pub rank: usize,
    pad_offset: usize,
}

impl HostPad {
    /// [`SymmetricMemory::device_barrier`] on the host: writes `epoch` into every
    /// peer's slot for this rank, then waits (at most `timeout`) until every peer
    /// wrote it into this rank's pad.
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "words inside the pad `alloc` sized: from < world, slot < SLOTS_PER_PEER"
    )]
    pub fn barrier(&self, slot: usize, epoch: u32, timeout: Duration) -> Result<()> {
        let word = |from: usize| (self.pad_offset / 4) + from * SLOTS_PER_PEER + slot;
        let peers = (0..self.mems.len()).filter(|&p| p != self.rank);
        for p in peers.clone() {
            self.mems[p]
                .store_flag(word(self.rank), epoch)
                .map_err(shm_error("the shared-memory barrier"))?;
        }
        let start = Instant::now();
        for p in peers {
            let left = timeout.saturating_sub(start.elapsed());
            self.wait_word(word(p), epoch, left, || {
                (
                    format!("rank {p} at a shared-memory barrier (epoch {epoch})"),
                    format!("rank {p} probably died or hangs; see its output"),
                )
            })?;
        }
        Ok(())
    }

    /// Waits (at most `timeout`) until this rank's 32-bit word `word` (counted
    /// from the start of its buffer) holds at least `value`, as a stream's
    /// `cuStreamWaitValue32` would; `what` names what was waited for and what
    /// to do, for the timeout error.
    pub fn wait_word(
        &self,
        word: usize,
        value: u32,
        timeout: Duration,
        what: impl Fn() -> (String, String),
    ) -> Result<()> {
        let start = Instant::now();
        let mut polls = 0u32;
        while self.mems[self.rank]
            .load_flag(word)
            .map_err(shm_error("waiting on a shared-memory flag"))?
            < value
        {
            if start.elapsed() >= timeout {
                let (what, hint) = what();
                return Err(Error::Timeout {
                    rank: self.rank,
                    what,
                    waited_ms: start.elapsed().as_millis() as u64,
                    hint,
                });
            }
            polls = polls.saturating_add(1);
            if polls > 1000 {
                std::thread::sleep(Duration::from_micros(100));
            } else {
                std::thread::yield_now();
            }
        }
        Ok(())
    }
}

/// Maps the interpreter's memory errors (an access outside a mapping) into
/// this crate's, with `context`.
pub(crate) fn shm_error(
    context: &str,
) -> impl Fn(tilefuse_interpret::InterpretError) -> Error + '_ {
    move |e| Error::Distributed {
        context: context.into(),
        message: e.to_string(),
    }
}

impl Drop for SymmetricMemory {
    fn drop(&mut self) {
        if self.dev.is_wedged() || !self.host.is_empty() {
            return; // See `Device::mark_wedged`: closing could wait forever.
        }
        if let Ok(ctx) = self.dev.context() {
            let _ = ctx.bind_to_thread();
        }
        for (r, &p) in self.bases.iter().enumerate() {
            if r != self.rank {
                // SAFETY: closes the mapping opened in `alloc`, once.
                let _ = unsafe { sys::cuIpcCloseMemHandle(p) };
            }
        }
    }
}

/// Where a symmetric buffer of `bytes` for `world` ranks puts its signal pad
/// (the data rounded up to 256 bytes), and its total size; an error naming
/// `bytes` where they overflow.
fn pad_layout(ctx: &str, bytes: usize, world: usize) -> Result<(usize, usize)> {
    let sizes = bytes.checked_next_multiple_of(256).and_then(|pad_offset| {
        let pad_bytes = world.checked_mul(SLOTS_PER_PEER * 4)?;
        Some((pad_offset, pad_offset.checked_add(pad_bytes)?))
    });
    sizes
        .filter(|&(_, t)| t <= isize::MAX as usize)
        .ok_or_else(|| {
            argument(
                ctx,
                "bytes",
                format!(
                    "{bytes} bytes and the signal pad of {world} ranks overflow the address space"
                ),
            )
        })
}

#[cfg(test)]
mod pad_tests {
    use super::*;

    #[test]
    fn sizes_that_overflow_are_refused_by_name() {
        assert_eq!(
            pad_layout("t", 1000, 2).ok(),
            Some((1024, 1024 + 2 * SLOTS_PER_PEER * 4))
        );
        for (bytes, world) in [
            (usize::MAX, 2),
            (usize::MAX - 100, 1),
            (isize::MAX as usize, 8),
            (0, usize::MAX),
        ] {
            let e = pad_layout("SymmetricMemory::alloc", bytes, world)
                .err()
                .map(|e| e.to_string());
            assert!(
                e.as_deref()
                    .is_some_and(|m| m.contains("bytes") && m.contains("overflow")),
                "{e:?}"
            );
        }
    }
}
