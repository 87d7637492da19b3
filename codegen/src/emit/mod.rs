//! Lowering of a checked kernel to self-contained CUDA C, for one specialization
//! and one config, by the lowering its plan chose ([`crate::plan::Planned`]).
//!
//! The registry of lowerings is `LOWERINGS`: each lives in its own folder
//! here (its plan, configs, tuning space, option checks and emitter, behind
//! `crate::plan::lowering::Lowering`); adding one is its folder, its `mod`
//! line and its entry in the list.

mod attention;
mod expr;
mod gemm;
pub mod general;
mod hopper;
mod options;
pub mod prelude;
mod rows;

pub use attention::{default_wgmma_attention, AtomicProduct, AttentionShape, MoreScores, Packed};
pub use expr::CTy;
pub use gemm::{default_wgmma_config, hopper_tiles, hopper_tiles_for, GemmShape, HopperTiles};
/// The device helpers of the Hopper lowerings (after [`prelude::PRELUDE`]):
/// `mbarrier`s, among them the bounded `tf_mbar_wait`, TMA and `wgmma` descriptors.
pub use hopper::HELPERS as HOPPER_HELPERS;

use crate::check::{check, Checked};
use crate::config::Config;
use crate::error::CodegenError;
use crate::ir::*;
use crate::plan::lowering::AnyLowering;
use crate::plan::Planned;
use crate::spec::{ScalarKind, Spec};
use expr::ElemCtx;
use std::collections::HashMap;
use std::fmt::Write;

/// The registry: every lowering, in the order they are tried; a kernel takes
/// the first that takes it. Attention and GEMM both look for `addmm` loops
/// (attention's has two, the GEMM's one); the general lowering, last, takes
/// every kernel.
pub(crate) static LOWERINGS: &[&dyn AnyLowering] = &[
    &attention::lowering::Attention,
    &gemm::lowering::Gemm,
    &rows::lowering::Rows,
    &general::lowering::General,
];

/// One kernel parameter, in the order the generated function takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Param {
    /// Device address of a tensor's first element.
    TensorPtr(TensorId),
    /// Size of a tensor along a dimension (`long long`).
    TensorDim(TensorId, usize),
    /// Stride of a tensor along a dimension, in elements (`long long`).
    TensorStride(TensorId, usize),
    /// A runtime scalar: `long long` or `float` per [`ScalarKind`].
    Scalar(ScalarId),
    /// Device address of the status block (see [`prelude::STATUS_WORDS`]).
    Status,
    /// How long a `wait` spins before giving up, in nanoseconds (`unsigned long long`).
    WaitTimeoutNs,
    /// Added to a `wait` site's index in the status block, so the host can tell which
    /// kernel and site timed out (`unsigned long long`).
    SiteBase,
    /// Split tail ([`SplitTail`]): how many output tiles run as one program each
    /// (`long long`); every later tile is split along K.
    SplitWhole,
    /// Split tail: the most programs that share one split tile (`int`, 1 = no
    /// split); the scratch holds this many partial tiles per split tile.
    SplitWays,
    /// Split tail, Hopper path: how many programs share the split tiles' K
    /// iterations, evenly and in order (`long long`): `split × ways` for an even
    /// split, one wave of programs for stream-K.
    SplitParts,
    /// Split tail: f32 scratch for partial accumulators, `tiles × ways × BM × BN` (`float*`).
    SplitPartials,
    /// Split tail: one arrival counter per split tile, zero at launch (`unsigned*`).
    SplitCounters,
    /// A persistent kernel's tile counter (`unsigned*`), zero at launch: each
    /// block takes its next tile with `atomicInc`, whose wrap leaves it zero
    /// again once every block has taken its last (see the attention walk).
    TileCounter,
    /// Bytes of shared memory the launch added for staged gathers
    /// ([`Lowered::gathers`]), 0 for none (`long long`).
    StageCap,
    /// 1 where the launch gave the kernel's private copies of atomically
    /// added tensors shared memory ([`Lowered::private`]), else 0 (`int`).
    PrivateOn,
    /// A TMA descriptor (`CUtensorMap`, 128 bytes, passed by value) of a tensor of
    /// 2 to 5 dimensions with its last dimension contiguous: boxes of `box_outer`
    /// rows by `box_inner` elements (one index of each other dimension), 128-byte
    /// swizzle, zeros outside the tensor.
    TensorMap {
        tensor: TensorId,
        box_inner: usize,
        box_outer: usize,
        /// The dimension (0: the outermost) the box's rows run along; `None`:
        /// the one before the last (a row-major matrix's rows). Packed
        /// `[total, H, D]` sequences take `Some(0)`.
        rows_axis: Option<usize>,
    },
}

/// A GEMM whose last, partial wave of output tiles can be split along K: the
/// runtime picks how many tiles run whole and how many programs share each of the
/// others (see `runtime::kernel`), from the shapes and the GPU's SM count. The
/// programs of a split tile add their partial sums in a fixed order, so results do
/// not depend on which finishes first.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitTail {
    /// Extents of the M, N and K tile dimensions.
    pub m: ScalarId,
    pub n: ScalarId,
    pub k: ScalarId,
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    /// The split tiles' K iterations are shared by one wave of programs, a
    /// program crossing tile boundaries ([`Config::stream_k`]), rather than
    /// split evenly within each tile.
    pub stream_k: bool,
    /// The fewest K tiles a part of a split tile keeps (the split tail's, not
    /// stream-K's): below it the part's fixed costs, filling the pipeline and
    /// the fix-up through scratch, outweigh the idle SMs it saves.
    pub min_part_k_tiles: usize,
}

/// A general kernel whose first tile loop its programs may share
/// (`general::split`): the runtime launches `ways` programs per grid tile
/// (up to `most`), each walking a contiguous share of the loop's tiles, with
/// `share_bytes` of scratch per program for its accumulators
/// ([`Param::SplitPartials`]) and an arrival counter per grid tile
/// ([`Param::SplitCounters`]); [`Param::SplitWays`] passes `ways`.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitLoopLaunch {
    /// The host scalar holding the loop's extent, and its block.
    pub extent: ScalarId,
    pub block: usize,
    /// The most programs that may share one grid tile's loop ([`Config::split`]).
    pub most: usize,
    pub share_bytes: usize,
}

/// The fewest K tiles per part of the portable path's split tail: there four
/// parts of 4 K tiles beat one whole tile at 1000³ (0.026 against 0.028 ms on an
/// H200, docs/perf-history.md, "Generated bf16 GEMM vs cuBLAS").
pub const PORTABLE_MIN_PART_K_TILES: usize = 4;
/// The Hopper path's: its pipeline takes longer to fill and each part's fix-up
/// moves a whole 128×256 tile, so short parts lose; at 1000³ the default took
/// 0.0236 ms in four parts of 4 K tiles, 0.0224 in two of 8, 0.0188 unsplit
/// (docs/perf-history.md, "the barrier waits' cost found").
pub const HOPPER_MIN_PART_K_TILES: usize = 16;

/// The most programs one launch may have: the lowerings number every
/// program along the grid's x, which CUDA bounds by 2^31 − 1. The runtime
/// refuses a launch beyond it, and interpret mode refuses the same.
pub const MAX_PROGRAMS: u64 = i32::MAX as u64;

/// The generated code and how to launch it.
#[derive(Clone, Debug)]
pub struct Lowered {
    pub source: String,
    /// The `extern "C"` name of the kernel function.
    pub entry: String,
    pub params: Vec<Param>,
    pub threads: u32,
    /// Dynamic shared memory per block, in bytes.
    pub shared_bytes: u32,
    /// The grid is `∏ ceil(extent / block)` over these (extent scalar, block size).
    pub grid: Vec<(ScalarId, usize)>,
    /// For each `wait` site (its index is recorded on timeout), the code as written.
    pub wait_sites: Vec<String>,
    /// Which lowering was taken, for logs.
    pub path: &'static str,
    /// Set for GEMMs that take the split-tail parameters.
    pub split_tail: Option<SplitTail>,
    /// Set for general kernels whose programs may share their first loop.
    pub split_loop: Option<SplitLoopLaunch>,
    /// The blocks loop over the grid's tiles (`pid += gridDim.x`): launch at most as
    /// many as fit on the GPU at once.
    pub persistent: bool,
    /// Blocks per cluster (compiled in with `__cluster_dims__`): the grid holds
    /// this many blocks per program of [`Lowered::grid`].
    pub cluster: u32,
    /// Output tiles a block works on at once (2 with [`Config::pingpong`], one
    /// per consumer warpgroup): a wave holds this many tiles per resident block,
    /// which is what the split tail balances.
    pub tiles_in_flight: u32,
    /// Operands the launch copies into 16-byte aligned scratch first (row pitch a
    /// multiple of 16 bytes): the code reads those copies ([`Config::stage`]).
    pub staged: Vec<TensorId>,
    /// Gathers the kernel stages through shared memory when the launch adds
    /// room for them after [`Lowered::shared_bytes`] (16-byte aligned) and
    /// passes its size as [`Param::StageCap`].
    pub gathers: Vec<general::GatherStage>,
    /// Tensors whose atomics the kernel adds into private copies in shared
    /// memory when the launch gives them room after [`Lowered::shared_bytes`]
    /// (16-byte aligned) and passes [`Param::PrivateOn`]; programs may then
    /// walk the grid. Such a launch gives staged gathers no room (they read
    /// global memory).
    pub private: Option<general::PrivateLaunch>,
    /// A persistent attention forward with the split tail
    /// ([`Config::stream_k`]): the floats of scratch each split tile takes
    /// ([`Param::SplitPartials`], one counter each in
    /// [`Param::SplitCounters`]). The tiles past the last whole wave but one
    /// are split when the waves do not come out even: one wave of blocks
    /// plus the remainder.
    pub split_tiles: Option<usize>,
}

/// Checks `kernel` and lowers it to CUDA C for `spec` and `config`, by the
/// lowering it takes.
pub fn lower(kernel: &Planned, spec: &Spec, config: &Config) -> Result<Lowered, CodegenError> {
    let planned = kernel.for_config(config);
    let kernel = &*planned.specialize(&spec.constexprs)?;
    let kernel = &*kernel.with_literal_types(spec)?;
    let (spec, staged) = crate::staging::staged_spec(kernel, spec, config);
    let spec = &spec;
    let checked = check(kernel, spec)?;
    if config.block_sizes.len() != kernel.dims.len() {
        let names: Vec<&str> = kernel.dims.iter().map(|d| d.name.as_str()).collect();
        return Err(config_err(
            kernel,
            config,
            format!(
                "it gives {} block sizes; the kernel has {} tile dimensions ({})",
                config.block_sizes.len(),
                kernel.dims.len(),
                names.join(", ")
            ),
        ));
    }
    // 12: three consumer warpgroups of a `wgmma` program (its lowering checks
    // that it runs them).
    let warps_ok =
        matches!(config.num_warps, 1 | 2 | 4 | 8 | 16) || (config.wgmma && config.num_warps == 12);
    if !warps_ok {
        return Err(config_err(
            kernel,
            config,
            "num_warps must be 1, 2, 4, 8 or 16 (or 12 with `wgmma`, on the Hopper attention program)",
        ));
    }
    if config.num_stages == 0 {
        return Err(config_err(
            kernel,
            config,
            "num_stages must be at least 1 (1: each tile loaded at its step; the matmul paths take 2 to 8)",
        ));
    }
    if let Some(b) = config.block_sizes.iter().find(|&&b| b == 0 || b > 16384) {
        return Err(config_err(
            kernel,
            config,
            format!("block size {b} is outside 1..=16384"),
        ));
    }
    if config.cluster_m != 1 && !(config.wgmma && config.cluster_m == 2) {
        return Err(config_err(
            kernel,
            config,
            "cluster_m takes 1, or 2 on the Hopper (wgmma) matmul path",
        ));
    }
    if config.stream_k && !config.wgmma {
        return Err(config_err(
            kernel,
            config,
            "stream-K is an option of the Hopper (wgmma) matmul path; set `wgmma` too, or drop `stream_k`",
        ));
    }
    if config.tma_store && !config.wgmma {
        return Err(config_err(
            kernel,
            config,
            "the TMA-store epilogue is an option of the Hopper (wgmma) matmul path; set `wgmma` too, or drop `tma_store`",
        ));
    }
    if config.pingpong && !config.wgmma {
        return Err(config_err(
            kernel,
            config,
            "ping-pong is an option of the Hopper (wgmma) matmul path; set `wgmma` and `persistent` too, or drop `pingpong`",
        ));
    }
    if config.persistent && !config.wgmma {
        return Err(config_err(
            kernel,
            config,
            "a persistent grid is an option of the Hopper (wgmma) matmul path; set `wgmma` too, or drop `persistent`",
        ));
    }
    kernel.chosen().check_options(kernel, config)?;
    let mut e = Emitter::new(kernel, kernel.lowering(), spec, &checked, config);
    let mut lowered = kernel.chosen().emit(&mut e)?;
    lowered.staged = staged;
    Ok(lowered)
}

/// `e` with every variable in `vars` replaced by its expression.
pub(crate) fn inline(e: &Expr, vars: &HashMap<VarId, Expr>) -> Expr {
    rewrite(e, &mut |x| match x {
        Expr::Var(v) => vars.get(v).cloned(),
        _ => None,
    })
}

/// `e` with each sub-expression `x` for which `f(x)` gives a replacement
/// replaced by it (outermost first; a replacement is not visited again).
pub(crate) fn rewrite(e: &Expr, f: &mut impl FnMut(&Expr) -> Option<Expr>) -> Expr {
    if let Some(r) = f(e) {
        return r;
    }
    e.map_children(&mut |x| rewrite(x, f))
}

/// Whether `e` reads variable `v`.
pub(crate) fn reads_var(e: &Expr, v: VarId) -> bool {
    let mut found = false;
    e.walk(&mut |x| found |= matches!(x, Expr::Var(w) if *w == v));
    found
}

pub(crate) fn config_err(k: &Kernel, c: &Config, message: impl Into<String>) -> CodegenError {
    CodegenError::Config {
        kernel: k.name.clone(),
        config: c.to_string(),
        message: message.into(),
    }
}

/// Shared state of the lowerings: the output text and what it has declared.
pub(crate) struct Emitter<'a> {
    pub k: &'a Kernel,
    /// The name of the lowering that took the kernel, for errors.
    pub lowering: &'static str,
    pub spec: &'a Spec,
    pub checked: &'a Checked,
    pub cfg: &'a Config,
    pub out: String,
    pub wait_sites: Vec<String>,
    /// Scalar `let`s materialized as C locals.
    pub named_vars: HashMap<VarId, String>,
    /// Tile `let`s, inlined where used.
    pub inline_vars: HashMap<VarId, Expr>,
    /// The threads that run the tile's stores, for a `signal` after them: this
    /// thread's index among them (an expression) and a barrier over them.
    pub storers: (String, String),
    /// The Hopper path's TMA-store epilogue ([`Config::tma_store`]): the store
    /// to this tensor goes through shared memory (see `tma_store`).
    pub tma_store: Option<TmaStore>,
    /// Where values are only rounded to 16-bit floats.
    pub narrow: crate::narrow::Narrow,
    /// Float values known to be bounded integers ([`crate::integral`]).
    pub integral: crate::integral::Integral,
}

/// Where the TMA-store epilogue stages its tile (see `tma_store`): the tensor
/// it stores, the output tile's N block, and the staging boxes' offset from
/// the ring's base `sA`.
#[derive(Clone, Debug)]
pub(crate) struct TmaStore {
    pub tensor: TensorId,
    pub bn: usize,
    pub offset: usize,
    /// A `signal` follows the store: wait for the TMA unit's writes first.
    pub signal_after: bool,
    /// Fragment row blocks of 64 rows a thread holds (`acc[mi]`).
    pub mi: usize,
    /// The row of box row block `mi` within the tile: `wg * 64` when the
    /// warpgroups share a tile, `mi * 64` when each has its own.
    pub box_row: &'static str,
}

impl<'a> Emitter<'a> {
    fn new(
        k: &'a Kernel,
        lowering: &'static str,
        spec: &'a Spec,
        checked: &'a Checked,
        cfg: &'a Config,
    ) -> Self {
        Emitter {
            k,
            lowering,
            spec,
            checked,
            cfg,
            out: String::new(),
            wait_sites: Vec::new(),
            named_vars: HashMap::new(),
            inline_vars: HashMap::new(),
            storers: ("threadIdx.x".into(), "__syncthreads();".into()),
            tma_store: None,
            narrow: crate::narrow::Narrow::of(k, spec),
            integral: crate::integral::Integral::of(k),
        }
    }

    pub fn entry(&self) -> String {
        format!("tf_{}", self.k.name)
    }

    /// The C bound of dimension `d`'s tiles (its extent, or its loop's end).
    pub fn end(&self, d: DimId) -> String {
        expr::end_of(self.k, d)
    }

    /// The host scalar holding dimension `d`'s extent: the fast paths take
    /// only dimensions that have one.
    pub fn host_extent(&self, d: DimId) -> Result<ScalarId, CodegenError> {
        self.k.dims[d]
            .extent
            .ok_or_else(|| CodegenError::Unsupported {
                kernel: self.k.name.clone(),
                at: self.k.dims[d].name.clone(),
                message: format!(
                    "the {} lowering takes tiles over host extents only",
                    self.path_name()
                ),
            })
    }

    /// The tile dimensions of a plain index (`t[(tm, tn)]`): the fast paths
    /// take no other.
    pub fn plain(&self, index: &[Expr], at: &str) -> Result<Vec<DimId>, CodegenError> {
        plain_index(index).ok_or_else(|| CodegenError::Unsupported {
            kernel: self.k.name.clone(),
            at: at.to_string(),
            message: format!(
                "the {} lowering indexes tensors by tiles only (`t[(tm, tn)]`)",
                self.path_name()
            ),
        })
    }

    fn path_name(&self) -> &'static str {
        self.lowering
    }

    /// A new emitter for the same kernel, specialization and config, with
    /// nothing emitted: for a lowering that hands the kernel to another.
    pub fn fresh(&self) -> Emitter<'a> {
        Emitter::new(self.k, self.lowering, self.spec, self.checked, self.cfg)
    }

    /// An element context with the given dimension coordinates bound.
    pub fn ctx(&self, coords: &[(DimId, String)]) -> ElemCtx<'_> {
        ElemCtx {
            k: self.k,
            spec: self.spec,
            checked: self.checked,
            coords: coords.iter().cloned().collect(),
            within: HashMap::new(),
            named_vars: self.named_vars.clone(),
            inline_vars: self.inline_vars.clone(),
            precomputed: Vec::new(),
            scaled_vars: HashMap::new(),
            narrow: &self.narrow,
            integral: &self.integral,
        }
    }

    /// The prelude, `helpers` (device functions of one lowering), block-size constants
    /// and the kernel signature, up to the opening brace.
    /// Starts the kernel: prelude, `helpers`, and the signature (tensors, scalars,
    /// status words, then `extra` parameters with their C declarations).
    pub fn begin(
        &mut self,
        threads: usize,
        min_blocks: usize,
        helpers: &str,
        extra: &[(Param, &str)],
    ) -> Vec<Param> {
        let mut params = Vec::new();
        let mut sig = Vec::new();
        for (t, ts) in self.spec.tensors.iter().enumerate() {
            params.push(Param::TensorPtr(t));
            sig.push(format!("{}* t{t}", ts.dtype.c_storage()));
            for i in 0..ts.rank {
                params.push(Param::TensorDim(t, i));
                sig.push(format!("long long t{t}_n{i}"));
            }
            for i in 0..ts.rank {
                params.push(Param::TensorStride(t, i));
                sig.push(format!("long long t{t}_s{i}"));
            }
        }
        for (s, kind) in self.spec.scalars.iter().enumerate() {
            params.push(Param::Scalar(s));
            sig.push(match kind {
                ScalarKind::Float => format!("float s{s}"),
                _ => format!("long long s{s}"),
            });
        }
        params.push(Param::Status);
        sig.push("tf_status* tf_st".into());
        params.push(Param::WaitTimeoutNs);
        sig.push("tf_u64 tf_timeout_ns".into());
        params.push(Param::SiteBase);
        sig.push("tf_u64 tf_site_base".into());
        for (p, decl) in extra {
            params.push(*p);
            sig.push(decl.to_string());
        }

        self.out.push_str(&prelude::prelude());
        self.out.push_str(helpers);
        let _ = writeln!(
            self.out,
            "\n// kernel `{}`, config: {}",
            self.k.name, self.cfg
        );
        for (d, b) in self.cfg.block_sizes.iter().enumerate() {
            let _ = writeln!(
                self.out,
                "#define B{d} {b}  // tile `{}`",
                self.k.dims[d].name
            );
        }
        // Clusters are compiled in, so a plain launch forms them.
        let cluster = match self.cfg.cluster_m {
            1 => String::new(),
            n => format!("__cluster_dims__({n}, 1, 1) "),
        };
        let _ = writeln!(
            self.out,
            "\nextern \"C\" __global__ void {cluster}__launch_bounds__({threads}, {min_blocks}) {}(\n    {}) {{",
            self.entry(),
            sig.join(",\n    ")
        );
        params
    }

    /// Emits a block-uniform statement (a scalar `let` or a `wait`); returns false
    /// for statements that are not block-level.
    pub fn block_stmt(&mut self, s: &Stmt, indent: &str) -> Result<bool, CodegenError> {
        match s {
            Stmt::Let { var, value, at } if self.checked.vars[*var].dims.is_empty() => {
                let (c, ty) = self.ctx(&[]).emit(value, at)?;
                let cty = ty.c();
                let name = format!("v{var}");
                let _ = writeln!(
                    self.out,
                    "{indent}const {cty} {name} = {c};  // {}",
                    self.k.vars[*var].name
                );
                self.named_vars.insert(*var, name);
                Ok(true)
            }
            Stmt::Wait { at, .. } => {
                let test = self.wait_test(s, &format!("{indent}  "), "tf_abort")?;
                let at = one_line(at);
                let _ = writeln!(
                    self.out,
                    "{indent}{{  // {at}\n\
                     {indent}  __shared__ int tf_abort;\n\
                     {indent}  if (threadIdx.x == 0) {{\n\
                     {test}\
                     {indent}  }}\n\
                     {indent}  __syncthreads();\n\
                     {indent}  if (tf_abort) return;\n\
                     {indent}}}"
                );
                Ok(true)
            }
            Stmt::Signal {
                tensor,
                index,
                value,
                at,
            } => {
                if !self.spec.tensors[*tensor].last_contiguous {
                    return Err(CodegenError::Argument {
                        kernel: self.k.name.clone(),
                        arg: self.k.tensors[*tensor].name.clone(),
                        message: "counters passed to `signal` must be contiguous (stride 1)".into(),
                    });
                }
                let (ic, _) = self.ctx(&[]).emit(index, at)?;
                let (vc, _) = self.ctx(&[]).emit(value, at)?;
                let (tid, sync) = &self.storers;
                // A tile past the end of the grid (a cluster's second block on
                // the last row of tiles) stored nothing and signals nothing.
                let inside: String = self
                    .k
                    .grid
                    .iter()
                    .map(|&d| format!(" && tb{d} < {}", self.end(d)))
                    .collect();
                // Every storing thread's stores happen before the barrier; the
                // system-scope fence after it is cumulative, so they are visible
                // (to the copy engine, to peers) before the count moves. Only the
                // signalling thread computes the index (a division: held by
                // every thread, it cost the ring's epilogue a spill).
                let _ = writeln!(
                    self.out,
                    "{indent}{{  // {at}\n\
                     {indent}  {sync}\n\
                     {indent}  if ({tid} == 0{inside}) {{\n\
                     {indent}    const long long tf_si = {ic};\n\
                     {indent}    if (tf_si >= 0 && tf_si < t{tensor}_n0) {{\n\
                     {indent}      __threadfence_system();\n\
                     {indent}      atomicAdd_system((unsigned int*)t{tensor} + tf_si, (unsigned int)({vc}));\n\
                     {indent}    }}\n\
                     {indent}  }}\n\
                     {indent}}}",
                    at = one_line(at)
                );
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The C pieces of a `wait`: flags (pointer and length), first index, end
    /// (`None`: one flag), value, site number.
    fn wait_parts(&mut self, s: &Stmt) -> Result<Option<WaitParts>, CodegenError> {
        let Stmt::Wait {
            tensor,
            index,
            end,
            value,
            at,
        } = s
        else {
            return Ok(None);
        };
        if !self.spec.tensors[*tensor].last_contiguous {
            return Err(CodegenError::Argument {
                kernel: self.k.name.clone(),
                arg: self.k.tensors[*tensor].name.clone(),
                message: "flags passed to `wait` must be contiguous (stride 1)".into(),
            });
        }
        let site = self.wait_sites.len();
        self.wait_sites.push(at.clone());
        let (lo, _) = self.ctx(&[]).emit(index, at)?;
        let (value, _) = self.ctx(&[]).emit(value, at)?;
        let end = match end {
            Some(end) => Some(self.ctx(&[]).emit(end, at)?.0),
            None => None,
        };
        Ok(Some(WaitParts {
            at: one_line(at),
            flags: format!("(const tf_u32*)t{tensor}, t{tensor}_n0"),
            lo,
            end,
            value,
            site: format!("tf_site_base + {site}ull"),
        }))
    }

    /// The code of one thread's bounded spin for a `wait` statement: it sets `failed`
    /// (an int lvalue) to 1 when a flag did not arrive in time (the status block then
    /// says which), else to 0. A range is waited flag by flag (every flag must pass,
    /// so their order does not matter) and stops at the first timeout.
    pub fn wait_test(
        &mut self,
        s: &Stmt,
        indent: &str,
        failed: &str,
    ) -> Result<String, CodegenError> {
        let Some(p) = self.wait_parts(s)? else {
            return Ok(String::new());
        };
        let WaitParts {
            flags,
            lo,
            value,
            site,
            ..
        } = &p;
        Ok(match &p.end {
            None => format!(
                "{indent}  {failed} = !tf_wait_flag({flags}, {lo}, {value}, tf_timeout_ns, tf_st, {site});\n"
            ),
            Some(end) => format!(
                "{indent}  {failed} = 0;\n\
                 {indent}  const long long tf_hi = {end};\n\
                 {indent}  for (long long tf_i = {lo}; tf_i < tf_hi && !{failed}; ++tf_i)\n\
                 {indent}    {failed} = !tf_wait_flag({flags}, tf_i, {value}, tf_timeout_ns, tf_st, {site});\n"
            ),
        })
    }

    /// The `wait`s inside a GEMM's K loop ([`GemmShape::k_waits`]) for k-tile
    /// `kt` of `bk` columns: `decls` go before the loop, `test` before the
    /// k-tile's loads. Each site keeps the last range that passed, so the
    /// k-tiles of one chunk cost a compare; `after` runs after a wait that ran
    /// (TMA reads through the async proxy and needs a fence).
    pub fn k_wait_code(
        &mut self,
        g: &GemmShape,
        kt: &str,
        bk: usize,
        indent: &str,
        failed: &str,
        after: &str,
    ) -> Result<(String, String), CodegenError> {
        let (mut decls, mut test) = (String::new(), String::new());
        let k = self.k;
        for (n, s) in g.k_waits(k).iter().enumerate() {
            // A branch left here would be a kernel lowered unspecialized: its
            // waits must not be dropped in silence.
            let Some(p) = self.wait_parts(s)? else {
                return Err(CodegenError::Unsupported {
                    kernel: k.name.clone(),
                    at: String::new(),
                    message: "a branch around a `wait` in the K loop was not decided: lower the kernel specialized for its `#[constexpr]` values".into(),
                });
            };
            let WaitParts {
                flags,
                lo,
                value,
                site,
                at,
                ..
            } = &p;
            let hi = p.end.clone().unwrap_or_else(|| "tf_lo + 1".into());
            let dk = g.k;
            let after = match after {
                "" => String::new(),
                a => format!("{indent}    {a}\n"),
            };
            let _ = writeln!(
                decls,
                // 32 bits of each end: a flag tensor holds fewer than 2^31 flags,
                // and a false mismatch only repeats a wait that passes.
                "{indent}int tf_kw{n}_lo = -1, tf_kw{n}_hi = -1;"
            );
            let _ = write!(
                test,
                "{indent}{{  // {at}\n\
                 {indent}  [[maybe_unused]] const long long tb{dk} = (long long)({kt}) * {bk};\n\
                 {indent}  const long long tf_lo = {lo}, tf_hi = {hi};\n\
                 {indent}  if (!{failed} && ((int)tf_lo != tf_kw{n}_lo || (int)tf_hi != tf_kw{n}_hi)) {{\n\
                 {indent}    for (long long tf_i = tf_lo; tf_i < tf_hi && !{failed}; ++tf_i)\n\
                 {indent}      {failed} = !tf_wait_flag_at({flags}, tf_i, {value}, tf_timeout_ns, tf_st, {site});\n\
                 {indent}    tf_kw{n}_lo = (int)tf_lo; tf_kw{n}_hi = (int)tf_hi;\n\
                 {after}\
                 {indent}  }}\n\
                 {indent}}}\n"
            );
        }
        Ok((decls, test))
    }

    /// Binds a tile `let`: its expression with the current values of the other
    /// inlined variables substituted now, so later reassignments do not leak in.
    /// The value is converted to the variable's dtype, as a variable holds
    /// it (a bf16 variable assigned an f32 value holds it rounded).
    pub fn bind_inline(&mut self, var: VarId, value: &Expr) {
        let v = inline(value, &self.inline_vars);
        let want = self.checked.vars[var].dtype;
        let have = crate::check::type_of(self.k, self.spec, self.checked, &v).map(|t| t.dtype);
        let v = match have {
            Some(t) if t != want => Expr::Cast {
                arg: Box::new(v),
                dtype: Some(want),
            },
            _ => v,
        };
        self.inline_vars.insert(var, v);
    }

    pub fn finish(
        &mut self,
        params: Vec<Param>,
        threads: usize,
        shared_bytes: usize,
        path: &'static str,
    ) -> Lowered {
        // The checker gives every grid dimension a host extent.
        let grid = self
            .k
            .grid
            .iter()
            .filter_map(|&d| Some((self.k.dims[d].extent?, self.cfg.block_sizes[d])))
            .collect();
        Lowered {
            entry: self.entry(),
            source: std::mem::take(&mut self.out),
            params,
            threads: threads as u32,
            shared_bytes: shared_bytes as u32,
            grid,
            wait_sites: std::mem::take(&mut self.wait_sites),
            path,
            split_tail: None,
            split_loop: None,
            persistent: false,
            cluster: 1,
            tiles_in_flight: 1,
            staged: Vec::new(),
            gathers: Vec::new(),
            private: None,
            split_tiles: None,
        }
    }
}

/// Kernel source text for a `// ...` comment of the generated code: one line, so
/// the code after it is not commented out.
pub(crate) fn one_line(at: &str) -> String {
    at.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// See [`Emitter::wait_parts`].
struct WaitParts {
    /// The statement's source, on one line.
    at: String,
    flags: String,
    lo: String,
    end: Option<String>,
    value: String,
    site: String,
}
