//! Tensors in host memory, holding each element as the exact value of its dtype.

use crate::error::InterpretError;
use tilefuse_codegen::DType;

/// A dense, row-major tensor on the host. Elements are kept as `f64`s that
/// hold exactly what the dtype can: a bf16 tensor's elements are bf16 values.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<f64>,
}

impl HostTensor {
    /// A tensor of `shape` from `data` (row-major), each value rounded to `dtype`
    /// as a store would round it.
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
        Ok(HostTensor {
            dtype,
            shape: shape.to_vec(),
            data: data.into_iter().map(|v| round_to(dtype, v)).collect(),
        })
    }

    /// A tensor of `shape` with every element `value` (NaN poisons a float
    /// tensor, so unwritten elements show).
    pub fn filled(dtype: DType, shape: &[usize], value: f64) -> HostTensor {
        HostTensor {
            dtype,
            shape: shape.to_vec(),
            data: vec![round_to(dtype, value); shape.iter().product()],
        }
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[f64] {
        &self.data
    }

    /// The element at `index` (one entry per dimension), or `None` outside the shape.
    pub fn get(&self, index: &[usize]) -> Option<f64> {
        self.offset_of(index).map(|at| self.data[at])
    }

    /// Row-major offset of `index`, or `None` outside the shape.
    pub(crate) fn offset_of<I: Copy + TryInto<usize>>(&self, index: &[I]) -> Option<usize> {
        if index.len() != self.shape.len() {
            return None;
        }
        let mut at = 0usize;
        for (&i, &n) in index.iter().zip(&self.shape) {
            let i: usize = i.try_into().ok()?;
            if i >= n {
                return None;
            }
            at = at * n + i;
        }
        Some(at)
    }

    pub(crate) fn load(&self, offset: usize) -> f64 {
        self.data[offset]
    }

    /// Stores `v` rounded to the dtype.
    pub(crate) fn store(&mut self, offset: usize, v: f64) {
        self.data[offset] = round_to(self.dtype, v);
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
