//! Random numbers of the general lowering, one Philox call per group of
//! offsets ([`RandKind::group`]): a thread's run along the layout's vectors
//! holds consecutive elements, and where their offsets are consecutive from a
//! multiple of the group (`tm * n + tn` with `n` a multiple of it), the
//! group's values come from one call's words. Otherwise each element makes
//! its own call, with the same numbers.

use super::{Gen, Val};
use crate::dtype::DType;
use crate::emit::expr::{convert, CTy};
use crate::error::CodegenError;
use crate::ir::*;

impl Gen<'_, '_> {
    /// Computes `x` (a `rand`, `randn` or `randint` over tiles) into registers
    /// of layout `l`, drawing once per group where the offsets allow; `None`
    /// where no run of the value is long enough (the elementwise code then
    /// draws per element). With `cmp`, `x` is that comparison of the `rand`
    /// with a value the whole tile shares: the registers hold the words, and
    /// the value's elements are their comparisons with the bound.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rand_groups(
        &mut self,
        x: &Expr,
        kind: RandKind,
        seed: &Expr,
        offset: &Expr,
        cmp: Option<&UniformCmp>,
        at: &str,
        l: usize,
        depth: usize,
        pre: &[(Expr, Val)],
    ) -> Result<Option<Val>, CodegenError> {
        let dims = self.ty(x).dims;
        let g = kind.group() as usize;
        let lay = self.layouts[l].clone();
        let Some(d) = self.rand_run(x, kind, offset, l) else {
            return Ok(None);
        };
        let (s, st) = self.ctx(l, pre).emit(seed, at)?;
        let seed_c = convert(&s, st, CTy::I64);
        let wrapped = self.in_u32(offset);
        let off = self.materialize(&wrapped, at, l, depth, pre)?;
        // Compared, the words themselves.
        let kind = if cmp.is_some() { RandKind::Bits } else { kind };
        let v = Val {
            name: self.temp("tf_rn"),
            dims: dims.clone(),
            cty: match kind {
                RandKind::Bits => CTy::U32,
                _ => CTy::F32,
            },
            layout: l,
            raw: None,
            view: None,
        };
        let decl = self.decl(&v);
        self.w(depth, format!("{decl};  // {}", crate::emit::one_line(at)));
        // The round keys once, outside the groups' branches, and held in
        // registers (`tf_philox_keys_held`): recomputed, they cost a fifth of
        // each call.
        let keys = self.temp("tf_pk");
        self.w(
            depth,
            format!("unsigned int {keys}[20]; tf_philox_keys_held({seed_c}, {keys});"),
        );
        let others: Vec<DimId> = dims.iter().copied().filter(|&x| x != d).collect();
        let n = self.open(l, &others, depth);
        let d1 = depth + n;
        let per = lay.per_thread(lay.pos(d).unwrap_or(0));
        self.w(
            d1,
            format!(
                "#pragma unroll\n{}for (int tf_g = 0; tf_g < {per}; tf_g += {g}) {{",
                super::indent(d1)
            ),
        );
        let d2 = d1 + 1;
        let at_j = |gen: &mut Self, j: usize, val: &Val| -> String {
            gen.rsub.insert(d, format!("(tf_g + {j})"));
            let a = gen.access(val);
            gen.rsub.remove(&d);
            a
        };
        let offs: Vec<String> = (0..g)
            .map(|j| {
                let a = at_j(self, j, &off);
                convert(&a, off.cty, CTy::U32)
            })
            .collect();
        let outs: Vec<String> = (0..g).map(|j| at_j(self, j, &v)).collect();
        let mut seq = vec![format!("tf_o % {g}u == 0u")];
        for (j, o) in offs.iter().enumerate().skip(1) {
            seq.push(format!("{o} == tf_o + {j}u"));
        }
        self.w(d2, format!("const unsigned int tf_o = {};", offs[0]));
        self.w(d2, format!("if ({}) {{", seq.join(" && ")));
        self.w(
            d2 + 1,
            format!("unsigned int tf_c[4]; tf_philox_k({keys}, tf_o / {g}u, tf_c);"),
        );
        for (j, out) in outs.iter().enumerate() {
            self.w(d2 + 1, format!("{out} = {};", kind.cuda_of_words(j as u32)));
        }
        self.w(d2, "} else {");
        for (out, o) in outs.iter().zip(&offs) {
            self.w(d2 + 1, format!("{out} = {};", kind.cuda(&seed_c, o)));
        }
        self.w(d2, "}");
        self.w(d1, "}");
        self.close(n, depth);
        Ok(Some(match cmp {
            Some(c) => Val {
                cty: CTy::Bool,
                view: Some((CTy::U32, c.of_word("{}"))),
                ..v
            },
            None => v,
        }))
    }

    /// The dimension along which a thread's elements of `x` (a draw over
    /// `offset`, or a comparison of one) run in groups of the draw
    /// (the layout's vector dimension, held `group` or more in a row), if any.
    fn rand_run(&self, x: &Expr, kind: RandKind, offset: &Expr, l: usize) -> Option<DimId> {
        let dims = self.ty(x).dims;
        let g = kind.group() as usize;
        let lay = &self.layouts[l];
        let d = lay.order.first().map(|&p| lay.dims[p]).filter(|d| {
            let p = lay.pos(*d).unwrap_or(0);
            dims.contains(d) && lay.spt[p] % g == 0 && !lay.wraps(p)
        })?;
        (self.ty(offset).dims == dims).then_some(d)
    }

    /// `x` as a `rand` compared with a value every element shares (`rand(seed,
    /// o) > p`, either side), drawn and compared once per group: the masks
    /// come from integer compares of the words with a bound made once from
    /// the value ([`UniformCmp`]). `None` where `x` is not such a comparison
    /// or its groups do not line up; the elementwise code then compares the
    /// floats.
    pub(super) fn rand_compare(
        &mut self,
        x: &Expr,
        l: usize,
        depth: usize,
        pre: &mut Vec<(Expr, Val)>,
    ) -> Result<Option<Val>, CodegenError> {
        let Expr::Compare { op, lhs, rhs, at } = x else {
            return Ok(None);
        };
        let rand_of = |e: &Expr| match e {
            Expr::Rand {
                kind: RandKind::Uniform,
                seed,
                offset,
                ..
            } => Some((seed.clone(), offset.clone())),
            _ => None,
        };
        // The `rand` on the left: `p < r` is `r > p`.
        let (op, (seed, offset), other) = match (rand_of(lhs), rand_of(rhs)) {
            (Some(r), None) => (*op, r, rhs),
            (None, Some(r)) => (op.flipped(), r, lhs),
            _ => return Ok(None),
        };
        // The comparison in f32 (as the elementwise code makes it), against
        // one value for the whole tile.
        let shared = self.ty(other).dims.is_empty()
            && crate::check::meet(&self.ty(lhs), &self.ty(rhs)) == DType::F32;
        if !shared
            || matches!(op, CmpOp::Eq | CmpOp::Ne)
            || self.rand_run(x, RandKind::Uniform, &offset, l).is_none()
        {
            return Ok(None);
        }
        for c in [&seed, &offset, other] {
            self.hoist_into(c, at, l, depth, pre)?;
        }
        let (p, pt) = self.ctx(l, pre).emit(other, at)?;
        let cmp = UniformCmp {
            op,
            bound: self.temp("tf_ub"),
        };
        let b = &cmp.bound;
        self.w(
            depth,
            format!(
                "const unsigned long long {b} = {}; const bool {b}_x = {b} >> 32; const unsigned int {b}_w = (unsigned int){b};",
                cmp.bound_c(&convert(&p, pt, CTy::F32))
            ),
        );
        self.rand_groups(
            x,
            RandKind::Uniform,
            &seed,
            &offset,
            Some(&cmp),
            at,
            l,
            depth,
            pre,
        )
    }

    /// `x` (an integer expression) computed modulo 2^32, in 32-bit arithmetic
    /// where that gives the same word: sums, differences, products and bitwise
    /// operations of its parts wrap alike, and the offset is taken modulo
    /// 2^32 anyway. `tm.index() * n + tn.index()` then costs 32-bit
    /// multiplies and adds per element instead of 64-bit ones, and the
    /// compiler sees that a run's offsets are consecutive.
    fn in_u32(&self, x: &Expr) -> Expr {
        let integral = |e: &Expr| !self.ty(e).dtype.is_float();
        match x {
            Expr::Binary { op, lhs, rhs, at }
                if integral(x)
                    && matches!(
                        op,
                        BinOp::Add
                            | BinOp::Sub
                            | BinOp::Mul
                            | BinOp::BitAnd
                            | BinOp::BitOr
                            | BinOp::BitXor
                    ) =>
            {
                Expr::Binary {
                    op: *op,
                    lhs: Box::new(self.in_u32(lhs)),
                    rhs: Box::new(self.in_u32(rhs)),
                    at: at.clone(),
                }
            }
            _ => Expr::Cast {
                arg: Box::new(x.clone()),
                dtype: Some(DType::U32),
            },
        }
    }
}

/// `rand(..) op value` where every element shares `value` (a scalar of the
/// kernel, a loop's value), as C over the draw's word. `tf_uniform(w)` is
/// `m · 2^-23` with `m = w >> 9`, so `u > p` holds exactly when `m >=
/// floor(p · 2^23) + 1`, `u >= p` when `m >= ceil(p · 2^23)`, `<` and `<=`
/// being their negations, and `m >= L` when `w >= L · 2^9`. The helper
/// `tf_uniform_bound` makes `L · 2^9` once, clamped to [0, 2^32] (2^32: no
/// word; a NaN compares false), and an element's mask is one integer
/// compare, written where the mask is used so that it stays a predicate:
/// the float compare costs three instructions (the uniform's mantissa, the
/// subtraction, the compare).
pub(super) struct UniformCmp {
    /// With the `rand` on the left; never `==` or `!=`.
    op: CmpOp,
    /// The C name of the bound (`unsigned long long`); `{bound}_x` is its
    /// bit 32 and `{bound}_w` its low word.
    bound: String,
}

impl UniformCmp {
    /// The bound's C, from the value's (f32).
    fn bound_c(&self, value: &str) -> String {
        let (strict, below) = match self.op {
            CmpOp::Gt => (true, false),
            CmpOp::Ge => (false, false),
            CmpOp::Lt => (false, true),
            _ => (true, true),
        };
        format!("tf_uniform_bound({value}, {strict}, {below})")
    }

    /// The mask of a word (`unsigned int` C): at least the bound (none at
    /// 2^32) for `>` and `>=`, below it (all at 2^32) for `<` and `<=`.
    fn of_word(&self, w: &str) -> String {
        let b = &self.bound;
        if matches!(self.op, CmpOp::Gt | CmpOp::Ge) {
            format!("(!{b}_x && ({w}) >= {b}_w)")
        } else {
            format!("({b}_x || ({w}) < {b}_w)")
        }
    }
}
