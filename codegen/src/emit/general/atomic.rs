//! f32 `atomic_add` of a tile along its contiguous index: each thread's run
//! goes out four elements a `red.global.add.v4.f32` (sm_90 and later; four
//! single adds elsewhere), element by element at ragged edges. One
//! instruction per 16 bytes instead of per element: a segment sum or an
//! embedding's gradient issues a quarter of the reductions.

use super::memory::Comp;
use super::{Gen, Val};
use crate::emit::expr::{convert, CTy};
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
        value: (&Expr, &[(Expr, Val)], &str),
        l: usize,
        depth: usize,
    ) -> Result<(), CodegenError> {
        let spt = self.layouts[l].spt[p];
        let to_f32 = |v: &str, ty: CTy| convert(v, ty, CTy::F32);
        let run = (d, p, chunk.max(16));
        let Some((n, d2, mask, _)) = self.open_run(
            t,
            comps,
            dims,
            run,
            owner,
            value,
            ("float", &to_f32),
            l,
            depth,
        )?
        else {
            return Ok(());
        };
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
        let slow = "tf_atomic_add(tf_p + tf_j, tf_s[tf_j]);";
        self.close_run(d, spt, (n, d2), &mask, slow, depth);
        Ok(())
    }
}
