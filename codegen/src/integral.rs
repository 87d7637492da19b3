//! Float values known to hold an integer within bounds.
//!
//! `(x / s).round().max(-127.0).min(127.0).cast::<i8>()` converts a float
//! that can only be an integer in [-127, 127]: the truncation, saturation
//! and NaN rule of Rust's `as` have nothing to do there, yet `cvt.rzi` runs on
//! the SM's conversion unit, at an eighth of an add's rate. Such a cast takes
//! the integer from the float's bits after one add instead
//! ([`crate::prims::cast::cuda_integral`]).
//!
//! A value's [`Fact`] says whether it is integral, between which bounds, and
//! whether it may be NaN. Facts come from literals, integer values (their
//! type's range), `floor`/`ceil`/`round`/`trunc`, `min`/`max`/`relu` (a NaN
//! loses to the other operand), negation, `abs`, `signum`, sums, differences
//! and products, `select`s, casts, and variables bound by one `let` and never
//! assigned (their value is that expression's, wherever they are read).

use crate::dtype::DType;
use crate::ir::*;
use std::collections::HashMap;

/// What is known of an f32 value: it lies within `lo..=hi` (an infinite
/// bound admits that infinity) or is NaN (only where `nan`); where
/// `integral`, each of its finite values is an integer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fact {
    pub integral: bool,
    pub lo: f64,
    pub hi: f64,
    pub nan: bool,
}

impl Fact {
    /// Nothing known.
    pub const ANY: Fact = Fact {
        integral: false,
        lo: f64::NEG_INFINITY,
        hi: f64::INFINITY,
        nan: true,
    };

    fn constant(v: f64) -> Fact {
        if v.is_nan() {
            return Fact::ANY;
        }
        Fact {
            integral: v.is_finite() && v.fract() == 0.0,
            lo: v,
            hi: v,
            nan: false,
        }
    }

    fn of_type(t: DType) -> Option<Fact> {
        t.int_range().map(|(lo, hi)| Fact {
            integral: true,
            lo,
            hi,
            nan: false,
        })
    }

    /// Integral, never NaN, and within `lo..=hi`.
    pub fn integer_within(&self, lo: f64, hi: f64) -> bool {
        self.integral && !self.nan && self.lo >= lo && self.hi <= hi
    }

    fn bounded(&self) -> bool {
        self.lo.is_finite() && self.hi.is_finite()
    }

    /// Either value.
    fn join(a: Fact, b: Fact) -> Fact {
        Fact {
            integral: a.integral && b.integral,
            lo: a.lo.min(b.lo),
            hi: a.hi.max(b.hi),
            nan: a.nan || b.nan,
        }
    }

    /// `max(a, b)` (`max`: true) or `min(a, b)`, where a NaN operand gives
    /// the other one.
    fn extremum(a: Fact, b: Fact, max: bool) -> Fact {
        let (mut lo, mut hi) = if max {
            (a.lo.max(b.lo), a.hi.max(b.hi))
        } else {
            (a.lo.min(b.lo), a.hi.min(b.hi))
        };
        // Where one operand is NaN the result is the other, unclamped.
        for (nan, other) in [(a.nan, b), (b.nan, a)] {
            if nan {
                lo = lo.min(other.lo);
                hi = hi.max(other.hi);
            }
        }
        Fact {
            integral: a.integral && b.integral,
            lo,
            hi,
            nan: a.nan && b.nan,
        }
    }

    /// `a + b`, `a - b` (`b` negated first) or `a * b`: integers stay integers
    /// (an f32 beyond 2^24 is one whatever the rounding); the bounds are exact
    /// while within ±2^24, where the result is exact, and only used there.
    fn arith(a: Fact, b: Fact, mul: bool) -> Fact {
        let integral = a.integral && b.integral;
        if !(a.bounded() && b.bounded()) {
            return Fact {
                integral,
                ..Fact::ANY
            };
        }
        let (lo, hi) = if mul {
            let c = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi];
            (
                c.iter().copied().fold(f64::INFINITY, f64::min),
                c.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            )
        } else {
            (a.lo + b.lo, a.hi + b.hi)
        };
        Fact {
            integral,
            lo,
            hi,
            nan: a.nan || b.nan,
        }
    }

    fn neg(self) -> Fact {
        Fact {
            lo: -self.hi,
            hi: -self.lo,
            ..self
        }
    }

    fn abs(self) -> Fact {
        let lo = if self.lo >= 0.0 {
            self.lo
        } else if self.hi <= 0.0 {
            -self.hi
        } else {
            0.0
        };
        Fact {
            lo,
            hi: self.lo.abs().max(self.hi.abs()),
            ..self
        }
    }
}

/// The variables of a kernel whose value is one expression: bound by a
/// single `let`, never assigned.
#[derive(Clone, Debug, Default)]
pub struct Integral {
    lets: HashMap<VarId, Expr>,
}

/// Deep enough for any chain of `let`s a kernel has; beyond, nothing is known.
const DEPTH: usize = 64;

impl Integral {
    /// The single-`let` variables of `k`.
    pub fn of(k: &Kernel) -> Integral {
        let mut lets: HashMap<VarId, Option<Expr>> = HashMap::new();
        k.walk_stmts(&mut |s| match s {
            Stmt::Let { var, value, .. } => {
                lets.entry(*var)
                    .and_modify(|v| *v = None)
                    .or_insert_with(|| Some(value.clone()));
            }
            Stmt::Assign { var, .. } => {
                lets.insert(*var, None);
            }
            _ => {}
        });
        Integral {
            lets: lets
                .into_iter()
                .filter_map(|(v, e)| Some((v, e?)))
                .collect(),
        }
    }

    /// What is known of `e`'s value; `dtype` gives an expression's type.
    pub fn fact(&self, e: &Expr, dtype: &dyn Fn(&Expr) -> DType) -> Fact {
        self.fact_at(e, dtype, 0)
    }

    fn fact_at(&self, e: &Expr, dtype: &dyn Fn(&Expr) -> DType, depth: usize) -> Fact {
        if depth > DEPTH {
            return Fact::ANY;
        }
        let f = |x: &Expr| self.fact_at(x, dtype, depth + 1);
        match e {
            Expr::Int(v) => return Fact::constant(*v as f64),
            Expr::Float(v) => return Fact::constant(*v),
            _ => {}
        }
        if let Some(t) = Fact::of_type(dtype(e)) {
            return t;
        }
        match e {
            Expr::Full {
                dtype: t, value, ..
            } => match crate::prims::cast::cpu(crate::prims::cast::Num::F(*value), *t) {
                crate::prims::cast::Num::F(v) => Fact::constant(v),
                crate::prims::cast::Num::I(v) => Fact::constant(v as f64),
            },
            Expr::Var(v) => self.lets.get(v).map_or(Fact::ANY, &f),
            Expr::Unary { op, arg } => {
                let a = f(arg);
                match op {
                    UnOp::Floor | UnOp::Ceil | UnOp::Round | UnOp::Trunc => Fact {
                        integral: true,
                        lo: a.lo.floor(),
                        hi: a.hi.ceil(),
                        nan: a.nan,
                    },
                    UnOp::Neg => a.neg(),
                    UnOp::Abs => a.abs(),
                    UnOp::Relu => Fact::extremum(a, Fact::constant(0.0), true),
                    UnOp::Sign => Fact {
                        integral: true,
                        lo: -1.0,
                        hi: 1.0,
                        nan: a.nan,
                    },
                    _ => Fact::ANY,
                }
            }
            Expr::Binary { op, lhs, rhs, .. } => {
                let (a, b) = (f(lhs), f(rhs));
                match op {
                    BinOp::Max => Fact::extremum(a, b, true),
                    BinOp::Min => Fact::extremum(a, b, false),
                    BinOp::Add => Fact::arith(a, b, false),
                    BinOp::Sub => Fact::arith(a, b.neg(), false),
                    BinOp::Mul => Fact::arith(a, b, true),
                    _ => Fact::ANY,
                }
            }
            Expr::Select {
                then, otherwise, ..
            }
            | Expr::IfConst {
                then, otherwise, ..
            } => Fact::join(f(then), f(otherwise)),
            Expr::Cast { arg, dtype: to } => {
                let a = f(arg);
                match to {
                    None | Some(DType::F32) => a,
                    // Integers up to 2^8 (bf16) and 2^11 (f16) round to themselves.
                    Some(DType::BF16) if a.integer_within(-256.0, 256.0) => a,
                    Some(DType::F16) if a.integer_within(-2048.0, 2048.0) => a,
                    _ => Fact::ANY,
                }
            }
            _ => Fact::ANY,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn var(v: VarId) -> Box<Expr> {
        Box::new(Expr::Var(v))
    }

    fn bin(op: BinOp, a: Box<Expr>, b: Box<Expr>) -> Box<Expr> {
        Box::new(Expr::Binary {
            op,
            lhs: a,
            rhs: b,
            at: Src::default(),
        })
    }

    fn un(op: UnOp, a: Box<Expr>) -> Box<Expr> {
        Box::new(Expr::Unary { op, arg: a })
    }

    fn lit(v: f64) -> Box<Expr> {
        Box::new(Expr::Float(v))
    }

    fn floats(_: &Expr) -> DType {
        DType::F32
    }

    #[test]
    fn a_rounded_value_clamped_by_integers_is_a_bounded_integer() {
        // v = (x / s).round(); v.max(-127.0).min(127.0)
        let mut k = Kernel::empty("q");
        let x = bin(BinOp::Div, var(0), var(1));
        k.body.push(Stmt::Let {
            var: 2,
            value: *un(UnOp::Round, x),
            at: Src::default(),
        });
        let facts = Integral::of(&k);
        let clamped = bin(BinOp::Min, bin(BinOp::Max, var(2), lit(-127.0)), lit(127.0));
        let f = facts.fact(&clamped, &floats);
        assert!(f.integer_within(-127.0, 127.0), "{f:?}");
        // Unclamped, the rounded value may be NaN or beyond any bound.
        let f = facts.fact(&Expr::Var(2), &floats);
        assert!(
            f.integral && f.nan && !f.integer_within(-1e30, 1e30),
            "{f:?}"
        );
        // A fractional bound keeps the integers out.
        let half = bin(BinOp::Max, var(2), lit(-0.5));
        assert!(!facts.fact(&half, &floats).integral);
    }

    /// Each shape's fact holds for its values at many inputs, NaN and the
    /// infinities among them: each value within the bounds (or NaN where it
    /// may be), each finite one an integer where the fact says integral.
    #[test]
    // `max` then `min` as the kernels write them: a NaN becomes the lower
    // bound, where `clamp` would keep it.
    #[allow(clippy::manual_clamp)]
    fn facts_hold_for_the_values_rust_computes() {
        type Shape = (Box<Expr>, fn(f32) -> f32);
        let x = || var(0);
        let shapes: Vec<Shape> = vec![
            (
                bin(
                    BinOp::Min,
                    bin(
                        BinOp::Max,
                        un(UnOp::Round, bin(BinOp::Mul, x(), lit(3.0))),
                        lit(-127.0),
                    ),
                    lit(127.0),
                ),
                |x| (x * 3.0).round().max(-127.0).min(127.0),
            ),
            (
                bin(
                    BinOp::Sub,
                    un(UnOp::Floor, bin(BinOp::Max, x(), lit(-5.5))),
                    lit(2.0),
                ),
                |x| x.max(-5.5).floor() - 2.0,
            ),
            (
                un(
                    UnOp::Neg,
                    un(UnOp::Abs, un(UnOp::Ceil, bin(BinOp::Min, x(), lit(9.0)))),
                ),
                |x| -x.min(9.0).ceil().abs(),
            ),
            (
                bin(
                    BinOp::Mul,
                    un(
                        UnOp::Trunc,
                        bin(BinOp::Min, bin(BinOp::Max, x(), lit(-3.0)), lit(4.0)),
                    ),
                    un(UnOp::Relu, un(UnOp::Round, bin(BinOp::Min, x(), lit(2.0)))),
                ),
                |x| x.max(-3.0).min(4.0).trunc() * x.min(2.0).round().max(0.0),
            ),
        ];
        let mut inputs = vec![
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            0.5,
            -0.5,
            2.5,
            -2.5,
        ];
        let mut u = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            u ^= u << 13;
            u ^= u >> 7;
            u ^= u << 17;
            inputs.push(f32::from_bits((u >> 32) as u32));
        }
        let facts = Integral::default();
        for (e, f) in &shapes {
            let fact = facts.fact(e, &floats);
            for &x in &inputs {
                let v = f(x);
                if v.is_nan() {
                    assert!(fact.nan, "{e:?} at {x}: NaN, {fact:?}");
                    continue;
                }
                let v = f64::from(v);
                assert!(fact.lo <= v && v <= fact.hi, "{e:?} at {x}: {v}, {fact:?}");
                assert!(
                    !fact.integral || !v.is_finite() || v.fract() == 0.0,
                    "{e:?} at {x}: {v}, {fact:?}"
                );
            }
        }
    }

    #[test]
    fn an_assigned_variable_is_not_known() {
        let mut k = Kernel::empty("a");
        k.body.push(Stmt::Let {
            var: 0,
            value: Expr::Float(1.0),
            at: Src::default(),
        });
        k.body.push(Stmt::Assign {
            var: 0,
            value: Expr::Float(0.5),
            at: Src::default(),
        });
        let facts = Integral::of(&k);
        assert_eq!(facts.fact(&Expr::Var(0), &floats), Fact::ANY);
    }

    #[test]
    fn integer_values_and_their_sums_keep_their_ranges() {
        let ints = |e: &Expr| match e {
            Expr::Var(_) => DType::I8,
            _ => DType::F32,
        };
        let facts = Integral::default();
        // q as f32 * 2 + 1: integral in [-255, 255].
        let e = bin(
            BinOp::Add,
            bin(
                BinOp::Mul,
                Box::new(Expr::Cast {
                    arg: var(0),
                    dtype: Some(DType::F32),
                }),
                lit(2.0),
            ),
            lit(1.0),
        );
        let f = facts.fact(&e, &ints);
        assert!(
            f.integer_within(-255.0, 255.0) && f.lo == -255.0 && f.hi == 255.0,
            "{f:?}"
        );
        // |x|, -x of a bounded integer; a NaN operand of max gives the other.
        let e = un(
            UnOp::Neg,
            un(
                UnOp::Abs,
                Box::new(Expr::Cast {
                    arg: var(0),
                    dtype: Some(DType::F32),
                }),
            ),
        );
        let f = facts.fact(&e, &ints);
        assert_eq!((f.lo, f.hi), (-128.0, 0.0));
        let e = bin(
            BinOp::Min,
            bin(BinOp::Max, un(UnOp::Floor, lit(f64::NAN)), lit(3.0)),
            lit(5.0),
        );
        let f = facts.fact(&e, &floats);
        assert!(f.integer_within(3.0, 5.0), "{f:?}");
    }
}
