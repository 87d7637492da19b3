//! Element types a tensor, a scalar or a tile can have.

use serde::{Deserialize, Serialize};

/// The element type of a tensor or tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    BF16,
    F16,
    F32,
    I32,
    U32,
    I64,
}

impl DType {
    /// Size of one element in bytes.
    pub fn size(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::I64 => 8,
        }
    }

    /// The Rust spelling a user writes (`bf16`, `f32`, …), used in messages.
    pub fn rust_name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
        }
    }

    /// Parses the Rust spelling of a type (`bf16`, `half::bf16`'s last segment, …).
    pub fn from_rust_name(name: &str) -> Option<DType> {
        Some(match name {
            "bf16" => DType::BF16,
            "f16" => DType::F16,
            "f32" => DType::F32,
            "i32" => DType::I32,
            "u32" => DType::U32,
            "i64" => DType::I64,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }

    /// 16-bit floats, the operand types of the tensor-core `addmm`.
    pub fn is_half(self) -> bool {
        matches!(self, DType::BF16 | DType::F16)
    }

    /// The C type a tensor of this dtype is stored as in generated code.
    pub fn c_storage(self) -> &'static str {
        match self {
            DType::BF16 | DType::F16 => "unsigned short",
            DType::F32 => "float",
            DType::I32 => "int",
            DType::U32 => "unsigned int",
            DType::I64 => "long long",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.rust_name())
    }
}
