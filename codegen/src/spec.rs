//! What the generated code is specialized on: the dtypes, layouts and alignment of
//! the tensors, the kinds of the scalars and the values of the constexprs.

use crate::dtype::DType;
use serde::{Deserialize, Serialize};

/// Facts about one tensor argument that change the generated code.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorSpec {
    pub dtype: DType,
    pub rank: usize,
    /// The last dimension has stride 1.
    pub last_contiguous: bool,
    /// The largest of 16, 8, 4, 2, 1 bytes dividing the base address and every
    /// stride but the last (in bytes): how wide a vector access may be.
    pub align: usize,
}

/// How a runtime scalar is passed: as `long long` or as `float`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScalarKind {
    Int,
    Float,
}

/// Everything a launch knows that the kernel source does not.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Spec {
    pub tensors: Vec<TensorSpec>,
    pub scalars: Vec<ScalarKind>,
    pub constexprs: Vec<i64>,
}

impl TensorSpec {
    /// A contiguous, 16-byte aligned tensor: what a fresh allocation gives.
    pub fn contiguous(dtype: DType, rank: usize) -> TensorSpec {
        TensorSpec {
            dtype,
            rank,
            last_contiguous: true,
            align: 16,
        }
    }

    /// The alignment (see [`TensorSpec::align`]) of an address and strides in elements.
    pub fn alignment_of(addr: u64, strides: &[i64], dtype: DType) -> usize {
        let esize = dtype.size() as u64;
        let mut g = addr;
        if let Some((_, outer)) = strides.split_last() {
            for &s in outer {
                g |= s.unsigned_abs() * esize;
            }
        }
        [16u64, 8, 4, 2, 1]
            .into_iter()
            .find(|a| g % a == 0)
            .unwrap_or(1) as usize
    }
}
