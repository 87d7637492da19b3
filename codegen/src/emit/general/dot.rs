//! `addmm` in the general lowering: both operands go to shared memory as
//! f32 (their elements past the extent of the contracted tile as zeros), and
//! each thread sums the products for its accumulator elements with FMAs.
//! Correct for any operands (batched, chained, computed); the tensor-core
//! paths for matmul-shaped kernels are the GEMM and attention lowerings.

use super::{Gen, Val};
use crate::emit::expr::{convert, CTy};
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

impl Gen<'_, '_> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn addmm(
        &mut self,
        acc: &Expr,
        a: &Expr,
        b: &Expr,
        at: &str,
        l: usize,
        depth: usize,
        pre: &[(Expr, Val)],
    ) -> Result<Val, CodegenError> {
        let (ta, tb, tc) = (self.ty(a), self.ty(b), self.ty(acc));
        let Some(&k) = ta
            .dims
            .iter()
            .find(|d| tb.dims.contains(d) && !tc.dims.contains(d))
        else {
            return Err(self.unsupported(at, "internal: `addmm` without a contracted tile"));
        };
        let bk = self.block(k);
        let size =
            |g: &Self, dims: &[DimId]| -> usize { dims.iter().map(|&d| g.block(d)).product() };
        let (na, nb) = (size(self, &ta.dims), size(self, &tb.dims));
        self.need_smem((na + nb) * 4);
        // In-block place of an operand element, `kk` along the contracted tile.
        let place = |g: &Self, dims: &[DimId], kk: Option<&str>| -> String {
            let mut s = String::from("0");
            let mut stride = 1;
            for &d in dims.iter().rev() {
                let off = match (d == k, kk) {
                    (true, Some(kk)) => kk.to_string(),
                    _ => g.offset_c(l, d),
                };
                let _ = write!(s, " + ({off}) * {stride}");
                stride *= g.block(d);
            }
            s
        };
        self.w(depth, format!("// {}", crate::emit::one_line(at)));
        self.w(depth, "__syncthreads();");
        for (x, t, base) in [(a, &ta, 0usize), (b, &tb, na)] {
            let n = self.open(l, &t.dims, depth);
            let owner = self.owner_c(l, &t.dims);
            let live = self.live_c(l, &[k]);
            let (c, ct) = self.ctx(l, pre).emit(x, at)?;
            let c = convert(&c, ct, CTy::F32);
            let pl = place(self, &t.dims, None);
            self.w(
                depth + n,
                format!("if ({owner}) ((float*)tf_smem)[{base} + {pl}] = ({live}) ? {c} : 0.0f;"),
            );
            self.close(n, depth);
        }
        self.w(depth, "__syncthreads();");
        let v = Val {
            name: self.temp("tf_d"),
            dims: tc.dims.clone(),
            cty: CTy::F32,
            layout: l,
            raw: None,
        };
        let decl = self.decl(&v);
        self.w(depth, format!("{decl};"));
        let n = self.open(l, &v.dims, depth);
        let (c, ct) = self.ctx(l, pre).emit(acc, at)?;
        let (pa, pb) = (
            place(self, &ta.dims, Some("tf_k")),
            place(self, &tb.dims, Some("tf_k")),
        );
        let access = self.access(&v);
        self.w(
            depth + n,
            format!("float tf_s = {};", convert(&c, ct, CTy::F32)),
        );
        self.w(
            depth + n,
            format!(
                "for (int tf_k = 0; tf_k < {bk}; ++tf_k) tf_s = fmaf(((float*)tf_smem)[{pa}], ((float*)tf_smem)[{na} + {pb}], tf_s);"
            ),
        );
        self.w(depth + n, format!("{access} = tf_s;"));
        self.close(n, depth);
        let _ = nb;
        Ok(v)
    }
}
