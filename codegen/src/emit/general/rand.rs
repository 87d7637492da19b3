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
    /// draws per element).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rand_groups(
        &mut self,
        x: &Expr,
        kind: RandKind,
        seed: &Expr,
        offset: &Expr,
        at: &str,
        l: usize,
        depth: usize,
        pre: &[(Expr, Val)],
    ) -> Result<Option<Val>, CodegenError> {
        let dims = self.ty(x).dims;
        let g = kind.group() as usize;
        let lay = self.layouts[l].clone();
        // The run: the layout's vector dimension, held `g` or more in a row.
        let Some(d) = lay.order.first().map(|&p| lay.dims[p]).filter(|d| {
            let p = lay.pos(*d).unwrap_or(0);
            dims.contains(d) && lay.spt[p] % g == 0 && !lay.wraps(p)
        }) else {
            return Ok(None);
        };
        if self.ty(offset).dims != dims {
            return Ok(None);
        }
        let (s, st) = self.ctx(l, pre).emit(seed, at)?;
        let seed_c = convert(&s, st, CTy::I64);
        let wrapped = self.in_u32(offset);
        let off = self.materialize(&wrapped, at, l, depth, pre)?;
        let v = Val {
            name: self.temp("tf_rn"),
            dims: dims.clone(),
            cty: if kind == RandKind::Bits {
                CTy::U32
            } else {
                CTy::F32
            },
            layout: l,
            raw: None,
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
        Ok(Some(v))
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
