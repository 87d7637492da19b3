//! Expressions: each tile IR expression's value, with the meaning its CUDA C
//! lowering has (f32 arithmetic, integer indices, broadcasting by tile name).

use crate::error::InterpretError;
use crate::exec::{Program, Scalar};
use crate::tensor::{f32r, round_to};
use crate::tile::Tile;
use tilefuse_codegen::ir::*;
use tilefuse_codegen::DType;

impl Program<'_> {
    /// The value of `e`; `cast_to` is the dtype a `.cast()` without a type
    /// takes (the tensor being stored to).
    pub(crate) fn eval(
        &mut self,
        e: &Expr,
        cast_to: Option<DType>,
    ) -> Result<Tile, InterpretError> {
        Ok(match e {
            Expr::Var(v) => self.vars[*v].clone().ok_or_else(|| {
                self.unsupported(format!(
                    "`{}` is read before it is set",
                    self.k.vars[*v].name
                ))
            })?,
            Expr::Load { tensor, index, at } => self.load(*tensor, index, at)?,
            Expr::Full { dims, dtype, value } => {
                let lens = self.lens(dims)?;
                let v = round_to(*dtype, *value);
                Tile::build(dims, &lens, is_int(*dtype), |_| v)
            }
            Expr::Addmm { acc, a, b, at } => {
                let (acc, a, b) = (
                    self.eval(acc, None)?,
                    self.eval(a, None)?,
                    self.eval(b, None)?,
                );
                self.addmm(&acc, &a, &b, at)?
            }
            Expr::Binary { op, lhs, rhs, at } => {
                let (l, r) = (self.eval(lhs, cast_to)?, self.eval(rhs, cast_to)?);
                let int = l.int && r.int;
                if int && matches!(op, BinOp::Div | BinOp::Rem) && r.data.contains(&0.0) {
                    return Err(self.unsupported(format!("`{at}` divides an integer by zero")));
                }
                Tile::zip(&[&l, &r], int, |x| binary(*op, x[0], x[1], int))
            }
            Expr::Unary { op, arg } => {
                let a = self.eval(arg, cast_to)?;
                if a.int && *op == UnOp::Neg {
                    a.map(true, |x| -x)
                } else {
                    a.map(false, |x| unary(*op, x))
                }
            }
            Expr::Cast { arg, dtype } => {
                let a = self.eval(arg, None)?;
                match dtype.or(cast_to) {
                    Some(t) => a.map(is_int(t), |x| round_to(t, x)),
                    None => a,
                }
            }
            Expr::Int(i) => Tile::scalar(*i as f64, true),
            Expr::Float(f) => Tile::scalar(f32r(*f), false),
            Expr::Scalar(s) => match self.scalars[*s] {
                Scalar::Int(i) => Tile::scalar(i as f64, true),
                Scalar::Float(f) => Tile::scalar(f64::from(f), false),
            },
            Expr::Const(c) => Tile::scalar(self.consts[*c] as f64, true),
            Expr::TileBegin(d) => Tile::scalar(self.range(*d)?.0 as f64, true),
            Expr::TileEnd(d) => Tile::scalar(self.range(*d)?.1 as f64, true),
            Expr::TileSize(d) => {
                let (b, e) = self.range(*d)?;
                Tile::scalar((e - b) as f64, true)
            }
            Expr::TileIndex(d) => {
                let (b, e) = self.range(*d)?;
                Tile::build(&[*d], &[(e - b) as usize], true, |pos| {
                    (b + pos[0] as i64) as f64
                })
            }
            Expr::Reduce { op, arg, dim, at } => {
                let a = self.eval(arg, None)?;
                self.reduce(*op, &a, *dim, at)?
            }
            Expr::Compare { op, lhs, rhs, .. } => {
                let (l, r) = (self.eval(lhs, None)?, self.eval(rhs, None)?);
                Tile::zip(&[&l, &r], true, |x| {
                    f64::from(u8::from(compare(*op, x[0], x[1])))
                })
            }
            Expr::Select {
                mask,
                then,
                otherwise,
                ..
            } => {
                let m = self.eval(mask, None)?;
                let (t, o) = (self.eval(then, cast_to)?, self.eval(otherwise, cast_to)?);
                let int = t.int && o.int;
                Tile::zip(
                    &[&m, &t, &o],
                    int,
                    |x| if x[0] != 0.0 { x[1] } else { x[2] },
                )
            }
            Expr::IfConst { at, .. } => {
                return Err(self.unsupported(format!("`{at}` was not specialized away")))
            }
        })
    }

    /// `acc + a·b`, contracting by name over the one dimension `a` and `b`
    /// share and `acc` lacks (the checker's rule); f32 accumulation, one
    /// rounding per K step (the GPU adds a K block's products on the tensor
    /// cores, then into the f32 accumulator).
    fn addmm(&self, acc: &Tile, a: &Tile, b: &Tile, at: &str) -> Result<Tile, InterpretError> {
        let shape_err = || {
            self.unsupported(format!(
                "`{at}`: addmm contracts over the one tile that both operands have and the accumulator lacks, \
                 and the accumulator has every other tile of the operands"
            ))
        };
        let ks: Vec<DimId> = a
            .dims
            .iter()
            .copied()
            .filter(|d| b.dims.contains(d) && !acc.dims.contains(d))
            .collect();
        let [k] = ks.as_slice() else {
            return Err(shape_err());
        };
        if a.dims
            .iter()
            .chain(&b.dims)
            .any(|d| d != k && !acc.dims.contains(d))
        {
            return Err(shape_err());
        }
        let kn = a.lens[a.dims.iter().position(|d| d == k).ok_or_else(shape_err)?];
        // Positions over acc's dims followed by k.
        let mut of = acc.dims.clone();
        of.push(*k);
        let mut full = vec![0usize; of.len()];
        Ok(Tile::build(&acc.dims, &acc.lens, false, |pos| {
            full[..pos.len()].copy_from_slice(pos);
            let mut s = 0.0;
            for kk in 0..kn {
                full[pos.len()] = kk;
                s += a.at(&of, &full) * b.at(&of, &full);
            }
            f32r(acc.at(&acc.dims, pos) + s)
        }))
    }

    fn reduce(&self, op: ReduceOp, a: &Tile, dim: DimId, at: &str) -> Result<Tile, InterpretError> {
        let Some(axis) = a.dims.iter().position(|&d| d == dim) else {
            return Err(self.unsupported(format!(
                "`{at}` reduces along tile `{}`, which the value does not have",
                self.k.dims[dim].name
            )));
        };
        let dims: Vec<DimId> = a.dims.iter().copied().filter(|&d| d != dim).collect();
        let lens: Vec<usize> = a
            .lens
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != axis)
            .map(|(_, &n)| n)
            .collect();
        let mut full = vec![0usize; a.dims.len()];
        Ok(Tile::build(&dims, &lens, a.int, |pos| {
            let mut acc: Option<f64> = None;
            for i in 0..a.lens[axis] {
                let mut p = pos.iter().copied();
                for (slot, x) in full.iter_mut().enumerate() {
                    *x = if slot == axis {
                        i
                    } else {
                        p.next().unwrap_or(0)
                    };
                }
                let v = a.at(&a.dims, &full);
                acc = Some(match (acc, op) {
                    (None, _) => v,
                    (Some(s), ReduceOp::Sum) => s + v,
                    (Some(s), ReduceOp::Max) => s.max(v),
                    (Some(s), ReduceOp::Min) => s.min(v),
                });
            }
            let v = acc.unwrap_or(0.0);
            if a.int {
                v
            } else {
                f32r(v)
            }
        }))
    }
}

pub(crate) fn is_int(t: DType) -> bool {
    matches!(t, DType::I32 | DType::U32 | DType::I64)
}

fn binary(op: BinOp, a: f64, b: f64, int: bool) -> f64 {
    if int {
        let (x, y) = (a as i64, b as i64);
        return match op {
            BinOp::Add => x.wrapping_add(y),
            BinOp::Sub => x.wrapping_sub(y),
            BinOp::Mul => x.wrapping_mul(y),
            BinOp::Div => x.wrapping_div(y),
            BinOp::Rem => x.wrapping_rem(y),
            BinOp::Min => x.min(y),
            BinOp::Max => x.max(y),
        } as f64;
    }
    f32r(match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        BinOp::Div => a / b,
        BinOp::Rem => a % b,
        BinOp::Min => a.min(b),
        BinOp::Max => a.max(b),
    })
}

fn unary(op: UnOp, x: f64) -> f64 {
    const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
    let phi = |x: f64| 0.5 * (1.0 + libm::erf(x * FRAC_1_SQRT_2));
    f32r(match op {
        UnOp::Neg => -x,
        UnOp::Exp => x.exp(),
        UnOp::Log => x.ln(),
        UnOp::Sqrt => x.sqrt(),
        UnOp::Rsqrt => 1.0 / x.sqrt(),
        UnOp::Abs => x.abs(),
        UnOp::Relu => x.max(0.0),
        UnOp::Gelu => x * phi(x),
        UnOp::GeluTanh => {
            0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh())
        }
        UnOp::Silu => x / (1.0 + (-x).exp()),
        UnOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnOp::Tanh => x.tanh(),
        UnOp::ReluGrad => f64::from(u8::from(x > 0.0)),
        UnOp::GeluGrad => phi(x) + x * 0.398_942_280_401_432_7 * (-0.5 * x * x).exp(),
    })
}

fn compare(op: CmpOp, a: f64, b: f64) -> bool {
    match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
    }
}
