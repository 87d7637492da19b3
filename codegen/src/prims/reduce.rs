//! Reductions along a tile dimension: `x.sum(tn)`, `x.max(tn)`, `x.min(tn)`,
//! `x.prod(tn)`: the in-bounds elements combined, the dimension dropped; and
//! their inclusive scans `x.cumsum(tn)`, `x.cummax(tn)`, `x.cummin(tn)`,
//! `x.cumprod(tn)`: each element combined with those before it along the
//! tile, the dimension kept; and, for the reductions that pick an element,
//! the index they pick: `x.argmax(tn)`, `x.argmin(tn)`.
//!
//! Everything a lowering, the interpreter or a message needs of a reduction
//! is its entry here: the C that combines two partials, the binary operation
//! an accumulation `acc = acc ⊕ x` reduces by, the identity, the atomic that
//! combines programs' partials in global memory, and the CPU semantics.

use super::{AtomicOp, BinOp};
use crate::dtype::{CTy, DType};
use serde::{Deserialize, Serialize};

/// The identity a reduction starts from (and what it gives over no element).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Identity {
    /// 0.
    Zero,
    /// 1.
    One,
    /// The type's least value (−∞ for floats).
    Lowest,
    /// The type's greatest value (+∞ for floats).
    Highest,
}

/// One reduction.
pub struct Reduce {
    pub op: ReduceOp,
    /// The method name (`sum`).
    pub name: &'static str,
    /// The method name of its inclusive scan (`cumsum`).
    pub scan: &'static str,
    /// The method name of the index it selects (`argmax`), for reductions
    /// that pick an element.
    pub arg: Option<&'static str>,
    pub doc: &'static str,
    /// C combining two partial results `{a}` and `{b}` (the helpers are
    /// overloaded, so one template serves floats and integers).
    pub cuda: &'static str,
    /// The binary operation that combines two partial results the same way
    /// (`+` for a sum): what an accumulation `acc = acc ⊕ x` reduces by.
    pub binary: BinOp,
    pub identity: Identity,
    /// The atomic that combines one program's partial into a global value,
    /// if there is one (named in messages that suggest it).
    pub atomic: Option<AtomicOp>,
    /// What interpret mode combines (floats, then rounded to f32).
    pub cpu: fn(f64, f64) -> f64,
    /// What interpret mode combines on integers (then wrapped to the type).
    pub cpu_int: fn(i64, i64) -> i128,
}

macro_rules! reduce_table {
    ($($op:ident: $name:literal, scan $scan:literal, arg $arg:expr, $doc:literal, cuda $cuda:literal, binary $bin:ident,
        identity $id:ident, atomic $atomic:expr, cpu $cpu:expr, cpu_int $cpui:expr;)*) => {
        /// Reductions along one tile dimension; see [`TABLE`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum ReduceOp { $(#[doc = concat!("`x.", $name, "(t)`: ", $doc)] $op),* }

        /// Every reduction, in [`ReduceOp`] order.
        pub static TABLE: &[Reduce] = &[$(Reduce {
            op: ReduceOp::$op, name: $name, scan: $scan, arg: $arg, doc: $doc, cuda: $cuda, binary: BinOp::$bin,
            identity: Identity::$id, atomic: $atomic, cpu: $cpu, cpu_int: $cpui,
        }),*];

        impl ReduceOp {
            /// Every reduction.
            pub const ALL: &'static [ReduceOp] = &[$(ReduceOp::$op),*];
        }
    };
}

reduce_table! {
    Sum: "sum", scan "cumsum", arg None, "the sum (floats in f32, in the GPU's order: not bit-identical to a sequential sum)",
        cuda "({a} + {b})", binary Add, identity Zero, atomic Some(AtomicOp::Add),
        cpu |a, b| a + b, cpu_int |a, b| a as i128 + b as i128;
    Max: "max", scan "cummax", arg Some("argmax"), "the largest element (NaNs lose)",
        cuda "tf_max({a}, {b})", binary Max, identity Lowest, atomic Some(AtomicOp::Max),
        cpu f64::max, cpu_int |a, b| i128::from(a.max(b));
    Min: "min", scan "cummin", arg Some("argmin"), "the smallest element (NaNs lose)",
        cuda "tf_min({a}, {b})", binary Min, identity Highest, atomic Some(AtomicOp::Min),
        cpu f64::min, cpu_int |a, b| i128::from(a.min(b));
    Prod: "prod", scan "cumprod", arg None, "the product",
        cuda "({a} * {b})", binary Mul, identity One, atomic None,
        cpu |a, b| a * b, cpu_int |a, b| a as i128 * b as i128;
}

impl ReduceOp {
    /// The table entry.
    pub fn entry(self) -> &'static Reduce {
        &TABLE[self as usize]
    }

    /// The binary operation that combines two partial results the same way
    /// (`+` for a sum): what an accumulation `acc = acc ⊕ x` reduces by.
    pub fn binary(self) -> BinOp {
        self.entry().binary
    }

    /// The reduction whose [`ReduceOp::binary`] is `op`, if any.
    pub fn of_binary(op: BinOp) -> Option<ReduceOp> {
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

    /// The DSL method of the inclusive scan (`x.cumsum(tn)`).
    pub fn scan_name(self) -> &'static str {
        self.entry().scan
    }

    /// The DSL method of the index this reduction selects (`x.argmax(tn)`), if
    /// it selects one.
    pub fn arg_name(self) -> Option<&'static str> {
        self.entry().arg
    }

    /// The reduction whose selected index a method name stands for (`argmax`: max).
    pub fn from_arg_name(name: &str) -> Option<ReduceOp> {
        ReduceOp::ALL
            .iter()
            .copied()
            .find(|o| o.arg_name() == Some(name))
    }

    /// The reduction whose inclusive scan a method name stands for (`cumsum`: sum).
    pub fn from_scan_name(name: &str) -> Option<ReduceOp> {
        ReduceOp::ALL
            .iter()
            .copied()
            .find(|o| o.scan_name() == name)
    }

    /// The result type on elements of `t`: floats reduce in f32, integers
    /// and masks in their promoted type.
    pub fn result(self, t: DType) -> DType {
        DType::arith(t)
    }

    /// C combining the partials `a` and `b`.
    pub fn combine_c(self, a: &str, b: &str) -> String {
        self.entry().cuda.replace("{a}", a).replace("{b}", b)
    }

    /// The identity in C, for padding and for elements outside the extent.
    pub fn identity_c(self, t: CTy) -> &'static str {
        match (self.entry().identity, t) {
            (Identity::Zero, CTy::F32) => "0.0f",
            (Identity::One, CTy::F32) => "1.0f",
            (Identity::Lowest, CTy::F32) => "__int_as_float(0xff800000)",
            (Identity::Highest, CTy::F32) => "__int_as_float(0x7f800000)",
            (Identity::Zero, _) => "0",
            (Identity::One, _) => "1",
            (Identity::Lowest, CTy::U32) => "0u",
            (Identity::Highest, CTy::U32) => "0xffffffffu",
            (Identity::Lowest, CTy::I64) => "(-9223372036854775807ll - 1)",
            (Identity::Highest, CTy::I64) => "9223372036854775807ll",
            (Identity::Lowest, _) => "(-2147483647 - 1)",
            (Identity::Highest, _) => "2147483647",
        }
    }

    /// The identity interpret mode starts from, and what a reduction over
    /// no element gives, for values of `t` (the result type): the same as
    /// [`ReduceOp::identity_c`].
    pub fn identity(self, t: DType) -> super::cast::Num {
        use super::cast::Num;
        let id = self.entry().identity;
        if t.is_float() {
            return Num::F(match id {
                Identity::Zero => 0.0,
                Identity::One => 1.0,
                Identity::Lowest => f64::NEG_INFINITY,
                Identity::Highest => f64::INFINITY,
            });
        }
        let bits = t.bits();
        let (min, max) = if t.is_signed() {
            (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
        } else {
            (0, (1i128 << bits) - 1)
        };
        Num::I(match id {
            Identity::Zero => 0,
            Identity::One => 1,
            Identity::Lowest => min as i64,
            Identity::Highest => max as i64,
        })
    }
}
