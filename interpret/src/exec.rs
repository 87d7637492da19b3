//! Running a kernel's programs: the statements of the tile IR, each with the
//! meaning its CUDA C lowering has (the expressions are in `eval`).

use crate::error::{InterpretError, OutOfBounds};
use crate::tensor::HostTensor;
use crate::tile::{walk, Tile};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tilefuse_codegen::check::{check_types, Checked, Types};
use tilefuse_codegen::ir::*;
use tilefuse_codegen::prims::cast::{self, Num};
use tilefuse_codegen::prims::wrap_int;
use tilefuse_codegen::prims::AtomicOp;
use tilefuse_codegen::{CodegenError, Config, DType, Planned, ScalarKind, Spec, TensorSpec};

/// A runtime scalar argument, as the GPU launch takes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    /// A 64-bit integer (an extent, an `i64`/`u64`/`usize`).
    Int(i64),
    Float(f32),
    /// An `i32` (or narrower signed, `u8`, `u16`): computed as i32.
    I32(i32),
    /// A `u32`: computed as u32.
    U32(u32),
}

impl Scalar {
    /// The value of an integer scalar.
    pub fn int(self) -> Option<i64> {
        match self {
            Scalar::Int(v) => Some(v),
            Scalar::I32(v) => Some(i64::from(v)),
            Scalar::U32(v) => Some(i64::from(v)),
            Scalar::Float(_) => None,
        }
    }
}

/// How a run waits, and on how many threads.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// How long a `wait` waits for its flag before the run fails with
    /// [`InterpretError::WaitTimeout`] (the GPU's `TILEFUSE_WAIT_TIMEOUT_MS`).
    pub wait_timeout: Duration,
    /// Threads running programs at once (0: one per core). Programs are taken
    /// in grid order; as on the GPU, they may finish in any order, and one that
    /// waits on a flag holds only its own thread.
    pub threads: usize,
}

impl Default for Options {
    /// Waits of 10 s, the GPU's default; one thread per core.
    fn default() -> Options {
        Options {
            wait_timeout: Duration::from_secs(10),
            threads: 0,
        }
    }
}

/// Runs every program of `kernel` on the host, taken in grid order by one
/// thread per core ([`Options::threads`]), with `config`'s block sizes:
/// `tensors` and `scalars` in the kernel's parameter order,
/// `constexprs` the values of its `#[constexpr]` parameters. Stores go to the
/// tensors' memory; a `wait` waits up to 10 s for another thread or process to
/// set its flag ([`run_with`] sets the time).
pub fn run(
    kernel: &Planned,
    config: &Config,
    constexprs: &[i64],
    tensors: &[HostTensor],
    scalars: &[Scalar],
) -> Result<(), InterpretError> {
    run_with(
        kernel,
        config,
        constexprs,
        tensors,
        scalars,
        &Options::default(),
    )
}

/// The specialization a GPU launch with these arguments compiles for.
fn spec_of(tensors: &[HostTensor], scalars: &[Scalar], constexprs: &[i64]) -> Spec {
    Spec {
        tensors: tensors
            .iter()
            .map(|t| TensorSpec {
                dtype: t.dtype(),
                rank: t.shape().len(),
                last_contiguous: t.strides().last().is_none_or(|&s| s == 1),
                // Any value: interpret mode has no vector accesses to align.
                align: 16,
            })
            .collect(),
        scalars: scalars
            .iter()
            .map(|s| match s {
                Scalar::Int(_) => ScalarKind::Int,
                Scalar::Float(_) => ScalarKind::Float,
                Scalar::I32(_) => ScalarKind::I32,
                Scalar::U32(_) => ScalarKind::U32,
            })
            .collect(),
        constexprs: constexprs.to_vec(),
    }
}

/// The interpreter's error for a refusal of the checks or the lowering: an
/// argument error stays one, anything else is [`InterpretError::Refused`].
fn refused(e: CodegenError) -> InterpretError {
    match e {
        CodegenError::Argument {
            kernel,
            arg,
            message,
        } => InterpretError::Argument {
            kernel,
            arg,
            message,
        },
        other => InterpretError::Refused(other),
    }
}

/// [`run`] with [`Options`].
pub fn run_with(
    kernel: &Planned,
    config: &Config,
    constexprs: &[i64],
    tensors: &[HostTensor],
    scalars: &[Scalar],
    options: &Options,
) -> Result<(), InterpretError> {
    let arg = |arg: &str, message: String| InterpretError::Argument {
        kernel: kernel.name.clone(),
        arg: arg.into(),
        message,
    };
    if tensors.len() != kernel.tensors.len() || scalars.len() != kernel.scalars.len() {
        return Err(arg(
            "(arguments)",
            format!(
                "{} tensors and {} scalars given; the kernel takes {} and {}",
                tensors.len(),
                scalars.len(),
                kernel.tensors.len(),
                kernel.scalars.len()
            ),
        ));
    }
    if constexprs.len() != kernel.constexprs.len() {
        return Err(arg(
            "(constexprs)",
            format!(
                "{} given, the kernel has {}",
                constexprs.len(),
                kernel.constexprs.len()
            ),
        ));
    }
    for (t, p) in tensors.iter().zip(&kernel.tensors) {
        if t.shape().len() != p.rank {
            return Err(arg(
                &p.name,
                format!(
                    "a tensor of rank {} expected, got shape {:?}",
                    p.rank,
                    t.shape()
                ),
            ));
        }
    }
    if config.block_sizes.len() != kernel.dims.len() || config.block_sizes.contains(&0) {
        return Err(arg(
            "(config)",
            format!(
                "one block size above 0 per tile dimension ({}) expected, got {:?}",
                kernel.dims.len(),
                config.block_sizes
            ),
        ));
    }
    // What the GPU path checks and lowers, refused here as there.
    let spec = spec_of(tensors, scalars, constexprs);
    let k = &*kernel.specialize(constexprs).map_err(refused)?;
    let k = &*k.with_literal_types(&spec).map_err(refused)?;
    let lowered = tilefuse_codegen::lower(k, &spec, config).map_err(refused)?;
    let (checked, types) = check_types(k, &spec).map_err(refused)?;
    let mut extents = vec![None; k.dims.len()];
    for (d, dim) in k.dims.iter().enumerate() {
        let Some(e) = dim.extent else { continue };
        match scalars[e] {
            s if s.int().is_some_and(|v| v >= 0) => extents[d] = s.int(),
            other => {
                return Err(arg(
                    &k.scalars[e].name,
                    format!(
                        "the extent of tile `{}` must be an integer >= 0, got {other:?}",
                        dim.name
                    ),
                ))
            }
        }
        if dim.whole && (config.block_sizes[d] as i64) < extents[d].unwrap_or(0) {
            return Err(arg(
                "(config)",
                format!(
                    "tile `{}` is `whole(…)`: its block ({}) must cover its extent ({}); \
                     `tilefuse::codegen::fit_whole_dims` fits it",
                    dim.name,
                    config.block_sizes[d],
                    extents[d].unwrap_or(0)
                ),
            ));
        }
    }
    // The sizes the launch checks on the GPU path (the lowering masks those
    // accesses by the extents alone), refused here as there.
    for r in k.size_rules() {
        let (Some(want), Some(have)) = (extents[r.dim], tensors[r.tensor].shape().get(r.axis))
        else {
            continue;
        };
        if let Some(message) = r.broken(k, *have as i64, want) {
            return Err(arg(&k.tensors[r.tensor].name, message));
        }
    }
    // `each` dimensions take one index at a time whatever the config says
    // (the general lowering refuses another block for them).
    let blocks: Vec<i64> = k
        .dims
        .iter()
        .zip(&config.block_sizes)
        .map(|(d, &b)| if d.each { 1 } else { b as i64 })
        .collect();
    let p = Program {
        k,
        types: &types,
        checked: &checked,
        blocks: &blocks,
        extents: &extents,
        consts: constexprs,
        scalars,
        tensors,
        wait_timeout: options.wait_timeout,
        fma: lowered.path == "general",
        ranges: vec![None; k.dims.len()],
        vars: vec![None; k.vars.len()],
    };
    // Programs: every combination of the grid dimensions' tiles, numbered with
    // the last grid dimension fastest; `starting_at` rotates each dimension's
    // tiles as the GPU's program decoding does.
    let counts: Vec<i64> = k
        .grid
        .iter()
        .map(|&d| {
            let b = blocks[d];
            (extents[d].unwrap_or(0) + b - 1) / b
        })
        .collect();
    let starts: Vec<i64> = k
        .grid
        .iter()
        .enumerate()
        .map(|(g, &d)| match k.grid_start.get(g).map(|&s| scalars[s]) {
            Some(s) if s.int().is_some() => s.int().unwrap_or(0) / blocks[d],
            _ => 0,
        })
        .collect();
    // As many programs as a GPU launch may have, or the launch's refusal.
    let total = counts
        .iter()
        .try_fold(1u64, |acc, &c| acc.checked_mul(c.max(0) as u64))
        .filter(|&n| n <= tilefuse_codegen::MAX_PROGRAMS)
        .ok_or_else(|| {
            arg(
                "(grid)",
                format!(
                    "{counts:?} tiles make more programs than a launch may have; use larger blocks"
                ),
            )
        })? as usize;
    let threads = match options.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(total);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // The failure of the lowest-numbered program: programs are taken in order,
    // so every program before a taken one was taken too, and this does not
    // depend on timing.
    let failed: Mutex<Option<(usize, InterpretError)>> = Mutex::new(None);
    let worker = |mut p: Program| {
        while !stop.load(Ordering::Relaxed) {
            let id = next.fetch_add(1, Ordering::Relaxed);
            if id >= total {
                return;
            }
            let mut rest = id as i64;
            for (g, &d) in k.grid.iter().enumerate().rev() {
                let t = counts[g];
                let tile = ((rest % t + starts[g] % t) % t + t) % t;
                p.enter(d, tile * p.blocks[d], p.extents[d].unwrap_or(0));
                rest /= t;
            }
            p.vars.iter_mut().for_each(|v| *v = None);
            if let Err(e) = p.stmts(&k.body) {
                stop.store(true, Ordering::Relaxed);
                let mut f = failed.lock().unwrap_or_else(|e| e.into_inner());
                if f.as_ref().is_none_or(|(at, _)| id < *at) {
                    *f = Some((id, e));
                }
                return;
            }
        }
    };
    if threads <= 1 {
        worker(p);
    } else {
        std::thread::scope(|s| {
            for _ in 1..threads {
                let p = p.clone();
                s.spawn(|| worker(p));
            }
            worker(p);
        });
    }
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some((_, e)) => Err(e),
        None => Ok(()),
    }
}

/// One program's state: where its tiles are and what its variables hold.
#[derive(Clone)]
pub(crate) struct Program<'a> {
    pub(crate) k: &'a Kernel,
    /// The checker's type of every expression of `k`.
    pub(crate) types: &'a Types,
    pub(crate) checked: &'a Checked,
    /// Per tile dimension: its block (1 for `each`).
    pub(crate) blocks: &'a [i64],
    /// Per tile dimension: its host extent (`None` for a loop with a range).
    pub(crate) extents: &'a [Option<i64>],
    pub(crate) consts: &'a [i64],
    pub(crate) scalars: &'a [Scalar],
    pub(crate) tensors: &'a [HostTensor],
    wait_timeout: Duration,
    /// `addmm` as the general lowering computes it: one FMA per product, in
    /// order (the tensor-core paths add a K block's products, then round).
    pub(crate) fma: bool,
    /// Each tile dimension's current range `[begin, end)`, clipped to its
    /// extent (or its loop's end).
    pub(crate) ranges: Vec<Option<(i64, i64)>>,
    pub(crate) vars: Vec<Option<Arc<Tile>>>,
}

impl Program<'_> {
    /// Enters the tile of `d` from `begin`, clipped at `end`.
    fn enter(&mut self, d: DimId, begin: i64, end: i64) {
        self.ranges[d] = Some((begin, begin.saturating_add(self.blocks[d]).min(end)));
    }

    pub(crate) fn unsupported(&self, message: String) -> InterpretError {
        InterpretError::Unsupported {
            kernel: self.k.name.clone(),
            message,
        }
    }

    /// The error for a use of a value an integer division by zero poisoned.
    pub(crate) fn divide_by_zero(&self, at: &str) -> InterpretError {
        InterpretError::DivideByZero {
            kernel: self.k.name.clone(),
            at: at.to_string(),
            tiles: self.tiles(),
        }
    }

    pub(crate) fn range(&self, d: DimId) -> Result<(i64, i64), InterpretError> {
        self.ranges[d].ok_or_else(|| {
            self.unsupported(format!(
                "tile `{}` is used outside its loop",
                self.k.dims[d].name
            ))
        })
    }

    pub(crate) fn lens(&self, dims: &[DimId]) -> Result<Vec<usize>, InterpretError> {
        dims.iter()
            .map(|&d| self.range(d).map(|(b, e)| (e - b) as usize))
            .collect()
    }

    /// The tiles in scope, for messages: `tm = 896..1000, tk = 64..128`.
    pub(crate) fn tiles(&self) -> String {
        let parts: Vec<String> = self
            .ranges
            .iter()
            .enumerate()
            .filter_map(|(d, r)| r.map(|(b, e)| format!("{} = {b}..{e}", self.k.dims[d].name)))
            .collect();
        parts.join(", ")
    }

    fn stmts(&mut self, body: &[Stmt]) -> Result<(), InterpretError> {
        for s in body {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), InterpretError> {
        match s {
            Stmt::Let { var, value, .. } => {
                let v = self.eval(value)?;
                self.vars[*var] = Some(v);
            }
            Stmt::Assign { var, value, .. } => {
                // The variable keeps its type: the value is converted to it.
                let v = self.eval(value)?;
                let dtype = self.checked.vars[*var].dtype;
                let v = if v.dtype == dtype {
                    v
                } else {
                    let mut t = Tile::clone(&v);
                    t.data.iter_mut().for_each(|x| *x = cast::cpu(*x, dtype));
                    t.dtype = dtype;
                    Arc::new(t)
                };
                self.vars[*var] = Some(v);
            }
            Stmt::Store {
                tensor,
                index,
                value,
                ..
            } => {
                self.store(*tensor, index, value, None)?;
            }
            Stmt::Atomic {
                op,
                tensor,
                index,
                value,
                old,
                ..
            } => {
                let before = self.store(*tensor, index, value, Some(*op))?;
                if let Some(v) = old {
                    self.vars[*v] = Some(Arc::new(before));
                }
            }
            Stmt::Loop {
                dim,
                body,
                until,
                range,
            } => {
                let (begin, end) = match range {
                    Some(r) => (self.int_scalar(&r.begin)?, self.int_scalar(&r.end)?),
                    None => match self.extents[*dim] {
                        Some(e) => (0, e),
                        None => {
                            return Err(self.unsupported(format!(
                                "the loop over `{}` has no bounds",
                                self.k.dims[*dim].name
                            )))
                        }
                    },
                };
                // Tiles end where the dimension's extent does (a range's end
                // for a loop without one), as the GPU's masks do.
                let clip = self.extents[*dim].unwrap_or(end);
                let mut tb = begin;
                loop {
                    // The bound is tested before each step, as the GPU's `for` does.
                    let stop = match until {
                        Some(u) => end.min(self.int_scalar(u)?),
                        None => end,
                    };
                    if tb >= stop {
                        break;
                    }
                    self.enter(*dim, tb, clip);
                    self.stmts(body)?;
                    tb = tb.saturating_add(self.blocks[*dim]);
                }
                self.ranges[*dim] = None;
            }
            Stmt::If {
                cond,
                then,
                otherwise,
                ..
            } => {
                if self.cond(cond)? {
                    self.stmts(then)?;
                } else {
                    self.stmts(otherwise)?;
                }
            }
            Stmt::Wait {
                tensor,
                index,
                end,
                value,
                at,
            } => {
                let lo = self.int_scalar(index)?;
                let hi = match end {
                    Some(e) => self.int_scalar(e)?,
                    None => lo + 1,
                };
                let want = self.int_scalar(value)?;
                for i in lo..hi {
                    self.wait_for(*tensor, i, want, at)?;
                }
            }
            Stmt::Signal {
                tensor,
                index,
                value,
                ..
            } => {
                let i = self.int_scalar(index)?;
                let add = self.int_scalar(value)?;
                let t = &self.tensors[*tensor];
                // Outside the tensor a signal adds nothing, as on the GPU.
                if let Some(off) = t.flat_offset(i) {
                    t.memory()
                        .add_flag(off, add as u32)
                        .map_err(|e| self.unsupported(e.to_string()))?;
                }
            }
        }
        Ok(())
    }

    /// Waits until flag `i` of `tensor` (indexed flat, as on the GPU) holds at
    /// least `want`, or the timeout passes: spinning first, then yielding, then
    /// sleeping, so a waiter does not starve the thread that sets the flag.
    fn wait_for(
        &self,
        tensor: TensorId,
        i: i64,
        want: i64,
        at: &str,
    ) -> Result<(), InterpretError> {
        let t = &self.tensors[tensor];
        let Some(off) = t.flat_offset(i) else {
            return Err(InterpretError::OutOfBounds(Box::new(OutOfBounds {
                kernel: self.k.name.clone(),
                at: at.into(),
                access: "waits on",
                tensor: self.k.tensors[tensor].name.clone(),
                index: vec![i],
                shape: t.shape().to_vec(),
                tiles: self.tiles(),
            })));
        };
        let read = || {
            t.memory()
                .load_flag(off)
                .map_err(|e| self.unsupported(e.to_string()))
        };
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            let seen = read()?;
            if i64::from(seen) >= want {
                return Ok(());
            }
            if start.elapsed() >= self.wait_timeout {
                return Err(InterpretError::WaitTimeout {
                    kernel: self.k.name.clone(),
                    at: at.into(),
                    index: i,
                    expected: want,
                    seen: i64::from(seen),
                    timeout_ms: self.wait_timeout.as_millis() as u64,
                });
            }
            polls += 1;
            match polls {
                0..=100 => std::hint::spin_loop(),
                101..=1000 => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(100)),
            }
        }
    }

    /// The value of `e`, an integer scalar (a loop bound, a flag's index).
    pub(crate) fn int_scalar(&self, e: &Expr) -> Result<i64, InterpretError> {
        let v = self.eval(e)?;
        if !v.dims.is_empty() {
            return Err(self.unsupported(
                "a flag index, a flag value or a loop bound must be a scalar".into(),
            ));
        }
        if let Some(at) = v.bad(0) {
            return Err(self.divide_by_zero(at));
        }
        Ok(match cast::cpu(v.data[0], DType::I64) {
            Num::I(i) => i,
            Num::F(x) => x as i64,
        })
    }

    /// `tensor[index] = value`, or with `op` an atomic update: one element per
    /// element of the index's (and the value's) tiles, skipped where an index
    /// leaves the tensor. A store converts the value to the tensor's dtype;
    /// an atomic combines it with the element as the GPU's atomics do.
    /// Returns what each place held before an atomic (0 where skipped, and
    /// for a store).
    fn store(
        &mut self,
        tensor: TensorId,
        index: &[Expr],
        value: &Expr,
        op: Option<AtomicOp>,
    ) -> Result<Tile, InterpretError> {
        let v = self.eval(value)?;
        let comps = index
            .iter()
            .map(|c| self.eval(c))
            .collect::<Result<Vec<_>, _>>()?;
        let mut dims = v.dims.clone();
        for c in &comps {
            dims.extend(&c.dims);
        }
        dims.sort_unstable();
        dims.dedup();
        let lens = self.lens(&dims)?;
        let mut strides = vec![self.strides(&v, &dims, &lens)?];
        for c in &comps {
            strides.push(self.strides(c, &dims, &lens)?);
        }
        let t = &self.tensors[tensor];
        let dtype = t.dtype();
        let zero = cast::cpu(Num::I(0), dtype);
        let mut before = vec![zero; lens.iter().product()];
        let mut idx = vec![0i64; comps.len()];
        walk(&lens, &strides, |i, _, offs| {
            for (a, c) in comps.iter().enumerate() {
                if let Some(at) = c.bad(offs[a + 1]) {
                    return Err(self.divide_by_zero(at));
                }
                idx[a] = index_value(c.data[offs[a + 1]]);
            }
            let Some(off) = t.offset_at(&idx) else {
                return Ok(());
            };
            if let Some(at) = v.bad(offs[0]) {
                return Err(self.divide_by_zero(at));
            }
            let x = v.data[offs[0]];
            match op {
                None => t.store(off, cast::cpu(x, dtype)),
                Some(op) => before[i] = atomic(t, op, off, x),
            }
            Ok(())
        })?;
        Ok(Tile {
            dims,
            lens,
            dtype,
            data: before,
            poison: None,
        })
    }

    /// `t`'s strides along `dims` for broadcasting it (see [`Tile::strides_in`]).
    pub(crate) fn strides(
        &self,
        t: &Tile,
        dims: &[DimId],
        lens: &[usize],
    ) -> Result<Vec<usize>, InterpretError> {
        t.strides_in(dims, lens).ok_or_else(|| {
            let names = |ds: &[DimId]| {
                let v: Vec<&str> = ds.iter().map(|&d| self.k.dims[d].name.as_str()).collect();
                v.join(", ")
            };
            self.unsupported(format!(
                "internal: a value over [{}] ({:?}) does not broadcast to [{}] ({lens:?})",
                names(&t.dims),
                t.lens,
                names(dims)
            ))
        })
    }
}

/// An index component's value (an integer: the checker sees to it).
pub(crate) fn index_value(v: Num) -> i64 {
    match v {
        Num::I(i) => i,
        Num::F(x) => x as i64,
    }
}

/// The C type's dtype a value of `t` is computed in (`int` for the narrow integers).
pub(crate) fn computed(t: DType) -> DType {
    use tilefuse_codegen::dtype::CTy;
    match t.cty() {
        CTy::F32 => DType::F32,
        CTy::Bool => DType::Bool,
        CTy::I32 => DType::I32,
        CTy::U32 => DType::U32,
        CTy::I64 => DType::I64,
    }
}

/// One element of an atomic: `op(old, x)` stored at `off` of `t` atomically;
/// returns `old`. As on the GPU, `x` is first converted to the type the
/// tensor's elements are computed in; floats combine in f32 (bf16/f16
/// elements widened, the result rounded back to them), integers wrap to the
/// tensor's width.
fn atomic(t: &HostTensor, op: AtomicOp, off: usize, x: Num) -> Num {
    let dtype = t.dtype();
    match cast::cpu(x, computed(dtype)) {
        Num::F(v) => t.update(off, |old| {
            let r = tilefuse_codegen::prims::f32r(op.cpu(old.as_f64(), v));
            cast::cpu(Num::F(r), dtype)
        }),
        Num::I(v) => t.update(off, |old| {
            let old = index_value(old);
            Num::I(wrap_int(dtype, op.cpu_int(old, v)))
        }),
    }
}
