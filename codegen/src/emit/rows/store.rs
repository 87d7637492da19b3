//! Stores from a row program: a tile's chunk 16 bytes at a time from a row
//! pointer with 32-bit column arithmetic, element by element at the ragged edge;
//! anything else (a row's or a column's values, strided or transposed outputs)
//! element by element with 64-bit indices, each element by one thread.

use super::load::{indent, step_paths};
use super::{Place, RowWriter};
use crate::dtype::DType;
use crate::emit::expr::{narrow, tensor_mask, tensor_offset, CTy};
use crate::emit::{one_line, Emitter};
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

impl RowWriter {
    pub(super) fn store(
        &mut self,
        e: &mut Emitter,
        t: TensorId,
        index: &[DimId],
        value: &Expr,
        at: &str,
        ind: &str,
    ) -> Result<(), CodegenError> {
        let value = &crate::emit::inline(value, &e.inline_vars);
        let pre = self.hoist(e, value, at, ind)?;
        let p = self.place(index);
        let mut ctx = e.ctx(&self.coords());
        ctx.precomputed = pre;
        let (shared, v, ty) = ctx.emit_shared(value, at)?;
        let _ = writeln!(e.out, "{ind}// {}", one_line(at));
        let ts = &e.spec.tensors[t];
        if p == Place::Tile
            && packs(ts.dtype)
            && ts.last_contiguous
            && index.len() == 2
            && index[0] == self.g.rd
        {
            self.store_rows(e, t, (&shared, &v), ty, ind);
            return Ok(());
        }
        let coords = self.coords();
        let idx: Vec<String> = index
            .iter()
            .map(|d| {
                coords
                    .iter()
                    .find(|(x, _)| x == d)
                    .map(|(_, c)| c.clone())
                    .unwrap_or_default()
            })
            .collect();
        // Each element is written by one thread: a row's value by its first lane,
        // a column's by the first row group.
        let owner = match p {
            Place::Row => "tf_lane == 0",
            Place::Col => "tf_grp == 0",
            Place::Tile => "true",
            Place::Scalar => "tid == 0",
        };
        let n = self.open(e, p, ind);
        let cty = ty.c();
        let _ = writeln!(
            e.out,
            "{ind}  if ({owner} && {}) {{ {shared}const {cty} v = {v}; t{t}[{}] = {}; }}",
            tensor_mask(t, &idx),
            tensor_offset(t, &idx),
            narrow(ts.dtype, "v", ty)
        );
        Self::close(e, n, ind);
        Ok(())
    }

    /// Whether `tensor[index]` moves 16 bytes at a time: 16- or 32-bit floats,
    /// rows 16-byte aligned, the loop's column the contiguous last index.
    pub(super) fn vec_ok(&self, e: &Emitter, t: TensorId, index: &[DimId]) -> bool {
        let ts = &e.spec.tensors[t];
        ts.dtype.is_float()
            && ts.last_contiguous
            && ts.align >= 16
            && index.last() == self.cur.as_ref()
            && (self.g.vec * ts.dtype.size()) % 16 == 0
    }

    /// Whether stores of `tensor[index]` move 16 bytes at a time: like
    /// [`RowWriter::vec_ok`], for every type [`packs`] takes.
    fn store_vec_ok(&self, e: &Emitter, t: TensorId, index: &[DimId]) -> bool {
        let ts = &e.spec.tensors[t];
        packs(ts.dtype)
            && ts.last_contiguous
            && ts.align >= 16
            && index.last() == self.cur.as_ref()
            && (self.g.vec * ts.dtype.size()) % 16 == 0
    }

    /// Stores a tile `t[row, col]` (rows contiguous) `VEC` columns at a time:
    /// packed 16-byte stores where the chunk lies inside the tensor and rows are
    /// aligned, element by element otherwise.
    fn store_rows(
        &self,
        e: &mut Emitter,
        t: TensorId,
        (shared, v): (&str, &str),
        ty: CTy,
        ind: &str,
    ) {
        let dtype = e.spec.tensors[t].dtype;
        let esize = dtype.size();
        let vec = self.g.vec;
        let chunks = self.cols(e) / vec;
        let cv = self.g.c * vec;
        let cd = self.cur.unwrap_or(0);
        let vec_ok = self.store_vec_ok(e, t, &[self.g.rd, cd]);
        let cty = ty.c();
        // An element's bits, zero-extended to a word.
        let bits = |x: &str| match dtype {
            DType::BF16 => format!("(tf_u32)tf_f32_to_bf16({x})"),
            DType::F16 => format!("(tf_u32)tf_f32_to_f16({x})"),
            DType::F32 => format!("__float_as_uint({x})"),
            _ => {
                let unsigned = ["", "unsigned char", "unsigned short", "", "tf_u32"][esize];
                format!("(tf_u32)({unsigned})({})", narrow(dtype, x, ty))
            }
        };
        // One chunk: its values, then 16-byte stores or element by element.
        let values = format!(
            "{cty} tf_o[{vec}];\n\
             #pragma unroll\nfor (int tf_v = 0; tf_v < {vec}; ++tf_v) {{ const int j = tf_ch * {vec} + tf_v; {shared}tf_o[tf_v] = {v}; }}\n"
        );
        let mut vector = String::from("uint4* tf_q = (uint4*)(tf_p + tf_c);\n");
        let per = 16 / esize;
        for q in 0..(vec / per) {
            let words: Vec<String> = (0..4)
                .map(|w| {
                    if esize == 1 {
                        let b = |i: usize| bits(&format!("tf_o[{}]", q * per + 4 * w + i));
                        format!(
                            "{} | ({} << 8) | ({} << 16) | ({} << 24)",
                            b(0),
                            b(1),
                            b(2),
                            b(3)
                        )
                    } else if esize == 2 {
                        let (a, b) = (q * per + 2 * w, q * per + 2 * w + 1);
                        format!(
                            "{} | ({} << 16)",
                            bits(&format!("tf_o[{a}]")),
                            bits(&format!("tf_o[{b}]"))
                        )
                    } else {
                        bits(&format!("tf_o[{}]", q * per + w))
                    }
                })
                .collect();
            let _ = writeln!(vector, "tf_q[{q}] = make_uint4({});", words.join(", "));
        }
        let edge = format!(
            "#pragma unroll\nfor (int tf_v = 0; tf_v < {vec}; ++tf_v)\n\
             \x20 if (tf_rok && tf_c + tf_v < tf_n) tf_p[tf_c + tf_v] = {};\n",
            narrow(dtype, "tf_o[tf_v]", ty)
        );
        let chunk_loop = |body: &str, ind: &str| {
            format!(
                "{ind}#pragma unroll\n{ind}for (int tf_ch = 0; tf_ch < {chunks}; ++tf_ch) {{\n\
                 {ind}  const int tf_c = tf_lv + tf_ch * {cv};\n{}{}{ind}}}\n",
                indent(&values, &format!("{ind}  ")),
                indent(body, &format!("{ind}  "))
            )
        };
        let _ = writeln!(
            e.out,
            "{ind}#pragma unroll\n{ind}for (int i = 0; i < {rpt}; ++i) {{\n\
             {ind}  const bool tf_rok = {row} < t{t}_n0;\n\
             {ind}  {st}* tf_p = t{t} + {row} * t{t}_s0 + tb{cd};\n\
             {ind}  const int tf_n = (int)max(0ll, min((long long)B{cd}, t{t}_n1 - tb{cd}));",
            rpt = self.g.rpt,
            row = self.g.row(),
            st = dtype.c_storage(),
        );
        e.out.push_str(&step_paths(
            vec_ok, cd, vec, &vector, &edge, chunk_loop, ind,
        ));
        let _ = writeln!(e.out, "{ind}}}");
    }
}

/// Whether a row program packs stores of `dtype` into 16-byte words: every
/// type of 1, 2 or 4 bytes but masks (8-byte integers go element by element).
fn packs(dtype: DType) -> bool {
    dtype != DType::Bool && matches!(dtype.size(), 1 | 2 | 4)
}
