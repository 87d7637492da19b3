//! Running a kernel's programs: the statements and expressions of the tile IR,
//! each with the meaning its CUDA C lowering has.

use crate::error::{InterpretError, OutOfBounds};
use crate::tensor::{f32r, round_to, HostTensor};
use crate::tile::Tile;
use tilefuse_codegen::ir::*;
use tilefuse_codegen::{Config, DType};

/// A runtime scalar argument, as the GPU launch takes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Int(i64),
    Float(f32),
}

/// Runs every program of `kernel` on the host, in grid order, with `config`'s
/// block sizes: `tensors` and `scalars` in the kernel's parameter order,
/// `constexprs` the values of its `#[constexpr]` parameters.
pub fn run(
    kernel: &Kernel,
    config: &Config,
    constexprs: &[i64],
    tensors: &mut [HostTensor],
    scalars: &[Scalar],
) -> Result<(), InterpretError> {
    let k = &*kernel
        .specialize(constexprs)
        .map_err(|e| InterpretError::Unsupported {
            kernel: kernel.name.clone(),
            message: e.to_string(),
        })?;
    let arg = |arg: &str, message: String| InterpretError::Argument {
        kernel: k.name.clone(),
        arg: arg.into(),
        message,
    };
    if tensors.len() != k.tensors.len() || scalars.len() != k.scalars.len() {
        return Err(arg(
            "(arguments)",
            format!(
                "{} tensors and {} scalars given; the kernel takes {} and {}",
                tensors.len(),
                scalars.len(),
                k.tensors.len(),
                k.scalars.len()
            ),
        ));
    }
    if constexprs.len() != k.constexprs.len() {
        return Err(arg(
            "(constexprs)",
            format!(
                "{} given, the kernel has {}",
                constexprs.len(),
                k.constexprs.len()
            ),
        ));
    }
    for (t, p) in tensors.iter().zip(&k.tensors) {
        if t.shape().len() != p.rank {
            return Err(arg(
                &p.name,
                format!(
                    "a tensor of rank {} expected, got shape {:?}",
                    p.rank,
                    t.shape()
                ),
            ));
        }
    }
    if config.block_sizes.len() != k.dims.len() || config.block_sizes.contains(&0) {
        return Err(arg(
            "(config)",
            format!(
                "one block size above 0 per tile dimension ({}) expected, got {:?}",
                k.dims.len(),
                config.block_sizes
            ),
        ));
    }
    let mut extents = Vec::with_capacity(k.dims.len());
    for d in &k.dims {
        match scalars[d.extent] {
            Scalar::Int(e) if e >= 0 => extents.push(e),
            other => {
                return Err(arg(
                    &k.scalars[d.extent].name,
                    format!(
                        "the extent of tile `{}` must be an integer >= 0, got {other:?}",
                        d.name
                    ),
                ))
            }
        }
    }
    let mut p = Program {
        k,
        blocks: &config.block_sizes,
        extents,
        consts: constexprs,
        scalars,
        tensors,
        ranges: vec![None; k.dims.len()],
        vars: vec![None; k.vars.len()],
    };
    // Programs: every combination of the grid dimensions' tiles.
    let counts: Vec<i64> = k
        .grid
        .iter()
        .map(|&d| (p.extents[d] + p.block(d) - 1) / p.block(d))
        .collect();
    if counts.contains(&0) {
        return Ok(());
    }
    let mut which = vec![0i64; k.grid.len()];
    loop {
        for (&d, &i) in k.grid.iter().zip(&which) {
            p.enter(d, i * p.block(d));
        }
        p.vars.iter_mut().for_each(|v| *v = None);
        p.stmts(&k.body)?;
        let mut g = which.len();
        loop {
            if g == 0 {
                return Ok(());
            }
            g -= 1;
            which[g] += 1;
            if which[g] < counts[g] {
                break;
            }
            which[g] = 0;
        }
    }
}

struct Program<'a> {
    k: &'a Kernel,
    blocks: &'a [usize],
    extents: Vec<i64>,
    consts: &'a [i64],
    scalars: &'a [Scalar],
    tensors: &'a mut [HostTensor],
    /// Each tile dimension's current range `[begin, end)`, clipped to its extent.
    ranges: Vec<Option<(i64, i64)>>,
    vars: Vec<Option<Tile>>,
}

impl Program<'_> {
    fn block(&self, d: DimId) -> i64 {
        self.blocks[d] as i64
    }

    fn enter(&mut self, d: DimId, begin: i64) {
        self.ranges[d] = Some((begin, (begin + self.block(d)).min(self.extents[d])));
    }

    fn unsupported(&self, message: String) -> InterpretError {
        InterpretError::Unsupported {
            kernel: self.k.name.clone(),
            message,
        }
    }

    fn range(&self, d: DimId) -> Result<(i64, i64), InterpretError> {
        self.ranges[d].ok_or_else(|| {
            self.unsupported(format!(
                "tile `{}` is used outside its loop",
                self.k.dims[d].name
            ))
        })
    }

    fn lens(&self, dims: &[DimId]) -> Result<Vec<usize>, InterpretError> {
        dims.iter()
            .map(|&d| self.range(d).map(|(b, e)| (e - b) as usize))
            .collect()
    }

    /// The tiles in scope, for messages: `tm = 896..1000, tk = 64..128`.
    fn tiles(&self) -> String {
        let parts: Vec<String> = self
            .ranges
            .iter()
            .enumerate()
            .filter_map(|(d, r)| r.map(|(b, e)| format!("{} = {b}..{e}", self.k.dims[d].name)))
            .collect();
        parts.join(", ")
    }

    fn stmts(&mut self, body: &[Stmt]) -> Result<(), InterpretError> {
        for s in body {
            self.stmt(s)?;
        }
        Ok(())
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), InterpretError> {
        match s {
            Stmt::Let { var, value, .. } | Stmt::Assign { var, value, .. } => {
                let v = self.eval(value, None)?;
                self.vars[*var] = Some(v);
            }
            Stmt::Store {
                tensor,
                index,
                value,
                at,
            } => self.store(*tensor, index, value, at)?,
            Stmt::Loop { dim, body } => {
                let mut begin = 0;
                while begin < self.extents[*dim] {
                    self.enter(*dim, begin);
                    self.stmts(body)?;
                    begin += self.block(*dim);
                }
                self.ranges[*dim] = None;
            }
            Stmt::Wait {
                tensor,
                index,
                end,
                value,
                at,
            } => {
                let lo = self.int_scalar(index)?;
                let hi = match end {
                    Some(e) => self.int_scalar(e)?,
                    None => lo + 1,
                };
                let want = self.int_scalar(value)?;
                for i in lo..hi {
                    let seen = self.flag(*tensor, i, at, "waits on")?;
                    if (seen as i64) < want {
                        return Err(InterpretError::WaitTimeout {
                            kernel: self.k.name.clone(),
                            at: at.clone(),
                            index: i,
                            expected: want,
                            seen: seen as i64,
                        });
                    }
                }
            }
            Stmt::Signal {
                tensor,
                index,
                value,
                ..
            } => {
                let i = self.int_scalar(index)?;
                let add = self.int_scalar(value)?;
                let t = &mut self.tensors[*tensor];
                // Outside the tensor a signal adds nothing, as on the GPU.
                if let Some(off) = usize::try_from(i).ok().filter(|&i| i < t.data().len()) {
                    let old = t.load(off) as i64;
                    t.store(off, (old.wrapping_add(add) as u32) as f64);
                }
            }
            Stmt::If { at, .. } => {
                return Err(self.unsupported(format!("`{at}` was not specialized away")))
            }
        }
        Ok(())
    }

    /// Flag `i` of `tensor` (indexed flat, as `wait` does on the GPU).
    fn flag(
        &self,
        tensor: TensorId,
        i: i64,
        at: &str,
        access: &'static str,
    ) -> Result<f64, InterpretError> {
        let t = &self.tensors[tensor];
        match usize::try_from(i).ok().filter(|&i| i < t.data().len()) {
            Some(off) => Ok(t.load(off)),
            None => Err(self.oob(tensor, at, access, vec![i])),
        }
    }

    fn oob(
        &self,
        tensor: TensorId,
        at: &str,
        access: &'static str,
        index: Vec<i64>,
    ) -> InterpretError {
        InterpretError::OutOfBounds(Box::new(OutOfBounds {
            kernel: self.k.name.clone(),
            at: at.into(),
            access,
            tensor: self.k.tensors[tensor].name.clone(),
            index,
            shape: self.tensors[tensor].shape().to_vec(),
            tiles: self.tiles(),
        }))
    }

    fn int_scalar(&mut self, e: &Expr) -> Result<i64, InterpretError> {
        let v = self.eval(e, None)?;
        if !v.dims.is_empty() {
            return Err(self.unsupported("a flag index or value must be a scalar".into()));
        }
        Ok(v.data[0] as i64)
    }

    fn store(
        &mut self,
        tensor: TensorId,
        index: &[DimId],
        value: &Expr,
        at: &str,
    ) -> Result<(), InterpretError> {
        let dtype = self.tensors[tensor].dtype();
        let v = self.eval(value, Some(dtype))?;
        if let Some(&d) = v.dims.iter().find(|d| !index.contains(d)) {
            return Err(self.unsupported(format!(
                "`{at}` stores a value over tile `{}`, which the index does not have",
                self.k.dims[d].name
            )));
        }
        let lens = self.lens(index)?;
        let begins: Vec<i64> = index
            .iter()
            .map(|&d| self.range(d).map(|r| r.0))
            .collect::<Result<_, _>>()?;
        let mut err = None;
        let mut writes = Vec::new();
        Tile::build(index, &lens, false, |pos| {
            let idx: Vec<i64> = begins.iter().zip(pos).map(|(b, &p)| b + p as i64).collect();
            match self.tensors[tensor].offset_of(&idx) {
                Some(off) => writes.push((off, v.at(index, pos))),
                None => {
                    err.get_or_insert(idx);
                }
            }
            0.0
        });
        if let Some(idx) = err {
            return Err(self.oob(tensor, at, "writes", idx));
        }
        let t = &mut self.tensors[tensor];
        for (off, x) in writes {
            t.store(off, x);
        }
        Ok(())
    }

    fn load(&self, tensor: TensorId, index: &[DimId], at: &str) -> Result<Tile, InterpretError> {
        let lens = self.lens(index)?;
        let begins: Vec<i64> = index
            .iter()
            .map(|&d| self.range(d).map(|r| r.0))
            .collect::<Result<_, _>>()?;
        let t = &self.tensors[tensor];
        let mut err = None;
        let tile = Tile::build(index, &lens, is_int(t.dtype()), |pos| {
            let idx: Vec<i64> = begins.iter().zip(pos).map(|(b, &p)| b + p as i64).collect();
            match t.offset_of(&idx) {
                Some(off) => t.load(off),
                None => {
                    err.get_or_insert(idx);
                    0.0
                }
            }
        });
        match err {
            Some(idx) => Err(self.oob(tensor, at, "reads", idx)),
            None => Ok(tile),
        }
    }

    /// The value of `e`; `cast_to` is the dtype a `.cast()` without a type
    /// takes (the tensor being stored to).
    fn eval(&mut self, e: &Expr, cast_to: Option<DType>) -> Result<Tile, InterpretError> {
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

    /// `acc + a·b`: the K dimension is `a`'s dimension that `acc` lacks; f32
    /// accumulation, one rounding per K step (the GPU adds a K block's products
    /// on the tensor cores, then into the f32 accumulator).
    fn addmm(&self, acc: &Tile, a: &Tile, b: &Tile, at: &str) -> Result<Tile, InterpretError> {
        let shape_err = || {
            self.unsupported(format!(
                "`{at}`: addmm takes acc over [m, n], a over [m, k] and b over [k, n]"
            ))
        };
        if acc.dims.len() != 2 || a.dims.len() != 2 || b.dims.len() != 2 {
            return Err(shape_err());
        }
        let k = *a
            .dims
            .iter()
            .find(|d| !acc.dims.contains(d))
            .ok_or_else(shape_err)?;
        let m = *a.dims.iter().find(|&&d| d != k).ok_or_else(shape_err)?;
        let n = *b.dims.iter().find(|&&d| d != k).ok_or_else(shape_err)?;
        if !b.dims.contains(&k) || !acc.dims.contains(&m) || !acc.dims.contains(&n) {
            return Err(shape_err());
        }
        let kn = a.lens[a.dims.iter().position(|&d| d == k).ok_or_else(shape_err)?];
        Ok(Tile::build(&acc.dims, &acc.lens, false, |pos| {
            let (i, j) = (
                pos[acc.dims.iter().position(|&d| d == m).unwrap_or(0)],
                pos[acc.dims.iter().position(|&d| d == n).unwrap_or(0)],
            );
            let mut s = 0.0;
            for kk in 0..kn {
                s += a.at(&[m, k], &[i, kk]) * b.at(&[k, n], &[kk, j]);
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

fn is_int(t: DType) -> bool {
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
