//! Chunked transfers between the ranks of one node, ordered by flags, on a
//! high-priority backend stream: the communication half of the fused GEMM +
//! collective ops.
//!
//! An [`Exchange`] is a symmetric buffer (data regions the caller lays out, then
//! `flag_slots` 32-bit flags, all zeroed) and a backend stream. Each call takes a
//! new epoch ([`Exchange::start`]); a flag "is set" once it holds the epoch, so
//! flags are never cleared. The backend stream follows the launch stream where
//! the caller says ([`Exchange::follow_launch`]: after the GEMM that produced a
//! region), or waits for a counter that a GEMM's tiles `signal` as they finish
//! ([`Exchange::await_count`]; such counters are zeroed at the call's start,
//! [`Exchange::reset_on_launch`]). It tells a peer that a region is ready by
//! writing the epoch into the peer's flag ([`Exchange::notify`]), waits for its
//! own flags ([`Exchange::await_slot`]), moves regions with the copy engine
//! (pulling a peer's, [`Exchange::pull`], or pushing into a peer's,
//! [`Exchange::push`]) and sets its own flags for kernels that `wait` on them
//! ([`Exchange::set_slot`]). [`Exchange::close`] ends the call: a barrier on the
//! backend stream (every peer is done with this rank's regions), then the launch
//! stream waits for the backend one, so the next call may overwrite them.
//!
//! Everything but the copies runs in the stream's front end, and the copies in the
//! copy engine: no SM is needed, so the backend progresses while a GEMM that waits
//! on its flags fills the GPU. Waits on the GPU have no deadline of their own:
//! `ProcessGroup::synchronize` bounds them on the host.

use super::group::ProcessGroup;
use super::stream_ops;
use super::symmetric::SymmetricMemory;
use crate::element::Element;
use crate::error::{argument, driver, Error, Result};
use crate::side_stream::SideStream;
use crate::tensor::Tensor;
use std::sync::Arc;

/// Which way [`Exchange::copy_rows`] copies.
#[derive(Clone, Copy)]
enum Way {
    /// From the peer's region into a local view.
    Pull,
    /// From a local view into the peer's region.
    Push,
}

/// Flag-ordered copies between the ranks of one node (see the module docs).
///
/// ```no_run
/// # fn main() -> tilefuse_runtime::Result<()> {
/// use tilefuse_runtime::dist::{Exchange, ProcessGroup};
/// let pg = ProcessGroup::init()?;
/// let (rank, world) = (pg.rank(), pg.world_size());
/// let mut ex = Exchange::new(&pg, 4096 * 4, 1)?;
/// let mine = ex.data::<f32>(0, &[4096])?;      // written on the launch stream
/// let got = tilefuse_runtime::Tensor::<f32>::empty([4096])?;
/// ex.start()?;
/// ex.follow_launch()?;                         // after `mine` is written
/// ex.notify((rank + 1) % world, 0)?;           // "my region is ready"
/// ex.await_slot(0)?;                           // the previous rank's is
/// ex.pull((rank + world - 1) % world, 0, 4096, &got.narrow(0, 0, 4096)?)?;
/// ex.close()?;
/// # Ok(()) }
/// ```
pub struct Exchange {
    sym: Arc<SymmetricMemory>,
    backend: SideStream,
    data_bytes: usize,
    slots: usize,
    epoch: u32,
    rank: usize,
    world: usize,
}

impl Exchange {
    /// Allocates `data_bytes` of regions and `flag_slots` flags on every rank of
    /// `pg` (collective: every rank passes the same sizes). One node only.
    pub fn new(pg: &ProcessGroup, data_bytes: usize, flag_slots: usize) -> Result<Exchange> {
        let data_bytes = data_bytes.div_ceil(256) * 256;
        let sym = Arc::new(SymmetricMemory::alloc(
            pg,
            data_bytes + flag_slots.max(1) * 4,
        )?);
        let backend = SideStream::new(pg.device(), true)?;
        Ok(Exchange {
            sym,
            backend,
            data_bytes,
            slots: flag_slots,
            epoch: 0,
            rank: pg.rank(),
            world: pg.world_size(),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The epoch of the current call (0 before the first [`Exchange::start`]).
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// This rank's region at `byte_offset` as a contiguous tensor of `shape`.
    pub fn data<T: Element>(&self, byte_offset: usize, shape: &[usize]) -> Result<Tensor<T>> {
        let need = shape.iter().product::<usize>() * std::mem::size_of::<T>();
        if byte_offset + need > self.data_bytes {
            return Err(argument(
                "Exchange::data",
                "byte_offset/shape",
                format!(
                    "{shape:?} at byte {byte_offset} runs past the {} data bytes",
                    self.data_bytes
                ),
            ));
        }
        self.sym.tensor_at(byte_offset, shape)
    }

    /// This rank's flags `first .. first + len`, for kernels that `wait` on them.
    pub fn flags(&self, first: usize, len: usize) -> Result<Tensor<u32>> {
        self.check_slot("Exchange::flags", first + len.max(1) - 1)?;
        self.sym.tensor_at(self.data_bytes + first * 4, &[len])
    }

    fn check_slot(&self, ctx: &str, slot: usize) -> Result<()> {
        if slot >= self.slots {
            return Err(argument(
                ctx,
                "slot",
                format!("{slot} is outside the {} flag slots", self.slots),
            ));
        }
        Ok(())
    }

    fn check_peer(&self, ctx: &str, peer: usize) -> Result<()> {
        if peer >= self.world {
            return Err(argument(
                ctx,
                "peer",
                format!("rank {peer} is outside the {} ranks", self.world),
            ));
        }
        Ok(())
    }

    fn raw(&self) -> Result<cudarc::driver::sys::CUstream> {
        self.sym
            .device()
            .context()
            .bind_to_thread()
            .map_err(driver("binding the GPU context"))?;
        Ok(self.backend.stream().cu_stream())
    }

    fn slot_addr(&self, owner: usize, slot: usize) -> u64 {
        self.sym.data_ptr(owner) + (self.data_bytes + slot * 4) as u64
    }

    /// Begins a call: a new epoch, and the backend stream after the launch
    /// stream's work so far. Returns the epoch.
    pub fn start(&mut self) -> Result<u32> {
        self.epoch = self
            .epoch
            .checked_add(1)
            .ok_or_else(|| Error::Distributed {
                context: "Exchange::start".into(),
                message: "the epoch counter wrapped after 4 billion calls; create a new Exchange"
                    .into(),
            })?;
        self.follow_launch()?;
        Ok(self.epoch)
    }

    /// The backend stream's next work waits for the launch stream's work so far.
    pub fn follow_launch(&self) -> Result<()> {
        self.backend
            .stream()
            .join(self.sym.device().stream())
            .map_err(driver(
                "ordering the backend stream after the launch stream",
            ))
    }

    /// Sets flag `slot` of rank `peer` to the epoch, after the backend's earlier
    /// work (the driver fences the write behind it).
    pub fn notify(&self, peer: usize, slot: usize) -> Result<()> {
        self.check_peer("Exchange::notify", peer)?;
        self.check_slot("Exchange::notify", slot)?;
        let raw = self.raw()?;
        // SAFETY: a 4-byte flag inside rank `peer`'s live symmetric allocation,
        // mapped here (or this rank's own), checked in range above.
        unsafe { stream_ops::write_value(raw, self.slot_addr(peer, slot), self.epoch) }
    }

    /// Sets this rank's flag `slot` to the epoch (for kernels waiting on it).
    pub fn set_slot(&self, slot: usize) -> Result<()> {
        self.notify(self.rank, slot)
    }

    /// The backend stream waits until this rank's flag `slot` holds the epoch.
    pub fn await_slot(&self, slot: usize) -> Result<()> {
        self.check_slot("Exchange::await_slot", slot)?;
        let raw = self.raw()?;
        // SAFETY: a 4-byte flag inside this rank's live symmetric allocation.
        unsafe { stream_ops::wait_value_geq(raw, self.slot_addr(self.rank, slot), self.epoch) }
    }

    /// Zeroes this rank's flags `first .. first + len` on the launch stream (the
    /// counters kernels `signal` before a call; queue it before
    /// [`Exchange::start`], so the backend's waits on them come after it).
    pub fn reset_on_launch(&self, first: usize, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.check_slot("Exchange::reset_on_launch", first + len - 1)?;
        self.raw()?;
        let launch = self.sym.device().stream().cu_stream();
        // SAFETY: `len` 4-byte flags inside this rank's live symmetric allocation
        // (checked in range above).
        unsafe { stream_ops::zero_words(launch, self.slot_addr(self.rank, first), len) }
    }

    /// The backend stream waits until this rank's counter `slot` (a flag slot
    /// kernels `signal`, zeroed at the call's start) holds at least `count`.
    pub fn await_count(&self, slot: usize, count: u32) -> Result<()> {
        self.check_slot("Exchange::await_count", slot)?;
        let raw = self.raw()?;
        // SAFETY: a 4-byte flag inside this rank's live symmetric allocation.
        unsafe { stream_ops::wait_value_geq(raw, self.slot_addr(self.rank, slot), count) }
    }

    /// Copies `src` (a 2-D view with unit last stride, or 1-D contiguous, on
    /// this GPU) into rank `peer`'s region at `dst_byte_offset`, whose rows are
    /// `dst_row_elems` elements apart, with the copy engine: NVLink writes, which
    /// run faster than the reads of [`Exchange::pull`] while GEMMs load both
    /// GPUs. Write into a peer's region only once it is done with its last
    /// contents (e.g. after [`Exchange::close`]'s barrier, with the launch stream
    /// followed before it).
    pub fn push<T: Element>(
        &self,
        peer: usize,
        dst_byte_offset: usize,
        dst_row_elems: usize,
        src: &Tensor<T>,
    ) -> Result<()> {
        self.copy_rows(
            "Exchange::push",
            peer,
            dst_byte_offset,
            dst_row_elems,
            src,
            Way::Push,
        )
    }

    /// Copies `dst` (a 2-D view with unit last stride, or 1-D contiguous, on
    /// this GPU) from rank `peer`'s region at `src_byte_offset`, whose rows are
    /// `src_row_elems` elements apart.
    pub fn pull<T: Element>(
        &self,
        peer: usize,
        src_byte_offset: usize,
        src_row_elems: usize,
        dst: &Tensor<T>,
    ) -> Result<()> {
        self.copy_rows(
            "Exchange::pull",
            peer,
            src_byte_offset,
            src_row_elems,
            dst,
            Way::Pull,
        )
    }

    /// Copies the rows of `local` (a view on this GPU) from or to rank `peer`'s
    /// region at `byte_offset`, whose rows are `row_elems` elements apart.
    fn copy_rows<T: Element>(
        &self,
        ctx: &str,
        peer: usize,
        byte_offset: usize,
        row_elems: usize,
        local: &Tensor<T>,
        way: Way,
    ) -> Result<()> {
        self.check_peer(ctx, peer)?;
        let elem = std::mem::size_of::<T>();
        let name = match way {
            Way::Pull => "dst",
            Way::Push => "src",
        };
        let (rows, cols, pitch) = local.row_layout(ctx, name)?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        if row_elems < cols {
            return Err(argument(
                ctx,
                "row_elems",
                format!("{row_elems} is shorter than a row of {cols}"),
            ));
        }
        let end = byte_offset + ((rows - 1) * row_elems + cols) * elem;
        if end > self.data_bytes {
            return Err(argument(
                ctx,
                "byte_offset",
                format!(
                    "{rows}x{cols} rows from byte {byte_offset} run past the {} data bytes",
                    self.data_bytes
                ),
            ));
        }
        if local.device().ordinal() != self.sym.device().ordinal() {
            return Err(argument(ctx, name, "is not on this rank's GPU"));
        }
        let raw = self.raw()?;
        let region = (
            self.sym.data_ptr(peer) + byte_offset as u64,
            row_elems * elem,
        );
        let view = (local.device_ptr(), pitch * elem);
        let ((dst, dst_pitch), (src, src_pitch)) = match way {
            Way::Pull => (view, region),
            Way::Push => (region, view),
        };
        // SAFETY: the region's rows lie inside rank `peer`'s live symmetric
        // allocation (checked above), mapped here; the local rows are the live
        // view `local` (its shape and strides describe memory its buffer owns).
        unsafe { stream_ops::copy_2d(raw, dst, dst_pitch, src, src_pitch, cols * elem, rows) }
    }

    /// Ends the call: a barrier across the ranks on the backend stream (each peer
    /// is done with this rank's regions; follow the launch stream first when peers
    /// push into regions this rank's kernels read), then the launch stream waits
    /// for the backend stream.
    pub fn close(&self) -> Result<()> {
        let raw = self.raw()?;
        self.sym.device_barrier(raw, 1, self.epoch)?;
        self.backend.join_into_launch_stream()
    }

    pub fn device(&self) -> &Arc<crate::device::Device> {
        self.sym.device()
    }
}
