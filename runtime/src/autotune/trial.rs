//! Running candidates on the launch's own arguments without disturbing them:
//! every tensor the kernel stores to is replaced by a scratch copy (restored from
//! the original before each run, so in-place kernels see the same input every
//! time), and every flag tensor it `wait`s on by scratch flags that are already
//! set, so a consumer kernel is timed as if its producer were done. Each
//! candidate's outputs are checked against the default config's before it is
//! timed, but those written with an atomic's old values (their order is the
//! atomics', which differs run to run).

use super::search::Measured;
use super::Launch;
use crate::args::TensorArg;
use crate::buffer::{Buffer, Memory};
use crate::device::Device;
use crate::error::{driver, Error, Result};
use crate::kernel::{launch_variant, Variant};
use cudarc::driver::result as cu;
use cudarc::driver::sys::CUevent_flags;
use std::collections::BTreeSet;
use std::sync::Arc;
use tilefuse_codegen::ir::{Expr, Stmt};
use tilefuse_codegen::DType;

/// L2 is flushed before each timed run by writing more than any L2 holds.
const FLUSH_BYTES: usize = 256 << 20;

/// One scratch replacement: the scratch buffer, the original's address, the bytes.
struct Stand {
    scratch: Buffer,
    original: u64,
    dtype: DType,
    output: bool,
    /// Compared with the default config's output: not where the kernel
    /// writes an atomic's old values ([`tilefuse_codegen::ir::Kernel::order_dependent`]),
    /// which two correct runs may order differently.
    compared: bool,
}

pub(crate) struct Trial<'a> {
    dev: &'a Arc<Device>,
    launch: &'a Launch<'a>,
    args: Vec<TensorArg>,
    stands: Vec<Stand>,
    flush: Buffer,
    reference: Vec<Vec<f64>>,
    pub warmup: usize,
    pub reps: usize,
}

/// The bytes a strided view spans from its first element (strides non-negative).
fn span_bytes(t: &TensorArg) -> Option<usize> {
    if t.strides.iter().any(|&s| s < 0) {
        return None;
    }
    if t.shape.contains(&0) {
        return Some(0);
    }
    let elems = 1 + t
        .shape
        .iter()
        .zip(&t.strides)
        .map(|(&n, &s)| (n - 1) * s as usize)
        .sum::<usize>();
    Some(elems * t.dtype.size())
}

impl<'a> Trial<'a> {
    /// Sets up the scratch tensors; `Err` says why this launch cannot be tuned.
    pub fn new(launch: &'a Launch<'a>) -> std::result::Result<Trial<'a>, String> {
        let (mut stored, mut loaded, mut waited) =
            (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
        launch.kernel.walk_stmts(&mut |s| {
            match s {
                // Counters a candidate signals, and tensors it adds into
                // atomically, are written too: it gets scratch ones, restored
                // before each run (an atomic adds to what was there).
                Stmt::Store { tensor, .. }
                | Stmt::Signal { tensor, .. }
                | Stmt::Atomic { tensor, .. } => {
                    stored.insert(*tensor);
                }
                Stmt::Wait { tensor, .. } => {
                    waited.insert(*tensor);
                }
                _ => {}
            }
            let mut visit = |e: &Expr| {
                e.walk(&mut |x| {
                    if let Expr::Load { tensor, .. } = x {
                        loaded.insert(*tensor);
                    }
                })
            };
            match s {
                Stmt::Let { value, .. }
                | Stmt::Assign { value, .. }
                | Stmt::Store { value, .. } => visit(value),
                _ => {}
            }
        });
        if let Some(t) = waited
            .iter()
            .find(|t| stored.contains(t) || loaded.contains(t))
        {
            return Err(format!(
                "`{}` is both waited on and read or written",
                launch.kernel.tensors[*t].name
            ));
        }
        let unordered = launch.kernel.order_dependent();
        let dev = launch.dev;
        let mut args = launch.tensors.to_vec();
        let mut stands = Vec::new();
        let err = |e: Error| e.to_string();
        for &t in stored.iter().chain(&waited) {
            let a = &launch.tensors[t];
            let bytes = span_bytes(a).ok_or_else(|| {
                format!("`{}` has a negative stride", launch.kernel.tensors[t].name)
            })?;
            let scratch = Buffer::alloc(dev, bytes, Memory::Pooled).map_err(err)?;
            args[t].ptr = scratch.ptr;
            let output = stored.contains(&t);
            if !output {
                // Set flags: 0x7f7f7f7f passes any `wait` on u32 or i32 flags.
                scratch.fill_bytes(0x7f).map_err(err)?;
            }
            stands.push(Stand {
                scratch,
                original: a.ptr,
                dtype: a.dtype,
                output,
                compared: output && !unordered.contains(&t),
            });
        }
        let flush = Buffer::alloc(dev, FLUSH_BYTES, Memory::Pooled).map_err(err)?;
        Ok(Trial {
            dev,
            launch,
            args,
            stands,
            flush,
            reference: Vec::new(),
            warmup: 1,
            reps: 10,
        })
    }

    /// Outputs back to their original contents, queued on the launch stream.
    fn restore(&self) -> Result<()> {
        let stream = self.dev.stream()?.cu_stream();
        for s in self
            .stands
            .iter()
            .filter(|s| s.output && s.scratch.bytes > 0)
        {
            // SAFETY: both ranges hold `bytes`: the scratch was allocated with the
            // span of the original view, which lies inside a live tensor.
            unsafe { cu::memcpy_dtod_async(s.scratch.ptr, s.original, s.scratch.bytes, stream) }
                .map_err(driver("restoring an output for the autotuner"))?;
        }
        Ok(())
    }

    fn run(&self, v: &Variant) -> Result<()> {
        self.restore()?;
        launch_variant(
            self.dev,
            self.launch.kernel,
            v,
            &self.args,
            self.launch.scalars,
        )
    }

    /// The outputs of the last run, as f64.
    fn outputs(&self) -> Result<Vec<Vec<f64>>> {
        self.dev.synchronize()?;
        let mut out = Vec::new();
        for s in self.stands.iter().filter(|s| s.output) {
            let mut bytes = vec![0u8; s.scratch.bytes];
            // SAFETY: the scratch buffer holds exactly `bytes.len()` bytes.
            unsafe { cu::memcpy_dtoh_sync(&mut bytes, s.scratch.ptr) }
                .map_err(driver("reading an output for the autotuner"))?;
            out.push(to_f64(&bytes, s.dtype));
        }
        Ok(out)
    }

    /// Runs the default config's variant and keeps its outputs as the reference.
    pub fn set_reference(&mut self, v: &Variant) -> Result<()> {
        self.run(v)?;
        self.reference = self.outputs()?;
        Ok(())
    }

    /// Checks one candidate against the reference, then times it.
    pub fn measure(&self, v: &Variant) -> Measured {
        match self.check(v).and_then(|()| self.time(v)) {
            Ok(r) => r,
            Err(e) => Measured::Dropped(e.to_string()),
        }
    }

    fn check(&self, v: &Variant) -> Result<()> {
        self.run(v)?;
        let got = self.outputs()?;
        for ((g, r), s) in got
            .iter()
            .zip(&self.reference)
            .zip(self.stands.iter().filter(|s| s.output))
        {
            if !s.compared {
                continue;
            }
            let err = rel_error(g, r);
            let tol = tolerance(s.dtype);
            if err.is_nan() || err > tol {
                return Err(Error::Argument {
                    context: "autotune".into(),
                    arg: "candidate".into(),
                    message: format!(
                        "its output differs from the default config's: relative error {err:.2e} > {tol:.0e}"
                    ),
                });
            }
        }
        Ok(())
    }

    /// [`Trial::time`] after running the candidate for `settle`: the GPU's
    /// clocks follow the power the work before draws, so this is the time under
    /// sustained load (what a training or serving loop sees), where a short
    /// timing gets the clocks the previous candidate left.
    pub fn time_settled(&self, v: &Variant, settle: std::time::Duration) -> Result<Measured> {
        let start = std::time::Instant::now();
        while start.elapsed() < settle {
            for _ in 0..8 {
                self.run(v)?;
            }
            self.dev.synchronize()?;
        }
        self.time(v)
    }

    /// Times a candidate (warm-up, then the median of `reps`, L2 flushed before each).
    pub fn time(&self, v: &Variant) -> Result<Measured> {
        for _ in 0..self.warmup {
            self.run(v)?;
        }
        let stream = self.dev.stream()?;
        let ctx = self.dev.context()?;
        let mut events = Vec::with_capacity(self.reps);
        for _ in 0..self.reps.max(1) {
            self.restore()?;
            self.flush.fill_bytes(0)?;
            let ev = || {
                ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(driver("creating an event"))
            };
            let (start, end) = (ev()?, ev()?);
            start.record(stream).map_err(driver("recording an event"))?;
            launch_variant(
                self.dev,
                self.launch.kernel,
                v,
                &self.args,
                self.launch.scalars,
            )?;
            end.record(stream).map_err(driver("recording an event"))?;
            events.push((start, end));
        }
        self.dev.synchronize()?;
        let mut ms = events
            .iter()
            .map(|(s, e)| {
                s.elapsed_ms(e)
                    .map(f64::from)
                    .map_err(driver("reading an event"))
            })
            .collect::<Result<Vec<f64>>>()?;
        super::count_bench_run();
        ms.sort_by(f64::total_cmp);
        Ok(Measured::Time(ms[ms.len() / 2]))
    }
}

fn to_f64(bytes: &[u8], dtype: DType) -> Vec<f64> {
    let n = dtype.size();
    bytes
        .chunks_exact(n)
        .map(|c| match dtype {
            DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F32 => f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::I8 => f64::from(c[0] as i8),
            DType::U8 | DType::Bool => f64::from(c[0]),
            DType::I16 => f64::from(i16::from_le_bytes([c[0], c[1]])),
            DType::I32 => f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::U32 => f64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::I64 => i64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f64,
        })
        .collect()
}

/// ‖got − reference‖ / ‖reference‖ (absolute when the reference is zero); NaN
/// when a value is NaN where the reference's is not.
fn rel_error(got: &[f64], reference: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&g, &r) in got.iter().zip(reference) {
        if g.is_nan() != r.is_nan() {
            return f64::NAN;
        }
        if r.is_nan() {
            continue;
        }
        num += (g - r) * (g - r);
        den += r * r;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// How far a candidate may differ from the default config: configs change the
/// order of the K sum, which moves 16-bit results by a rounding or two.
fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 | DType::F16 => 1e-2,
        DType::F32 => 1e-4,
        _ => 0.0,
    }
}
