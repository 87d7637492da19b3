//! Element types a tensor, a scalar or a tile can have, and the types
//! arithmetic on them produces.

use serde::{Deserialize, Serialize};

/// The element type of a tensor or tile.
///
/// [`DType::Bool`] is the type of comparisons and masks; tensors hold masks as
/// `u8` (compare with `!= 0`, or `.cast::<bool>()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DType {
    BF16,
    F16,
    F32,
    I8,
    U8,
    I16,
    I32,
    U32,
    I64,
    Bool,
}

/// The C type a value is computed in: floats in `float`, masks in `bool`,
/// integers narrower than 32 bits promoted to `int` (as C does).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CTy {
    F32,
    Bool,
    I32,
    U32,
    I64,
}

impl CTy {
    /// The C spelling.
    pub fn c(self) -> &'static str {
        match self {
            CTy::F32 => "float",
            CTy::Bool => "bool",
            CTy::I32 => "int",
            CTy::U32 => "unsigned int",
            CTy::I64 => "long long",
        }
    }

    /// Bytes a value of this type takes in shared memory.
    pub fn size(self) -> usize {
        match self {
            CTy::I64 => 8,
            _ => 4,
        }
    }
}

impl DType {
    /// Every dtype, for messages and tables.
    pub const ALL: [DType; 10] = [
        DType::BF16,
        DType::F16,
        DType::F32,
        DType::I8,
        DType::U8,
        DType::I16,
        DType::I32,
        DType::U32,
        DType::I64,
        DType::Bool,
    ];

    /// Size of one element in bytes (as a tensor stores it).
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::BF16 | DType::F16 | DType::I16 => 2,
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
            DType::I8 => "i8",
            DType::U8 => "u8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// Parses the Rust spelling of a type (`bf16`, `half::bf16`'s last segment, …).
    pub fn from_rust_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.rust_name() == name)
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }

    /// Integer types (not `bool`).
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8 | DType::U8 | DType::I16 | DType::I32 | DType::U32 | DType::I64
        )
    }

    /// The values of an integer type or `bool` (`None` for floats), as f64:
    /// exact up to ±2^53, which the 64-bit types pass (their ends round).
    pub fn int_range(self) -> Option<(f64, f64)> {
        let bits = |signed: bool, n: i32| {
            if signed {
                (-(2f64.powi(n - 1)), 2f64.powi(n - 1) - 1.0)
            } else {
                (0.0, 2f64.powi(n) - 1.0)
            }
        };
        match self {
            DType::Bool => Some((0.0, 1.0)),
            t if t.is_int() => Some(bits(t.is_signed(), t.bits() as i32)),
            _ => None,
        }
    }

    /// Signed integer types.
    pub fn is_signed(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64)
    }

    /// 16-bit floats, the operand types of the tensor-core `addmm`.
    pub fn is_half(self) -> bool {
        matches!(self, DType::BF16 | DType::F16)
    }

    /// Bits of an integer type (8 for `bool`, as stored).
    pub fn bits(self) -> u32 {
        self.size() as u32 * 8
    }

    /// The C type a tensor of this dtype is stored as in generated code.
    pub fn c_storage(self) -> &'static str {
        match self {
            DType::BF16 | DType::F16 => "unsigned short",
            DType::F32 => "float",
            DType::I8 => "signed char",
            DType::U8 | DType::Bool => "unsigned char",
            DType::I16 => "short",
            DType::I32 => "int",
            DType::U32 => "unsigned int",
            DType::I64 => "long long",
        }
    }

    /// The C type values of this dtype are computed in.
    pub fn cty(self) -> CTy {
        match self {
            DType::BF16 | DType::F16 | DType::F32 => CTy::F32,
            DType::Bool => CTy::Bool,
            DType::I8 | DType::U8 | DType::I16 | DType::I32 => CTy::I32,
            DType::U32 => CTy::U32,
            DType::I64 => CTy::I64,
        }
    }

    /// The type arithmetic on two values gives (C's usual conversions, with
    /// floats computed in f32): f32 if either is a float; else i64 if either
    /// is i64; else u32 if either is u32; else i32 (narrower integers and
    /// `bool` promote to i32).
    pub fn promote(a: DType, b: DType) -> DType {
        if a.is_float() || b.is_float() {
            DType::F32
        } else if a == DType::I64 || b == DType::I64 {
            DType::I64
        } else if a == DType::U32 || b == DType::U32 {
            DType::U32
        } else {
            DType::I32
        }
    }

    /// The type of a one-argument arithmetic result on `a` that keeps
    /// integers integral (negation, `abs`): floats give f32, narrow integers
    /// and `bool` i32.
    pub fn arith(a: DType) -> DType {
        DType::promote(a, a)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.rust_name())
    }
}
