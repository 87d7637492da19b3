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

/// What a runtime scalar is: an integer of the host value's type (passed as
/// a `long long`, typed in the kernel as its Rust type promotes: `u32` as u32,
/// `i8`..`i32` and `u8`, `u16` as i32, 64-bit integers as i64), or a `float`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScalarKind {
    Int,
    Float,
    I32,
    U32,
}

impl ScalarKind {
    /// An integer of some width.
    pub fn is_int(self) -> bool {
        self != ScalarKind::Float
    }

    /// The kind of a parameter of Rust type `name` (`f32`, `u8`, …), as a
    /// launch passes its value; `None` for types that are not scalars.
    pub fn of_type_name(name: &str) -> Option<ScalarKind> {
        match name {
            "f32" | "f64" => Some(ScalarKind::Float),
            "u32" => Some(ScalarKind::U32),
            "i32" | "i16" | "i8" | "u16" | "u8" => Some(ScalarKind::I32),
            "i64" | "u64" | "isize" | "usize" => Some(ScalarKind::Int),
            _ => None,
        }
    }

    /// The Rust type the kernel's textual form writes for this kind.
    pub fn type_name(self) -> &'static str {
        match self {
            ScalarKind::Float => "f32",
            ScalarKind::I32 => "i32",
            ScalarKind::U32 => "u32",
            ScalarKind::Int => "i64",
        }
    }

    /// The dtype device code computes with the scalar in.
    pub fn dtype(self) -> crate::dtype::DType {
        use crate::dtype::DType;
        match self {
            ScalarKind::Int => DType::I64,
            ScalarKind::Float => DType::F32,
            ScalarKind::I32 => DType::I32,
            ScalarKind::U32 => DType::U32,
        }
    }
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
