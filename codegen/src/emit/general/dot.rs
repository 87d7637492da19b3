//! `addmm` in the general lowering. Both operands go to shared memory, and:
//!
//! - On the tensor cores, where the operands are bf16 or f16 (both the same)
//!   and the blocks of M, N and K are multiples of 16 (other dimensions of
//!   block 1, such as a batch's or a head's): operands staged as 16-bit rows
//!   (padded by 16 bytes, so `ldmatrix`'s eight rows fall in different banks),
//!   each warp computes 16×16 pieces of the product with `ldmatrix` and
//!   `mma.sync.m16n8k16` (f32 accumulation), and writes them to shared memory
//!   as f32; each thread then adds its accumulator elements from there (the
//!   layout conversion back to the value's blocked layout).
//! - Otherwise as f32 (elements past the extent of the contracted tile as
//!   zeros), each thread summing the products for its accumulator elements
//!   with FMAs: at the blocks the tensor cores take, ptxas needs minutes for
//!   the unrolled sums of attention's backward, where the tensor-core form
//!   compiles in about one.
//!
//! Correct for any operands (batched, chained, computed); the GEMM and
//! attention lowerings remain the fast paths for matmul-shaped kernels.

use super::{Gen, Val};
use crate::dtype::DType;
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
        if let Some(mma) = self.mma_shape(&ta, &tb, &tc, k) {
            return self.addmm_mma(acc, a, b, at, (l, depth), pre, &tc, mma);
        }
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
        self.product_value(acc, at, (l, depth), pre, &tc.dims, |g, init, out| {
            let (pa, pb) = (
                place(g, &ta.dims, Some("tf_k")),
                place(g, &tb.dims, Some("tf_k")),
            );
            vec![
                format!("float tf_s = {init};"),
                format!(
                    "for (int tf_k = 0; tf_k < {bk}; ++tf_k) tf_s = fmaf(((float*)tf_smem)[{pa}], ((float*)tf_smem)[{na} + {pb}], tf_s);"
                ),
                format!("{out} = tf_s;"),
            ]
        })
    }

    /// The product as a value over `dims` in layout `l`: for each of this
    /// thread's elements, `lines(g, init, out)` (C statements that set `out`
    /// from `init`, the accumulator `acc`'s element).
    fn product_value(
        &mut self,
        acc: &Expr,
        at: &str,
        (l, depth): (usize, usize),
        pre: &[(Expr, Val)],
        dims: &[DimId],
        lines: impl Fn(&Self, &str, &str) -> Vec<String>,
    ) -> Result<Val, CodegenError> {
        let v = Val {
            name: self.temp("tf_d"),
            dims: dims.to_vec(),
            cty: CTy::F32,
            layout: l,
            raw: None,
            view: None,
        };
        let decl = self.decl(&v);
        self.w(depth, format!("{decl};"));
        let n = self.open(l, &v.dims, depth);
        let (c, ct) = self.ctx(l, pre).emit(acc, at)?;
        let access = self.access(&v);
        for line in lines(self, &convert(&c, ct, CTy::F32), &access) {
            self.w(depth + n, line);
        }
        self.close(n, depth);
        Ok(v)
    }

    /// The tensor-core form's dimensions, where it applies (see the module
    /// docs): operands of one 16-bit type, an M dimension only `a` has and an
    /// N only `b` has, both in the accumulator, blocks of M, N and K multiples
    /// of 16, and every other dimension of block 1.
    fn mma_shape(
        &self,
        ta: &crate::check::Ty,
        tb: &crate::check::Ty,
        tc: &crate::check::Ty,
        k: DimId,
    ) -> Option<Mma> {
        let half = match (ta.dtype, tb.dtype) {
            (DType::BF16, DType::BF16) => Half::Bf16,
            (DType::F16, DType::F16) => Half::F16,
            _ => return None,
        };
        let wide = |dims: &[DimId]| -> Vec<DimId> {
            dims.iter()
                .copied()
                .filter(|&d| d != k && self.block(d) > 1)
                .collect()
        };
        let (wa, wb) = (wide(&ta.dims), wide(&tb.dims));
        let (&[m], &[n]) = (wa.as_slice(), wb.as_slice()) else {
            return None;
        };
        let mut out = wide(&tc.dims);
        out.sort_unstable();
        let mut want = vec![m, n];
        want.sort_unstable();
        let fits = m != n && out == want && [m, n, k].iter().all(|&d| self.block(d) % 16 == 0);
        fits.then_some(Mma { m, n, k, half })
    }

    /// `addmm` on the tensor cores (see the module docs).
    #[allow(clippy::too_many_arguments)]
    fn addmm_mma(
        &mut self,
        acc: &Expr,
        a: &Expr,
        b: &Expr,
        at: &str,
        (l, depth): (usize, usize),
        pre: &[(Expr, Val)],
        tc: &crate::check::Ty,
        Mma { m, n, k, half }: Mma,
    ) -> Result<Val, CodegenError> {
        let (ta, tb) = (self.ty(a), self.ty(b));
        let (bm, bn, bk) = (self.block(m), self.block(n), self.block(k));
        // Row strides in elements, each row padded by 16 bytes (8 halves, or
        // 8 floats for the product).
        let (sa, sb, sd) = (bk + 8, bn + 8, bn + 8);
        let b_at = bm * sa * 2;
        let d_at = b_at + bk * sb * 2;
        self.need_smem(d_at + bm * sd * 4);
        let (to_half, mma) = match half {
            Half::Bf16 => ("tf_f32_to_bf16", "tf_mma_bf16"),
            Half::F16 => ("tf_f32_to_f16", "tf_mma_f16"),
        };
        self.w(
            depth,
            format!("// {} (tensor cores)", crate::emit::one_line(at)),
        );
        self.w(depth, "__syncthreads();");
        for (x, t, base, (row, col), stride) in
            [(a, &ta, 0, (m, k), sa), (b, &tb, b_at, (k, n), sb)]
        {
            let nl = self.open(l, &t.dims, depth);
            let owner = self.owner_c(l, &t.dims);
            let live = self.live_c(l, &[k]);
            let (c, ct) = self.ctx(l, pre).emit(x, at)?;
            let c = convert(&c, ct, CTy::F32);
            let (r, cc) = (self.offset_c(l, row), self.offset_c(l, col));
            self.w(
                depth + nl,
                format!(
                    "if ({owner}) ((tf_u16*)(tf_smem + {base}))[({r}) * {stride} + ({cc})] = {to_half}(({live}) ? {c} : 0.0f);"
                ),
            );
            self.close(nl, depth);
        }
        self.w(depth, "__syncthreads();");
        // Each warp a 16×16 piece of the product at a time: A's 16×16 by
        // `ldmatrix.x4` (lanes 0-15 its rows at k, 16-31 at k + 8), B's 16×16 by
        // `ldmatrix.x4.trans` (the two 8-column halves), two `mma.sync`s. The
        // C fragment: c[0], c[1] at row lane / 4, columns 2·(lane % 4) + {0, 1};
        // c[2], c[3] eight rows below.
        let pieces = (bm / 16) * (bn / 16);
        let warps = self.e.cfg.num_warps.max(1);
        let (per_row, steps) = (bn / 16, bk / 16);
        for line in [
            "{".to_string(),
            "  const tf_u32 tf_mma_a = tf_smem_u32(tf_smem);".to_string(),
            format!("  const tf_u32 tf_mma_b = tf_smem_u32(tf_smem + {b_at});"),
            format!("  float* tf_mma_d = (float*)(tf_smem + {d_at});"),
            format!("  for (int tf_p = tf_warp; tf_p < {pieces}; tf_p += {warps}) {{"),
            format!("    const int tf_pm = (tf_p / {per_row}) * 16, tf_pn = (tf_p % {per_row}) * 16;"),
            "    float tf_c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, tf_c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};".to_string(),
            format!("    for (int tf_kk = 0; tf_kk < {steps}; ++tf_kk) {{"),
            "      tf_u32 tf_ra[4], tf_rb[4];".to_string(),
            format!("      tf_ldmatrix_x4(tf_ra, tf_mma_a + ((tf_pm + (tf_lane & 15)) * {sa} + tf_kk * 16 + (tf_lane >> 4) * 8) * 2);"),
            format!("      tf_ldmatrix_x4_trans(tf_rb, tf_mma_b + ((tf_kk * 16 + (tf_lane & 15)) * {sb} + tf_pn + (tf_lane >> 4) * 8) * 2);"),
            format!("      {mma}(tf_c0, tf_ra, tf_rb);"),
            format!("      {mma}(tf_c1, tf_ra, tf_rb + 2);"),
            "    }".to_string(),
            "    const int tf_r = tf_pm + (tf_lane >> 2), tf_q = tf_pn + (tf_lane & 3) * 2;".to_string(),
            format!("    *(float2*)(tf_mma_d + tf_r * {sd} + tf_q) = make_float2(tf_c0[0], tf_c0[1]);"),
            format!("    *(float2*)(tf_mma_d + (tf_r + 8) * {sd} + tf_q) = make_float2(tf_c0[2], tf_c0[3]);"),
            format!("    *(float2*)(tf_mma_d + tf_r * {sd} + tf_q + 8) = make_float2(tf_c1[0], tf_c1[1]);"),
            format!("    *(float2*)(tf_mma_d + (tf_r + 8) * {sd} + tf_q + 8) = make_float2(tf_c1[2], tf_c1[3]);"),
            "  }".to_string(),
            "}".to_string(),
            "__syncthreads();".to_string(),
        ] {
            self.w(depth, line);
        }
        self.product_value(acc, at, (l, depth), pre, &tc.dims, |g, init, out| {
            let (r, cc) = (g.offset_c(l, m), g.offset_c(l, n));
            vec![format!(
                "{out} = {init} + ((float*)(tf_smem + {d_at}))[({r}) * {sd} + ({cc})];"
            )]
        })
    }
}

/// The tensor-core `addmm`'s rows (only in `a`), columns (only in `b`),
/// contracted dimension and operand type.
#[derive(Clone, Copy)]
struct Mma {
    m: DimId,
    n: DimId,
    k: DimId,
    half: Half,
}

#[derive(Clone, Copy)]
enum Half {
    Bf16,
    F16,
}
