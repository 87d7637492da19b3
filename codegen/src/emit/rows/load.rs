//! Loads of a column chunk into registers, and their reuse: within a loop step
//! (the same tile loaded twice) and across walks over the same columns (a second
//! walk whose block covered the row in one step reads the registers the first
//! walk filled, so the row crosses the memory bus once).
//!
//! 16-bit elements stay packed two to a 32-bit register until they are used (half
//! the registers of f32 values); rows use 32-bit column arithmetic from a row
//! pointer, so a chunk costs one 16-byte load and a compare.

use super::{Geometry, Place, RowWriter};
use crate::dtype::DType;
use crate::emit::expr::{tensor_mask, tensor_offset, widen, CTy};
use crate::emit::Emitter;
use crate::ir::*;
use std::fmt::Write;

/// A load's identity across the loops of one program: the tensor, its index with
/// the loop's column written as `None`, and the loop's extent and block.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(super) struct LoadKey {
    tensor: TensorId,
    index: Vec<Option<DimId>>,
    extent: Option<ScalarId>,
    block: usize,
}

/// A load that several walks share: one register array, declared before the
/// first walk that loads it.
#[derive(Debug)]
pub(super) struct Kept {
    key: LoadKey,
    name: String,
    /// Declared before the walk that loads it first.
    declared: bool,
    /// Filled by a walk already emitted.
    filled: bool,
}

/// The device functions the packed layout needs.
pub(super) const HELPERS: &str = "\n\
__device__ __forceinline__ float tf_bf16_of(tf_u32 w, int hi) { return __uint_as_float(hi ? (w & 0xffff0000u) : (w << 16)); }\n\
__device__ __forceinline__ float tf_f16_of(tf_u32 w, int hi) { return tf_f16_to_f32((tf_u16)(hi ? (w >> 16) : (w & 0xffffu))); }\n";

fn key(e: &Emitter, t: TensorId, index: &[DimId], cur: DimId) -> LoadKey {
    LoadKey {
        tensor: t,
        index: index.iter().map(|&d| (d != cur).then_some(d)).collect(),
        extent: e.k.dims[cur].extent,
        block: e.cfg.block_sizes[cur],
    }
}

/// The loads of the loop's column in `body` (a loop's direct statements).
fn loads_in(e: &Emitter, body: &[Stmt], cur: DimId, out: &mut Vec<LoadKey>) {
    for s in body {
        let value = match s {
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Store { value, .. } => {
                value
            }
            _ => continue,
        };
        value.walk(&mut |x| {
            if let Expr::Load { tensor, index, .. } = x {
                let index = plain_index(index).unwrap_or_default();
                if index.contains(&cur) {
                    let k = key(e, *tensor, &index, cur);
                    if !out.contains(&k) {
                        out.push(k);
                    }
                }
            }
        });
    }
}

/// Tensors some statement of the kernel stores to: never kept in registers
/// across statements (a store may change them).
pub(super) fn written(k: &Kernel) -> Vec<TensorId> {
    let mut out = Vec::new();
    k.walk_stmts(&mut |s| {
        if let Stmt::Store { tensor, .. } = s {
            out.push(*tensor);
        }
    });
    out
}

/// The loads that two or more of `body`'s loops make (over the same columns, with
/// the same block), of tensors nothing writes.
pub(super) fn shared_loads(e: &Emitter, body: &[Stmt], written: &[TensorId]) -> Vec<Kept> {
    let mut seen: Vec<(LoadKey, usize)> = Vec::new();
    for s in body {
        if let Stmt::Loop { dim, body, .. } = s {
            let mut keys = Vec::new();
            loads_in(e, body, *dim, &mut keys);
            for k in keys {
                match seen.iter_mut().find(|(x, _)| *x == k) {
                    Some((_, n)) => *n += 1,
                    None => seen.push((k, 1)),
                }
            }
        }
    }
    seen.into_iter()
        .filter(|(k, n)| *n > 1 && !written.contains(&k.tensor))
        .enumerate()
        .map(|(i, (key, _))| Kept {
            key,
            name: format!("tf_keep{i}"),
            declared: false,
            filled: false,
        })
        .collect()
}

/// About how many 32-bit registers per thread the loads of the busiest walk hold
/// (for the launch bounds: a thread needs these and a few dozen more).
pub(super) fn held_words(e: &Emitter, g: &Geometry, body: &[Stmt]) -> usize {
    body.iter()
        .filter_map(|s| match s {
            Stmt::Loop { dim, body, .. } => {
                let mut keys = Vec::new();
                loads_in(e, body, *dim, &mut keys);
                let cols = e.cfg.block_sizes[*dim] / g.c;
                let words: usize = keys
                    .iter()
                    .map(|k| {
                        let rows = if k.index.contains(&Some(g.rd)) {
                            g.rpt
                        } else {
                            1
                        };
                        let per = match e.spec.tensors[k.tensor].dtype.size() {
                            2 => cols.div_ceil(2),
                            8 => 2 * cols,
                            _ => cols,
                        };
                        rows * per
                    })
                    .sum();
                Some(words)
            }
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

/// How a row-major chunk of a float tensor sits in registers (other loads take
/// the 64-bit index path and are widened as [`widen`] does).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Two 16-bit floats per `tf_u32`.
    Packed(DType),
    /// One `float` per element.
    F32,
}

impl RowWriter {
    /// The fast layout of `tensor[index]`: its rows contiguous, the loop's column
    /// last, the grid's rows before it.
    fn layout(&self, e: &Emitter, t: TensorId, index: &[DimId]) -> Option<Layout> {
        let ts = &e.spec.tensors[t];
        let fast = ts.last_contiguous
            && index.last() == self.cur.as_ref()
            && index[..index.len() - 1].iter().all(|&d| d == self.g.rd);
        match ts.dtype {
            DType::BF16 | DType::F16 if fast => Some(Layout::Packed(ts.dtype)),
            DType::F32 if fast => Some(Layout::F32),
            _ => None,
        }
    }

    /// The C declaration of a register array holding a chunk of `t` at `p`, and
    /// the access of element `(i, j)`.
    fn array(&self, e: &Emitter, layout: Layout, p: Place, name: &str) -> (String, String) {
        let (rpt, cols) = (self.g.rpt, self.cols(e));
        let (shape, at) = match (p, layout) {
            (Place::Tile, Layout::Packed(_)) => (format!("[{rpt}][{}]", cols / 2), "[i][j / 2]"),
            (_, Layout::Packed(_)) => (format!("[{}]", cols / 2), "[j / 2]"),
            (Place::Tile, _) => (format!("[{rpt}][{cols}]"), "[i][j]"),
            _ => (format!("[{cols}]"), "[j]"),
        };
        let (cty, access) = match layout {
            Layout::Packed(DType::F16) => ("tf_u32", format!("tf_f16_of({name}{at}, j % 2)")),
            Layout::Packed(_) => ("tf_u32", format!("tf_bf16_of({name}{at}, j % 2)")),
            Layout::F32 => ("float", format!("{name}{at}")),
        };
        (format!("{cty} {name}{shape};"), access)
    }

    /// Loads `tensor[index]` (it has the loop's column) into registers, or finds
    /// it already there; returns the C access of element `(i, j)`.
    pub(super) fn load(
        &mut self,
        e: &mut Emitter,
        t: TensorId,
        index: &[DimId],
        ind: &str,
    ) -> String {
        let cur = self.cur.unwrap_or(0);
        let k = key(e, t, index, cur);
        let reuse = !self.written.contains(&t);
        if reuse {
            if let Some((_, access)) = self.step.iter().find(|(x, _)| *x == k) {
                return access.clone();
            }
        }
        let layout = self.layout(e, t, index);
        let p = self.place(index);
        let kept = self.kept.iter().position(|x| x.key == k);
        let access = match (kept, layout) {
            (Some(n), Some(layout)) if self.kept[n].declared => {
                let name = self.kept[n].name.clone();
                let (_, access) = self.array(e, layout, p, &name);
                if self.kept[n].filled {
                    // An earlier walk over these columns filled the registers; when
                    // its block covered the row, they hold this step's values.
                    let ext = e.end(cur);
                    let _ = writeln!(
                        e.out,
                        "{ind}if ({ext} > B{cur}) {{  // not one step: load again"
                    );
                    self.fill(e, layout, t, index, &name, &format!("{ind}  "));
                    let _ = writeln!(e.out, "{ind}}}");
                } else {
                    self.fill(e, layout, t, index, &name, ind);
                    self.kept[n].filled = true;
                }
                access
            }
            (_, layout) => {
                let name = format!("tf_ld{}", self.temps);
                self.temps += 1;
                if let Some(layout) = layout {
                    let (decl, access) = self.array(e, layout, p, &name);
                    let _ = writeln!(e.out, "{ind}{decl}");
                    self.fill(e, layout, t, index, &name, ind);
                    access
                } else {
                    let (decl, access) = self.shape(e, p);
                    let dtype = e.spec.tensors[t].dtype;
                    let cty = if dtype.is_float() {
                        "float"
                    } else {
                        "long long"
                    };
                    let _ = writeln!(e.out, "{ind}{cty} {name}{decl};");
                    self.load_generic(e, t, index, &name, ind);
                    format!("{name}{access}")
                }
            }
        };
        if reuse {
            self.step.push((k, access.clone()));
        }
        access
    }

    /// Declares, before the loop over `dim` starts, the kept arrays it loads first.
    pub(super) fn declare_kept(&mut self, e: &mut Emitter, dim: DimId, body: &[Stmt], ind: &str) {
        let mut keys = Vec::new();
        loads_in(e, body, dim, &mut keys);
        let saved = self.cur.replace(dim);
        for n in 0..self.kept.len() {
            if self.kept[n].declared || !keys.contains(&self.kept[n].key) {
                continue;
            }
            let k = &self.kept[n].key;
            let (t, index): (TensorId, Vec<DimId>) =
                (k.tensor, k.index.iter().map(|d| d.unwrap_or(dim)).collect());
            let Some(layout) = self.layout(e, t, &index) else {
                continue;
            };
            let p = self.place(&index);
            let (decl, _) = self.array(e, layout, p, &self.kept[n].name.clone());
            let _ = writeln!(
                e.out,
                "{ind}{decl}  // kept across walks over `{}`",
                e.k.dims[dim].name
            );
            self.kept[n].declared = true;
        }
        self.cur = saved;
    }

    /// The code filling `name` with this step's chunk of `tensor[index]`: 16-byte
    /// loads only when the row is in bounds and the step whole (no per-chunk
    /// tests, so the loads issue back to back), else chunk by chunk, element by
    /// element at the ragged edge.
    fn fill(
        &self,
        e: &mut Emitter,
        layout: Layout,
        t: TensorId,
        index: &[DimId],
        name: &str,
        ind: &str,
    ) {
        let g: &Geometry = &self.g;
        let cur = self.cur.unwrap_or(0);
        let ts = &e.spec.tensors[t];
        let esize = ts.dtype.size();
        let (v, cv) = (g.vec, g.c * g.vec);
        let chunks = self.cols(e) / v;
        let last = index.len() - 1;
        let has_row = index.len() > 1;
        let (ri, rows_ok, row_off) = if has_row {
            (
                "[i]",
                format!("{} < t{t}_n0", g.row()),
                format!(" + {} * t{t}_s0", g.row()),
            )
        } else {
            ("", "true".to_string(), String::new())
        };
        let at = |w: &str| format!("{name}{ri}[{w}]");
        // One chunk (`tf_c` its first column) by 16-byte loads.
        let mut vector = String::from("const uint4* tf_q = (const uint4*)(tf_p + tf_c);\n");
        for q in 0..(v * esize / 16) {
            let _ = writeln!(vector, "{{ const uint4 tf_w = tf_q[{q}];");
            for (x, word) in ["tf_w.x", "tf_w.y", "tf_w.z", "tf_w.w"].iter().enumerate() {
                let w = q * 4 + x;
                let _ = writeln!(
                    vector,
                    "  {}",
                    match layout {
                        Layout::Packed(_) =>
                            format!("{} = {word};", at(&format!("tf_ch * {} + {w}", v / 2))),
                        Layout::F32 => format!(
                            "{} = __uint_as_float({word});",
                            at(&format!("tf_ch * {v} + {w}"))
                        ),
                    }
                );
            }
            vector.push_str("}\n");
        }
        // One chunk element by element, zeros outside the tensor.
        let edge = match layout {
            Layout::Packed(_) => format!(
                "#pragma unroll\nfor (int tf_v = 0; tf_v < {v}; tf_v += 2) {{\n\
                 \x20 const tf_u32 tf_lo = (tf_rok && tf_c + tf_v < tf_n) ? (tf_u32)tf_p[tf_c + tf_v] : 0u;\n\
                 \x20 const tf_u32 tf_hi = (tf_rok && tf_c + tf_v + 1 < tf_n) ? (tf_u32)tf_p[tf_c + tf_v + 1] : 0u;\n\
                 \x20 {} = tf_lo | (tf_hi << 16);\n}}\n",
                at(&format!("(tf_ch * {v} + tf_v) / 2"))
            ),
            Layout::F32 => format!(
                "#pragma unroll\nfor (int tf_v = 0; tf_v < {v}; ++tf_v)\n\
                 \x20 {} = (tf_rok && tf_c + tf_v < tf_n) ? tf_p[tf_c + tf_v] : 0.0f;\n",
                at(&format!("tf_ch * {v} + tf_v"))
            ),
        };
        let chunk_loop = |body: &str, ind: &str| {
            format!(
                "{ind}#pragma unroll\n{ind}for (int tf_ch = 0; tf_ch < {chunks}; ++tf_ch) {{\n\
                 {ind}  const int tf_c = tf_lv + tf_ch * {cv};\n{}{ind}}}\n",
                indent(body, &format!("{ind}  "))
            )
        };
        if has_row {
            let _ = writeln!(
                e.out,
                "{ind}#pragma unroll\n{ind}for (int i = 0; i < {}; ++i) {{",
                g.rpt
            );
        } else {
            let _ = writeln!(e.out, "{ind}{{");
        }
        let _ = writeln!(
            e.out,
            "{ind}  const bool tf_rok = {rows_ok};\n\
             {ind}  const {cty}* tf_p = t{t}{row_off} + tb{cur};\n\
             {ind}  const int tf_n = (int)max(0ll, min((long long)B{cur}, t{t}_n{last} - tb{cur}));",
            cty = ts.dtype.c_storage()
        );
        let paths = step_paths(
            self.vec_ok(e, t, index),
            cur,
            v,
            &vector,
            &edge,
            chunk_loop,
            ind,
        );
        e.out.push_str(&paths);
        let _ = writeln!(e.out, "{ind}}}");
    }

    /// Any other load (integers, strided or transposed rows): element by element
    /// with 64-bit indices, 16 bytes at a time where the layout allows.
    fn load_generic(&self, e: &mut Emitter, t: TensorId, index: &[DimId], name: &str, ind: &str) {
        let p = self.place(index);
        let (_, access) = self.shape(e, p);
        let dtype = e.spec.tensors[t].dtype;
        let cd = self.cur.unwrap_or(0);
        let esize = dtype.size();
        let vec_ok = self.vec_ok(e, t, index);
        let idx: Vec<String> = index
            .iter()
            .map(|&d| {
                if d == cd {
                    "tf_c".to_string()
                } else {
                    self.g.row()
                }
            })
            .collect();
        let has_row = matches!(p, Place::Tile);
        let v = self.g.vec;
        let chunks = self.cols(e) / v;
        if has_row {
            let _ = writeln!(
                e.out,
                "{ind}#pragma unroll\n{ind}for (int i = 0; i < {}; ++i) {{",
                self.g.rpt
            );
        }
        let _ = writeln!(
            e.out,
            "{ind}#pragma unroll\n{ind}for (int tf_ch = 0; tf_ch < {chunks}; ++tf_ch) {{\n\
             {ind}  const long long tf_c0 = tb{cd} + tf_ch * {cv} + tf_lane * {v};",
            cv = self.g.c * v
        );
        let elem = |j: &str| access.replace("[j]", &format!("[{j}]"));
        let mask0 = tensor_mask(t, &idx).replace("tf_c", &format!("(tf_c0 + {} - 1)", v));
        if vec_ok {
            let per = 16 / esize;
            let _ = writeln!(
                e.out,
                "{ind}  if ({mask0}) {{\n{ind}    const long long tf_c = tf_c0;\n\
                 {ind}    const uint4* tf_q = (const uint4*)(t{t} + {off});",
                off = tensor_offset(t, &idx)
            );
            for q in 0..(v / per) {
                let _ = writeln!(e.out, "{ind}    {{ const uint4 tf_w = tf_q[{q}];");
                for x in 0..per {
                    let word = ["tf_w.x", "tf_w.y", "tf_w.z", "tf_w.w"][x * esize / 4];
                    let raw = match esize {
                        2 => format!(
                            "(tf_u16)({word} >> {})",
                            if x % 2 == 0 { "0" } else { "16" }
                        ),
                        _ => word.to_string(),
                    };
                    let val = match dtype {
                        DType::BF16 => format!("tf_bf16_to_f32({raw})"),
                        DType::F16 => format!("tf_f16_to_f32({raw})"),
                        _ => format!("__uint_as_float({raw})"),
                    };
                    let j = format!("tf_ch * {v} + {}", q * per + x);
                    let _ = writeln!(e.out, "{ind}      {name}{} = {val};", elem(&j));
                }
                let _ = writeln!(e.out, "{ind}    }}");
            }
            let _ = writeln!(e.out, "{ind}  }} else {{");
        } else {
            let _ = writeln!(e.out, "{ind}  {{");
        }
        let (wv, ty) = widen(dtype, &format!("t{t}[{}]", tensor_offset(t, &idx)));
        let zero = if ty == CTy::F32 { "0.0f" } else { "0ll" };
        let _ = writeln!(
            e.out,
            "{ind}    #pragma unroll\n{ind}    for (int tf_v = 0; tf_v < {v}; ++tf_v) {{\n\
             {ind}      const long long tf_c = tf_c0 + tf_v;\n\
             {ind}      {name}{} = ({}) ? {wv} : {zero};\n{ind}    }}\n{ind}  }}\n{ind}}}",
            elem(&format!("tf_ch * {v} + tf_v")),
            tensor_mask(t, &idx)
        );
        if has_row {
            let _ = writeln!(e.out, "{ind}}}");
        }
    }
}

/// `code` with each line indented by `ind`.
pub(super) fn indent(code: &str, ind: &str) -> String {
    code.lines().map(|l| format!("{ind}{l}\n")).collect()
}

/// The chunks of one step of a row (inside its `for i` or block, at `ind`): with
/// 16-byte access, the `vector` chunk code alone when the row is in bounds and
/// the step whole, else chunk by chunk `vector` or the `edge` code; without it,
/// `edge` alone. `chunk_loop(body, indent)` wraps a chunk's code in the loop over
/// chunks.
pub(super) fn step_paths(
    vec_ok: bool,
    cur: DimId,
    v: usize,
    vector: &str,
    edge: &str,
    chunk_loop: impl Fn(&str, &str) -> String,
    ind: &str,
) -> String {
    let inner = format!("{ind}  ");
    if !vec_ok {
        return chunk_loop(edge, &inner);
    }
    let checked = format!(
        "if (tf_rok && tf_c + {} < tf_n) {{\n{}}} else {{\n{}}}\n",
        v - 1,
        indent(vector, "  "),
        indent(edge, "  ")
    );
    format!(
        "{inner}if (tf_rok && tf_n == B{cur}) {{  // a whole step of a row in bounds\n{}{inner}}} else {{\n{}{inner}}}\n",
        chunk_loop(vector, &format!("{inner}  ")),
        chunk_loop(&checked, &format!("{inner}  "))
    )
}
