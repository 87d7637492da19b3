//! `x.argmax(t)`, `x.argmin(t)` in the general lowering: a reduction of
//! (value, index) pairs, in the order of a plain reduction (a thread's
//! registers, then lanes by butterfly shuffles, then warps through shared
//! memory). A pair beats another with a better value, or an equal one at a
//! smaller index, so every order of combining picks the first index of the
//! best value; NaNs compare false and are never picked. Elements past the
//! extent and copies of a wrapped layout take no part. The pairs carry the
//! index within the block (32 bits: one shuffle, one compare); the tile's
//! start is added once at the end. Where the kernel also reduces the same
//! tile by the same operation (`lo = v.min(tm)` beside `v.argmin(tm)`, a
//! running argmin), the pairs' values are that reduction ([`paired`]): it is
//! not computed a second time.

use super::{Gen, Val};
use crate::emit::expr::{convert, CTy};
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

/// The offset in the block no element has: where it survives (a block of
/// NaNs only), the block's first index is given instead.
const NONE: &str = "2147483647";

/// The reductions `(op, x, t)` whose kernel has both `x.op(t)` and
/// `x.argop(t)`: the pairs of the argument's reduction give the plain one's
/// value too. Their values agree: both skip NaNs and elements outside the
/// extent and start from the operation's identity.
pub(super) fn paired(k: &Kernel) -> Vec<(ReduceOp, Expr, DimId)> {
    let (mut plain, mut args) = (Vec::new(), Vec::new());
    k.walk_exprs(&mut |x| match x {
        Expr::Reduce { op, arg, dim, .. } => plain.push((*op, (**arg).clone(), *dim)),
        Expr::ArgReduce { op, arg, dim, .. } => args.push((*op, (**arg).clone(), *dim)),
        _ => {}
    });
    args.retain(|a| plain.contains(a));
    args.dedup();
    args
}

/// `x` without the source text of its outermost node: a reduction and its
/// argument's reduction are found in [`Gen::loaded`] by what they compute.
pub(super) fn cache_key(x: &Expr) -> Expr {
    let mut k = x.clone();
    if let Some(at) = k.at_mut() {
        at.clear();
    }
    k
}

impl Gen<'_, '_> {
    /// `x.argmax(t)` / `x.argmin(t)`: the indices, and with `keep_value` the
    /// best values too (what `x.max(t)` / `x.min(t)` gives).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn arg_reduce(
        &mut self,
        op: ReduceOp,
        arg: &Expr,
        dim: DimId,
        at: &str,
        l: usize,
        depth: usize,
        pre: &[(Expr, Val)],
        keep_value: bool,
    ) -> Result<(Val, Option<Val>), CodegenError> {
        let t = self.ty(arg);
        let vt = op.result(t.dtype).cty();
        let out: Vec<DimId> = t.dims.iter().copied().filter(|&d| d != dim).collect();
        let cmp = match op {
            ReduceOp::Max => ">",
            ReduceOp::Min => "<",
            _ => {
                return Err(self.unsupported(
                    at,
                    format!(
                        "`{}` picks no element, so it has no index to give",
                        op.name()
                    ),
                ))
            }
        };
        let better = |v: &str, i: &str, bv: &str, bi: &str| {
            format!("({v} {cmp} {bv} || ({v} == {bv} && {i} < {bi}))")
        };
        let idx = Val {
            name: self.temp("tf_ai"),
            dims: out.clone(),
            cty: CTy::I64,
            layout: l,
            raw: None,
            view: None,
        };
        let val = Val {
            name: self.temp("tf_av"),
            cty: vt,
            ..idx.clone()
        };
        let local = Val {
            name: self.temp("tf_al"),
            cty: CTy::I32,
            ..idx.clone()
        };
        let lay = self.layouts[l].clone();
        let Some(p) = lay.pos(dim) else {
            return Err(self.unsupported(
                at,
                "internal: the reduced tile is not in the scope's layout",
            ));
        };
        let identity = op.identity_c(vt);
        let (decl_i, decl_v, decl_l) = (self.decl(&idx), self.decl(&val), self.decl(&local));
        self.w(
            depth,
            format!("{decl_i};  // {}", crate::emit::one_line(at)),
        );
        self.w(depth, format!("{decl_l};"));
        // The values travel only where other threads hold part of the dimension.
        let shared = lay.tpw[p] > 1 || lay.wpc[p] > 1;
        let kept = shared || keep_value;
        if kept {
            self.w(depth, format!("{decl_v};"));
        }
        self.w(depth, "{");
        let depth = depth + 1;
        // 1. This thread's elements along `dim`.
        let n = self.open(l, &out, depth);
        let d1 = depth + n;
        let ty = vt.c();
        self.w(d1, format!("{ty} tf_v = {identity}; int tf_i = {NONE};"));
        let count = lay.per_thread(p);
        self.w(
            d1,
            format!(
                "#pragma unroll\n{}for (int r{dim} = 0; r{dim} < {count}; ++r{dim}) {{",
                super::indent(d1)
            ),
        );
        let (x, xt) = self.ctx(l, pre).emit(arg, at)?;
        let x = convert(&x, xt, vt);
        let live = self.live_c(l, &[dim]);
        let offset = match self.k().is_each(dim) {
            true => "0".to_string(),
            false => self.offset_c(l, dim),
        };
        self.w(
            d1 + 1,
            format!(
                "{{ const {ty} tf_x = {x}; const int tf_k = {offset}; if (({live}) && {}) {{ tf_v = tf_x; tf_i = tf_k; }} }}",
                better("tf_x", "tf_k", "tf_v", "tf_i")
            ),
        );
        self.w(d1, "}");
        let (ai, av) = (self.access(&local), self.access(&val));
        if kept {
            self.w(d1, format!("{ai} = tf_i; {av} = tf_v;"));
        } else {
            self.w(d1, format!("{ai} = tf_i;"));
        }
        self.close(n, depth);
        // 2. Across the lanes along `dim`: every lane ends with the best pair.
        if lay.tpw[p] > 1 {
            let n = self.open(l, &out, depth);
            let stride = lay.lane_stride(p);
            let mut line = String::new();
            let mut off = 1;
            while off < lay.tpw[p] {
                let s = off * stride;
                let _ = write!(
                    line,
                    "{{ const {ty} tf_x = __shfl_xor_sync(0xffffffffu, {av}, {s}); const int tf_k = __shfl_xor_sync(0xffffffffu, {ai}, {s}); if ({}) {{ {av} = tf_x; {ai} = tf_k; }} }} ",
                    better("tf_x", "tf_k", &av, &ai)
                );
                off *= 2;
            }
            self.w(depth + n, line.trim_end());
            self.close(n, depth);
        }
        // 3. Across the warps along `dim`, through shared memory: the values,
        // then the indices (8-byte aligned after them).
        if lay.wpc[p] > 1 {
            let super::reduce::WarpSlots {
                per,
                place,
                warp: wcoord,
                writer: first_lane,
            } = self.warp_slots(l, p, &out);
            let warps = lay.wpc[p];
            let at_idx = (warps * per * vt.size()).next_multiple_of(8);
            self.need_smem(at_idx + warps * per * 4);
            let vcell = |w: &str| format!("(({ty}*)tf_smem)[{w} * {per} + {place}]");
            let icell = |w: &str| format!("((int*)(tf_smem + {at_idx}))[{w} * {per} + {place}]");
            self.w(depth, "__syncthreads();");
            let n = self.open(l, &out, depth);
            self.w(
                depth + n,
                format!(
                    "if ({first_lane}) {{ {} = {av}; {} = {ai}; }}",
                    vcell(&wcoord),
                    icell(&wcoord)
                ),
            );
            self.close(n, depth);
            self.w(depth, "__syncthreads();");
            let n = self.open(l, &out, depth);
            self.w(
                depth + n,
                format!(
                    "#pragma unroll\n{}for (int tf_w = 0; tf_w < {warps}; ++tf_w) {{ const {ty} tf_x = {}; const int tf_k = {}; if ({}) {{ {av} = tf_x; {ai} = tf_k; }} }}",
                    super::indent(depth + n),
                    vcell("tf_w"),
                    icell("tf_w"),
                    better("tf_x", "tf_k", &av, &ai)
                ),
            );
            self.close(n, depth);
        }
        // The index: the block's start plus the offset; a block of NaNs
        // only gives its first index.
        let n = self.open(l, &out, depth);
        let index = self.access(&idx);
        self.w(
            depth + n,
            format!("{index} = (long long)tb{dim} + ({ai} == {NONE} ? 0 : {ai});"),
        );
        self.close(n, depth);
        self.w(depth - 1, "}");
        Ok((idx, keep_value.then_some(val)))
    }
}
