//! Reductions along the loop's column: each thread over its own in-bounds
//! columns, then across the row's lanes (warp shuffles, and shared memory when a
//! row spans several warps).

use super::{dims_of, RowWriter};
use crate::emit::expr::CTy;
use crate::emit::{one_line, Emitter};
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

impl RowWriter {
    /// Reduces `arg` along the loop's column `dim` (its in-bounds columns): each
    /// thread over its own columns, then over the row's lanes.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce(
        &mut self,
        e: &mut Emitter,
        pre: &[(Expr, String)],
        op: ReduceOp,
        arg: &Expr,
        dim: DimId,
        at: &str,
        ind: &str,
    ) -> Result<String, CodegenError> {
        let name = format!("tf_red{}", self.temps);
        self.temps += 1;
        let has_row = dims_of(e, arg).contains(&self.g.rd);
        let unsupported = || CodegenError::Unsupported {
            kernel: e.k.name.clone(),
            at: at.to_string(),
            message: "the row lowering reduces floats only".into(),
        };
        let identity = op.identity_c(CTy::F32);
        let f = |a: &str, b: &str| op.combine_c(a, b);
        let mut ctx = e.ctx(&self.coords());
        ctx.precomputed = pre.to_vec();
        let (shared, v, ty) = ctx.emit_shared(arg, at)?;
        if ty != CTy::F32 {
            return Err(unsupported());
        }
        let rpt = if has_row { self.g.rpt } else { 1 };
        let _ = writeln!(
            e.out,
            "{ind}float {name}[{rpt}];  // {}\n{ind}#pragma unroll\n{ind}for (int i = 0; i < {rpt}; ++i) {{\n\
             {ind}  float tf_a = {identity};\n\
             {ind}  if (tf_rem{dim} == B{dim}) {{  // a whole step: every column in bounds\n\
             {ind}    #pragma unroll\n{ind}    for (int j = 0; j < {cols}; ++j) {{ {shared}tf_a = {upd}; }}\n\
             {ind}  }} else {{\n\
             {ind}    #pragma unroll\n{ind}    for (int j = 0; j < {cols}; ++j)\n\
             {ind}      if ({col} < tf_rem{dim}) {{ {shared}tf_a = {upd}; }}\n\
             {ind}  }}",
            one_line(at),
            cols = self.cols(e),
            col = self.g.col_in_step(),
            upd = f("tf_a", &format!("({v})"))
        );
        let lanes = self.g.c.min(32);
        let _ = writeln!(
            e.out,
            "{ind}  #pragma unroll\n{ind}  for (int tf_sh = {}; tf_sh > 0; tf_sh >>= 1) tf_a = {};\n\
             {ind}  {name}[i] = tf_a;\n{ind}}}",
            lanes / 2,
            f("tf_a", "__shfl_xor_sync(0xffffffffu, tf_a, tf_sh)")
        );
        if self.g.c > 32 {
            let per_row = self.g.c / 32;
            let _ = writeln!(
                e.out,
                "{ind}__syncthreads();\n\
                 {ind}if (tid % 32 == 0) for (int i = 0; i < {rpt}; ++i) tf_red[(tf_grp * {rpt} + i) * {per_row} + tf_lane / 32] = {name}[i];\n\
                 {ind}__syncthreads();\n\
                 {ind}#pragma unroll\n{ind}for (int i = 0; i < {rpt}; ++i) {{\n\
                 {ind}  float tf_a = {identity};\n\
                 {ind}  #pragma unroll\n{ind}  for (int w = 0; w < {per_row}; ++w) tf_a = {};\n\
                 {ind}  {name}[i] = tf_a;\n{ind}}}",
                f("tf_a", &format!("tf_red[(tf_grp * {rpt} + i) * {per_row} + w]"))
            );
        }
        Ok(if has_row {
            format!("{name}[i]")
        } else {
            format!("{name}[0]")
        })
    }
}
