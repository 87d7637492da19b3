//! NCCL for baselines, fallbacks and more than one node: one communicator per
//! process group, created from an id that rank 0 publishes in the store.
//!
//! In interpret mode the same calls run on the host through the group's store
//! (each rank publishes its data, every rank reads all of it): slow, for the
//! small sizes of CPU runs, and with NCCL's results (sums in f64, rounded once).

use super::store::Store;
use crate::device::Device;
use crate::element::Element;
use crate::error::{argument, Error, Result};
use crate::tensor::Tensor;
use cudarc::nccl::{result as nc, sys as ncs};
use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tilefuse_codegen::DType;

/// A communicator over every rank of a process group, on each rank's launch stream.
pub struct Nccl {
    /// Null in interpret mode.
    /// Null in interpret mode, and once aborted or destroyed: whoever swaps the
    /// pointer out frees the communicator, so abort and drop cannot both.
    comm: AtomicPtr<ncs::ncclComm>,
    rank: usize,
    world: usize,
    dev: Arc<Device>,
    /// How long an init, an enqueue (its first connections) or the final
    /// flush may take before the communicator is aborted.
    timeout: Duration,
    /// Interpret mode's collectives through the store.
    host: Option<HostCollectives>,
}

/// What a host collective needs: the store every rank reaches, and a counter
/// that names each call the same on every rank (all make the same calls).
struct HostCollectives {
    store: Arc<Store>,
    timeout: Duration,
    seq: AtomicU64,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time;
// tilefuse queues its calls from the thread that holds the process group.
unsafe impl Send for Nccl {}
// SAFETY: as above; NCCL's enqueue functions are thread safe per communicator
// when calls do not overlap, which the launch stream's single user ensures.
unsafe impl Sync for Nccl {}

impl Drop for Nccl {
    fn drop(&mut self) {
        if self.host.is_some() {
            return;
        }
        let comm = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if comm.is_null() {
            return; // aborted: freed already
        }
        // Flush the queued work first (bounded: a dead peer would hold it
        // forever), then free; past the timeout, abort instead.
        // SAFETY: the communicator is live (not swapped out by `abort`), and
        // this is its last use: finalize, then destroy or abort, frees it once.
        let flushed = unsafe { ncs::ncclCommFinalize(comm) }
            .result()
            .is_ok_and(|_| settle(comm, self.timeout).is_ok());
        // SAFETY: as above.
        let _ = unsafe {
            if flushed {
                nc::comm_destroy(comm)
            } else {
                nc::comm_abort(comm)
            }
        };
    }
}

/// NCCL's `NCCL_CONFIG_UNDEF_INT`: a field left to NCCL's default.
const UNDEF: std::ffi::c_int = i32::MIN;

/// A non-blocking communicator's config (`NCCL_CONFIG_INITIALIZER` with
/// `blocking = 0`): init and enqueues return at once and are polled, so a
/// peer that never joins or connects ends in a timeout, not a hang. NCCL
/// reads `size` bytes of it, so older libraries take it too.
fn nonblocking_config() -> ncs::ncclConfig_t {
    ncs::ncclConfig_t {
        size: std::mem::size_of::<ncs::ncclConfig_t>(),
        magic: 0xcafe_beef,
        // NCCL_VERSION(2, 28, 0): the header cudarc's bindings follow.
        version: 22800,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
    }
}

/// What stopped a communicator's pending operation from completing.
enum Unsettled {
    /// Still in progress after the timeout.
    TimedOut(Duration),
    Failed(String),
}

/// Waits until the communicator's pending operation (a non-blocking init,
/// an enqueue making its first connections, a finalize) completes, at most
/// `timeout`.
fn settle(comm: ncs::ncclComm_t, timeout: Duration) -> std::result::Result<(), Unsettled> {
    let start = Instant::now();
    loop {
        let mut state = ncs::ncclResult_t::ncclSuccess;
        // SAFETY: `comm` is a live communicator (its init returned) and
        // `state` a valid place for the result.
        let asked = unsafe { ncs::ncclCommGetAsyncError(comm, &mut state) };
        if asked != ncs::ncclResult_t::ncclSuccess {
            return Err(Unsettled::Failed(format!("{asked:?}")));
        }
        match state {
            ncs::ncclResult_t::ncclSuccess => return Ok(()),
            ncs::ncclResult_t::ncclInProgress => {}
            e => return Err(Unsettled::Failed(format!("{e:?}"))),
        }
        if start.elapsed() >= timeout {
            return Err(Unsettled::TimedOut(start.elapsed()));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn nccl_err(context: impl Into<String>) -> impl FnOnce(nc::NcclError) -> Error {
    let context = context.into();
    move |e| Error::Nccl {
        context,
        message: format!("{e:?}"),
    }
}

/// The id's bytes, for the store.
pub(crate) fn new_id() -> Result<Vec<u8>> {
    crate::libs::require_nccl()?;
    let id = nc::get_uniqueid().map_err(nccl_err("creating a unique id"))?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

impl Nccl {
    /// Joins the communicator `id` as `rank` of `world` (every rank must call
    /// it), waiting at most `timeout` for the others.
    pub(crate) fn join(
        dev: &Arc<Device>,
        id: &[u8],
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<Nccl> {
        crate::libs::require_nccl()?;
        let mut uid = ncs::ncclUniqueId { internal: [0; 128] };
        if id.len() != uid.internal.len() {
            return Err(Error::Distributed {
                context: "joining NCCL".into(),
                message: format!("the published NCCL id has {} bytes, not 128", id.len()),
            });
        }
        for (d, s) in uid.internal.iter_mut().zip(id) {
            *d = *s as std::ffi::c_char;
        }
        dev.context()?
            .bind_to_thread()
            .map_err(crate::error::driver("binding the GPU context"))?;
        let ctx = format!("joining the communicator as rank {rank} of {world}");
        let mut comm: ncs::ncclComm_t = std::ptr::null_mut();
        let mut config = nonblocking_config();
        // SAFETY: `comm` and `config` are valid places; the id came from rank 0's
        // ncclGetUniqueId through the store; every rank of `world` calls this.
        // Non-blocking, the call returns at once (in progress) with `comm` set.
        let started = unsafe {
            ncs::ncclCommInitRankConfig(&mut comm, world as i32, uid, rank as i32, &mut config)
        }
        .result();
        match started {
            Ok(_) => {}
            // A library that refuses the config joins blocking: its init is
            // then bounded only by the store barrier every rank passed before.
            Err(nc::NcclError(ncs::ncclResult_t::ncclInvalidArgument)) if comm.is_null() => {
                tracing::warn!(
                    "NCCL refused a non-blocking communicator config; joining blocking \
                     (a peer that dies during init then hangs this rank)"
                );
                // SAFETY: as above, with NCCL's default (blocking) config.
                unsafe { nc::comm_init_rank(&mut comm, world as i32, uid, rank as i32) }
                    .map_err(nccl_err(ctx.clone()))?;
            }
            Err(e) => {
                if !comm.is_null() {
                    // SAFETY: NCCL handed out a communicator before failing;
                    // nothing else holds it, so it is freed once, here.
                    let _ = unsafe { nc::comm_abort(comm) };
                }
                return Err(nccl_err(ctx)(e));
            }
        }
        if comm.is_null() {
            return Err(Error::Nccl {
                context: ctx,
                message: "NCCL returned no communicator".into(),
            });
        }
        let nccl = Nccl {
            comm: AtomicPtr::new(comm),
            rank,
            world,
            dev: dev.clone(),
            timeout,
            host: None,
        };
        nccl.settled(&ctx)?;
        Ok(nccl)
    }

    /// Waits for the communicator's pending operation, at most its timeout;
    /// past it, or when it failed, aborts the communicator.
    fn settled(&self, ctx: &str) -> Result<()> {
        let comm = self.live(ctx)?;
        let outcome = settle(comm, self.timeout);
        if outcome.is_err() {
            self.abort();
        }
        match outcome {
            Ok(()) => Ok(()),
            Err(Unsettled::Failed(message)) => Err(Error::Nccl {
                context: ctx.into(),
                message,
            }),
            Err(Unsettled::TimedOut(waited)) => Err(Error::Timeout {
                rank: self.rank,
                what: format!("NCCL ({ctx})"),
                waited_ms: waited.as_millis() as u64,
                hint: format!(
                    "a peer of the {} ranks probably died or never joined; the communicator was aborted",
                    self.world
                ),
            }),
        }
    }

    /// Interpret mode's communicator: collectives through `store`.
    pub(crate) fn on_host(
        dev: &Arc<Device>,
        store: Arc<Store>,
        timeout: Duration,
        rank: usize,
        world: usize,
    ) -> Nccl {
        Nccl {
            comm: AtomicPtr::new(std::ptr::null_mut()),
            rank,
            world,
            dev: dev.clone(),
            timeout,
            host: Some(HostCollectives {
                store,
                timeout,
                seq: AtomicU64::new(0),
            }),
        }
    }

    /// Every rank's `send`, in rank order, through the store (interpret mode).
    fn host_gather<T: Element>(
        &self,
        h: &HostCollectives,
        send: &Tensor<T>,
    ) -> Result<Vec<Vec<f64>>> {
        let name = format!("nccl-host#{}", h.seq.fetch_add(1, Ordering::Relaxed));
        let mine: Vec<u8> = send
            .to_vec()?
            .into_iter()
            .flat_map(|x| x.to_f64().to_le_bytes())
            .collect();
        h.store.set(&format!("{name}/{}", self.rank), &mine)?;
        (0..self.world)
            .map(|r| {
                let what = format!("rank {r}'s part of a collective");
                let bytes = h.store.get(&format!("{name}/{r}"), h.timeout, &what)?;
                Ok(bytes
                    .chunks_exact(8)
                    .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                    .collect())
            })
            .collect()
    }

    /// The elementwise sum of every rank's `send` (interpret mode).
    fn host_sum<T: Element>(&self, h: &HostCollectives, send: &Tensor<T>) -> Result<Vec<f64>> {
        let parts = self.host_gather(h, send)?;
        let mut sum = vec![0f64; send.numel()];
        for part in &parts {
            sum.iter_mut().zip(part).for_each(|(s, x)| *s += x);
        }
        Ok(sum)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world
    }

    /// Checks that `send` and `out` are contiguous tensors on this rank's GPU and
    /// that `out` holds `out_per_send` times as many elements as `send` (a
    /// fraction for a reduce-scatter: `(1, world)`).
    fn check_pair<T: Element>(
        &self,
        ctx: &str,
        send: &Tensor<T>,
        out: &Tensor<T>,
        (num, den): (usize, usize),
    ) -> Result<()> {
        for (name, t) in [("send", send), ("out", out)] {
            if !t.is_contiguous() {
                return Err(argument(ctx, name, "must be contiguous"));
            }
            if t.device().ordinal() != self.dev.ordinal() {
                return Err(argument(ctx, name, "is not on this rank's GPU"));
            }
        }
        if send.numel() * num % den != 0 || out.numel() != send.numel() * num / den {
            return Err(argument(
                ctx,
                "out",
                format!(
                    "has {} elements; with {} on every one of {} ranks it needs {} × {num}/{den}",
                    out.numel(),
                    send.numel(),
                    self.world,
                    send.numel()
                ),
            ));
        }
        Ok(())
    }

    /// `out = concat(send of rank 0, send of rank 1, …)` along the first dimension,
    /// queued on the launch stream. Both contiguous, `out` `world` times `send`.
    pub fn all_gather<T: Element>(&self, send: &Tensor<T>, out: &Tensor<T>) -> Result<()> {
        let ctx = "Nccl::all_gather";
        self.check_pair(ctx, send, out, (self.world, 1))?;
        if let Some(h) = &self.host {
            let all: Vec<T> = self
                .host_gather(h, send)?
                .concat()
                .into_iter()
                .map(T::from_f64)
                .collect();
            return out.clone().copy_from_slice(&all);
        }
        // SAFETY: both pointers are live contiguous device buffers of the sizes
        // checked above, on the communicator's device; the call is queued on the
        // launch stream, which orders it with the tensors' other uses.
        unsafe {
            nc::all_gather(
                send.device_ptr() as *const c_void,
                out.device_ptr() as *mut c_void,
                send.numel(),
                nccl_type(ctx, T::DTYPE)?,
                self.live(ctx)?,
                self.dev.stream()?.cu_stream() as _,
            )
        }
        .map_err(nccl_err(ctx))
        .and_then(|status| self.enqueued(ctx, status))
    }

    /// `out = (Σ over ranks of send)[this rank's part]`: `send` is cut into `world`
    /// equal contiguous parts (along the first dimension of a row-major tensor) and
    /// rank `r` gets the sum of everyone's part `r`. Queued on the launch stream.
    pub fn reduce_scatter<T: Element>(&self, send: &Tensor<T>, out: &Tensor<T>) -> Result<()> {
        let ctx = "Nccl::reduce_scatter";
        self.check_pair(ctx, send, out, (1, self.world))?;
        if let Some(h) = &self.host {
            let n = out.numel();
            let sum = self.host_sum(h, send)?;
            let mine: Vec<T> = sum[self.rank * n..(self.rank + 1) * n]
                .iter()
                .map(|&x| T::from_f64(x))
                .collect();
            return out.clone().copy_from_slice(&mine);
        }
        // SAFETY: as in `all_gather`; `out` holds `send.numel() / world` elements.
        unsafe {
            nc::reduce_scatter(
                send.device_ptr() as *const c_void,
                out.device_ptr() as *mut c_void,
                out.numel(),
                nccl_type(ctx, T::DTYPE)?,
                ncs::ncclRedOp_t::ncclSum,
                self.live(ctx)?,
                self.dev.stream()?.cu_stream() as _,
            )
        }
        .map_err(nccl_err(ctx))
        .and_then(|status| self.enqueued(ctx, status))
    }

    /// `out = Σ over ranks of send` (elementwise; `out` may be `send`). Queued on
    /// the launch stream.
    pub fn all_reduce<T: Element>(&self, send: &Tensor<T>, out: &Tensor<T>) -> Result<()> {
        let ctx = "Nccl::all_reduce";
        self.check_pair(ctx, send, out, (1, 1))?;
        if let Some(h) = &self.host {
            let sum: Vec<T> = self
                .host_sum(h, send)?
                .into_iter()
                .map(T::from_f64)
                .collect();
            return out.clone().copy_from_slice(&sum);
        }
        // SAFETY: as in `all_gather`; both hold `send.numel()` elements (in place is
        // allowed by NCCL).
        unsafe {
            nc::all_reduce(
                send.device_ptr() as *const c_void,
                out.device_ptr() as *mut c_void,
                send.numel(),
                nccl_type(ctx, T::DTYPE)?,
                ncs::ncclRedOp_t::ncclSum,
                self.live(ctx)?,
                self.dev.stream()?.cu_stream() as _,
            )
        }
        .map_err(nccl_err(ctx))
        .and_then(|status| self.enqueued(ctx, status))
    }

    /// After an enqueue: one still in progress (making its first connections
    /// to peers) is waited for, at most the timeout.
    fn enqueued(&self, ctx: &str, status: nc::NcclStatus) -> Result<()> {
        match status {
            nc::NcclStatus::InProgress => self.settled(ctx),
            _ => Ok(()),
        }
    }

    /// Aborts the communicator (pending collectives give up), after a peer failed.
    /// Later collectives are errors; dropping it then frees nothing more.
    pub fn abort(&self) {
        if self.host.is_some() {
            return; // host collectives time out on their own
        }
        let comm = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if comm.is_null() {
            return; // aborted before
        }
        // SAFETY: the communicator was live and is now unreachable from `self`
        // (swapped out), so it is freed once; abort may run with work queued.
        let _ = unsafe { nc::comm_abort(comm) };
    }

    /// The communicator, or an error once it was aborted.
    fn live(&self, ctx: &str) -> Result<ncs::ncclComm_t> {
        let comm = self.comm.load(Ordering::Acquire);
        if comm.is_null() {
            return Err(Error::Distributed {
                context: ctx.into(),
                message: "the NCCL communicator was aborted after a peer failed; make a new process group".into(),
            });
        }
        Ok(comm)
    }
}

/// NCCL's type for `d`; NCCL has no 16-bit integer type.
fn nccl_type(ctx: &str, d: DType) -> Result<ncs::ncclDataType_t> {
    Ok(match d {
        DType::BF16 => ncs::ncclDataType_t::ncclBfloat16,
        DType::F16 => ncs::ncclDataType_t::ncclFloat16,
        DType::F32 => ncs::ncclDataType_t::ncclFloat32,
        DType::I8 => ncs::ncclDataType_t::ncclInt8,
        DType::U8 | DType::Bool => ncs::ncclDataType_t::ncclUint8,
        DType::I32 => ncs::ncclDataType_t::ncclInt32,
        DType::U32 => ncs::ncclDataType_t::ncclUint32,
        DType::I64 => ncs::ncclDataType_t::ncclInt64,
        DType::I16 => {
            return Err(crate::error::argument(
                ctx,
                "send",
                "NCCL has no 16-bit integer type; convert the tensor to i32 first",
            ))
        }
    })
}
