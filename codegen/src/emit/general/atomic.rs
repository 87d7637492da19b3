//! f32 `atomic_add` of a tile along its contiguous index: each thread's run
//! goes out four elements a `red.global.add.v4.f32` (sm_90 and later; four
//! single adds elsewhere), element by element at ragged edges. One
//! instruction per 16 bytes instead of per element: a segment sum or an
//! embedding's gradient issues a quarter of the reductions.

use super::memory::Comp;
use super::{Gen, Val};
use crate::error::CodegenError;
use crate::ir::*;

impl Gen<'_, '_> {
    /// The runs of an f32 `atomic_add(t[index], value)` (see the module doc);
    /// `run` as [`Gen::vector_run`] gives it, with a run of 4 or more.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn atomic_add_runs(
        &mut self,
        t: TensorId,
        comps: &[Comp],
        dims: &[DimId],
        (d, p, chunk): (DimId, usize, usize),
        owner: &str,
        (value, pre, at): (&Expr, &[(Expr, Val)], &str),
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        let lay = self.layouts[l].clone();
        let (spt, runs) = (lay.spt[p], lay.per_thread(p) / lay.spt[p]);
        let others: Vec<DimId> = dims.iter().copied().filter(|&x| x != d).collect();
        let Some(Comp::Affine { off, .. }) = comps.last() else {
            return Ok(());
        };
        let off = off.clone();
        let n = self.open(l, &others, depth);
        let d1 = depth + n;
        self.w(
            d1,
            format!(
                "#pragma unroll\n{}for (int tf_q = 0; tf_q < {runs}; ++tf_q) {{",
                super::indent(d1)
            ),
        );
        let d2 = d1 + 1;
        self.w(d2, format!("float tf_s[{spt}];"));
        self.w(
            d2,
            format!(
                "#pragma unroll\n{}for (int tf_j = 0; tf_j < {spt}; ++tf_j) {{",
                super::indent(d2)
            ),
        );
        self.rsub.insert(d, format!("(tf_q * {spt} + tf_j)"));
        let (v, ty) = self.stored(value, pre, at, l)?;
        let v = crate::emit::expr::convert(&v, ty, crate::emit::expr::CTy::F32);
        self.w(d2 + 1, format!("tf_s[tf_j] = {v};"));
        self.w(d2, "}");
        self.rsub.insert(d, format!("(tf_q * {spt})"));
        let ok = vec![owner.to_string(), self.live_c(l, &others)];
        let mask = self.run_head(t, comps, (d, spt, chunk.max(16)), &off, ok, "", l, d2);
        for g in (0..spt).step_by(4) {
            self.w(
                d2 + 1,
                format!(
                    "tf_red_add_v4(tf_p + {g}, tf_s[{g}], tf_s[{}], tf_s[{}], tf_s[{}]);",
                    g + 1,
                    g + 2,
                    g + 3
                ),
            );
        }
        self.w(d2, "} else {");
        self.w(
            d2 + 1,
            format!(
                "#pragma unroll\n{}for (int tf_j = 0; tf_j < {spt}; ++tf_j) if ({mask}) tf_atomic_add(tf_p + tf_j, tf_s[tf_j]);",
                super::indent(d2 + 1)
            ),
        );
        self.rsub.remove(&d);
        self.w(d2, "}");
        self.w(d1, "}");
        self.close(n, depth);
        Ok(())
    }
}
