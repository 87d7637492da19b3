//! `KernelDef`: what a `#[fused_kernel]` expands to. It owns the kernel's IR, picks
//! a config, compiles (once per specialization, config and device) and launches.

use crate::args::{ScalarArg, TensorArg};
use crate::device::Device;
use crate::error::{argument, driver, Error, Result};
use crate::jit;
use crate::private_copies::{self, PrivateLaunchShape, PrivatePlan};
use crate::split_loop;
use crate::split_tail::{self, SplitPlan};
use crate::status;
use cudarc::driver::sys::CUfunction_attribute as FnAttr;
use cudarc::driver::CudaFunction;
use cudarc::nvrtc::Ptx;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};
use tilefuse_codegen::ir::Kernel;
use tilefuse_codegen::{
    default_config, default_config_at, default_config_within, hopper_tiles, lower, Config,
    HopperTiles, Lowered, Param, Planned, Spec, TensorSpec,
};

/// A compiled kernel for one specialization, config and device.
pub struct Variant {
    pub lowered: Lowered,
    function: CudaFunction,
    site_base: u64,
    /// Blocks of this kernel the whole GPU holds at once (a persistent grid's size):
    /// clusters need their blocks on SMs of one GPC, so not every SM may take one.
    resident_blocks: u64,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct VariantKey {
    spec: Spec,
    config: Config,
    device: usize,
}

/// An untuned default's key: the specialization, the GPU's ordinal, the Hopper tiles.
type DefaultKey = (Spec, usize, HopperTiles);

/// A kernel defined with `#[fused_kernel]`. The macro creates one `static` per
/// kernel; users reach it as `my_kernel::kernel()`.
pub struct KernelDef {
    name: &'static str,
    json: &'static str,
    pinned: Option<&'static str>,
    /// The IR, planned once: the lowering it takes chosen.
    ir: OnceLock<std::result::Result<Planned, String>>,
    /// The IR with its compile-time `if`s decided, per constexpr values (empty
    /// when the kernel has none), each planned once.
    specialized: OnceLock<Mutex<HashMap<Vec<i64>, Arc<Planned>>>>,
    /// Whether the IR has compile-time `if`s.
    branches: OnceLock<bool>,
    variants: OnceLock<Mutex<HashMap<VariantKey, Arc<Variant>>>>,
    /// The untuned default per specialization and GPU ordinal.
    defaults: OnceLock<Mutex<HashMap<DefaultKey, Config>>>,
}

thread_local! {
    /// Configs set by `KernelDef::with_config`, innermost last.
    static OVERRIDES: RefCell<Vec<(&'static str, Config)>> = const { RefCell::new(Vec::new()) };
    /// Caps set by `KernelDef::with_group_rows`, innermost last.
    static GROUP_ROWS: RefCell<Vec<(&'static str, usize)>> = const { RefCell::new(Vec::new()) };
    /// SMs that persistent grids leave free, set by [`leaving_sms`].
    static SMS_LEFT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs `f` with every persistent kernel it launches (on this thread) leaving
/// `sms` SMs of its GPU free: its grid holds that many fewer blocks (clusters
/// round it down). For a consumer that waits on a producer kernel running beside
/// it, such as an all-gather copied by SMs
/// ([`crate::dist::AllGather::copy_with_sms`]): a persistent grid that filled
/// every SM would keep the producer from running. Kernels that are not
/// persistent launch as usual.
///
/// ```ignore
/// tilefuse_runtime::kernel::leaving_sms(ag.sms_in_use(), || ag_matmul(&a, &b, &c, ...))?;
/// ```
pub fn leaving_sms<R>(sms: usize, f: impl FnOnce() -> R) -> R {
    struct Restore(usize);
    impl Drop for Restore {
        fn drop(&mut self) {
            SMS_LEFT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(SMS_LEFT.with(|c| c.replace(sms)));
    f()
}

/// Blocks of a persistent grid of `resident` blocks (the GPU's whole capacity
/// for it) once [`leaving_sms`]'s SMs are taken out.
fn resident_after_left(resident: u64, sm_count: usize) -> u64 {
    let left = SMS_LEFT.with(std::cell::Cell::get) as u64;
    let per_sm = (resident / (sm_count.max(1) as u64)).max(1);
    resident.saturating_sub(left.saturating_mul(per_sm))
}

/// A kernel's IR for one launch: the whole IR, or its specialization for the
/// launch's constexpr values (shared with every launch of the same values).
enum IrRef<'a> {
    Whole(&'a Planned),
    Specialized(Arc<Planned>),
}

impl std::ops::Deref for IrRef<'_> {
    type Target = Planned;
    fn deref(&self) -> &Planned {
        match self {
            IrRef::Whole(k) => k,
            IrRef::Specialized(k) => k,
        }
    }
}

/// Pops the innermost entry of a thread-local stack when dropped.
struct PopOnDrop<T: 'static>(&'static std::thread::LocalKey<RefCell<Vec<T>>>);

impl<T: 'static> Drop for PopOnDrop<T> {
    fn drop(&mut self) {
        self.0.with(|o| {
            o.borrow_mut().pop();
        });
    }
}

impl KernelDef {
    /// Used by the macro: the kernel's name, its IR as JSON and an optional pinned config as JSON.
    pub const fn new(
        name: &'static str,
        json: &'static str,
        pinned: Option<&'static str>,
    ) -> KernelDef {
        KernelDef {
            name,
            json,
            pinned,
            ir: OnceLock::new(),
            specialized: OnceLock::new(),
            branches: OnceLock::new(),
            variants: OnceLock::new(),
            defaults: OnceLock::new(),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The kernel's tile IR, planned (the lowering it takes chosen once).
    pub fn ir(&self) -> Result<&Planned> {
        self.ir
            .get_or_init(|| {
                Kernel::from_json(self.json)
                    .map(Planned::new)
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| Error::Definition {
                kernel: self.name.to_string(),
                message: format!(
                    "its IR could not be read ({e}); rebuild the crate that defines it"
                ),
            })
    }

    /// The IR for these constexpr values: compile-time `if`s decided (see
    /// `Planned::specialize`), made and planned once per values.
    fn ir_for(&self, consts: &[i64]) -> Result<IrRef<'_>> {
        let k = self.ir()?;
        // Shared, never copied: a launch must not pay for the IR's size.
        if k.constexprs.is_empty() || !*self.branches.get_or_init(|| k.has_branches()) {
            return Ok(IrRef::Whole(k));
        }
        let map = self.specialized.get_or_init(Default::default);
        if let Some(s) = map.lock().unwrap_or_else(|p| p.into_inner()).get(consts) {
            return Ok(IrRef::Specialized(s.clone()));
        }
        let s = Arc::new(k.specialize(consts)?.into_owned());
        map.lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(consts.to_vec(), s.clone());
        Ok(IrRef::Specialized(s))
    }

    /// The config pinned on the attribute, if any.
    pub fn pinned_config(&self) -> Result<Option<Config>> {
        let Some(j) = self.pinned else {
            return Ok(None);
        };
        parse_config(j).map(Some).map_err(|e| Error::Definition {
            kernel: self.name.to_string(),
            message: format!("its pinned config could not be read: {e}"),
        })
    }

    /// The config an untuned launch on `dev` with `spec` uses where its extents
    /// are not known: [`KernelDef::default_at`] with none.
    pub fn default_for(&self, dev: &Device, spec: &Spec) -> Result<Config> {
        self.default_at(dev, spec, &[])
    }

    /// The config an untuned launch on `dev` with `spec` and these extents
    /// (`extents[d]`: dimension `d`'s, where known) uses: an override or the
    /// pinned config, else [`default_config_at`] (the Hopper path where the GPU
    /// and the specialization allow it, with tiles that keep the SMs busy),
    /// decided once per specialization, GPU and choice of tiles. Row kernels
    /// and `whole(…)` tiles are then fitted to the extents at the launch.
    pub fn default_at(
        &self,
        dev: &Device,
        spec: &Spec,
        extents: &[Option<usize>],
    ) -> Result<Config> {
        if let Some(c) = self.chosen_config()? {
            return Ok(c);
        }
        let target = dev.target();
        // The IR of this specialization: its branches taken.
        let k = self.ir_for(&spec.constexprs)?;
        let tiles = match target.wgmma {
            true => hopper_tiles(&k, extents, target.sms),
            false => HopperTiles::Pairs,
        };
        let key = (spec.clone(), dev.ordinal(), tiles);
        let map = self.defaults.get_or_init(Default::default);
        if let Some(c) = map.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(c.clone());
        }
        let c = default_config_at(&k, spec, target, extents);
        map.lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, c.clone());
        Ok(c)
    }

    /// The portable path's config a launch on `dev` uses now: like
    /// [`KernelDef::config`], with the default fitted to the device's shared memory
    /// ([`default_config_within`]). See [`KernelDef::default_for`] for the default
    /// of a given specialization.
    pub fn config_on(&self, dev: &Device) -> Result<Config> {
        match self.chosen_config()? {
            Some(c) => Ok(c),
            None => Ok(default_config_within(
                self.ir()?,
                dev.max_shared_per_block(),
            )),
        }
    }

    /// The config a launch uses now: a [`KernelDef::with_config`] override, else the
    /// pinned config, else the default (for any GPU; see [`KernelDef::config_on`]).
    pub fn config(&self) -> Result<Config> {
        match self.chosen_config()? {
            Some(c) => Ok(c),
            None => Ok(default_config(self.ir()?)),
        }
    }

    /// A [`KernelDef::with_config`] override, else the pinned config.
    fn chosen_config(&self) -> Result<Option<Config>> {
        let over = OVERRIDES.with(|o| {
            o.borrow()
                .iter()
                .rev()
                .find(|(n, _)| std::ptr::eq(*n, self.name) || *n == self.name)
                .map(|(_, c)| c.clone())
        });
        if over.is_some() {
            return Ok(over);
        }
        self.pinned_config()
    }

    /// Runs `f` with this kernel launched under `config` (on this thread).
    ///
    /// ```ignore
    /// let c = matmul::kernel().with_config(Config::new(&[128, 128, 32]), || matmul(&a, &b))?;
    /// ```
    pub fn with_config<R>(&self, config: Config, f: impl FnOnce() -> R) -> R {
        OVERRIDES.with(|o| o.borrow_mut().push((self.name, config)));
        let _pop = PopOnDrop(&OVERRIDES);
        f()
    }

    /// Runs `f` with this matmul kernel's output tiles visited in groups of at
    /// most `rows` rows (the config's `group_m` lowered to fit, whatever config
    /// the launch resolves: tuned, pinned or default), so that bands of `rows`
    /// rows complete one after the other. For a consumer that moves the output
    /// in row chunks as they complete (see `signal`); costs some L2 reuse.
    pub fn with_group_rows<R>(&self, rows: usize, f: impl FnOnce() -> R) -> R {
        GROUP_ROWS.with(|o| o.borrow_mut().push((self.name, rows)));
        let _pop = PopOnDrop(&GROUP_ROWS);
        f()
    }

    /// `config` with its tile-order groups capped by [`KernelDef::with_group_rows`].
    fn group_rows_capped(&self, k: &Planned, config: Config) -> Config {
        let cap = GROUP_ROWS.with(|o| {
            o.borrow()
                .iter()
                .rev()
                .find(|(n, _)| std::ptr::eq(*n, self.name) || *n == self.name)
                .map(|(_, r)| *r)
        });
        match cap {
            Some(rows) => tilefuse_codegen::group_rows(k, config, rows),
            None => config,
        }
    }

    /// A specialization from the dtypes written in the source: contiguous, aligned
    /// tensors and integer scalars. Errors if a tensor's dtype was not written.
    pub fn declared_spec(&self) -> Result<Spec> {
        let k = self.ir()?;
        let tensors = k
            .tensors
            .iter()
            .map(|t| {
                t.declared
                    .map(|d| TensorSpec::contiguous(d, t.rank))
                    .ok_or_else(|| {
                        argument(
                            format!("kernel `{}`", k.name),
                            &t.name,
                            "its dtype is not written in the source",
                        )
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Spec {
            tensors,
            scalars: k.declared_scalar_kinds(),
            constexprs: vec![1; k.constexprs.len()],
        })
    }

    /// Lowers the kernel to CUDA C for a specialization and config (no GPU needed).
    pub fn lower(&self, spec: &Spec, config: &Config) -> Result<Lowered> {
        // The specialization, planned once for all lowerings of these values.
        Ok(lower(&*self.ir_for(&spec.constexprs)?, spec, config)?)
    }

    /// Lowers and compiles the kernel with NVRTC for `arch` (no GPU needed).
    pub fn compile(&self, spec: &Spec, config: &Config, arch: &str) -> Result<jit::Cubin> {
        let l = self.lower(spec, config)?;
        jit::compile_cubin(self.name, &l.source, arch)
    }

    fn spec_of(
        &self,
        k: &Kernel,
        tensors: &[TensorArg],
        scalars: &[ScalarArg],
        consts: &[i64],
    ) -> Result<Spec> {
        let ctx = || format!("kernel `{}`", k.name);
        if tensors.len() != k.tensors.len()
            || scalars.len() != k.scalars.len()
            || consts.len() != k.constexprs.len()
        {
            return Err(argument(
                ctx(),
                "(all)",
                "the launch does not match the kernel's parameters; rebuild",
            ));
        }
        let mut specs = Vec::with_capacity(tensors.len());
        for (p, t) in k.tensors.iter().zip(tensors) {
            if t.shape.len() != p.rank {
                return Err(argument(
                    ctx(),
                    &p.name,
                    format!(
                        "expected a {}-D tensor (it is indexed with {} tile(s)), got shape {:?}",
                        p.rank, p.rank, t.shape
                    ),
                ));
            }
            if let Some(d) = p.declared {
                if d != t.dtype {
                    return Err(argument(
                        ctx(),
                        &p.name,
                        format!("expected Tensor<{d}>, got Tensor<{}>", t.dtype),
                    ));
                }
            }
            let strides: Vec<i64> = t.strides.iter().map(|&s| s as i64).collect();
            specs.push(TensorSpec {
                dtype: t.dtype,
                rank: t.shape.len(),
                last_contiguous: t.strides.last().is_none_or(|&s| s == 1)
                    || t.shape.last() == Some(&1),
                align: TensorSpec::alignment_of(t.ptr, &strides, t.dtype),
            });
        }
        Ok(Spec {
            tensors: specs,
            scalars: scalars.iter().map(|s| s.kind()).collect(),
            constexprs: consts.to_vec(),
        })
    }

    fn check_sizes(&self, k: &Planned, tensors: &[TensorArg], scalars: &[ScalarArg]) -> Result<()> {
        let ctx = || format!("kernel `{}`", k.name);
        for d in &k.dims {
            let Some(e) = d.extent else { continue };
            if let Some(v) = scalars[e].int() {
                if v < 0 {
                    return Err(argument(
                        ctx(),
                        &k.scalars[e].name,
                        format!(
                            "is the extent of tile `{}` and must not be negative, got {v}",
                            d.name
                        ),
                    ));
                }
            }
        }
        for r in k.size_rules() {
            let dim = &k.dims[r.dim];
            let Some(ext) = dim.extent.and_then(|e| scalars[e].int()) else {
                continue;
            };
            let have = tensors[r.tensor].shape[r.axis] as i64;
            if let Some(message) = r.broken(k, have, ext) {
                return Err(argument(ctx(), &k.tensors[r.tensor].name, message));
            }
        }
        Ok(())
    }

    fn variant(
        &self,
        dev: &Arc<Device>,
        k: &Planned,
        spec: Spec,
        config: Config,
    ) -> Result<Arc<Variant>> {
        let key = VariantKey {
            spec,
            config,
            device: dev.ordinal(),
        };
        let map = self.variants.get_or_init(Default::default);
        if let Some(v) = map.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(v.clone());
        }
        let (lowered, cubin) = compile_variant(k, &key.spec, &key.config, dev)?;
        let v = Arc::new(load_variant(dev, &k.name, lowered, cubin)?);
        map.lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, v.clone());
        Ok(v)
    }

    /// Launches the kernel on the device of its tensors (used by the generated glue).
    pub fn launch(
        &self,
        tensors: &[TensorArg],
        scalars: &[ScalarArg],
        consts: &[i64],
    ) -> Result<()> {
        let k = self.ir()?;
        let dev = match tensors.first() {
            Some(t) => t.device.clone(),
            None => Device::current()?,
        };
        for (p, t) in k.tensors.iter().zip(tensors) {
            if t.device.ordinal() != dev.ordinal() {
                return Err(argument(
                    format!("kernel `{}`", k.name),
                    &p.name,
                    format!(
                        "is on GPU {} but `{}` is on GPU {}",
                        t.device.ordinal(),
                        k.tensors[0].name,
                        dev.ordinal()
                    ),
                ));
            }
        }
        let spec = self.spec_of(k, tensors, scalars, consts)?;
        // Sizes, tuning and compilation see only the branches taken.
        let specialized = self.ir_for(consts)?;
        let k = &specialized;
        self.check_sizes(k, tensors, scalars)?;
        if dev.is_host() {
            // Interpret mode: the pinned or default config's block sizes, no tuning.
            let ext = crate::autotune::extents(k, scalars);
            let default =
                tilefuse_codegen::fit_default(k, self.default_at(&dev, &spec, &ext)?, &ext);
            let config = self.group_rows_capped(k, default);
            let config =
                tilefuse_codegen::fit_whole_dims(k, config, &crate::autotune::extents(k, scalars));
            return crate::interpret::launch(k, &config, consts, tensors, scalars);
        }
        let config = match self.chosen_config()? {
            Some(c) => c,
            None => crate::autotune::config_for(
                self,
                &crate::autotune::Launch {
                    dev: &dev,
                    kernel: k,
                    spec: &spec,
                    tensors,
                    scalars,
                },
            )?,
        };
        let config = self.group_rows_capped(k, config);
        // A `whole` tile's block follows the extent, whatever the config says.
        let config =
            tilefuse_codegen::fit_whole_dims(k, config, &crate::autotune::extents(k, scalars));
        let v = self.variant(&dev, k, spec, config)?;
        launch_variant(&dev, k, &v, tensors, scalars)
    }

    /// The variant for a config, compiled (or taken from the caches) and loaded.
    pub(crate) fn variant_for(
        &self,
        dev: &Arc<Device>,
        k: &Planned,
        spec: &Spec,
        config: &Config,
    ) -> Result<Arc<Variant>> {
        self.variant(dev, k, spec.clone(), config.clone())
    }

    /// Keeps a variant the autotuner compiled, so the launch after tuning reuses it.
    pub(crate) fn keep_variant(&self, dev: &Device, spec: &Spec, config: &Config, v: Arc<Variant>) {
        let key = VariantKey {
            spec: spec.clone(),
            config: config.clone(),
            device: dev.ordinal(),
        };
        self.variants
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_insert(v);
    }

    /// Tunes this kernel over exactly these configs (the default config is always
    /// measured too, as the reference), instead of the space derived from its IR;
    /// an empty list goes back to that space.
    ///
    /// ```ignore
    /// matmul::kernel().tune_over(vec![Config::new(&[128, 128, 64]).num_warps(4)]);
    /// ```
    pub fn tune_over(&self, configs: Vec<Config>) {
        crate::autotune::set_candidates(self.name, configs);
    }

    /// The compiled variants cached in this process, by config (for tests and tools).
    pub fn variant_count(&self) -> usize {
        self.variants
            .get()
            .map_or(0, |m| m.lock().unwrap_or_else(|p| p.into_inner()).len())
    }
}

/// Launches a loaded variant on `dev`'s launch stream with these arguments (checked
/// against the kernel already).
pub(crate) fn launch_variant(
    dev: &Device,
    k: &Kernel,
    v: &Variant,
    tensors: &[TensorArg],
    scalars: &[ScalarArg],
) -> Result<()> {
    let mut blocks: u64 = 1;
    for &(s, b) in &v.lowered.grid {
        let Some(ext) = scalars[s].int() else {
            continue;
        };
        blocks = blocks.saturating_mul((ext.max(0) as u64).div_ceil(b as u64));
    }
    if blocks == 0 {
        return Ok(());
    }
    // Unaligned operands of a staged config: the kernel reads aligned copies.
    let staged;
    let tensors = if v.lowered.staged.is_empty() {
        tensors
    } else {
        staged = dev.stage_operands(k, tensors, &v.lowered.staged)?;
        &staged[..]
    };
    if blocks > tilefuse_codegen::MAX_PROGRAMS {
        return Err(argument(
            format!("kernel `{}`", k.name),
            "(grid)",
            format!("{blocks} programs exceed the launch limit; use larger blocks"),
        ));
    }
    // `blocks` counts programs (output tiles; a cluster's tile on the clustered
    // path) until the launch below.
    let cluster = u64::from(v.lowered.cluster.max(1));
    let resident_blocks = match v.lowered.persistent {
        true => resident_after_left(v.resident_blocks, dev.sm_count()),
        false => v.resident_blocks,
    };
    let resident_programs = (resident_blocks / cluster).max(1);
    // Tiles in one wave: a ping-pong block holds two at once.
    let wave = resident_programs * u64::from(v.lowered.tiles_in_flight.max(1));
    // GEMMs: split the last, partial wave of tiles along K.
    let (mut split, mut scratch) = (SplitPlan::none(blocks), (0, 0));
    if let Some(st) = &v.lowered.split_tail {
        let ext = |s: usize| scalars[s].int().map_or(0, |x| x.max(0) as u64);
        let k_tiles = ext(st.k).div_ceil(st.bk as u64);
        split = if st.stream_k {
            split_tail::stream_k_plan(blocks, k_tiles, wave)
        } else {
            split_tail::plan(blocks, k_tiles, wave, st.min_part_k_tiles as u64)
        };
        if split.ways > 1 {
            // Scratch per program: its blocks' tiles (`st.bm` spans the cluster).
            let floats = split.split * split.ways * (st.bm * st.bn) as u64;
            scratch = dev.split_scratch(floats as usize, (split.split * cluster) as usize)?;
        }
        blocks = split.programs();
    }
    // General kernels: programs share a reduction loop when the grid alone
    // does not fill the GPU.
    if let Some(sl) = &v.lowered.split_loop {
        let ext = scalars[sl.extent].int().map_or(0, |x| x.max(0) as u64);
        let tiles = ext.div_ceil(sl.block as u64);
        let ways = split_loop::ways(blocks, tiles, resident_programs, sl.most);
        if ways > 1 {
            let words = blocks * ways * (sl.share_bytes as u64).div_ceil(4);
            scratch = dev.split_scratch(words as usize, blocks as usize)?;
        }
        split.ways = ways;
        blocks = blocks.saturating_mul(ways);
    }
    // A persistent kernel loops over its work: one wave of programs is enough.
    let programs = blocks;
    if v.lowered.persistent {
        blocks = blocks.min(resident_programs);
    }
    // A persistent attention forward's split tail: when the waves do not
    // come out even, the last wave and the remainder share their steps, and
    // each of those tiles gets scratch for its two parts and a counter (the
    // kernel computes the same split from its grid).
    if let (Some(per_tile), true) = (v.lowered.split_tiles, blocks > 0) {
        let rem = programs % blocks;
        if rem != 0 {
            let tiles = (blocks + rem) as usize;
            scratch = dev.split_scratch(tiles.saturating_mul(per_tile), tiles)?;
        }
    }
    // Private copies of atomically added tensors: where they fit and pay, the
    // programs (one wave of them where the kernel walks the grid) add into
    // shared memory.
    let private = private_room(dev, v, tensors, scalars, blocks)?;
    if let Some(p) = &private {
        blocks = p.blocks;
    }
    blocks = blocks.saturating_mul(cluster);
    // A grid that cannot leave `leaving_sms`'s SMs free would keep the kernel
    // it waits for off the GPU until its waits give up: refuse it now.
    if !v.lowered.persistent && SMS_LEFT.with(std::cell::Cell::get) > 0 {
        let room = resident_after_left(v.resident_blocks, dev.sm_count());
        if blocks > room {
            return Err(argument(
                format!("kernel `{}`", k.name),
                "(grid)",
                format!(
                    "{blocks} blocks, not a persistent grid, cannot leave {} SMs free for the producer it waits on (room for {room} blocks beside it): use a persistent config (`\"persistent\": true` on the Hopper path) or the copy engine",
                    SMS_LEFT.with(std::cell::Cell::get)
                ),
            ));
        }
    }
    let gpu = dev.gpu("launching a compiled kernel")?;
    let (status_ptr, guard) = cudarc::driver::DevicePtr::device_ptr(&gpu.status, &gpu.stream);
    drop(guard);
    let timeout_ns = status::wait_timeout_ms()?.saturating_mul(1_000_000);
    // TMA descriptors, passed by value (128 bytes each).
    let mut maps: Vec<cudarc::driver::sys::CUtensorMap> = Vec::new();
    for p in &v.lowered.params {
        if let Param::TensorMap {
            tensor,
            box_inner,
            box_outer,
            rows_axis,
        } = *p
        {
            maps.push(crate::tma::tensor_map(
                &tensors[tensor],
                &k.tensors[tensor].name,
                box_inner,
                box_outer,
                rows_axis,
            )?);
        }
    }
    let (stage_cap, shared_bytes) = match &private {
        // The copies take the room staged gathers would (their rows then
        // come from global memory).
        Some(p) => (0, p.shared_bytes as u32),
        None => gather_room(dev, &v.lowered, tensors),
    };
    // A persistent kernel's tile counter: the split scratch's first counter,
    // zero between launches (the kernel's atomic wrap leaves it so; a launch
    // that failed has it zeroed with the others, see `status`).
    let tile_counter = match v.lowered.params.contains(&Param::TileCounter) {
        true => dev.split_scratch(0, 1)?.1,
        false => 0,
    };
    let mut values: Vec<u64> = Vec::with_capacity(v.lowered.params.len());
    for p in &v.lowered.params {
        values.push(match *p {
            Param::TensorMap { .. } => 0,
            Param::StageCap => stage_cap,
            Param::PrivateOn => u64::from(private.is_some()),
            Param::TensorPtr(t) => tensors[t].ptr,
            Param::TensorDim(t, i) => tensors[t].shape[i] as u64,
            Param::TensorStride(t, i) => tensors[t].strides[i] as i64 as u64,
            Param::Scalar(s) => match scalars[s] {
                ScalarArg::Float(f) => u64::from(f.to_bits()),
                // Integers of every kind travel as a `long long`.
                i => i.int().unwrap_or(0) as u64,
            },
            Param::Status => status_ptr,
            Param::WaitTimeoutNs => timeout_ns,
            Param::SiteBase => v.site_base,
            Param::SplitWhole => split.whole,
            Param::SplitWays => split.ways,
            Param::SplitParts => split.parts,
            Param::SplitPartials => scratch.0,
            Param::SplitCounters => scratch.1,
            Param::TileCounter => tile_counter,
        });
    }
    let mut next_map = maps.iter_mut();
    let mut ptrs: Vec<*mut c_void> = values
        .iter_mut()
        .zip(&v.lowered.params)
        .map(|(x, p)| match p {
            Param::TensorMap { .. } => next_map
                .next()
                .map_or(std::ptr::null_mut(), |m| m as *mut _ as *mut c_void),
            _ => x as *mut u64 as *mut c_void,
        })
        .collect();
    gpu.ctx
        .bind_to_thread()
        .map_err(driver("binding the GPU context"))?;
    // SAFETY: `ptrs` holds one pointer per kernel parameter, in the order and with
    // the C types `lower` declared (64-bit values; a float's bits in the low word,
    // which is where a little-endian 4-byte read finds them; TMA descriptors point
    // at 64-byte aligned `CUtensorMap`s that live until the launch is queued). Tensor pointers come
    // from live tensors on this device whose sizes were checked against the tile
    // extents above; the kernel masks every access to those sizes.
    unsafe {
        cudarc::driver::result::launch_kernel(
            v.function.cu_function(),
            (blocks as u32, 1, 1),
            (v.lowered.threads, 1, 1),
            shared_bytes,
            gpu.stream.cu_stream(),
            &mut ptrs,
        )
    }
    .map_err(driver(format!("launching kernel `{}`", k.name)))?;
    Ok(())
}

/// The shared memory a launch adds for the kernel's staged gathers (the
/// kernel's `tf_stage_cap`: the largest of those worth staging at these
/// shapes, 0 where none is or it does not fit the block) and the launch's
/// shared memory in all.
fn gather_room(dev: &Device, lowered: &Lowered, tensors: &[TensorArg]) -> (u64, u32) {
    let base = lowered.shared_bytes as usize;
    let need = lowered
        .gathers
        .iter()
        .filter_map(|g| {
            let len = *tensors.get(g.tensor)?.shape.get(g.axis)?;
            g.worth(len).then(|| g.bytes(len))
        })
        .max()
        .unwrap_or(0);
    let total = base.next_multiple_of(16) + need;
    if need == 0 || total > gather_room_most(dev) {
        return (0, lowered.shared_bytes);
    }
    (need as u64, total as u32)
}

/// Whether this launch gives the kernel's private copies shared memory, and
/// its programs then ([`crate::private_copies::plan`]).
fn private_room(
    dev: &Device,
    v: &Variant,
    tensors: &[TensorArg],
    scalars: &[ScalarArg],
    blocks: u64,
) -> Result<Option<PrivatePlan>> {
    let Some(p) = &v.lowered.private else {
        return Ok(None);
    };
    let (mut entries, mut bytes) = (0usize, 0usize);
    for c in &p.copies {
        let Some(t) = tensors.get(c.tensor) else {
            return Ok(None);
        };
        entries = entries.saturating_add(c.entries(&t.shape));
        bytes = bytes.saturating_add(c.bytes(&t.shape));
    }
    let grid = &v.lowered.grid;
    let kept_tiles = grid[grid.len().saturating_sub(p.kept)..]
        .iter()
        .map(|&(s, b)| {
            let ext = scalars[s].int().map_or(0, |x| x.max(0) as u64);
            ext.div_ceil(b as u64)
        })
        .product();
    let shape = PrivateLaunchShape {
        entries,
        bytes,
        base_bytes: v.lowered.shared_bytes as usize,
        most_bytes: gather_room_most(dev),
        programs: blocks,
        kept_tiles,
        tile_elems: p.tile_elems,
        walk: p.walk,
    };
    private_copies::plan(&shape, |total| {
        let per_sm = v
            .function
            .occupancy_max_active_blocks_per_multiprocessor(v.lowered.threads, total, None)
            .map_err(driver(
                "reading the occupancy of a kernel with private copies",
            ))?;
        Ok((dev.sm_count() as u64).saturating_mul(u64::from(per_sm.max(1))))
    })
}

/// Bytes the kernel's own `__shared__` words (a reduction's flag, a few
/// counters) may take beside the dynamic shared memory.
const STATIC_SHARED: usize = 1024;

/// The most dynamic shared memory a kernel with staged gathers or private
/// copies may be given:
/// the block's opt-in limit, less room for its static words.
fn gather_room_most(dev: &Device) -> usize {
    dev.max_shared_per_block().saturating_sub(STATIC_SHARED)
}

/// Lowers and compiles one variant for `dev` (or takes its cubin from the disk
/// cache). Needs no GPU context: the autotuner runs it on several threads.
pub(crate) fn compile_variant(
    k: &Planned,
    spec: &Spec,
    config: &Config,
    dev: &Device,
) -> Result<(Lowered, jit::Cubin)> {
    let lowered = lower(k, spec, config)?;
    if lowered.shared_bytes as usize > dev.max_shared_per_block() {
        return Err(Error::Codegen(tilefuse_codegen::CodegenError::Config {
            kernel: k.name.clone(),
            config: config.to_string(),
            message: format!(
                "it needs {} bytes of shared memory per block; {} allows {}",
                lowered.shared_bytes,
                dev.name(),
                dev.max_shared_per_block()
            ),
        }));
    }
    let arch = dev.arch();
    let cubin = jit::compile_cubin(&k.name, &lowered.source, &arch)?;
    tracing::debug!(kernel = %k.name, config = %config, path = lowered.path, "compiled for {arch}");
    Ok((lowered, cubin))
}

/// Loads a compiled variant into `dev`'s context.
pub(crate) fn load_variant(
    dev: &Device,
    name: &str,
    lowered: Lowered,
    cubin: jit::Cubin,
) -> Result<Variant> {
    let gpu = dev.gpu("loading a compiled kernel")?;
    let module = gpu
        .ctx
        .load_module(Ptx::from_binary(cubin.image))
        .map_err(driver(format!("loading kernel `{name}`")))?;
    let function = module
        .load_function(&lowered.entry)
        .map_err(driver(format!("finding `{}` in its module", lowered.entry)))?;
    // Dynamic shared memory plus the kernel's few static words may pass the
    // 48 KB a launch gets by default even when the dynamic part alone does not.
    // Staged gathers and private copies take what a launch's shapes need, up
    // to the block's most.
    let most = match lowered.gathers.is_empty() && lowered.private.is_none() {
        true => lowered.shared_bytes as usize,
        false => gather_room_most(dev).max(lowered.shared_bytes as usize),
    };
    if most > 0 {
        function
            .set_attribute(
                FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                most as i32,
            )
            .map_err(driver(format!(
                "raising the shared memory limit of `{name}`"
            )))?;
    }
    let site_base = status::register(name, &lowered.wait_sites);
    let blocks_per_sm = function
        .occupancy_max_active_blocks_per_multiprocessor(
            lowered.threads,
            lowered.shared_bytes as usize,
            None,
        )
        .map_err(driver(format!("reading the occupancy of `{name}`")))?
        .max(1);
    let cluster = lowered.cluster.max(1);
    let resident_blocks = if cluster > 1 {
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (cluster, 1, 1),
            block_dim: (lowered.threads, 1, 1),
            shared_mem_bytes: lowered.shared_bytes,
        };
        let clusters = function
            .occupancy_max_active_clusters(cfg, &gpu.stream)
            .map_err(driver(format!(
                "reading how many clusters of `{name}` fit at once"
            )))?;
        u64::from(clusters.max(1)) * u64::from(cluster)
    } else {
        dev.sm_count() as u64 * u64::from(blocks_per_sm)
    };
    Ok(Variant {
        lowered,
        function,
        site_base,
        resident_blocks,
    })
}

/// Reads a config written by the macro as JSON.
fn parse_config(j: &str) -> std::result::Result<Config, String> {
    serde_json::from_str(j).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::{leaving_sms, resident_after_left};

    /// A persistent grid gives up the SMs `leaving_sms` names, as many blocks
    /// as each SM would hold; nested scopes restore the outer value; outside
    /// any, nothing is left.
    #[test]
    fn leaving_sms_takes_the_named_sms_out_of_a_persistent_grid() {
        assert_eq!(resident_after_left(132, 132), 132);
        leaving_sms(16, || {
            assert_eq!(resident_after_left(132, 132), 116);
            // Two blocks an SM: two blocks an SM left.
            assert_eq!(resident_after_left(264, 132), 232);
            // Clusters that leave some SMs unused: the count still comes off.
            assert_eq!(resident_after_left(128, 132), 112);
            leaving_sms(200, || assert_eq!(resident_after_left(132, 132), 0));
            assert_eq!(resident_after_left(132, 132), 116);
        });
        assert_eq!(resident_after_left(132, 132), 132);
    }
}
