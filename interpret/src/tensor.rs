//! Tensors in host memory: strided views of [`HostMemory`], read and written as
//! the exact values of their dtype.

use crate::error::InterpretError;
use crate::memory::HostMemory;
use std::sync::Arc;
use tilefuse_codegen::DType;

/// A strided view of [`HostMemory`] with a dtype: the interpreter's tensor.
/// Views share their memory, so a kernel's stores are seen by every view of it,
/// and flags set by another thread or process are seen by a `wait`.
#[derive(Clone, Debug)]
pub struct HostTensor {
    dtype: DType,
    shape: Vec<usize>,
    strides: Vec<isize>,
    /// In elements, from the memory's first byte.
    offset: usize,
    mem: Arc<HostMemory>,
}

fn contiguous(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![1isize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1) as isize;
    }
    strides
}

impl HostTensor {
    /// A new tensor of `shape` holding `data` (row-major), each value rounded to
    /// `dtype` as a store would round it.
    pub fn from_f64(
        dtype: DType,
        shape: &[usize],
        data: Vec<f64>,
    ) -> Result<HostTensor, InterpretError> {
        let len: usize = shape.iter().product();
        if data.len() != len {
            return Err(InterpretError::Argument {
                kernel: "(host tensor)".into(),
                arg: "data".into(),
                message: format!(
                    "{} values for shape {shape:?}, which holds {len}",
                    data.len()
                ),
            });
        }
        let t = HostTensor::zeroed(dtype, shape);
        for (i, v) in data.into_iter().enumerate() {
            t.mem.store(dtype, i, round_to(dtype, v));
        }
        Ok(t)
    }

    /// A new tensor of `shape` with every element `value` (NaN poisons a float
    /// tensor, so unwritten elements show).
    pub fn filled(dtype: DType, shape: &[usize], value: f64) -> HostTensor {
        let t = HostTensor::zeroed(dtype, shape);
        let v = round_to(dtype, value);
        for i in 0..t.numel() {
            t.mem.store(dtype, i, v);
        }
        t
    }

    fn zeroed(dtype: DType, shape: &[usize]) -> HostTensor {
        let n: usize = shape.iter().product();
        HostTensor {
            dtype,
            shape: shape.to_vec(),
            strides: contiguous(shape),
            offset: 0,
            mem: HostMemory::zeroed(n * dtype.size()),
        }
    }

    /// A view of `mem`: `shape` and `strides` in elements of `dtype`, from
    /// element `offset`. An error unless every element lies inside the memory.
    pub fn view(
        mem: Arc<HostMemory>,
        dtype: DType,
        shape: &[usize],
        strides: &[isize],
        offset: usize,
    ) -> Result<HostTensor, InterpretError> {
        let bad = |message: String| InterpretError::Argument {
            kernel: "(host tensor)".into(),
            arg: "view".into(),
            message,
        };
        if strides.len() != shape.len() {
            return Err(bad(format!(
                "{} strides for shape {shape:?}",
                strides.len()
            )));
        }
        if shape.contains(&0) {
            return Ok(HostTensor {
                dtype,
                shape: shape.to_vec(),
                strides: strides.to_vec(),
                offset,
                mem,
            });
        }
        let mut last = offset as i128;
        let mut first = offset as i128;
        for (&n, &s) in shape.iter().zip(strides) {
            let reach = (n as i128 - 1) * s as i128;
            if reach >= 0 {
                last += reach;
            } else {
                first += reach;
            }
        }
        let elems = (mem.len() / dtype.size()) as i128;
        if first < 0 || last >= elems {
            return Err(bad(format!(
                "shape {shape:?}, strides {strides:?} from element {offset} reach elements \
                 {first}..={last}, outside the {elems} elements of {dtype} the memory holds"
            )));
        }
        Ok(HostTensor {
            dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
            mem,
        })
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The memory this tensor views.
    pub fn memory(&self) -> &Arc<HostMemory> {
        &self.mem
    }

    /// The elements, row-major, as exact values of the dtype.
    pub fn values(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.numel());
        crate::tile::for_each_position(&self.shape, |pos| {
            let at = self.at(pos.iter().map(|&p| p as i64));
            out.push(self.mem.load(self.dtype, at));
        });
        out
    }

    /// The element at `index` (one entry per dimension), or `None` outside the shape.
    pub fn get(&self, index: &[usize]) -> Option<f64> {
        self.offset_of(index).map(|at| self.load(at))
    }

    /// Element offset of `index` in the memory, or `None` outside the shape.
    pub(crate) fn offset_of<I: Copy + TryInto<usize>>(&self, index: &[I]) -> Option<usize> {
        if index.len() != self.shape.len() {
            return None;
        }
        let mut pos = Vec::with_capacity(index.len());
        for (&i, &n) in index.iter().zip(&self.shape) {
            let i: usize = i.try_into().ok()?;
            if i >= n {
                return None;
            }
            pos.push(i as i64);
        }
        Some(self.at(pos.into_iter()))
    }

    /// Element offset in the memory of the in-bounds `flat`-th element in row-major order.
    pub(crate) fn flat_offset(&self, flat: i64) -> Option<usize> {
        let mut rest = usize::try_from(flat).ok().filter(|&f| f < self.numel())?;
        let mut pos = vec![0i64; self.shape.len()];
        for d in (0..self.shape.len()).rev() {
            pos[d] = (rest % self.shape[d]) as i64;
            rest /= self.shape[d];
        }
        Some(self.at(pos.into_iter()))
    }

    fn at(&self, pos: impl Iterator<Item = i64>) -> usize {
        let off: i64 = pos.zip(&self.strides).map(|(p, &s)| p * s as i64).sum();
        (self.offset as i64 + off) as usize
    }

    pub(crate) fn load(&self, offset: usize) -> f64 {
        self.mem.load(self.dtype, offset)
    }

    /// Stores `v` rounded to the dtype.
    pub(crate) fn store(&self, offset: usize, v: f64) {
        self.mem.store(self.dtype, offset, round_to(self.dtype, v));
    }
}

/// `v` as the GPU holds it in `dtype`: round to nearest even for floats (f32
/// values through f32), truncation toward zero (and wrapping) for integers, as
/// a C cast does.
pub(crate) fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::BF16 => f64::from(half::bf16::from_f32(v as f32)),
        DType::F16 => f64::from(half::f16::from_f32(v as f32)),
        DType::F32 => f64::from(v as f32),
        DType::I32 => f64::from(v as i64 as i32),
        DType::U32 => f64::from(v as i64 as u32),
        DType::I64 => v.trunc(),
    }
}

/// An f32 operation's result: computed exactly (or nearly) in f64, rounded once.
pub(crate) fn f32r(v: f64) -> f64 {
    f64::from(v as f32)
}
