//! Reductions of the general lowering: a thread combines its own registers
//! along the dimension, then the lanes that hold the rest combine by
//! butterfly shuffles, then the warps through shared memory. Every thread
//! ends with the result for its elements of the other dimensions (the
//! reduced layout is the slice, so the result broadcasts back for free).
//! Elements past the extent, and copies of a wrapped layout, count as the
//! identity.

use super::{Gen, Val};
use crate::emit::expr::{convert, fill};
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

/// The partial results a thread keeps while combining its own elements.
const ACCUMULATORS: usize = 4;

/// Where the warps along a reduced (or scanned) dimension meet in shared
/// memory: one slot per element of the other dimensions `out`.
pub(super) struct WarpSlots {
    /// Slots a warp fills: the product of `out`'s blocks.
    pub per: usize,
    /// The current element's slot (C, from the `r{d}` of `out`).
    pub place: String,
    /// This thread's warp coordinate along the dimension (C).
    pub warp: String,
    /// Whether this thread writes its warp's value (C): the first lane along
    /// the dimension, and no copy of a wrapped dimension of `out` (its loads
    /// were masked: its value is the identity's or garbage, and it would race
    /// the real one for the slot).
    pub writer: String,
}

impl Gen<'_, '_> {
    /// The slots of [`WarpSlots`] for a value over `out` whose dimension at
    /// position `p` of layout `l` is combined across warps.
    pub(super) fn warp_slots(&self, l: usize, p: usize, out: &[DimId]) -> WarpSlots {
        let lay = &self.layouts[l];
        let blocks: Vec<usize> = out.iter().map(|&d| self.block(d)).collect();
        let mut place = String::from("0");
        let mut stride = 1;
        for (&d, &b) in out.iter().zip(&blocks).rev() {
            let _ = write!(place, " + ({}) * {stride}", self.offset_c(l, d));
            stride *= b;
        }
        let mut writer = format!("((tf_lane / {}) % {}) == 0", lay.lane_stride(p), lay.tpw[p]);
        for &d in out {
            if let Some(q) = lay.pos(d).filter(|&q| lay.wraps(q)) {
                let _ = write!(writer, " && tf_u{l}_{q}");
            }
        }
        WarpSlots {
            per: blocks.iter().product(),
            place,
            warp: format!("((tf_warp / {}) % {})", lay.warp_stride(p), lay.wpc[p]),
            writer,
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn reduce(
        &mut self,
        op: ReduceOp,
        arg: &Expr,
        dim: DimId,
        at: &str,
        l: usize,
        depth: usize,
        pre: &[(Expr, Val)],
    ) -> Result<Val, CodegenError> {
        let t = self.ty(arg);
        let cty = op.result(t.dtype).cty();
        let out: Vec<DimId> = t.dims.iter().copied().filter(|&d| d != dim).collect();
        let v = Val {
            name: self.temp("tf_r"),
            dims: out.clone(),
            cty,
            layout: l,
            raw: None,
            view: None,
        };
        let lay = self.layouts[l].clone();
        let Some(p) = lay.pos(dim) else {
            return Err(self.unsupported(
                at,
                "internal: the reduced tile is not in the scope's layout",
            ));
        };
        let identity = op.identity_c(cty);
        let comb = |a: &str, b: &str| fill(op.entry().cuda, &[("a", a), ("b", b)]);
        let decl = self.decl(&v);
        self.w(depth, format!("{decl};  // {}", crate::emit::one_line(at)));
        // 1. This thread's elements along `dim`.
        self.w(depth, "{");
        let depth = depth + 1;
        // Several partial results, so that the combines form short chains
        // rather than one as long as the thread's elements (4 cycles each);
        // one below `UNMASKED_MIN` elements, where the partials' extra
        // combines cost more than the chain (jagged_softmax, 4 rows a
        // thread: 12% slower with four).
        let count = lay.per_thread(p);
        let parts = match count >= super::UNMASKED_MIN {
            true => count.min(ACCUMULATORS),
            false => 1,
        };
        let (slot, first) = match parts {
            1 => ("tf_a".to_string(), "tf_a"),
            _ => (format!("tf_a[r{dim} % {parts}]"), "tf_a[0]"),
        };
        let (x, xt) = self.ctx(l, pre).emit(arg, at)?;
        let x = convert(&x, xt, cty);
        let stmt = format!("{slot} = {};", comb(&slot, &x));
        let access = self.access(&v);
        let init = match parts {
            1 => format!("{{ {} tf_a = {identity};", cty.c()),
            _ => format!(
                "{{ {} tf_a[{parts}] = {{{}}};",
                cty.c(),
                vec![identity.to_string(); parts].join(", ")
            ),
        };
        let mut tree = Vec::new();
        let mut width = parts;
        while width > 1 {
            let half = width.div_ceil(2);
            for i in 0..width - half {
                let (a, b) = (format!("tf_a[{i}]"), format!("tf_a[{}]", i + half));
                tree.push(format!("{a} = {};", comb(&a, &b)));
            }
            width = half;
        }
        let mut body = |g: &mut Self, depth: usize, guard: Option<&str>| {
            let n = g.open(l, &out, depth);
            let d1 = depth + n;
            g.w(d1, &init);
            let m = g.open(l, &[dim], d1);
            match guard {
                Some(live) => g.w(d1 + m, format!("if ({live}) {stmt}")),
                None => g.w(d1 + m, &stmt),
            }
            g.close(m, d1);
            for line in &tree {
                g.w(d1, line);
            }
            g.w(d1, format!("{access} = {first}; }}"));
            g.close(n, depth);
            Ok(())
        };
        let live = self.live_c(l, &[dim]);
        self.unmasked_where_whole(l, &[dim], &live, depth, &mut body)?;
        // 2. Across the lanes along `dim`.
        if lay.tpw[p] > 1 {
            let n = self.open(l, &out, depth);
            let stride = lay.lane_stride(p);
            let mut line = String::new();
            let mut off = 1;
            while off < lay.tpw[p] {
                let _ = write!(
                    line,
                    "{access} = {}; ",
                    comb(
                        &access,
                        &format!("__shfl_xor_sync(0xffffffffu, {access}, {})", off * stride)
                    )
                );
                off *= 2;
            }
            self.w(depth + n, line.trim_end());
            self.close(n, depth);
        }
        // 3. Across the warps along `dim`, through shared memory.
        if lay.wpc[p] > 1 {
            let WarpSlots {
                per,
                place,
                warp: wcoord,
                writer: first_lane,
            } = self.warp_slots(l, p, &out);
            let warps = lay.wpc[p];
            self.need_smem(warps * per * cty.size());
            let ty = cty.c();
            self.w(depth, "__syncthreads();");
            let n = self.open(l, &out, depth);
            self.w(
                depth + n,
                format!(
                    "if ({first_lane}) (({ty}*)tf_smem)[{wcoord} * {per} + {place}] = {access};"
                ),
            );
            self.close(n, depth);
            self.w(depth, "__syncthreads();");
            self.w(depth, "{");
            let depth = depth + 1;
            let n = self.open(l, &out, depth);
            self.w(depth + n, format!("{ty} tf_a = {identity};"));
            self.w(
                depth + n,
                format!(
                    "#pragma unroll\n{}for (int tf_w = 0; tf_w < {warps}; ++tf_w) tf_a = {};",
                    super::indent(depth + n),
                    comb("tf_a", &format!("(({ty}*)tf_smem)[tf_w * {per} + {place}]"))
                ),
            );
            self.w(depth + n, format!("{access} = tf_a;"));
            self.close(n, depth);
            self.w(depth - 1, "}");
        }
        self.w(depth - 1, "}");
        Ok(v)
    }
}
