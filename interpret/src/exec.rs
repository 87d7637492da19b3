//! Running a kernel's programs: the statements and expressions of the tile IR,
//! each with the meaning its CUDA C lowering has.

use crate::error::{InterpretError, OutOfBounds};
use crate::tensor::HostTensor;
use crate::tile::{for_each_position, Tile};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tilefuse_codegen::ir::*;
use tilefuse_codegen::Config;

use crate::eval::is_int;

/// A runtime scalar argument, as the GPU launch takes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Int(i64),
    Float(f32),
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
    kernel: &Kernel,
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

/// [`run`] with [`Options`].
pub fn run_with(
    kernel: &Kernel,
    config: &Config,
    constexprs: &[i64],
    tensors: &[HostTensor],
    scalars: &[Scalar],
    options: &Options,
) -> Result<(), InterpretError> {
    let k = &*kernel
        .specialize(constexprs)
        .map_err(|e| InterpretError::Unsupported {
            kernel: kernel.name.clone(),
            message: e.to_string(),
        })?;
    let arg = |arg: &str, message: String| InterpretError::Argument {
        kernel: k.name.clone(),
        arg: arg.into(),
        message,
    };
    if tensors.len() != k.tensors.len() || scalars.len() != k.scalars.len() {
        return Err(arg(
            "(arguments)",
            format!(
                "{} tensors and {} scalars given; the kernel takes {} and {}",
                tensors.len(),
                scalars.len(),
                k.tensors.len(),
                k.scalars.len()
            ),
        ));
    }
    if constexprs.len() != k.constexprs.len() {
        return Err(arg(
            "(constexprs)",
            format!(
                "{} given, the kernel has {}",
                constexprs.len(),
                k.constexprs.len()
            ),
        ));
    }
    for (t, p) in tensors.iter().zip(&k.tensors) {
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
    if config.block_sizes.len() != k.dims.len() || config.block_sizes.contains(&0) {
        return Err(arg(
            "(config)",
            format!(
                "one block size above 0 per tile dimension ({}) expected, got {:?}",
                k.dims.len(),
                config.block_sizes
            ),
        ));
    }
    let mut extents = Vec::with_capacity(k.dims.len());
    for d in &k.dims {
        match scalars[d.extent] {
            Scalar::Int(e) if e >= 0 => extents.push(e),
            other => {
                return Err(arg(
                    &k.scalars[d.extent].name,
                    format!(
                        "the extent of tile `{}` must be an integer >= 0, got {other:?}",
                        d.name
                    ),
                ))
            }
        }
    }
    for (d, dim) in k.dims.iter().enumerate() {
        if dim.whole && (config.block_sizes[d] as i64) < extents[d] {
            return Err(arg(
                "(config)",
                format!(
                    "tile `{}` is `whole(…)`: its block ({}) must cover its extent ({}); \
                     `tilefuse::codegen::fit_whole_dims` fits it",
                    dim.name, config.block_sizes[d], extents[d]
                ),
            ));
        }
    }
    let p = Program {
        k,
        blocks: &config.block_sizes,
        extents,
        consts: constexprs,
        scalars,
        tensors,
        wait_timeout: options.wait_timeout,
        ranges: vec![None; k.dims.len()],
        vars: vec![None; k.vars.len()],
    };
    // Programs: every combination of the grid dimensions' tiles, numbered with
    // the last grid dimension fastest.
    let counts: Vec<i64> = k
        .grid
        .iter()
        .map(|&d| (p.extents[d] + p.block(d) - 1) / p.block(d))
        .collect();
    let total = counts.iter().product::<i64>().max(0) as usize;
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
                p.enter(d, (rest % counts[g]) * p.block(d));
                rest /= counts[g];
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

#[derive(Clone)]
pub(crate) struct Program<'a> {
    pub(crate) k: &'a Kernel,
    pub(crate) blocks: &'a [usize],
    pub(crate) extents: Vec<i64>,
    pub(crate) consts: &'a [i64],
    pub(crate) scalars: &'a [Scalar],
    pub(crate) tensors: &'a [HostTensor],
    wait_timeout: Duration,
    /// Each tile dimension's current range `[begin, end)`, clipped to its extent.
    pub(crate) ranges: Vec<Option<(i64, i64)>>,
    pub(crate) vars: Vec<Option<Tile>>,
}

impl Program<'_> {
    fn block(&self, d: DimId) -> i64 {
        self.blocks[d] as i64
    }

    fn enter(&mut self, d: DimId, begin: i64) {
        self.ranges[d] = Some((begin, (begin + self.block(d)).min(self.extents[d])));
    }

    pub(crate) fn unsupported(&self, message: String) -> InterpretError {
        InterpretError::Unsupported {
            kernel: self.k.name.clone(),
            message,
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
    fn tiles(&self) -> String {
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
            Stmt::Let { var, value, .. } | Stmt::Assign { var, value, .. } => {
                let v = self.eval(value, None)?;
                self.vars[*var] = Some(v);
            }
            Stmt::Store {
                tensor,
                index,
                value,
                at,
            } => self.store(*tensor, index, value, at)?,
            Stmt::Loop { dim, body, until } => {
                let end = match until {
                    Some(u) => self.int_scalar(u)?.min(self.extents[*dim]),
                    None => self.extents[*dim],
                };
                let mut begin = 0;
                while begin < end {
                    self.enter(*dim, begin);
                    self.stmts(body)?;
                    begin += self.block(*dim);
                }
                self.ranges[*dim] = None;
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
            Stmt::If { at, .. } => {
                return Err(self.unsupported(format!("`{at}` was not specialized away")))
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
            return Err(self.oob(tensor, at, "waits on", vec![i]));
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

    fn oob(
        &self,
        tensor: TensorId,
        at: &str,
        access: &'static str,
        index: Vec<i64>,
    ) -> InterpretError {
        InterpretError::OutOfBounds(Box::new(OutOfBounds {
            kernel: self.k.name.clone(),
            at: at.into(),
            access,
            tensor: self.k.tensors[tensor].name.clone(),
            index,
            shape: self.tensors[tensor].shape().to_vec(),
            tiles: self.tiles(),
        }))
    }

    fn int_scalar(&mut self, e: &Expr) -> Result<i64, InterpretError> {
        let v = self.eval(e, None)?;
        if !v.dims.is_empty() {
            return Err(self.unsupported(
                "a flag index, a flag value or a loop bound must be a scalar".into(),
            ));
        }
        Ok(v.data[0] as i64)
    }

    fn store(
        &mut self,
        tensor: TensorId,
        index: &[DimId],
        value: &Expr,
        at: &str,
    ) -> Result<(), InterpretError> {
        let dtype = self.tensors[tensor].dtype();
        let v = self.eval(value, Some(dtype))?;
        if let Some(&d) = v.dims.iter().find(|d| !index.contains(d)) {
            return Err(self.unsupported(format!(
                "`{at}` stores a value over tile `{}`, which the index does not have",
                self.k.dims[d].name
            )));
        }
        let offsets = self.offsets(tensor, index, at, "writes")?;
        let lens = self.lens(index)?;
        let values = Tile::build(index, &lens, v.int, |pos| v.at(index, pos));
        let t = &self.tensors[tensor];
        for (off, x) in offsets.into_iter().zip(values.data) {
            t.store(off, x);
        }
        Ok(())
    }
    /// The offsets in `tensor` of the current tiles of `index`, row-major over
    /// the tiles, or an error naming the first index outside the tensor.
    fn offsets(
        &self,
        tensor: TensorId,
        index: &[DimId],
        at: &str,
        access: &'static str,
    ) -> Result<Vec<usize>, InterpretError> {
        let lens = self.lens(index)?;
        let begins: Vec<i64> = index
            .iter()
            .map(|&d| self.range(d).map(|r| r.0))
            .collect::<Result<_, _>>()?;
        let t = &self.tensors[tensor];
        let (mut offsets, mut outside) = (Vec::with_capacity(lens.iter().product()), None);
        for_each_position(&lens, |pos| {
            let idx: Vec<i64> = begins.iter().zip(pos).map(|(b, &p)| b + p as i64).collect();
            match t.offset_of(&idx) {
                Some(off) => offsets.push(off),
                None => {
                    outside.get_or_insert(idx);
                }
            }
        });
        match outside {
            Some(idx) => Err(self.oob(tensor, at, access, idx)),
            None => Ok(offsets),
        }
    }

    pub(crate) fn load(
        &self,
        tensor: TensorId,
        index: &[DimId],
        at: &str,
    ) -> Result<Tile, InterpretError> {
        let offsets = self.offsets(tensor, index, at, "reads")?;
        let t = &self.tensors[tensor];
        Ok(Tile {
            dims: index.to_vec(),
            lens: self.lens(index)?,
            int: is_int(t.dtype()),
            data: offsets.into_iter().map(|off| t.load(off)).collect(),
        })
    }
}
