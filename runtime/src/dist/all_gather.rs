//! The copy-engine all-gather with progress flags, the producer half of a fused
//! all-gather matmul.
//!
//! The gathered tensor itself is the symmetric buffer: each rank writes its shard
//! into its own rows of it, so the local shard needs no copy (a same-GPU copy may
//! run as a kernel, and a kernel on the backend stream would starve behind a GEMM
//! whose programs fill every SM waiting for it: seen on 2×H200). On a
//! high-priority backend stream: the flags of this rank's own chunks first (one
//! batch of stream writes, before the barrier, so the consumer's tiles of them
//! need not wait for the slowest rank); then, after a GPU-side barrier (every
//! rank's shard is written), each peer's shard in rotation (rank + 1, rank + 2,
//! …), pulled by the copy engine in `splits_per_rank` chunks; after each chunk,
//! `cuStreamWriteValue32` sets its progress flag to this call's epoch. A consumer
//! kernel launched meanwhile on the launch stream waits per chunk
//! (`wait(progress, row / rows_per_chunk, epoch)`), so it computes on the first
//! chunks while the later ones are still in flight. Flags are never cleared: the
//! epoch grows each call. A second barrier after the copies (peers are done
//! reading this rank's shard) ends the call, and [`AllGather::finish`] makes the
//! launch stream wait for it.
//!
//! In interpret mode the same protocol runs on the host: the buffers are shared
//! memory between the CPU ranks, and a background thread plays the copy engine,
//! with the same barriers, copies and flags in the same order, while the consumer
//! kernel runs in the interpreter on the calling thread.

use super::group::ProcessGroup;
use super::sm_copy::{Piece, SmCopier};
use super::stream_ops;
use super::symmetric::{shm_error, SymmetricMemory};
use crate::element::Element;
use crate::error::{argument, driver, Error, Result};
use crate::side_stream::SideStream;
use crate::tensor::Tensor;
use crate::timing::Timeline;
use std::thread::JoinHandle;
use std::time::Duration;

/// Errors of the host copy thread (interpret mode) say this.
const CONTEXT: &str = "AllGather (interpret mode)";

/// How an [`AllGather`] cuts the peers' shards into chunks, each with its own
/// progress flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Chunks {
    /// Each shard in this many bands of rows, peer after peer: chunk `c` of rank
    /// `r` is flag `r * splits + c`, so row `i` of the gathered tensor is ready
    /// once flag `i / rows_per_chunk` is. For a GEMM of many waves, whose tiles
    /// of a peer's rows start only after the tiles of this rank's own.
    Rows(usize),
    /// Every shard in this many bands of columns, band after band (band 0 of
    /// every peer, then band 1, …): band `c` of rank `r` is flag `c * world + r`,
    /// so element `(i, j)` is ready once flag
    /// `j / cols_per_chunk * world + i / rows` is. For a GEMM of one wave, whose
    /// every tile starts at once: each waits per k-tile, so all of them run on
    /// the first columns while the later ones are in flight.
    Cols(usize),
}

/// A reusable all-gather of `[rows, cols]` shards into a `[world × rows, cols]`
/// tensor, with one progress flag per chunk (see [`Chunks`]).
///
/// ```no_run
/// # fn main() -> tilefuse_runtime::Result<()> {
/// use tilefuse_runtime::dist::{AllGather, ProcessGroup};
/// let pg = ProcessGroup::init()?;
/// let mut ag = AllGather::<half::bf16>::new(&pg, 2048, 16384, 4)?;
/// // ... write this rank's rows into ag.shard() on the launch stream ...
/// let epoch = ag.start()?;
/// // ... launch a kernel that waits on ag.progress() >= epoch per chunk ...
/// ag.finish()?;
/// # Ok(()) }
/// ```
pub struct AllGather<T: Element> {
    sym: SymmetricMemory,
    shard: Tensor<T>,
    gathered: Tensor<T>,
    progress: Tensor<u32>,
    /// The copy engine's stream; `None` in interpret mode.
    backend: Option<SideStream>,
    /// Set by [`AllGather::copy_with_sms`]: SMs copy instead of the copy engine.
    sm_copier: Option<SmCopier>,
    /// In interpret mode, the thread of the call in flight.
    copier: Option<JoinHandle<Result<()>>>,
    /// How long the host copier waits at a barrier for a peer.
    timeout: Duration,
    rows: usize,
    cols: usize,
    /// With the count of chunks per shard that [`AllGather::with_chunks`] made.
    chunks: Chunks,
    rank: usize,
    world: usize,
    epoch: u32,
    /// Where the next call marks its barrier and each chunk's arrival.
    timeline: Option<Timeline>,
}

impl<T: Element> AllGather<T> {
    /// Plans an all-gather of `rows × cols` shards from every rank of `pg`, each
    /// copied in `splits_per_rank` bands of rows ([`Chunks::Rows`]). Every rank
    /// must pass the same values (an error on every rank says which disagree).
    pub fn new(
        pg: &ProcessGroup,
        rows: usize,
        cols: usize,
        splits_per_rank: usize,
    ) -> Result<Self> {
        Self::with_chunks(pg, rows, cols, Chunks::Rows(splits_per_rank))
    }

    /// [`AllGather::new`] with the chunks cut as `chunks` says. Bands of columns
    /// are `cols_per_chunk = ceil(cols / n)` wide (the last one narrower), so
    /// there may be fewer than asked.
    pub fn with_chunks(
        pg: &ProcessGroup,
        rows: usize,
        cols: usize,
        chunks: Chunks,
    ) -> Result<Self> {
        let ctx = "AllGather::new";
        if rows == 0 || cols == 0 {
            return Err(argument(
                ctx,
                "rows/cols",
                format!("a {rows}x{cols} shard is empty"),
            ));
        }
        let chunks = match chunks {
            Chunks::Rows(s) if s == 0 || rows % s != 0 => {
                return Err(argument(
                    ctx,
                    "splits_per_rank",
                    format!("must divide the shard's {rows} rows (got {s})"),
                ))
            }
            Chunks::Cols(0) => {
                return Err(argument(
                    ctx,
                    "chunks",
                    "Chunks::Cols needs at least one band of columns (got 0)",
                ))
            }
            Chunks::Cols(s) => Chunks::Cols(cols.div_ceil(cols.div_ceil(s.min(cols)))),
            rows => rows,
        };
        let mine = format!("{rows}x{cols}/{}/{chunks:?}", T::DTYPE);
        let all = pg.all_gather_bytes("all-gather-shape", mine.as_bytes())?;
        for (r, theirs) in all.iter().enumerate() {
            if theirs != mine.as_bytes() {
                return Err(argument(
                    ctx,
                    "shard",
                    format!(
                        "rank {} has shard {mine} (rows x cols / dtype / chunks) but rank {r} has {}: every rank's shard must have the same shape, dtype and chunks",
                        pg.rank(),
                        String::from_utf8_lossy(theirs)
                    ),
                ));
            }
        }
        let world = pg.world_size();
        let all_rows = world
            .checked_mul(rows)
            .ok_or_else(|| argument(ctx, "rows", format!("{world} x {rows} rows overflow")))?;
        let data_bytes = crate::tensor::checked_bytes::<T>(ctx, "rows/cols", &[all_rows, cols])?;
        let sym = SymmetricMemory::alloc(pg, data_bytes)?;
        let gathered = sym.tensor::<T>(&[all_rows, cols])?;
        let shard = gathered.narrow(0, pg.rank() * rows, rows)?;
        let dev = pg.device();
        let progress = Tensor::<u32>::flags(world * chunk_count(chunks))?;
        let backend = match dev.is_host() {
            true => None,
            false => Some(SideStream::new(dev, true)?),
        };
        dev.synchronize()?;
        Ok(AllGather {
            sym,
            shard,
            gathered,
            progress,
            backend,
            sm_copier: None,
            copier: None,
            timeout: pg.timeout(),
            rows,
            cols,
            chunks,
            rank: pg.rank(),
            world,
            epoch: 0,
            timeline: None,
        })
    }

    /// This rank's shard: its rows of the gathered tensor, in symmetric memory.
    /// Write the input here.
    pub fn shard(&self) -> &Tensor<T> {
        &self.shard
    }

    /// Where all shards land, rank after rank.
    pub fn gathered(&self) -> &Tensor<T> {
        &self.gathered
    }

    /// One flag per chunk, laid out as [`Chunks`] says; a chunk is ready once its
    /// flag holds the call's epoch.
    pub fn progress(&self) -> &Tensor<u32> {
        &self.progress
    }

    /// How the shards are cut (with the count of chunks made).
    pub fn chunks(&self) -> Chunks {
        self.chunks
    }

    /// Rows of a chunk: a band's, or a whole shard's with [`Chunks::Cols`].
    pub fn rows_per_chunk(&self) -> usize {
        match self.chunks {
            Chunks::Rows(s) => self.rows / s,
            Chunks::Cols(_) => self.rows,
        }
    }

    /// Columns of a chunk (the last band may be narrower): all of them with
    /// [`Chunks::Rows`].
    pub fn cols_per_chunk(&self) -> usize {
        match self.chunks {
            Chunks::Rows(_) => self.cols,
            Chunks::Cols(s) => self.cols.div_ceil(s),
        }
    }

    /// Copies the peers' chunks with `sms` SMs (an even count) instead of the
    /// copy engine, from the next call on: a small kernel on the backend stream
    /// pulls each chunk over NVLink and sets its flag, in the same order and with
    /// the same flags. Faster where the copy engine's incoming rate bounds the
    /// overlap (small M on 4 ranks), but the consumer must leave these SMs free:
    /// launch it inside [`crate::kernel::leaving_sms`]`(ag.sms_in_use(), ..)`.
    /// In interpret mode the host copier stays, and a world of one copies nothing.
    ///
    /// ```no_run
    /// # fn main() -> tilefuse_runtime::Result<()> {
    /// use tilefuse_runtime::dist::{AllGather, ProcessGroup};
    /// let pg = ProcessGroup::init()?;
    /// let mut ag = AllGather::<half::bf16>::new(&pg, 256, 16384, 4)?;
    /// ag.copy_with_sms(16)?;
    /// let epoch = ag.start()?;
    /// tilefuse_runtime::kernel::leaving_sms(ag.sms_in_use(), || {
    ///     // ... launch the persistent consumer, waiting on ag.progress() >= epoch ...
    /// });
    /// ag.finish()?;
    /// # Ok(()) }
    /// ```
    pub fn copy_with_sms(&mut self, sms: usize) -> Result<()> {
        // Interpret mode keeps its host copier; a world of one has nothing to copy.
        if self.backend.is_none() || self.world == 1 {
            return Ok(());
        }
        let pieces: Vec<Piece> = self
            .pieces()
            .into_iter()
            .map(|(p, c)| {
                let (src, dst, rows, width, pitch) = self.piece_rows(p, c);
                Piece {
                    src,
                    dst,
                    flag: self.flag_ptr(p, c),
                    rows,
                    width,
                    pitch,
                }
            })
            .collect();
        self.sm_copier = Some(SmCopier::new(self.gathered.device(), &pieces, sms)?);
        Ok(())
    }

    /// SMs the copies occupy while they run: 0 with the copy engine.
    pub fn sms_in_use(&self) -> usize {
        self.sm_copier.as_ref().map_or(0, SmCopier::sms)
    }

    /// Where chunk `c` of rank `p` comes from and goes: `(src, dst, rows, width,
    /// pitch)`, addresses and bytes.
    fn piece_rows(&self, p: usize, c: usize) -> (u64, u64, usize, usize, usize) {
        let (row0, rows, col0, cols) = self.chunk_rect(c);
        let elem = std::mem::size_of::<T>();
        let off = (((p * self.rows + row0) * self.cols + col0) * elem) as u64;
        let (src, dst) = (self.sym.data_ptr(p) + off, self.gathered.device_ptr() + off);
        (src, dst, rows, cols * elem, self.cols * elem)
    }

    /// The device address of chunk `c` of rank `p`'s flag.
    fn flag_ptr(&self, p: usize, c: usize) -> u64 {
        self.progress.device_ptr() + (self.flag_index(p, c) * 4) as u64
    }

    /// The flag of chunk `c` of rank `p`'s shard.
    fn flag_index(&self, p: usize, c: usize) -> usize {
        flag_index(self.chunks, self.world, p, c)
    }

    /// The peers' chunks `(rank, chunk)` in the order they are copied: peer after
    /// peer in rotation for bands of rows, band after band for bands of columns.
    fn pieces(&self) -> Vec<(usize, usize)> {
        let others = (1..self.world).map(|i| (self.rank + i) % self.world);
        match self.chunks {
            Chunks::Rows(s) => others.flat_map(|p| (0..s).map(move |c| (p, c))).collect(),
            Chunks::Cols(s) => (0..s)
                .flat_map(|c| others.clone().map(move |p| (p, c)))
                .collect(),
        }
    }

    /// Chunk `c`'s rows and columns within a shard: `(row0, rows, col0, cols)`.
    fn chunk_rect(&self, c: usize) -> (usize, usize, usize, usize) {
        match self.chunks {
            Chunks::Rows(_) => {
                let r = self.rows_per_chunk();
                (c * r, r, 0, self.cols)
            }
            Chunks::Cols(_) => {
                let w = self.cols_per_chunk();
                (0, self.rows, c * w, w.min(self.cols - c * w))
            }
        }
    }

    /// Marks the next call's opening barrier and each chunk's flag on
    /// `timeline` (see [`AllGather::take_timeline`]): when the copies land, next
    /// to the kernel that waits for them.
    pub fn trace_next(&mut self, timeline: Timeline) {
        self.timeline = Some(timeline);
    }

    /// The timeline given to [`AllGather::trace_next`], with the points of the
    /// call that followed.
    pub fn take_timeline(&mut self) -> Option<Timeline> {
        self.timeline.take()
    }

    /// Checks that `t` is this all-gather's shard (in symmetric memory).
    pub fn check_shard(&self, t: &Tensor<T>) -> Result<()> {
        if !self.sym.holds(t) {
            return Err(argument(
                "AllGather",
                "shard",
                "is not in this all-gather's symmetric memory: write the input into `shard()` (peers read it from there)",
            ));
        }
        Ok(())
    }

    /// Queues the all-gather on the backend stream, after the launch stream's work
    /// so far (the shard's writes); returns the epoch the flags will reach.
    pub fn start(&mut self) -> Result<u32> {
        self.epoch = self
            .epoch
            .checked_add(1)
            .ok_or_else(|| Error::Distributed {
                context: "AllGather::start".into(),
                message: "the epoch counter wrapped after 4 billion calls; create a new AllGather"
                    .into(),
            })?;
        let epoch = self.epoch;
        let Some(backend) = &self.backend else {
            return self.start_on_host(epoch).map(|()| epoch);
        };
        let dev = self.gathered.device().clone();
        let s = backend.stream();
        s.join(dev.stream()?)
            .map_err(driver("ordering the all-gather after the shard's writes"))?;
        let raw = s.cu_stream();
        let mut timeline = self.timeline.take();
        // This rank's rows are in place already: their flags first, in one
        // batch, so the consumer's tiles of them start before the barrier
        // with the peers passes (it waits for the slowest rank).
        let own: Vec<u64> = (0..chunk_count(self.chunks))
            .map(|c| self.flag_ptr(self.rank, c))
            .collect();
        // SAFETY: flags of the plain-memory progress tensor.
        unsafe { stream_ops::write_values(raw, &own, epoch)? };
        // Every shard is written before anyone reads it.
        self.sym.device_barrier(raw, 0, epoch)?;
        if let Some(t) = timeline.as_mut() {
            t.mark(s, "opening barrier passed")?;
        }
        if let Some(copier) = &self.sm_copier {
            // SAFETY: the pieces are the chunks below, in peers' symmetric
            // buffers (mapped, not written until the closing barrier) and this
            // rank's; their flags are the progress tensor's; calls queue on this
            // one stream, so no two copy kernels run at once.
            unsafe { copier.launch(raw, epoch)? };
            if let Some(t) = timeline.as_mut() {
                t.mark(s, "every chunk flagged (SM copies)")?;
            }
        } else {
            for (p, c) in self.pieces() {
                let (src, dst, rows, width, pitch) = self.piece_rows(p, c);
                // SAFETY: the `rows` rows of `width` bytes, `pitch` bytes apart,
                // from `src` lie in rank p's own rows of its symmetric buffer
                // (mapped here, alive while every rank holds its AllGather, not
                // written by p until it passes the closing barrier), those from
                // `dst` in the same rows of this rank's buffer (`chunk_rect`
                // stays inside the shard).
                unsafe { stream_ops::copy_2d(raw, dst, pitch, src, pitch, width, rows)? };
                // SAFETY: a flag of the plain-memory progress tensor.
                unsafe { stream_ops::write_value(raw, self.flag_ptr(p, c), epoch)? };
                if let Some(t) = timeline.as_mut() {
                    t.mark(s, format!("rank {p} chunk {c} flagged"))?;
                }
            }
        }
        // Peers are done reading this rank's shard once they pass this.
        self.sym.device_barrier(raw, 1, epoch)?;
        if let Some(mut t) = timeline {
            t.mark(s, "closing barrier passed")?;
            self.timeline = Some(t);
        }
        Ok(epoch)
    }

    /// Makes the launch stream wait for the all-gather (queue it after the consumer
    /// kernel, so the two overlap).
    /// In interpret mode, waits for the copy thread and returns its error, if any.
    pub fn finish(&mut self) -> Result<()> {
        match &self.backend {
            Some(b) => b.join_into_launch_stream(),
            None => self.join_copier(),
        }
    }

    fn join_copier(&mut self) -> Result<()> {
        match self.copier.take() {
            None => Ok(()),
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(Error::Distributed {
                    context: CONTEXT.into(),
                    message: "the copy thread panicked".into(),
                })
            }),
        }
    }

    /// Interpret mode's `start`: the copy engine's work, in the same order, on a
    /// thread (a call still in flight is finished first).
    fn start_on_host(&mut self, epoch: u32) -> Result<()> {
        self.join_copier()?;
        let (Some(pad), Some((progress, flag0)), Some((_, first))) = (
            self.sym.host_pad(),
            self.progress.host_memory(),
            self.gathered.host_memory(),
        ) else {
            return Err(Error::Distributed {
                context: "AllGather::start".into(),
                message: "interpret mode, but the buffers are not in host memory".into(),
            });
        };
        let progress = progress.clone();
        let elem = std::mem::size_of::<T>();
        let first_byte = first * elem;
        let (rank, world, chunks, timeout) = (self.rank, self.world, self.chunks, self.timeout);
        let (shard_rows, cols) = (self.rows, self.cols);
        // (rank, chunk, first row of the gathered tensor, rows, first column, columns)
        let pieces: Vec<_> = self
            .pieces()
            .into_iter()
            .map(|(p, c)| {
                let (row0, rows, col0, n) = self.chunk_rect(c);
                (p, c, p * shard_rows + row0, rows, col0, n)
            })
            .collect();
        let flag = move |p: usize, c: usize| -> Result<()> {
            progress
                .store_flag(flag0 + flag_index(chunks, world, p, c), epoch)
                .map_err(shm_error(CONTEXT))
        };
        let copy = move || -> Result<()> {
            // This rank's rows first, then every shard is written before
            // anyone reads it.
            for c in 0..chunk_count(chunks) {
                flag(rank, c)?;
            }
            pad.barrier(0, epoch, timeout)?;
            let mut row = vec![0u8; cols * elem];
            for (p, c, row0, rows, col0, n) in pieces {
                let bytes = &mut row[..n * elem];
                for i in row0..row0 + rows {
                    let at = first_byte + (i * cols + col0) * elem;
                    pad.mems[p]
                        .read_bytes(at, bytes)
                        .map_err(shm_error(CONTEXT))?;
                    pad.mems[rank]
                        .write_bytes(at, bytes)
                        .map_err(shm_error(CONTEXT))?;
                }
                flag(p, c)?;
            }
            // Peers are done reading this rank's shard once they pass this.
            pad.barrier(1, epoch, timeout)
        };
        self.copier = Some(std::thread::spawn(copy));
        Ok(())
    }
}

/// Chunks per shard.
fn chunk_count(chunks: Chunks) -> usize {
    match chunks {
        Chunks::Rows(s) | Chunks::Cols(s) => s,
    }
}

/// The flag of chunk `c` of rank `p`'s shard (see [`Chunks`]).
fn flag_index(chunks: Chunks, world: usize, p: usize, c: usize) -> usize {
    match chunks {
        Chunks::Rows(s) => p * s + c,
        Chunks::Cols(_) => c * world + p,
    }
}
