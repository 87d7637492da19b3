//! Tensors in host memory: strided views of [`HostMemory`], read and written as
//! the exact values of their dtype.

use crate::error::InterpretError;
use crate::memory::HostMemory;
use std::sync::Arc;
use tilefuse_codegen::prims::cast::Num;
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

/// Row-major strides of `shape`, whose element count [`elements`] checked.
fn contiguous(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![1isize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1].max(1) as isize);
    }
    strides
}

/// The elements of `shape`, if they and their bytes of `dtype` fit an
/// `isize` (what an allocation and every stride must fit), with every
/// dimension counted at least once (an empty tensor's strides too).
fn elements(dtype: DType, shape: &[usize]) -> Result<usize, InterpretError> {
    let fits = |n: Option<usize>| {
        n.filter(|&n| {
            n.checked_mul(dtype.size())
                .is_some_and(|b| b <= isize::MAX as usize)
        })
    };
    let all = shape
        .iter()
        .try_fold(1usize, |n, &d| fits(n.checked_mul(d.max(1))));
    match all {
        Some(_) => Ok(shape.iter().product()),
        None => Err(InterpretError::Argument {
            kernel: "(host tensor)".into(),
            arg: "shape".into(),
            message: format!("{shape:?} of {dtype} holds more bytes than an allocation can"),
        }),
    }
}

impl HostTensor {
    /// A new tensor of `shape` holding `data` (row-major), each value converted
    /// to `dtype` as Rust's `as` converts an `f64`: floats rounded to nearest
    /// even, integers truncated toward zero and saturated (NaN is 0), `bool`
    /// true where not zero.
    pub fn from_f64(
        dtype: DType,
        shape: &[usize],
        data: Vec<f64>,
    ) -> Result<HostTensor, InterpretError> {
        let t = HostTensor::sized(dtype, shape, data.len())?;
        for (i, v) in data.into_iter().enumerate() {
            t.mem.store(dtype, i, from_f64(dtype, v));
        }
        Ok(t)
    }

    /// A new tensor of `shape` holding `data` (row-major), exactly for the
    /// integer dtypes (each value wrapped to the dtype's width, as `as` does;
    /// `bool` true where not zero), rounded to nearest even for the float ones.
    /// For `i64` values beyond 2^53, which `f64` cannot hold.
    pub fn from_i64(
        dtype: DType,
        shape: &[usize],
        data: Vec<i64>,
    ) -> Result<HostTensor, InterpretError> {
        let t = HostTensor::sized(dtype, shape, data.len())?;
        for (i, v) in data.into_iter().enumerate() {
            t.mem.store(dtype, i, from_i64(dtype, v));
        }
        Ok(t)
    }

    /// A zeroed tensor of `shape`, which must hold `len` elements.
    fn sized(dtype: DType, shape: &[usize], len: usize) -> Result<HostTensor, InterpretError> {
        let want = elements(dtype, shape)?;
        if len != want {
            return Err(InterpretError::Argument {
                kernel: "(host tensor)".into(),
                arg: "data".into(),
                message: format!("{len} values for shape {shape:?}, which holds {want}"),
            });
        }
        HostTensor::zeroed(dtype, shape)
    }

    /// A new tensor of `shape` with every element `value`, converted as
    /// [`HostTensor::from_f64`] does (NaN poisons a float tensor, so unwritten
    /// elements show). An error if the shape holds more than memory can.
    pub fn filled(dtype: DType, shape: &[usize], value: f64) -> Result<HostTensor, InterpretError> {
        let t = HostTensor::zeroed(dtype, shape)?;
        let v = from_f64(dtype, value);
        for i in 0..t.numel() {
            t.mem.store(dtype, i, v);
        }
        Ok(t)
    }

    fn zeroed(dtype: DType, shape: &[usize]) -> Result<HostTensor, InterpretError> {
        let n = elements(dtype, shape)?;
        Ok(HostTensor {
            dtype,
            shape: shape.to_vec(),
            strides: contiguous(shape),
            offset: 0,
            // Below isize::MAX bytes: checked by `elements`.
            mem: HostMemory::zeroed(n * dtype.size()),
        })
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

    /// Strides in elements, one per dimension.
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// The memory this tensor views.
    pub fn memory(&self) -> &Arc<HostMemory> {
        &self.mem
    }

    /// The elements, row-major, as values of the dtype (integers beyond 2^53
    /// rounded: [`HostTensor::values_i64`] has them exactly).
    pub fn values(&self) -> Vec<f64> {
        self.nums().into_iter().map(Num::as_f64).collect()
    }

    /// The elements, row-major: integers (and `bool`s, 0 or 1) exactly, floats
    /// truncated toward zero.
    pub fn values_i64(&self) -> Vec<i64> {
        self.nums().into_iter().map(to_i64).collect()
    }

    fn nums(&self) -> Vec<Num> {
        let mut out = Vec::with_capacity(self.numel());
        crate::tile::for_each_position(&self.shape, |pos| {
            let at = self.at(pos.iter().map(|&p| p as i64));
            out.push(self.mem.load(self.dtype, at));
        });
        out
    }

    /// The element at `index` (one entry per dimension), or `None` outside the shape.
    pub fn get(&self, index: &[usize]) -> Option<f64> {
        self.offset_of(index).map(|at| self.load(at).as_f64())
    }

    /// [`HostTensor::get`] as an exact integer (see [`HostTensor::values_i64`]).
    pub fn get_i64(&self, index: &[usize]) -> Option<i64> {
        self.offset_of(index).map(|at| to_i64(self.load(at)))
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

    /// Element offset in the memory of the element at `index` (signed, one
    /// per dimension), or `None` where some `0 <= index[a] < shape[a]` fails.
    pub(crate) fn offset_at(&self, index: &[i64]) -> Option<usize> {
        let mut off = self.offset as i64;
        for ((&i, &n), &s) in index.iter().zip(&self.shape).zip(&self.strides) {
            if i < 0 || i as u64 >= n as u64 {
                return None;
            }
            off += i * s as i64;
        }
        Some(off as usize)
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

    /// The element at memory offset `offset`, exactly.
    pub(crate) fn load(&self, offset: usize) -> Num {
        self.mem.load(self.dtype, offset)
    }

    /// Stores `v`, already a value of the dtype, at memory offset `offset`.
    pub(crate) fn store(&self, offset: usize, v: Num) {
        self.mem.store(self.dtype, offset, v);
    }

    /// Replaces the element at `offset` by `f(old)` atomically (see
    /// [`HostMemory`]'s CAS loops).
    /// Returns the element's value before.
    pub(crate) fn update(&self, offset: usize, f: impl Fn(Num) -> Num) -> Num {
        self.mem.update(self.dtype, offset, f)
    }
}

fn to_i64(v: Num) -> i64 {
    match v {
        Num::I(i) => i,
        Num::F(x) => x as i64,
    }
}

/// `v` as `dtype` holds it, converted as Rust's `as` converts an `f64`.
fn from_f64(dtype: DType, v: f64) -> Num {
    match dtype {
        DType::BF16 => Num::F(half::bf16::from_f64(v).to_f64()),
        DType::F16 => Num::F(half::f16::from_f64(v).to_f64()),
        DType::F32 => Num::F(f64::from(v as f32)),
        DType::I8 => Num::I(i64::from(v as i8)),
        DType::U8 => Num::I(i64::from(v as u8)),
        DType::I16 => Num::I(i64::from(v as i16)),
        DType::I32 => Num::I(i64::from(v as i32)),
        DType::U32 => Num::I(i64::from(v as u32)),
        DType::I64 => Num::I(v as i64),
        DType::Bool => Num::I(i64::from(v != 0.0)),
    }
}

/// `v` as `dtype` holds it: integers wrapped, floats rounded to nearest even.
fn from_i64(dtype: DType, v: i64) -> Num {
    match dtype {
        DType::F32 => Num::F(f64::from(v as f32)),
        DType::BF16 | DType::F16 => from_f64(dtype, v as f64),
        _ => Num::I(tilefuse_codegen::prims::wrap_int(dtype, i128::from(v))),
    }
}
