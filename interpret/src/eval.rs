//! Expressions: each tile IR expression's value, with the meaning its CUDA C
//! lowering has. Every value has the type the checker gives it
//! ([`tilefuse_codegen::check::check_types`]); operands are converted to the
//! type an operation computes in as the emitted C converts them, and each
//! primitive computes with its table's CPU function
//! ([`tilefuse_codegen::prims`]), so the two cannot disagree.

use crate::error::InterpretError;
use crate::exec::{index_value, Program, Scalar};
use crate::tile::{walk, BadSet, Tile};
use std::convert::Infallible;
use std::sync::Arc;
use tilefuse_codegen::check::Ty;
use tilefuse_codegen::ir::*;
use tilefuse_codegen::prims::cast::{self, Num};
use tilefuse_codegen::prims::{f32r, wrap_int};
use tilefuse_codegen::DType;

/// `v` converted to `t` (C's conversion of a computed value: floats to f32,
/// integers wrapped, to `bool` by `!= 0`).
fn conv(v: Num, t: DType) -> Num {
    cast::cpu(v, t)
}

fn int(v: Num) -> i64 {
    index_value(v)
}

fn nonzero(v: Num) -> bool {
    match v {
        Num::I(i) => i != 0,
        Num::F(x) => x != 0.0,
    }
}

/// The type both sides of a comparison are converted to, as the emitted C
/// converts them: the promoted type, except that a literal meets a non-float
/// side in that side's (promoted) type.
/// `a op b`, both already of one type.
fn compare(op: CmpOp, a: Num, b: Num) -> bool {
    match (a, b) {
        (Num::I(a), Num::I(b)) => op.eval(a, b),
        _ => op.eval(a.as_f64(), b.as_f64()),
    }
}

impl Program<'_> {
    /// The checker's type of `e`.
    pub(crate) fn ty(&self, e: &Expr) -> Result<&Ty, InterpretError> {
        self.types.of(e).ok_or_else(|| {
            self.unsupported(format!(
                "internal: the checker gave no type to {}",
                describe(e)
            ))
        })
    }

    /// The value of `e`.
    pub(crate) fn eval(&self, e: &Expr) -> Result<Arc<Tile>, InterpretError> {
        match e {
            Expr::Var(v) => self.vars[*v].clone().ok_or_else(|| {
                self.unsupported(format!(
                    "`{}` is read before it is set",
                    self.k.vars[*v].name
                ))
            }),
            // `.cast()` at a store: the store converts to the tensor's type.
            Expr::Cast { arg, dtype: None } => self.eval(arg),
            _ => self.compute(e).map(Arc::new),
        }
    }

    /// A scalar's value (a condition's operand), an error if poisoned.
    fn scalar_num(&self, e: &Expr) -> Result<Num, InterpretError> {
        let v = self.eval(e)?;
        if !v.dims.is_empty() {
            return Err(self.unsupported(format!(
                "internal: {} is a condition's operand but not a scalar",
                describe(e)
            )));
        }
        if let Some(at) = v.bad(0) {
            return Err(self.divide_by_zero(at));
        }
        Ok(v.data[0])
    }

    /// A runtime condition (on scalars), as C evaluates it (`&&` and `||`
    /// stop at the first operand that decides).
    pub(crate) fn cond(&self, c: &Cond) -> Result<bool, InterpretError> {
        Ok(match c {
            Cond::Cmp { op, lhs, rhs } => {
                let t = tilefuse_codegen::check::meet(self.ty(lhs)?, self.ty(rhs)?);
                let (l, r) = (self.scalar_num(lhs)?, self.scalar_num(rhs)?);
                compare(*op, conv(l, t), conv(r, t))
            }
            Cond::Not(c) => !self.cond(c)?,
            Cond::And(a, b) => self.cond(a)? && self.cond(b)?,
            Cond::Or(a, b) => self.cond(a)? || self.cond(b)?,
            Cond::NonZero(e) => nonzero(self.scalar_num(e)?),
        })
    }

    /// A scalar of the program (a tile's bounds, a parameter).
    fn scalar_tile(&self, v: Num, ty: &Ty) -> Tile {
        Tile::scalar(v, ty.dtype)
    }

    fn compute(&self, e: &Expr) -> Result<Tile, InterpretError> {
        let ty = self.ty(e)?;
        Ok(match e {
            Expr::Var(_) | Expr::Cast { dtype: None, .. } => Tile::clone(&*self.eval(e)?),
            Expr::Load { tensor, index, .. } => self.load(*tensor, index, ty)?,
            Expr::Full { dtype, value, .. } => {
                let v = tilefuse_codegen::prims::cast::cpu(Num::F(*value), *dtype);
                self.zip(ty, &[], "", |_| Some(v))?
            }
            Expr::Addmm { acc, a, b, at } => {
                let (acc, a, b) = (self.eval(acc)?, self.eval(a)?, self.eval(b)?);
                self.addmm(&acc, &a, &b, ty, at)?
            }
            Expr::Binary { op, lhs, rhs, at } => {
                let (l, r) = (self.eval(lhs)?, self.eval(rhs)?);
                let (t, entry) = (ty.dtype, op.entry());
                if t.is_float() {
                    self.zip(ty, &[&l, &r], at, |x| {
                        let (a, b) = (conv(x[0], t).as_f64(), conv(x[1], t).as_f64());
                        Some(Num::F(f32r((entry.cpu)(a, b))))
                    })?
                } else {
                    // `None`: an integer division by zero, poisoning the element.
                    // A shift's amount keeps its own value (the emitted C
                    // passes it as a `long long`).
                    let shift = entry.rule == tilefuse_codegen::prims::binary::Rule::Shift;
                    self.zip(ty, &[&l, &r], at, |x| {
                        let a = int(conv(x[0], t));
                        let b = if shift { int(x[1]) } else { int(conv(x[1], t)) };
                        (entry.cpu_int)(a, b, t).map(|v| Num::I(wrap_int(t, v)))
                    })?
                }
            }
            Expr::Unary { op, arg } => {
                let a = self.eval(arg)?;
                let (t, entry) = (ty.dtype, op.entry());
                if t.is_float() {
                    self.zip(ty, &[&a], "", |x| {
                        Some(Num::F(f32r((entry.cpu)(conv(x[0], t).as_f64()))))
                    })?
                } else {
                    self.zip(ty, &[&a], "", |x| {
                        Some(Num::I(wrap_int(t, (entry.cpu_int)(int(conv(x[0], t)), t))))
                    })?
                }
            }
            Expr::Cast {
                arg,
                dtype: Some(t),
            } => {
                let a = self.eval(arg)?;
                self.zip(ty, &[&a], "", |x| Some(conv(x[0], *t)))?
            }
            Expr::Rand {
                kind, seed, offset, ..
            } => {
                let seed = self.int_scalar(seed)?;
                let o = self.eval(offset)?;
                self.zip(ty, &[&o], "", |x| {
                    Some(kind.cpu(seed, int(conv(x[0], DType::U32)) as u32))
                })?
            }
            Expr::Int(i) => self.scalar_tile(Num::I(*i), ty),
            Expr::Float(f) => self.scalar_tile(Num::F(f32r(*f)), ty),
            Expr::Scalar(s) => match self.scalars[*s] {
                Scalar::Float(f) => self.scalar_tile(Num::F(f64::from(f)), ty),
                i => self.scalar_tile(Num::I(i.int().unwrap_or(0)), ty),
            },
            Expr::Const(c) => self.scalar_tile(Num::I(self.consts[*c]), ty),
            Expr::TileBegin(d) => self.scalar_tile(Num::I(self.range(*d)?.0), ty),
            Expr::TileEnd(d) => self.scalar_tile(Num::I(self.range(*d)?.1), ty),
            Expr::TileSize(d) => {
                let (b, e) = self.range(*d)?;
                self.scalar_tile(Num::I(e - b), ty)
            }
            Expr::TileIndex(d) => {
                let (b, _) = self.range(*d)?;
                if ty.dims.is_empty() {
                    // An `each` dimension's index: a scalar.
                    self.scalar_tile(Num::I(b), ty)
                } else {
                    let mut t = self.zip(ty, &[], "", |_| Some(Num::I(0)))?;
                    for (i, x) in t.data.iter_mut().enumerate() {
                        *x = Num::I(b + i as i64);
                    }
                    t
                }
            }
            Expr::Reduce { op, arg, dim, at } => {
                let a = self.eval(arg)?;
                self.reduce(*op, &a, *dim, ty, at)?
            }
            Expr::Scan { op, arg, dim, at } => {
                let a = self.eval(arg)?;
                self.scan(*op, &a, *dim, ty, at)?
            }
            Expr::ArgReduce { op, arg, dim, at } => {
                let a = self.eval(arg)?;
                self.arg_reduce(*op, &a, *dim, ty, at)?
            }
            Expr::Compare { op, lhs, rhs, at } => {
                let t = tilefuse_codegen::check::meet(self.ty(lhs)?, self.ty(rhs)?);
                let (l, r) = (self.eval(lhs)?, self.eval(rhs)?);
                self.zip(ty, &[&l, &r], at, |x| {
                    let c = compare(*op, conv(x[0], t), conv(x[1], t));
                    Some(Num::I(i64::from(c)))
                })?
            }
            Expr::Select {
                mask,
                then,
                otherwise,
                ..
            } => {
                let (m, a, b) = (self.eval(mask)?, self.eval(then)?, self.eval(otherwise)?);
                self.select(&m, &a, &b, ty)?
            }
            Expr::IfConst {
                cond,
                then,
                otherwise,
                ..
            } => {
                // A runtime `if` value: only the branch taken is computed (C's `?:`).
                let chosen = self.eval(if self.cond(cond)? { then } else { otherwise })?;
                let t = ty.dtype;
                self.zip(ty, &[&chosen], "", |x| Some(conv(x[0], t)))?
            }
        })
    }

    /// `f` elementwise over `inputs` broadcast to the tile of `ty`, giving
    /// values of `ty.dtype`. An element of a poisoned input is poisoned; one
    /// for which `f` gives `None` is poisoned by `at` (an integer division by
    /// zero).
    fn zip(
        &self,
        ty: &Ty,
        inputs: &[&Tile],
        at: &str,
        mut f: impl FnMut(&[Num]) -> Option<Num>,
    ) -> Result<Tile, InterpretError> {
        let lens = self.lens(&ty.dims)?;
        let strides = inputs
            .iter()
            .map(|t| self.strides(t, &ty.dims, &lens))
            .collect::<Result<Vec<_>, _>>()?;
        let n = lens.iter().product();
        let mut data = Vec::with_capacity(n);
        let mut bad = BadSet::new(n);
        let mut args = vec![Num::I(0); inputs.len()];
        let _ = walk::<Infallible>(&lens, &strides, |i, _, offs| {
            for (k, t) in inputs.iter().enumerate() {
                args[k] = t.data[offs[k]];
                if let Some(a) = t.bad(offs[k]) {
                    bad.mark(i, a);
                }
            }
            data.push(f(&args).unwrap_or_else(|| {
                bad.mark(i, at);
                Num::I(0)
            }));
            Ok(())
        });
        Ok(Tile {
            dims: ty.dims.clone(),
            lens,
            dtype: ty.dtype,
            data,
            poison: bad.finish(),
        })
    }

    /// `select(m, a, b)`: `a` where `m` is not zero, else `b`, converted to
    /// the select's type. Poison of the branch not taken is dropped.
    fn select(&self, m: &Tile, a: &Tile, b: &Tile, ty: &Ty) -> Result<Tile, InterpretError> {
        let lens = self.lens(&ty.dims)?;
        let strides = [m, a, b]
            .iter()
            .map(|t| self.strides(t, &ty.dims, &lens))
            .collect::<Result<Vec<_>, _>>()?;
        let n = lens.iter().product();
        let mut data = Vec::with_capacity(n);
        let mut bad = BadSet::new(n);
        let _ = walk::<Infallible>(&lens, &strides, |i, _, offs| {
            let (t, o) = if nonzero(m.data[offs[0]]) {
                (a, offs[1])
            } else {
                (b, offs[2])
            };
            if let Some(at) = m.bad(offs[0]).or_else(|| t.bad(o)) {
                bad.mark(i, at);
            }
            data.push(conv(t.data[o], ty.dtype));
            Ok(())
        });
        Ok(Tile {
            dims: ty.dims.clone(),
            lens,
            dtype: ty.dtype,
            data,
            poison: bad.finish(),
        })
    }

    /// `tensor[index]`: per element of the index's tiles, the element there,
    /// or zero where an index component leaves the tensor (`0 <= i < size`
    /// fails).
    fn load(&self, tensor: TensorId, index: &[Expr], ty: &Ty) -> Result<Tile, InterpretError> {
        let comps = index
            .iter()
            .map(|c| self.eval(c))
            .collect::<Result<Vec<_>, _>>()?;
        let lens = self.lens(&ty.dims)?;
        let strides = comps
            .iter()
            .map(|c| self.strides(c, &ty.dims, &lens))
            .collect::<Result<Vec<_>, _>>()?;
        let t = &self.tensors[tensor];
        let zero = if t.dtype().is_float() {
            Num::F(0.0)
        } else {
            Num::I(0)
        };
        let n = lens.iter().product();
        let mut data = Vec::with_capacity(n);
        let mut bad = BadSet::new(n);
        let mut idx = vec![0i64; comps.len()];
        let _ = walk::<Infallible>(&lens, &strides, |i, _, offs| {
            for (a, c) in comps.iter().enumerate() {
                idx[a] = int(c.data[offs[a]]);
                // An index computed from a division by zero reads an
                // unspecified element: the value is poisoned too.
                if let Some(at) = c.bad(offs[a]) {
                    bad.mark(i, at);
                }
            }
            data.push(t.offset_at(&idx).map_or(zero, |off| t.load(off)));
            Ok(())
        });
        Ok(Tile {
            dims: ty.dims.clone(),
            lens,
            dtype: t.dtype(),
            data,
            poison: bad.finish(),
        })
    }

    /// `x.op(dim)`: each line of `a` along `dim` folded from the identity in
    /// index order, in the reduction's type (floats rounded to f32 at each
    /// step, integers wrapped).
    fn reduce(
        &self,
        op: ReduceOp,
        a: &Tile,
        dim: DimId,
        ty: &Ty,
        at: &str,
    ) -> Result<Tile, InterpretError> {
        let axis = self.axis(a, dim, at, "reduces")?;
        let mut st = vec![0usize; a.dims.len()];
        let mut s = 1;
        for i in (0..a.dims.len()).rev() {
            st[i] = s;
            s *= a.lens[i];
        }
        let (step, count) = (st[axis], a.lens[axis]);
        let out_strides: Vec<usize> = (0..st.len())
            .filter(|&i| i != axis)
            .map(|i| st[i])
            .collect();
        let out_lens: Vec<usize> = (0..st.len())
            .filter(|&i| i != axis)
            .map(|i| a.lens[i])
            .collect();
        let t = ty.dtype;
        let entry = op.entry();
        let n = out_lens.iter().product();
        let mut data = Vec::with_capacity(n);
        let mut bad = BadSet::new(n);
        let _ = walk::<Infallible>(&out_lens, &[out_strides], |i, _, offs| {
            let mut acc = op.identity(t);
            for j in 0..count {
                let at = offs[0] + j * step;
                if let Some(p) = a.bad(at) {
                    bad.mark(i, p);
                }
                let x = conv(a.data[at], t);
                acc = match (acc, x) {
                    (Num::I(s), Num::I(x)) => Num::I(wrap_int(t, (entry.cpu_int)(s, x))),
                    (s, x) => Num::F(f32r((entry.cpu)(s.as_f64(), x.as_f64()))),
                };
            }
            data.push(acc);
            Ok(())
        });
        Ok(Tile {
            dims: ty.dims.clone(),
            lens: out_lens,
            dtype: t,
            data,
            poison: bad.finish(),
        })
    }

    /// The position of `dim` among `a`'s tiles, which `at` (it `verb` along
    /// it) needs.
    fn axis(&self, a: &Tile, dim: DimId, at: &str, verb: &str) -> Result<usize, InterpretError> {
        a.dims.iter().position(|&d| d == dim).ok_or_else(|| {
            self.unsupported(format!(
                "`{at}` {verb} along tile `{}`, which the value does not have",
                self.k.dims[dim].name
            ))
        })
    }

    /// The index along `dim` (from the tile's first, as `t.index()`) of the
    /// first element equal to `a`'s reduction by `op` (max or min) along it:
    /// the GPU's pair reduction, in index order. NaNs are never picked; a
    /// line of NaNs only gives its first index.
    fn arg_reduce(
        &self,
        op: ReduceOp,
        a: &Tile,
        dim: DimId,
        ty: &Ty,
        at: &str,
    ) -> Result<Tile, InterpretError> {
        let axis = self.axis(a, dim, at, "picks")?;
        let (begin, _) = self.range(dim)?;
        let step: usize = a.lens[axis + 1..].iter().product();
        let count = a.lens[axis];
        let vt = op.result(a.dtype);
        let out_lens: Vec<usize> = (0..a.lens.len())
            .filter(|&i| i != axis)
            .map(|i| a.lens[i])
            .collect();
        let n: usize = out_lens.iter().product();
        let mut data = Vec::with_capacity(n);
        let mut bad = BadSet::new(n);
        for (i, start) in (0..a.data.len())
            .filter(|i| (i / step) % count == 0)
            .enumerate()
        {
            let mut best: Option<(Num, usize)> = None;
            for j in 0..count {
                let at_j = start + j * step;
                if let Some(p) = a.bad(at_j) {
                    bad.mark(i, p);
                }
                let x = conv(a.data[at_j], vt);
                let beats = |b: Num| match (x, b) {
                    (Num::I(x), Num::I(b)) => match op {
                        ReduceOp::Min => x < b,
                        _ => x > b,
                    },
                    (x, b) => match op {
                        ReduceOp::Min => x.as_f64() < b.as_f64(),
                        _ => x.as_f64() > b.as_f64(),
                    },
                };
                let nan = matches!(x, Num::F(v) if v.is_nan());
                if !nan && best.is_none_or(|(b, _)| beats(b)) {
                    best = Some((x, j));
                }
            }
            data.push(Num::I(begin + best.map_or(0, |(_, j)| j) as i64));
        }
        Ok(Tile {
            dims: ty.dims.clone(),
            lens: out_lens,
            dtype: ty.dtype,
            data,
            poison: bad.finish(),
        })
    }

    /// The inclusive scan of `a` along `dim` by `op`, in index order over the
    /// tile's in-bounds elements (a prefix is poisoned from its first
    /// poisoned element on).
    fn scan(
        &self,
        op: ReduceOp,
        a: &Tile,
        dim: DimId,
        ty: &Ty,
        at: &str,
    ) -> Result<Tile, InterpretError> {
        let axis = self.axis(a, dim, at, "scans")?;
        let step: usize = a.lens[axis + 1..].iter().product();
        let count = a.lens[axis];
        let t = ty.dtype;
        let entry = op.entry();
        let n = a.data.len();
        let mut data = vec![Num::I(0); n];
        let mut bad = BadSet::new(n);
        // Every line along the axis starts at an index whose axis coordinate is 0.
        for start in (0..n).filter(|i| (i / step) % count == 0) {
            let mut acc = op.identity(t);
            let mut poisoned = None;
            for j in 0..count {
                let i = start + j * step;
                if let Some(p) = a.bad(i) {
                    poisoned.get_or_insert(p);
                }
                let x = conv(a.data[i], t);
                acc = match (acc, x) {
                    (Num::I(s), Num::I(x)) => Num::I(wrap_int(t, (entry.cpu_int)(s, x))),
                    (s, x) => Num::F(f32r((entry.cpu)(s.as_f64(), x.as_f64()))),
                };
                data[i] = acc;
                if let Some(p) = poisoned {
                    bad.mark(i, p);
                }
            }
        }
        Ok(Tile {
            dims: a.dims.clone(),
            lens: a.lens.clone(),
            dtype: t,
            data,
            poison: bad.finish(),
        })
    }

    /// `acc + a·b`, contracting over the one tile `a` and `b` share and `acc`
    /// lacks (the checker's rule), in f32: on the general lowering's path one
    /// fused multiply-add per product in K order over the whole K block (its
    /// elements past the extent as zeros), exactly as its code does; on the
    /// tensor-core paths a K block's products summed (exactly, in index order)
    /// and added to the accumulator with one rounding.
    fn addmm(
        &self,
        acc: &Tile,
        a: &Tile,
        b: &Tile,
        ty: &Ty,
        at: &str,
    ) -> Result<Tile, InterpretError> {
        for x in [acc, a, b] {
            if let Some(p) = x.any_bad() {
                return Err(self.divide_by_zero(p));
            }
        }
        let Some(&k) = a
            .dims
            .iter()
            .find(|d| b.dims.contains(d) && !acc.dims.contains(d))
        else {
            return Err(self.unsupported(format!(
                "`{at}`: addmm contracts over the one tile that both operands have and the accumulator lacks"
            )));
        };
        let kn = a.lens[a.dims.iter().position(|&d| d == k).unwrap_or(0)];
        let mut dims_k = acc.dims.clone();
        dims_k.push(k);
        let mut lens_k = acc.lens.clone();
        lens_k.push(kn);
        let sa = self.strides(a, &dims_k, &lens_k)?;
        let sb = self.strides(b, &dims_k, &lens_k)?;
        let nd = acc.dims.len();
        let (ka, kb) = (sa[nd], sb[nd]);
        let sacc = self.strides(acc, &acc.dims, &acc.lens)?;
        let af: Vec<f64> = a.data.iter().map(|x| x.as_f64()).collect();
        let bf: Vec<f64> = b.data.iter().map(|x| x.as_f64()).collect();
        let block = self.blocks[k].max(kn as i64) as usize;
        let mut data = Vec::with_capacity(acc.data.len());
        let strides = [sacc, sa[..nd].to_vec(), sb[..nd].to_vec()];
        let _ = walk::<Infallible>(&acc.lens, &strides, |_, _, offs| {
            let c = acc.data[offs[0]].as_f64();
            let dot = |kk: usize| af[offs[1] + kk * ka] * bf[offs[2] + kk * kb];
            let v = if self.fma {
                (0..block).fold(c, |s, kk| f32r(s + if kk < kn { dot(kk) } else { 0.0 }))
            } else {
                f32r(c + (0..kn).map(dot).sum::<f64>())
            };
            data.push(Num::F(v));
            Ok(())
        });
        Ok(Tile {
            dims: acc.dims.clone(),
            lens: acc.lens.clone(),
            dtype: ty.dtype,
            data,
            poison: None,
        })
    }
}

/// A short description of an expression, for internal errors.
fn describe(e: &Expr) -> String {
    let s = format!("{e:?}");
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("`{}…`", &s[..i]),
        None => format!("`{s}`"),
    }
}
