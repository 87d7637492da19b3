//! Reductions along a tile dimension: `x.sum(tn)`, `x.max(tn)`, `x.min(tn)`,
//! `x.prod(tn)`: the in-bounds elements combined, the dimension dropped.

use crate::dtype::{CTy, DType};
use serde::{Deserialize, Serialize};

/// One reduction.
pub struct Reduce {
    pub op: ReduceOp,
    /// The method name (`sum`).
    pub name: &'static str,
    pub doc: &'static str,
    /// C combining two partial results `{a}` and `{b}` (the helpers are overloaded).
    pub cuda: &'static str,
    /// What interpret mode combines (floats, then rounded to f32).
    pub cpu: fn(f64, f64) -> f64,
    /// What interpret mode combines on integers (then wrapped to the type).
    pub cpu_int: fn(i64, i64) -> i128,
}

macro_rules! reduce_table {
    ($($op:ident: $name:literal, $doc:literal, cuda $cuda:literal, cpu $cpu:expr, cpu_int $cpui:expr;)*) => {
        /// Reductions along one tile dimension; see [`TABLE`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum ReduceOp { $($op),* }

        /// Every reduction, in [`ReduceOp`] order.
        pub static TABLE: &[Reduce] = &[$(Reduce {
            op: ReduceOp::$op, name: $name, doc: $doc, cuda: $cuda, cpu: $cpu, cpu_int: $cpui,
        }),*];

        impl ReduceOp {
            /// Every reduction.
            pub const ALL: &'static [ReduceOp] = &[$(ReduceOp::$op),*];
        }
    };
}

reduce_table! {
    Sum: "sum", "the sum (floats in f32, in the GPU's order: not bit-identical to a sequential sum)",
        cuda "({a} + {b})", cpu |a, b| a + b, cpu_int |a, b| a as i128 + b as i128;
    Max: "max", "the largest element (NaNs lose)",
        cuda "tf_max({a}, {b})", cpu f64::max, cpu_int |a, b| i128::from(a.max(b));
    Min: "min", "the smallest element (NaNs lose)",
        cuda "tf_min({a}, {b})", cpu f64::min, cpu_int |a, b| i128::from(a.min(b));
    Prod: "prod", "the product",
        cuda "({a} * {b})", cpu |a, b| a * b, cpu_int |a, b| a as i128 * b as i128;
}

impl ReduceOp {
    /// The table entry.
    pub fn entry(self) -> &'static Reduce {
        &TABLE[self as usize]
    }

    /// The binary operation that combines two partial results the same way
    /// (`+` for a sum): what an accumulation `acc = acc ⊕ x` reduces by.
    pub fn binary(self) -> super::BinOp {
        match self {
            ReduceOp::Sum => super::BinOp::Add,
            ReduceOp::Prod => super::BinOp::Mul,
            ReduceOp::Max => super::BinOp::Max,
            ReduceOp::Min => super::BinOp::Min,
        }
    }

    /// The reduction whose [`ReduceOp::binary`] is `op`, if any.
    pub fn of_binary(op: super::BinOp) -> Option<ReduceOp> {
        ReduceOp::ALL.iter().copied().find(|r| r.binary() == op)
    }

    /// The DSL method (`x.sum(tn)`).
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// The reduction a method name stands for.
    pub fn from_name(name: &str) -> Option<ReduceOp> {
        ReduceOp::ALL.iter().copied().find(|o| o.name() == name)
    }

    /// The result type on elements of `t`: floats reduce in f32, integers
    /// and masks in their promoted type.
    pub fn result(self, t: DType) -> DType {
        DType::arith(t)
    }

    /// The identity in C, for padding and for elements outside the extent.
    pub fn identity_c(self, t: CTy) -> &'static str {
        match (self, t) {
            (ReduceOp::Sum, CTy::F32) => "0.0f",
            (ReduceOp::Prod, CTy::F32) => "1.0f",
            (ReduceOp::Max, CTy::F32) => "__int_as_float(0xff800000)",
            (ReduceOp::Min, CTy::F32) => "__int_as_float(0x7f800000)",
            (ReduceOp::Sum, _) => "0",
            (ReduceOp::Prod, _) => "1",
            (ReduceOp::Max, CTy::U32) => "0u",
            (ReduceOp::Min, CTy::U32) => "0xffffffffu",
            (ReduceOp::Max, CTy::I64) => "(-9223372036854775807ll - 1)",
            (ReduceOp::Min, CTy::I64) => "9223372036854775807ll",
            (ReduceOp::Max, _) => "(-2147483647 - 1)",
            (ReduceOp::Min, _) => "2147483647",
        }
    }

    /// The identity interpret mode starts from, and what a reduction over
    /// no element gives, for values of `t` (the result type): the same as
    /// [`ReduceOp::identity_c`].
    pub fn identity(self, t: DType) -> super::cast::Num {
        use super::cast::Num;
        if t.is_float() {
            return Num::F(match self {
                ReduceOp::Sum => 0.0,
                ReduceOp::Prod => 1.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                ReduceOp::Min => f64::INFINITY,
            });
        }
        let bits = t.bits();
        let (min, max) = if t.is_signed() {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        } else {
            (0, (1i128 << bits) - 1)
        };
        Num::I(match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => min as i64,
            ReduceOp::Min => max as i64,
        })
    }
}
