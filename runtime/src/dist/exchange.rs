// Region sizes and offsets come from users: checked where they enter (`new`,
// `data`, the copies), allowed where they index what `new` sized.
#![warn(clippy::arithmetic_side_effects)]
//! Chunked transfers between the ranks of one node, ordered by flags, on a
//! high-priority backend stream: the communication half of the fused GEMM +
//! collective ops.
//!
//! An [`Exchange`] is a symmetric buffer (data regions the caller lays out, then
//! `flag_slots` 32-bit flags, all zeroed) and a backend stream. A call runs
//! from [`Exchange::start`] to [`Exchange::close`]. A flag is set when it holds
//! [`Exchange::SET`] (1); a counter (a flag slot that a GEMM's tiles `signal`
//! as they finish) when it reaches a count. The backend stream follows the
//! launch stream where the caller says ([`Exchange::follow_launch`]: after the
//! GEMM that produced a region), or waits for a counter ([`Exchange::await_count`]).
//! It tells a peer that a region is ready by setting the peer's flag
//! ([`Exchange::notify`]), waits for its own flags ([`Exchange::await_slot`]),
//! moves regions with the copy engine (pulling a peer's, [`Exchange::pull`], or
//! pushing into a peer's, [`Exchange::push`]) and sets its own flags for kernels
//! that `wait` on them ([`Exchange::set_slot`]).
//!
//! [`Exchange::close`] ends the call: the backend follows the launch stream
//! (every kernel that waited is done), zeroes this rank's flags and counters,
//! and passes a barrier across the ranks; then the launch stream waits for the
//! backend. A peer sets this rank's flags for the next call only after that
//! barrier, so the zeroing never loses one. The barrier itself alternates
//! between two sets of slots (the call's parity) and clears the other set
//! before it signals, for the same reason. So every call queues the same
//! operations with the same values: a call can be captured once in a CUDA graph
//! for each parity and replayed ([`Exchange::replayed`]). The rule this needs:
//! every flag a peer sets in a call is waited for in that call.
//!
//! Everything but the copies runs in the stream's front end, and the copies in the
//! copy engine: no SM is needed, so the backend progresses while a GEMM that waits
//! on its flags fills the GPU. Waits on the GPU have no deadline of their own:
//! `ProcessGroup::synchronize` bounds them on the host.
//!
//! In interpret mode the same operations, in the same order, run on a host
//! thread over the ranks' shared memory (`dist/backend.rs`); its waits end
//! after the group's timeout with an error naming the flag.

use super::backend::{Backend, LocalRows, Way};
use super::group::ProcessGroup;
use super::symmetric::SymmetricMemory;
use crate::element::Element;
use crate::error::{argument, Error, Result};
use crate::tensor::Tensor;
use std::sync::Arc;

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
    backend: Backend,
    data_bytes: usize,
    slots: usize,
    /// Calls closed so far (their parity picks the barrier's slots).
    calls: u64,
    /// A call was started and not closed: it failed midway.
    open: bool,
    rank: usize,
    world: usize,
}

impl Exchange {
    /// Allocates `data_bytes` of regions and `flag_slots` flags on every rank of
    /// `pg` (collective: every rank passes the same sizes). One node only.
    pub fn new(pg: &ProcessGroup, data_bytes: usize, flag_slots: usize) -> Result<Exchange> {
        // Flags: the barrier's slots of parity 0 (one per rank), the caller's
        // slots, then the barrier's of parity 1, so that what a call clears
        // (the caller's and one parity's) is contiguous.
        let world = pg.world_size();
        let sizes = data_bytes.checked_next_multiple_of(256).and_then(|d| {
            let flags = flag_slots
                .checked_add(world.checked_mul(2)?)?
                .checked_mul(4)?;
            Some((d, d.checked_add(flags)?))
        });
        let Some((data_bytes, total)) = sizes.filter(|&(_, t)| t <= isize::MAX as usize) else {
            return Err(argument(
                "Exchange::new",
                "data_bytes/flag_slots",
                format!("{data_bytes} bytes and {flag_slots} flags overflow the address space"),
            ));
        };
        let sym = Arc::new(SymmetricMemory::alloc(pg, total)?);
        let backend = Backend::new(&sym, pg.timeout())?;
        Ok(Exchange {
            sym,
            backend,
            data_bytes,
            slots: flag_slots,
            calls: 0,
            open: false,
            rank: pg.rank(),
            world,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The value a set flag holds: what kernels that `wait` on this exchange's
    /// flags wait for.
    pub const SET: u32 = 1;

    /// The calls closed so far (queued, or replayed from a graph).
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// This rank's region at `byte_offset` as a contiguous tensor of `shape`.
    pub fn data<T: Element>(&self, byte_offset: usize, shape: &[usize]) -> Result<Tensor<T>> {
        let need = crate::tensor::checked_bytes::<T>("Exchange::data", "shape", shape)?;
        if byte_offset
            .checked_add(need)
            .is_none_or(|e| e > self.data_bytes)
        {
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

    /// Rank `peer`'s region at `byte_offset`, as mapped here, as a contiguous
    /// tensor of `shape`: kernels read it over NVLink (a one-shot all-reduce
    /// reads every peer's partial where it lives). Read it only between a
    /// flag the peer set in this call and [`Exchange::close`].
    pub fn peer_data<T: Element>(
        &self,
        peer: usize,
        byte_offset: usize,
        shape: &[usize],
    ) -> Result<Tensor<T>> {
        self.check_peer("Exchange::peer_data", peer)?;
        // The same bounds as this rank's region (every rank's has the same size).
        self.data::<T>(byte_offset, shape)?;
        self.sym.peer_tensor_at(peer, byte_offset, shape)
    }

    /// This rank's flags `first .. first + len`, for kernels that `wait` on them.
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "the slots are checked first; their bytes lie inside what `new` sized"
    )]
    pub fn flags(&self, first: usize, len: usize) -> Result<Tensor<u32>> {
        let last = first.saturating_add(len.saturating_sub(1));
        self.check_slot("Exchange::flags", last)?;
        self.sym
            .tensor_at(self.data_bytes + (self.world + first) * 4, &[len])
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

    /// The byte offset of flag word `word` (barrier words included) in every
    /// rank's buffer.
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "words are below 2·world + slots, whose bytes `new` checked"
    )]
    fn word_byte(&self, word: usize) -> usize {
        self.data_bytes + word * 4
    }

    #[allow(
        clippy::arithmetic_side_effects,
        reason = "slots are checked by the callers; see `word_byte`"
    )]
    fn slot_byte(&self, slot: usize) -> usize {
        self.word_byte(self.world + slot)
    }

    /// The barrier word of parity `parity` that rank `from` sets.
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "below 2·world + slots; see `word_byte`"
    )]
    fn barrier_word(&self, parity: usize, from: usize) -> usize {
        match parity {
            0 => from,
            _ => self.world + self.slots + from,
        }
    }

    /// Begins a call: the backend stream after the launch stream's work so far.
    /// Refused after a call that failed midway: its flags are in an unknown
    /// state, on this rank and its peers.
    pub fn start(&mut self) -> Result<()> {
        if self.open {
            return Err(Error::Distributed {
                context: "Exchange::start".into(),
                message: "the previous call on this exchange stopped midway (an error after it started), so its flags are in an unknown state; drop the workspace and build a new one on every rank".into(),
            });
        }
        self.follow_launch()?;
        self.open = true;
        Ok(())
    }

    /// The backend stream's next work waits for the launch stream's work so far.
    pub fn follow_launch(&self) -> Result<()> {
        self.backend.follow_launch(&self.sym)
    }

    /// The launch stream's next work waits for the backend's work so far (e.g.
    /// a kernel that reads what the backend received).
    pub fn launch_follows(&self) -> Result<()> {
        self.backend.launch_follows()
    }

    /// Sets flag `slot` of rank `peer`, after the backend's earlier work (the
    /// driver fences the write behind it). The peer must wait for it in this call.
    pub fn notify(&self, peer: usize, slot: usize) -> Result<()> {
        self.check_peer("Exchange::notify", peer)?;
        self.check_slot("Exchange::notify", slot)?;
        self.backend
            .write_word(&self.sym, peer, self.slot_byte(slot), Self::SET)
    }

    /// [`Exchange::notify`] for each `(rank, slot)` of `flags` (this rank's
    /// own included), in order, as one batch: a step of the backend stream
    /// instead of one per flag.
    pub fn notify_all(&self, flags: &[(usize, usize)]) -> Result<()> {
        let mut words = Vec::with_capacity(flags.len());
        for &(peer, slot) in flags {
            self.check_peer("Exchange::notify_all", peer)?;
            self.check_slot("Exchange::notify_all", slot)?;
            words.push((peer, self.slot_byte(slot)));
        }
        self.backend.write_words(&self.sym, &words, Self::SET)
    }

    /// Sets this rank's flag `slot` (for kernels waiting on it in this call).
    pub fn set_slot(&self, slot: usize) -> Result<()> {
        self.notify(self.rank, slot)
    }

    /// The backend stream waits until this rank's flag `slot` is set.
    pub fn await_slot(&self, slot: usize) -> Result<()> {
        self.check_slot("Exchange::await_slot", slot)?;
        let what = format!("its exchange flag {slot} (set by a peer)");
        self.backend
            .wait_word(&self.sym, self.slot_byte(slot), Self::SET, what)
    }

    /// The backend stream waits until this rank's counter `slot` (a flag slot
    /// kernels `signal`, zero when the call starts) holds at least `count`.
    pub fn await_count(&self, slot: usize, count: u32) -> Result<()> {
        self.check_slot("Exchange::await_count", slot)?;
        let what = format!("its exchange counter {slot} (counted by its kernels)");
        self.backend
            .wait_word(&self.sym, self.slot_byte(slot), count, what)
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
        // Checked: a huge pitch or offset must not wrap into the region.
        let end = rows
            .saturating_sub(1)
            .checked_mul(row_elems)
            .and_then(|x| x.checked_add(cols))
            .and_then(|x| x.checked_mul(elem))
            .and_then(|x| x.checked_add(byte_offset));
        if end.is_none_or(|e| e > self.data_bytes) {
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
        // Bounded by `end` (checked above) and by the local tensor's invariant.
        #[allow(clippy::arithmetic_side_effects, reason = "checked above")]
        let local = LocalRows {
            ptr: local.device_ptr(),
            host: local
                .host_memory()
                .map(|(m, first)| (m.clone(), first * elem)),
            pitch: pitch * elem,
            width: cols * elem,
            rows,
        };
        #[allow(
            clippy::arithmetic_side_effects,
            reason = "inside `end`, checked above"
        )]
        let row_bytes = row_elems * elem;
        self.backend
            .copy_rows(&self.sym, peer, byte_offset, row_bytes, local, way)
    }

    /// Ends the call (see the module docs): the backend follows the launch
    /// stream, zeroes this rank's flags, passes a barrier across the ranks (each
    /// peer is done with this rank's regions and flags), and the launch stream
    /// waits for it, so the next call may overwrite them.
    #[allow(
        clippy::arithmetic_side_effects,
        reason = "word counts below 2·world + slots (see `word_byte`); ranks modulo world ≥ 1"
    )]
    pub fn close(&mut self) -> Result<()> {
        self.follow_launch()?;
        let parity = (self.calls % 2) as usize;
        // The caller's flags and the other parity's barrier words: the peers
        // set those last in the previous call's barrier, which this rank passed.
        let (first, len) = match parity {
            0 => (self.world, self.slots + self.world),
            _ => (0, self.world + self.slots),
        };
        self.backend
            .zero_words(&self.sym, self.word_byte(first), len)?;
        let peers = (1..self.world).map(|d| (self.rank + d) % self.world);
        for p in peers.clone() {
            let at = self.word_byte(self.barrier_word(parity, self.rank));
            self.backend.write_word(&self.sym, p, at, Self::SET)?;
        }
        for p in peers {
            let at = self.word_byte(self.barrier_word(parity, p));
            let what = format!("rank {p} at the exchange's closing barrier");
            self.backend.wait_word(&self.sym, at, Self::SET, what)?;
        }
        self.backend.launch_follows()?;
        self.calls = self.calls.wrapping_add(1);
        self.open = false;
        Ok(())
    }

    /// Counts a call that a CUDA graph captured from this exchange replayed
    /// (see the module docs: replay the capture of the parity of
    /// [`Exchange::calls`]).
    pub fn replayed(&mut self) {
        // Only its parity matters.
        self.calls = self.calls.wrapping_add(1);
    }

    /// Forgets a call that a failed graph capture left open: nothing of it ran,
    /// so the flags are as the last closed call left them.
    pub fn discard_failed_capture(&mut self, calls_before: u64) {
        self.calls = calls_before;
        self.open = false;
    }

    pub fn device(&self) -> &Arc<crate::device::Device> {
        self.sym.device()
    }
}
