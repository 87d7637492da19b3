//! Tile values of an attention program as registers, in the layouts of the
//! `mma.sync.m16n8k16` fragments that produce them, and the elementwise code
//! over them.
//!
//! A warp owns `16 · MI` rows of the program's tile; in each 16-row block a
//! thread holds rows `g` and `g + 8` (`g = lane / 4`) and, of every 8 columns,
//! columns `2t` and `2t + 1` (`t = lane % 4`). So a value over `[tm, tn]` (the
//! scores) is `[MI][NI][4]` floats a thread, one over `[tm, td]` (the output
//! accumulator) `[MI][DI][4]`, and one over `[tm]` (a row's max or sum)
//! `[MI][2]`, the same in the four threads of a quad. Row reductions add a
//! thread's elements, then the quad's with two shuffles.

use super::super::expr::{convert, ElemCtx};
use super::super::Emitter;
use crate::dtype::CTy;
use crate::dtype::DType;
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

/// A fragment element's row within its block (its warp's rows, its 16-row
/// tile, its half, its group), and its column within the block's columns.
const ROW_WITHIN: &str = "tf_wr + tf_mi * 16 + tf_h * 8 + tf_g";
const COL_WITHIN: &str = "tf_j * 8 + 2 * tf_t + tf_e";

/// Where the elements of a value live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// One value for the whole program (batch tiles count as scalars: one index each).
    Scalar,
    /// Per row: `[MI][2]`.
    Row,
    /// Over rows and key columns: `[MI][NI][4]`.
    Scores,
    /// Over rows and the head dimension: `[MI][DI][4]`.
    Out,
}

/// The tile geometry of one config.
#[derive(Clone, Copy, Debug)]
pub(super) struct Geo {
    pub m: DimId,
    pub n: DimId,
    pub d: DimId,
    pub bm: usize,
    pub bn: usize,
    pub hd: usize,
    pub warps: usize,
    /// 16-row blocks per warp, 8-column blocks of the scores and of the output.
    pub mi: usize,
    pub ni: usize,
    pub di: usize,
    /// The Hopper program (`wgmma`, TMA; see `hopper`), with its ring of stages.
    pub wgmma: bool,
    pub stages: usize,
    /// Hopper: a tile's `p·v` is issued with the next tile's `q·kᵀ` (see `hopper`).
    pub defer_pv: bool,
    /// Hopper, with `defer_pv`: the two go in separate groups, `q·kᵀ` first, and
    /// the step waits for `p·v` only where it next touches the output
    /// ([`crate::Config::overlap`]).
    pub overlap: bool,
    /// Hopper, a persistent forward: the warpgroups' turns at the tensor cores
    /// run on across tiles (see `hopper::scores_product`).
    pub persistent: bool,
    /// Hopper, a persistent forward with the split tail (`split`): a tile's
    /// steps may start past its first (at `tf_j0`).
    pub split: bool,
}

impl Geo {
    /// The first step of the tile's part a block walks: 0, or `tf_j0` with
    /// the split tail.
    pub fn first_step(&self) -> &'static str {
        if self.split {
            "tf_j0"
        } else {
            "0"
        }
    }

    /// The C array dimensions of a layout (empty for a scalar).
    pub fn shape(&self, l: Layout) -> String {
        match l {
            Layout::Scalar => String::new(),
            Layout::Row => format!("[{}][2]", self.mi),
            Layout::Scores => format!("[{}][{}][4]", self.mi, self.ni),
            Layout::Out => format!("[{}][{}][4]", self.mi, self.di),
        }
    }

    /// The element of a value in layout `of` seen from a loop over layout `at`,
    /// if `at` has it (a row value is everywhere; a scores value only in scores loops).
    pub fn index(&self, of: Layout, at: Layout) -> Option<&'static str> {
        match (of, at) {
            (Layout::Scalar, _) => Some(""),
            (Layout::Row, Layout::Row | Layout::Scores | Layout::Out) => Some("[tf_mi][tf_h]"),
            (Layout::Scores, Layout::Scores) | (Layout::Out, Layout::Out) => {
                Some("[tf_mi][tf_j][tf_h * 2 + tf_e]")
            }
            _ => None,
        }
    }

    /// The global index of the element's row, and of its column along the
    /// loop's column tile (keys or head dimension).
    pub fn row(&self) -> String {
        format!("(tb{} + {ROW_WITHIN})", self.m)
    }

    pub fn col(&self, l: Layout) -> String {
        match l {
            Layout::Scores => format!("(tb{} + {COL_WITHIN})", self.n),
            _ => format!("({COL_WITHIN})"),
        }
    }

    /// Whether a scores element's key is below `end` (an extent): its offset in
    /// the block against the block's room, in 32 bits.
    pub fn key_below(&self, end: &str) -> String {
        format!("((int)({COL_WITHIN}) < tf_sat30(({end}) - tb{}))", self.n)
    }

    /// The in-block offsets of the coordinates `l` binds as `tb{d} + offset`.
    pub fn within(&self, l: Layout) -> Vec<(DimId, String)> {
        match l {
            Layout::Scalar => vec![],
            Layout::Row | Layout::Out => vec![(self.m, ROW_WITHIN.into())],
            Layout::Scores => vec![(self.m, ROW_WITHIN.into()), (self.n, COL_WITHIN.into())],
        }
    }

    /// The tile coordinates an element of a `l` loop binds.
    pub fn coords(&self, l: Layout, batch: &[DimId]) -> Vec<(DimId, String)> {
        let mut c: Vec<(DimId, String)> = batch.iter().map(|&b| (b, format!("tb{b}"))).collect();
        match l {
            Layout::Scalar => {}
            Layout::Row => c.push((self.m, self.row())),
            Layout::Scores => {
                c.push((self.m, self.row()));
                c.push((self.n, self.col(l)));
            }
            Layout::Out => {
                c.push((self.m, self.row()));
                c.push((self.d, self.col(l)));
            }
        }
        c
    }

    /// [`Geo::loop_open`] of [`Layout::Out`] without the innermost loop over a
    /// thread's two neighbouring columns (`tf_e`): the body takes both.
    pub fn pairs_open(&self, ind: &str) -> (String, String) {
        let mut s = String::new();
        for (v, n) in [("tf_mi", self.mi), ("tf_j", self.di), ("tf_h", 2)] {
            let _ = write!(
                s,
                "{ind}#pragma unroll\n{ind}for (int {v} = 0; {v} < {n}; ++{v})\n"
            );
        }
        (format!("{s}{ind}{{\n"), format!("{ind}}}\n"))
    }

    /// `for` headers over a layout's elements (fully unrolled), and the closing braces.
    pub fn loop_open(&self, l: Layout, ind: &str) -> (String, String) {
        let unroll = |v: &str, n: usize| {
            format!("{ind}#pragma unroll\n{ind}for (int {v} = 0; {v} < {n}; ++{v})\n")
        };
        let mut s = String::new();
        match l {
            Layout::Scalar => return (format!("{ind}{{\n"), format!("{ind}}}\n")),
            Layout::Row => {
                s += &unroll("tf_mi", self.mi);
                s += &unroll("tf_h", 2);
            }
            Layout::Scores | Layout::Out => {
                let cols = if l == Layout::Scores {
                    self.ni
                } else {
                    self.di
                };
                s += &unroll("tf_mi", self.mi);
                s += &unroll("tf_j", cols);
                s += &unroll("tf_h", 2);
                s += &unroll("tf_e", 2);
            }
        }
        (format!("{s}{ind}{{\n"), format!("{ind}}}\n"))
    }
}

/// Lowers the elementwise statements of an attention program.
pub(super) struct Frags<'g> {
    pub geo: &'g Geo,
    pub batch: &'g [DimId],
    /// The layout of each variable that has been given a value.
    pub layouts: Vec<Option<Layout>>,
    /// Variables held unscaled ([`Frags::scale_later`]): the scores array
    /// that holds their raw values and the scale's C expression.
    pub scaled: Vec<Option<(String, String)>>,
    /// Counter for temporaries.
    pub temps: usize,
    /// The code being emitted may see columns past the tensor's edge (an edge
    /// tile of keys): reductions leave them out.
    pub masked: bool,
    /// Indentation of the code being emitted.
    pub ind: String,
    /// Loads of the key loop's step staged in shared memory (the Hopper
    /// program's column vectors, see `hopper`), with the C expression that
    /// reads an element of the scores layout there.
    pub staged: Vec<(Expr, String)>,
    /// Masked steps compare tile indices and keys in 32 bits (offsets in the
    /// block against the tiles' starts, [`Geo::key_below`], `ElemCtx::within`):
    /// the Hopper programs, where it was measured; the portable program at
    /// head dimension 128 holds 254 registers and spilled with them.
    pub narrow_keys: bool,
}

impl Frags<'_> {
    /// Whether a scores element's key is inside the keys' extent.
    pub fn key_in(&self, e: &Emitter) -> String {
        let (g, end) = (self.geo, e.end(self.geo.n));
        match self.narrow_keys {
            true => g.key_below(&end),
            false => format!("({} < {end})", g.col(Layout::Scores)),
        }
    }

    fn unsupported(e: &Emitter, at: &str, message: impl Into<String>) -> CodegenError {
        CodegenError::Unsupported {
            kernel: e.k.name.clone(),
            at: at.to_string(),
            message: message.into(),
        }
    }

    /// The layout a value over `dims` takes.
    pub fn layout_of(&self, e: &Emitter, dims: &[DimId], at: &str) -> Result<Layout, CodegenError> {
        let g = self.geo;
        let own: Vec<DimId> = dims
            .iter()
            .copied()
            .filter(|d| !self.batch.contains(d) && !e.k.dims[*d].each)
            .collect();
        let has = |d: DimId| own.contains(&d);
        if own.iter().any(|&d| d != g.m && d != g.n && d != g.d) || (has(g.n) && has(g.d)) {
            let names: Vec<&str> = dims.iter().map(|&d| e.k.dims[d].name.as_str()).collect();
            return Err(Self::unsupported(
                e,
                at,
                format!(
                    "in an attention kernel a value is over the rows and either the keys or the head dimension \
                     (`[{m}, {n}]` or `[{m}, {d}]`), or over the rows only; this one is over [{}]",
                    names.join(", "),
                    m = e.k.dims[g.m].name,
                    n = e.k.dims[g.n].name,
                    d = e.k.dims[g.d].name,
                ),
            ));
        }
        Ok(if has(g.n) {
            Layout::Scores
        } else if has(g.d) {
            Layout::Out
        } else if has(g.m) {
            Layout::Row
        } else {
            Layout::Scalar
        })
    }

    /// An element context for a loop over layout `l`: coordinates bound, every
    /// variable visible from `l` named by its element, and `pre`'s values.
    pub fn ctx<'e>(&self, e: &'e Emitter, l: Layout, pre: &[(Expr, String)]) -> ElemCtx<'e> {
        let mut c = e.ctx(&self.geo.coords(l, self.batch));
        if self.narrow_keys {
            c.within = self.geo.within(l).into_iter().collect();
        }
        for (v, lay) in self.layouts.iter().enumerate() {
            let Some(of) = lay else { continue };
            match (self.geo.index(*of, l), &self.scaled[v]) {
                (Some(ix), None) => {
                    c.named_vars.insert(v, format!("v{v}{ix}"));
                }
                (Some(ix), Some((raw, scale))) => {
                    let raw = format!("{raw}{ix}");
                    c.named_vars.insert(v, format!("({raw} * ({scale}))"));
                    c.scaled_vars.insert(v, (raw, scale.clone()));
                }
                (None, _) => {
                    c.named_vars.remove(&v);
                }
            }
        }
        c.precomputed = pre.to_vec();
        if l == Layout::Scores {
            c.precomputed.extend(self.staged.iter().cloned());
        }
        c
    }

    /// Computes the row reductions inside `value` (innermost first) into
    /// temporaries, and returns them as precomputed values. Under
    /// [`Frags::masked`], columns outside the tensor are left out (they hold
    /// zeros from the loads).
    pub fn reductions(
        &mut self,
        e: &mut Emitter,
        value: &Expr,
        pre: &mut Vec<(Expr, String)>,
    ) -> Result<(), CodegenError> {
        let (masked, ind) = (self.masked, self.ind.clone());
        let mut found: Vec<Expr> = Vec::new();
        value.walk(&mut |x| {
            if matches!(x, Expr::Reduce { .. }) {
                found.push(x.clone());
            }
        });
        // `walk` visits outer before inner: reduce the inner ones first.
        for r in found.into_iter().rev() {
            if pre.iter().any(|(x, _)| *x == r) {
                continue;
            }
            let Expr::Reduce { op, arg, dim, at } = &r else {
                continue;
            };
            let g = self.geo;
            let l = if *dim == g.n {
                Layout::Scores
            } else if *dim == g.d {
                Layout::Out
            } else {
                return Err(Self::unsupported(
                    e,
                    at,
                    format!(
                        "an attention kernel reduces along the keys (`{}`) or the head dimension (`{}`)",
                        e.k.dims[g.n].name, e.k.dims[g.d].name
                    ),
                ));
            };
            let ctx = self.ctx(e, l, pre);
            let (x, _) = ctx.emit(arg, at)?;
            // The extreme of unscaled scores, scaled once a row: the same
            // value where the scale is positive and finite (rounding keeps
            // order), the scaled elements' otherwise.
            let unscaled = match (&**arg, op) {
                (Expr::Var(v), ReduceOp::Max | ReduceOp::Min) => ctx.scaled_vars.get(v).cloned(),
                _ => None,
            };
            let init = op.identity_c(CTy::F32);
            let fold = op.combine_c("tf_a", "tf_b");
            let name = format!("tf_r{}", self.temps);
            self.temps += 1;
            let cols = if l == Layout::Scores { g.ni } else { g.di };
            let inside = match l {
                Layout::Scores => self.key_in(e),
                _ => format!("({} < {})", g.col(l), e.end(g.d)),
            };
            let take = |x: &str| {
                if masked || l == Layout::Out {
                    format!("{inside} ? ({x}) : {init}")
                } else {
                    x.to_string()
                }
            };
            let reduce = |take: &str, scale: &str, ind: &str| {
                format!(
                "{ind}#pragma unroll\n\
                 {ind}for (int tf_mi = 0; tf_mi < {mi}; ++tf_mi)\n\
                 {ind}#pragma unroll\n\
                 {ind}for (int tf_h = 0; tf_h < 2; ++tf_h) {{\n\
                 {ind}  // {parts} partial results (short dependency chains), then the quad's.\n\
                 {ind}  float tf_acc[{parts}];\n\
                 {ind}  #pragma unroll\n\
                 {ind}  for (int tf_q = 0; tf_q < {parts}; ++tf_q) tf_acc[tf_q] = {init};\n\
                 {ind}  #pragma unroll\n\
                 {ind}  for (int tf_j = 0; tf_j < {cols}; ++tf_j)\n\
                 {ind}  #pragma unroll\n\
                 {ind}  for (int tf_e = 0; tf_e < 2; ++tf_e) {{\n\
                 {ind}    const float tf_b = {take}; float tf_a = tf_acc[(tf_j * 2 + tf_e) % {parts}];\n\
                 {ind}    tf_acc[(tf_j * 2 + tf_e) % {parts}] = {fold};\n\
                 {ind}  }}\n\
                 {ind}  float tf_a = tf_acc[0];\n\
                 {ind}  #pragma unroll\n\
                 {ind}  for (int tf_q = 1; tf_q < {parts}; ++tf_q) {{ const float tf_b = tf_acc[tf_q]; tf_a = {fold}; }}\n\
                 {ind}  float tf_b = __shfl_xor_sync(0xffffffffu, tf_a, 1); tf_a = {fold};\n\
                 {ind}  tf_b = __shfl_xor_sync(0xffffffffu, tf_a, 2); tf_a = {fold};\n\
                 {ind}  {name}[tf_mi][tf_h] = tf_a{scale};\n\
                 {ind}}}\n",
                mi = g.mi,
                parts = (2 * cols).min(4),
                )
            };
            let _ = writeln!(
                e.out,
                "{ind}float {name}[{mi}][2];  // {}",
                super::super::one_line(at),
                mi = g.mi
            );
            match unscaled {
                None => e.out.push_str(&reduce(&take(&x), "", &ind)),
                Some((raw, scale)) => {
                    let inner = format!("{ind}  ");
                    let _ = write!(
                        e.out,
                        "{ind}if ({scale} > 0.0f && {scale} < __int_as_float(0x7f800000)) {{\n{}{ind}}} else {{\n{}{ind}}}\n",
                        reduce(&take(&raw), &format!(" * ({scale})"), &inner),
                        reduce(&take(&x), "", &inner),
                    );
                }
            }
            pre.push((r.clone(), format!("{name}[tf_mi][tf_h]")));
        }
        Ok(())
    }

    /// `let` (declare = true) or assignment of `value` to `var`, elementwise.
    pub fn assign(
        &mut self,
        e: &mut Emitter,
        var: VarId,
        value: &Expr,
        declare: bool,
        pre: &mut Vec<(Expr, String)>,
        at: &str,
    ) -> Result<(), CodegenError> {
        let ind = self.ind.clone();
        let ind = ind.as_str();
        let ty = e.checked.vars[var].clone();
        let l = self.layout_of(e, &ty.dims, at)?;
        // `let y = x` of unscaled scores: `y` the same raw values and scale.
        if let (true, Expr::Var(w)) = (declare, value) {
            if let Some(raw) = self.scaled[*w].clone() {
                if l == Layout::Scores && !e.k.vars[var].mutable {
                    self.scaled[var] = Some(raw);
                    self.layouts[var] = Some(l);
                    return Ok(());
                }
            }
        }
        self.scaled[var] = None;
        if let (false, Some(old)) = (declare, self.layouts[var]) {
            if old != l {
                return Err(Self::unsupported(
                    e,
                    at,
                    "a variable keeps its tiles when reassigned",
                ));
            }
        }
        self.reductions(e, value, pre)?;
        let (c, cty) = self.ctx(e, l, pre).emit(value, at)?;
        let cty_name = cty.c();
        if declare {
            let _ = writeln!(
                e.out,
                "{ind}{cty_name} v{var}{};  // {}",
                self.geo.shape(l),
                e.k.vars[var].name
            );
        }
        self.layouts[var] = Some(l);
        let ix = self.geo.index(l, l).unwrap_or("");
        let (open, close) = self.geo.loop_open(l, ind);
        let _ = write!(e.out, "{open}{ind}  v{var}{ix} = {c};\n{close}");
        Ok(())
    }

    /// `let var = value` where `value` is `product * scale` (or `scale *
    /// product`) of the scores array `raw`, a uniform f32 `scale`, and `var`
    /// not `mut` (never reassigned): `var` is held unscaled (see
    /// [`ElemCtx::scaled_vars`]), the multiply left to its uses, where a max
    /// folds it into one per row and `exp(var - m)` into the exponent's FMA
    /// (FlashAttention-3's softmax: 64 multiplies a step fewer for a thread's
    /// 64 scores). Whether it was taken.
    pub fn scale_later(
        &mut self,
        e: &Emitter,
        (var, value): (VarId, &Expr),
        (product, raw): (&Expr, &str),
        pre: &[(Expr, String)],
        at: &str,
    ) -> Result<bool, CodegenError> {
        let Expr::Binary {
            op: BinOp::Mul,
            lhs,
            rhs,
            ..
        } = value
        else {
            return Ok(false);
        };
        let scale = match (&**lhs, &**rhs) {
            (p, s) | (s, p) if p == product && uniform(s) => s,
            _ => return Ok(false),
        };
        if e.checked.vars[var].dtype != DType::F32 || e.k.vars[var].mutable {
            return Ok(false);
        }
        let (c, ty) = self.ctx(e, Layout::Scores, pre).emit(scale, at)?;
        self.scaled[var] = Some((raw.to_string(), convert(&c, ty, CTy::F32)));
        self.layouts[var] = Some(Layout::Scores);
        Ok(true)
    }

    /// `tensor[index] = value` for a value over the rows (and the head dimension):
    /// each thread stores its elements, masked at the tensor's edges; a row value
    /// is stored by one thread of each quad.
    pub fn store(
        &mut self,
        e: &mut Emitter,
        tensor: TensorId,
        index: &[DimId],
        value: &Expr,
        at: &str,
    ) -> Result<(), CodegenError> {
        let ind = self.ind.clone();
        let ind = ind.as_str();
        let mut dims = index.to_vec();
        dims.sort_unstable();
        let l = self.layout_of(e, &dims, at)?;
        if matches!(l, Layout::Scores | Layout::Scalar) {
            return Err(Self::unsupported(
                e,
                at,
                "an attention kernel stores tiles over its rows (and head dimension) after the key loop",
            ));
        }
        let mut pre = Vec::new();
        self.reductions(e, value, &mut pre)?;
        let ctx = self.ctx(e, l, &pre);
        let coords: Vec<String> = index
            .iter()
            .map(|d| {
                ctx.coords
                    .get(d)
                    .cloned()
                    .unwrap_or_else(|| format!("tb{d}"))
            })
            .collect();
        let dst = e.spec.tensors[tensor].dtype;
        let (c, cty) = super::super::expr::ElemCtx::emit(&ctx, &strip_store_cast(value), at)?;
        let v = super::super::expr::narrow(dst, &c, cty);
        let mut mask = super::super::expr::tensor_mask(tensor, &coords);
        // A tile whose bounds the program computes (a packed sequence's rows)
        // stops at its range's end, inside the tensor (its start may be
        // before the tensor's: bounds are data).
        for (d, c) in index.iter().zip(&coords) {
            if e.k.dims[*d].extent.is_none() {
                let _ = write!(mask, " && ({c}) >= 0 && ({c}) < {}", e.end(*d));
            }
        }
        let off = super::super::expr::tensor_offset(tensor, &coords);
        let quad = if l == Layout::Row {
            "tf_t == 0 && "
        } else {
            ""
        };
        let narrow_out = l == Layout::Out && matches!(dst, DType::BF16 | DType::F16);
        if narrow_out {
            if let Some(by_rows) = self.store_by_rows(e, tensor, index, &coords, (&c, cty), dst) {
                e.out.push_str(&by_rows);
                return Ok(());
            }
        }
        if narrow_out && e.cfg.wgmma {
            // A thread's two neighbouring columns (`tf_e`) in one 4-byte store
            // where both are in the tensor, next to each other and aligned
            // (strides are data: tested at run time), else one at a time. The
            // Hopper program's only: the `mma.sync` one's dK/dV, at 255
            // registers, spills 12 bytes holding both elements' places.
            let (open, close) = self.geo.pairs_open(ind);
            let _ = write!(
                e.out,
                "{open}{ind}  unsigned short tf_sv[2];\n\
                 {ind}  bool tf_sm[2];\n\
                 {ind}  long long tf_so[2];\n\
                 {ind}  #pragma unroll\n\
                 {ind}  for (int tf_e = 0; tf_e < 2; ++tf_e) {{\n\
                 {ind}    tf_sm[tf_e] = {mask};\n\
                 {ind}    tf_so[tf_e] = {off};\n\
                 {ind}    tf_sv[tf_e] = 0;\n\
                 {ind}    if (tf_sm[tf_e]) tf_sv[tf_e] = {v};  // its loads only inside\n\
                 {ind}  }}\n\
                 {ind}  if (tf_sm[0] && tf_sm[1] && tf_so[1] == tf_so[0] + 1 && (((unsigned long long)(t{tensor} + tf_so[0])) & 3ull) == 0)\n\
                 {ind}    *(unsigned int*)(t{tensor} + tf_so[0]) = (unsigned int)tf_sv[0] | ((unsigned int)tf_sv[1] << 16);\n\
                 {ind}  else {{\n\
                 {ind}    if (tf_sm[0]) t{tensor}[tf_so[0]] = tf_sv[0];\n\
                 {ind}    if (tf_sm[1]) t{tensor}[tf_so[1]] = tf_sv[1];\n\
                 {ind}  }}\n{close}"
            );
            return Ok(());
        }
        let (open, close) = self.geo.loop_open(l, ind);
        let _ = write!(
            e.out,
            "{open}{ind}  if ({quad}{mask}) t{tensor}[{off}] = {v};\n{close}"
        );
        Ok(())
    }

    /// The output store (rows and the head dimension into a 16-bit float
    /// tensor), on both programs, by rows: each of a thread's rows gets its address
    /// and mask once, each column pair a 32-bit offset, converted by one
    /// `cvt.rn.{bf16,f16}x2` and stored in 4 bytes where the head dimension
    /// is contiguous and the rows start 4-byte aligned (tested once, strides
    /// being data), else element by element. The per-element 64-bit address
    /// and mask arithmetic it replaces was most of a tile's end: 0.585 →
    /// 0.518 ms at 32×16×1024×128 on an H200 (perf-history, "The attention
    /// output's store by rows"). `None` where the index is not the rows, the
    /// head dimension (a host extent) and uniform tiles.
    fn store_by_rows(
        &self,
        e: &Emitter,
        tensor: TensorId,
        index: &[DimId],
        coords: &[String],
        (c, cty): (&str, CTy),
        dst: DType,
    ) -> Option<String> {
        let (g, ind) = (&self.geo, self.ind.as_str());
        let pos = |d: DimId| index.iter().position(|&x| x == d);
        let (rp, cp) = (pos(g.m)?, pos(g.d)?);
        let once = |d: DimId| index.iter().filter(|&&x| x == d).count() == 1;
        if !once(g.m) || !once(g.d) || e.k.dims[g.d].extent.is_none() {
            return None;
        }
        let t = format!("t{tensor}");
        // The uniform part (batch tiles): offset and mask.
        let (mut uoff, mut umask) = (Vec::new(), Vec::new());
        let mut rmask = format!("({}) < {t}_n{rp}", coords[rp]);
        for (i, (d, c)) in index.iter().zip(coords).enumerate() {
            let data = e.k.dims[*d].extent.is_none();
            let bound = format!(" && ({c}) >= 0 && ({c}) < {}", e.end(*d));
            if i == rp {
                if data {
                    rmask += &bound;
                }
            } else if i != cp {
                uoff.push(format!("({c}) * {t}_s{i}"));
                umask.push(format!("({c}) < {t}_n{i}"));
                if data {
                    umask.push(bound[4..].to_string());
                }
            }
        }
        let uoff = if uoff.is_empty() {
            "0ll".to_string()
        } else {
            uoff.join(" + ")
        };
        let rok = umask
            .into_iter()
            .chain([rmask])
            .collect::<Vec<_>>()
            .join(" && ");
        let f32v = crate::prims::cast::cuda(c, cty, DType::F32);
        let (pack, one) = match dst {
            DType::F16 => ("tf_pack_f16x2", "tf_f32_to_f16"),
            _ => ("tf_pack_bf16x2", "tf_f32_to_bf16"),
        };
        let row = &coords[rp];
        let (mi, di) = (g.mi, g.di);
        // Where the whole head dimension is in the tensor, contiguous, and
        // every row starts 16-byte aligned (a warp-uniform test), each quad
        // trades its packed column pairs by two rounds of `shfl.xor` so that
        // a thread holds 8 adjacent columns: one 16-byte store where four
        // 4-byte ones went, each warp store covering 64 bytes of each of its 8
        // rows (whole 32-byte sectors) instead of 16. Stored through the row
        // viewed as 16-byte words: NVVM split the first of the stores into four
        // 4-byte ones when written through a cast of an element's address.
        // The loops over a thread's rows, each row's mask and address, at
        // indent `i` (both store forms open them).
        let rows = |i: &str| -> String {
            format!(
                "{i}#pragma unroll\n\
                 {i}for (int tf_mi = 0; tf_mi < {mi}; ++tf_mi)\n\
                 {i}#pragma unroll\n\
                 {i}for (int tf_h = 0; tf_h < 2; ++tf_h) {{\n\
                 {i}  const bool tf_rok = {rok};\n\
                 {i}  unsigned short* tf_ob = {t} + tf_ou + ({row}) * {t}_s{rp};\n"
            )
        };
        let wide = match di % 4 {
            0 => format!(
                "{ind}  if (tf_o16) {{  // a quad's pairs traded: 8 adjacent columns a thread, 16 bytes a store\n\
                 {ind}    const bool tf_b0 = (tf_t & 1) != 0, tf_b1 = (tf_t & 2) != 0;\n\
                 {rows_wide}\
                 {ind}      #pragma unroll\n\
                 {ind}      for (int tf_q = 0; tf_q < {groups}; ++tf_q) {{\n\
                 {ind}        unsigned int tf_w[4];\n\
                 {ind}        #pragma unroll\n\
                 {ind}        for (int tf_jj = 0; tf_jj < 4; ++tf_jj) {{\n\
                 {ind}          const int tf_j = tf_q * 4 + tf_jj;\n\
                 {ind}          float tf_ov[2];\n\
                 {ind}          #pragma unroll\n\
                 {ind}          for (int tf_e = 0; tf_e < 2; ++tf_e) tf_ov[tf_e] = {f32v};\n\
                 {ind}          tf_w[tf_jj] = {pack}(tf_ov[0], tf_ov[1]);\n\
                 {ind}        }}\n\
                 {ind}        // Thread t's word u ends as thread u's word t (a 4x4 transpose in the quad).\n\
                 {ind}        #pragma unroll\n\
                 {ind}        for (int tf_k = 0; tf_k < 2; ++tf_k) {{\n\
                 {ind}          const bool tf_b = tf_k == 0 ? tf_b0 : tf_b1;\n\
                 {ind}          #pragma unroll\n\
                 {ind}          for (int tf_lo = 0; tf_lo < 4; ++tf_lo) {{\n\
                 {ind}            if (tf_lo & (1 << tf_k)) continue;\n\
                 {ind}            const int tf_hi = tf_lo | (1 << tf_k);\n\
                 {ind}            const unsigned int tf_r = __shfl_xor_sync(0xffffffffu, tf_b ? tf_w[tf_lo] : tf_w[tf_hi], 1 << tf_k);\n\
                 {ind}            if (tf_b) tf_w[tf_lo] = tf_r; else tf_w[tf_hi] = tf_r;\n\
                 {ind}          }}\n\
                 {ind}        }}\n\
                 {ind}        if (tf_rok) ((uint4*)tf_ob)[tf_q * 4 + tf_t] = make_uint4(tf_w[0], tf_w[1], tf_w[2], tf_w[3]);\n\
                 {ind}      }}\n\
                 {ind}    }}\n\
                 {ind}  }} else\n",
                groups = di / 4,
                rows_wide = rows(&format!("{ind}    ")),
            ),
            _ => String::new(),
        };
        let o16 = match di % 4 {
            0 => format!(
                "{ind}  const bool tf_o16 = {t}_s{cp} == 1 && {t}_n{cp} >= {cols} && (({t}_s{rp} | tf_ou) & 7) == 0 && (((unsigned long long){t}) & 15ull) == 0;\n",
                cols = di * 8
            ),
            _ => String::new(),
        };
        Some(format!(
            "{ind}{{  // the output by rows: a row's address and mask once, a column a 32-bit offset\n\
             {ind}  const long long tf_ou = {uoff};\n\
             {ind}  // Columns contiguous, every row's start 4-byte aligned: pairs go in one store.\n\
             {ind}  const bool tf_oc = {t}_s{cp} == 1 && (({t}_s{rp} | tf_ou) & 1) == 0 && (((unsigned long long){t}) & 3ull) == 0;\n\
             {o16}{wide}\
             {ind}  {{\n\
             {rows_pairs}\
             {ind}    #pragma unroll\n\
             {ind}    for (int tf_j = 0; tf_j < {di}; ++tf_j) {{\n\
             {ind}      const int tf_col = tf_j * 8 + 2 * tf_t;\n\
             {ind}      float tf_ov[2];\n\
             {ind}      #pragma unroll\n\
             {ind}      for (int tf_e = 0; tf_e < 2; ++tf_e) tf_ov[tf_e] = {f32v};\n\
             {ind}      if (tf_rok && tf_oc && tf_col + 1 < {t}_n{cp}) *(unsigned int*)(tf_ob + tf_col) = {pack}(tf_ov[0], tf_ov[1]);\n\
             {ind}      else {{\n\
             {ind}        if (tf_rok && tf_col < {t}_n{cp}) tf_ob[tf_col * {t}_s{cp}] = {one}(tf_ov[0]);\n\
             {ind}        if (tf_rok && tf_col + 1 < {t}_n{cp}) tf_ob[(tf_col + 1) * {t}_s{cp}] = {one}(tf_ov[1]);\n\
             {ind}      }}\n\
             {ind}    }}\n\
             {ind}  }}\n\
             {ind}  }}\n\
             {ind}}}\n",
            rows_pairs = rows(&format!("{ind}  ")),
        ))
    }
}

/// The tile dimensions of `x` (sorted), by the checker's rules.
pub(super) fn dims_of(e: &Emitter, x: &Expr) -> Vec<DimId> {
    crate::check::dims_of(e.k, e.spec, e.checked, x)
}

/// A store's value without its untyped `.cast()` (the store converts).
fn strip_store_cast(v: &Expr) -> Expr {
    match v {
        Expr::Cast { arg, dtype: None } => (**arg).clone(),
        other => other.clone(),
    }
}

/// Whether `x` is the same for every element and program: literals, scalar
/// arguments and `#[constexpr]` values, and arithmetic and casts of them.
fn uniform(x: &Expr) -> bool {
    match x {
        Expr::Int(_) | Expr::Float(_) | Expr::Scalar(_) | Expr::Const(_) => true,
        Expr::Cast { arg, .. } | Expr::Unary { arg, .. } => uniform(arg),
        Expr::Binary { lhs, rhs, .. } => uniform(lhs) && uniform(rhs),
        _ => false,
    }
}
