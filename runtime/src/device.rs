//! A GPU: its context, the stream tilefuse launches on, its properties, and the
//! status block kernels report failed `wait`s into; or, in interpret mode
//! ([`crate::mode`]), the host, where kernels run on the CPU.

use crate::error::{driver, Error, Result};
use crate::libs;
use crate::status;
use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// One GPU and the stream tilefuse work is ordered on, or the host in interpret
/// mode ([`Device::is_host`]).
pub struct Device {
    /// `None` for the host.
    gpu: Option<Gpu>,
    ordinal: usize,
    name: String,
    cc: (i32, i32),
    sm_count: usize,
    max_shared_optin: usize,
    /// Scratch for GEMM tiles split along K (see [`crate::split_tail`]).
    pub(crate) split: Mutex<crate::split_tail::Scratch>,
    /// Scratch for copies of unaligned GEMM operands (see [`crate::staging`]).
    pub(crate) staging: Mutex<crate::staging::Scratch>,
    /// Set when work on this GPU waits on a peer that is gone (see [`Device::mark_wedged`]).
    wedged: std::sync::atomic::AtomicBool,
}

/// What only a GPU device has.
pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// Kernels record the first failed `wait` here (see `tilefuse_codegen::emit::prelude`).
    pub(crate) status: CudaSlice<u64>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Device({}: {}, sm_{}{})",
            self.ordinal, self.name, self.cc.0, self.cc.1
        )
    }
}

thread_local! {
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// The ordinal used when none was chosen: `TILEFUSE_DEVICE`, else `LOCAL_RANK` (so
/// each rank under a launcher takes its own GPU), else 0.
fn default_ordinal() -> usize {
    ["TILEFUSE_DEVICE", "LOCAL_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.parse().ok())
        .unwrap_or(0)
}

impl Device {
    /// The number of GPUs visible, or an error when there is no driver.
    pub fn count() -> Result<usize> {
        libs::require_driver()?;
        let n = CudaContext::device_count().map_err(driver("counting GPUs"))?;
        Ok(n.max(0) as usize)
    }

    /// The device with this ordinal, opened once per process: a GPU, or in
    /// interpret mode the host (any ordinal: each rank of a CPU run has its own).
    pub fn get(ordinal: usize) -> Result<Arc<Device>> {
        static OPEN: OnceLock<Mutex<HashMap<usize, Arc<Device>>>> = OnceLock::new();
        let interpret = crate::mode::mode()? == crate::mode::Mode::Interpret;
        let map = OPEN.get_or_init(Default::default);
        let mut open = map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = open.get(&ordinal) {
            return Ok(d.clone());
        }
        if interpret {
            let d = Arc::new(Device::host(ordinal));
            open.insert(ordinal, d.clone());
            return Ok(d);
        }
        let count = Device::count()?;
        if ordinal >= count {
            return Err(Error::Unavailable {
                what: "the requested GPU",
                hint: format!("device {ordinal} was asked for but {count} GPU(s) are visible"),
            });
        }
        let d = Arc::new(Device::open(ordinal)?);
        open.insert(ordinal, d.clone());
        Ok(d)
    }

    fn open(ordinal: usize) -> Result<Device> {
        let ctx = CudaContext::new(ordinal).map_err(driver(format!("opening GPU {ordinal}")))?;
        // SAFETY: called before this context allocates anything. tilefuse orders all of
        // its work on one stream per device and joins other streams with explicit
        // events, so cudarc's per-allocation events would only add overhead.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(driver("creating the launch stream"))?;
        let attr =
            |a: Attr, what: &str| ctx.attribute(a).map_err(driver(format!("reading {what}")));
        let cc = ctx
            .compute_capability()
            .map_err(driver("reading the compute capability"))?;
        let sm_count = attr(
            Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "the SM count",
        )? as usize;
        let max_shared_optin = attr(
            Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "the shared memory limit",
        )? as usize;
        let name = ctx.name().map_err(driver("reading the device name"))?;
        let status = stream
            .alloc_zeros::<u64>(tilefuse_codegen::emit::prelude::STATUS_WORDS)
            .map_err(driver("allocating the status block"))?;
        Ok(Device {
            wedged: Default::default(),
            gpu: Some(Gpu {
                ctx,
                stream,
                status,
            }),
            ordinal,
            name,
            cc,
            sm_count,
            max_shared_optin,
            split: Mutex::default(),
            staging: Mutex::default(),
        })
    }

    /// The host of interpret mode. Its "shared memory" limit is a Hopper GPU's,
    /// so configs are checked (and defaults chosen) as for the portable GPU path.
    fn host(ordinal: usize) -> Device {
        Device {
            wedged: Default::default(),
            gpu: None,
            ordinal,
            name: "CPU (interpret mode)".into(),
            cc: (0, 0),
            sm_count: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_shared_optin: 227 * 1024,
            split: Mutex::default(),
            staging: Mutex::default(),
        }
    }

    /// Interpret mode's host in any process, a GPU process too: tensors made on
    /// it ([`crate::Tensor::empty_on`]) live in host memory and kernels launched
    /// on them run in the interpreter, so one program can run a kernel both
    /// ways on the same inputs and compare.
    ///
    /// ```no_run
    /// # use tilefuse_runtime::{Device, Tensor};
    /// let host = Device::interpreter();
    /// let x = Tensor::<f32>::from_slice_on(&host, &[1.0, 2.0], [2])?;
    /// assert!(x.device().is_host());
    /// # Ok::<(), tilefuse_runtime::Error>(())
    /// ```
    pub fn interpreter() -> Arc<Device> {
        static HOST: OnceLock<Arc<Device>> = OnceLock::new();
        // Its own ordinal, so caches keyed by device never mix it with a GPU.
        HOST.get_or_init(|| Arc::new(Device::host(usize::MAX)))
            .clone()
    }

    /// Whether this is the host of interpret mode rather than a GPU.
    pub fn is_host(&self) -> bool {
        self.gpu.is_none()
    }

    /// The GPU parts, or an error saying that `what` needs a GPU.
    pub(crate) fn gpu(&self, what: &str) -> Result<&Gpu> {
        self.gpu.as_ref().ok_or_else(|| Error::Unavailable {
            what: "a GPU",
            hint: format!(
                "{what} needs a GPU, and this process runs in interpret mode on the CPU \
                 (TILEFUSE_INTERPRET=1, or no GPU was found)"
            ),
        })
    }

    /// An error saying that `what` needs a GPU when this is interpret mode's
    /// host, for programs that only make sense on a GPU (benchmarks).
    pub fn require_gpu(&self, what: &str) -> Result<()> {
        self.gpu(what).map(|_| ())
    }

    /// The device this thread uses for new tensors: the last [`Device::set_current`],
    /// else `TILEFUSE_DEVICE` / `LOCAL_RANK` / 0.
    pub fn current() -> Result<Arc<Device>> {
        let ord = CURRENT.with(|c| c.get()).unwrap_or_else(default_ordinal);
        Device::get(ord)
    }

    /// Makes `ordinal` this thread's current device.
    pub fn set_current(ordinal: usize) -> Result<Arc<Device>> {
        let d = Device::get(ordinal)?;
        CURRENT.with(|c| c.set(Some(ordinal)));
        Ok(d)
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The product name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (i32, i32) {
        self.cc
    }

    /// The NVRTC target for this GPU: `sm_90a` on Hopper (wgmma, setmaxnreg), else
    /// `sm_XY`; `host` for the host.
    pub fn arch(&self) -> String {
        if self.is_host() {
            return "host".into();
        }
        match self.cc {
            (9, 0) => "sm_90a".to_string(),
            (maj, min) => format!("sm_{maj}{min}"),
        }
    }

    /// What generated code may use here: the shared memory per block, and the
    /// Hopper instructions (TMA, `wgmma`) on compute capability 9.0.
    pub fn target(&self) -> tilefuse_codegen::Target {
        tilefuse_codegen::Target {
            shared_limit: self.max_shared_per_block(),
            wgmma: self.cc == (9, 0),
            sms: self.sm_count,
        }
    }

    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// The most dynamic shared memory one block may use, in bytes.
    pub fn max_shared_per_block(&self) -> usize {
        self.max_shared_optin
    }

    /// The stream tilefuse launches on (cuBLAS baselines use it too); an error on
    /// the host.
    pub fn stream(&self) -> Result<&Arc<CudaStream>> {
        Ok(&self.gpu("a CUDA stream")?.stream)
    }

    /// The underlying cudarc context; an error on the host.
    pub fn context(&self) -> Result<&Arc<CudaContext>> {
        Ok(&self.gpu("a CUDA context")?.ctx)
    }

    /// Records that queued work on this GPU may never finish (it waits on a peer
    /// rank that died): from now on, freeing device memory leaks it instead of
    /// calling `cuMemFree`, which would wait for that work forever. The process
    /// should report the error and exit; set by a distributed timeout.
    pub fn mark_wedged(&self) {
        if !self.wedged.swap(true, std::sync::atomic::Ordering::SeqCst) {
            crate::log::warn(format_args!(
                "GPU {}: queued work waits on a peer that is gone; device memory is no longer freed",
                self.ordinal
            ));
        }
    }

    /// Whether [`Device::mark_wedged`] was called.
    pub fn is_wedged(&self) -> bool {
        self.wedged.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Changes whenever a scratch buffer that launches pass to kernels (split-K,
    /// staged operands) is reallocated: a captured graph holds the old address.
    pub(crate) fn scratch_generation(&self) -> u64 {
        self.split_scratch_generation() + self.staging_generation()
    }

    /// Waits for all work queued on the launch stream, then reports a `wait` that
    /// timed out in any kernel since the last check.
    /// On the host there is nothing queued: kernels ran when they were called.
    pub fn synchronize(&self) -> Result<()> {
        let Some(gpu) = &self.gpu else {
            return Ok(());
        };
        gpu.stream
            .synchronize()
            .map_err(driver("synchronizing the launch stream"))?;
        status::check(self)
    }
}
