//! Scans of the general lowering (`x.cumsum(tn)`): the inclusive prefix along
//! one dimension of a register tile, in the order of the layout's elements
//! along it (run of a thread, then lanes, then warps, then the pattern's
//! repeats: a blocked layout's own order, see [`super::Layout`]).
//!
//! 1. Each thread scans each of its runs in registers; the run's last value
//!    is its total.
//! 2. The lanes along the dimension scan those totals by `__shfl_up_sync`
//!    (Hillis-Steele, log2 lanes steps); a lane keeps the total of the lanes
//!    before it, and learns the warp's.
//! 3. Warps along the dimension meet through shared memory: each adds the
//!    totals of the warps before it, and learns the block's.
//! 4. The pattern's repeats follow each other: each adds the totals of the
//!    repeats before it. Every element then adds what came before its run.
//!
//! Elements past the extent, and copies of a wrapped layout, count as the
//! identity (they come after every element in the extent, so no prefix
//! that a store keeps sees them).

use super::{indent, Gen, Val};
use crate::emit::expr::{convert, fill};
use crate::error::CodegenError;
use crate::ir::*;
use std::fmt::Write;

impl Gen<'_, '_> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scan(
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
        let others: Vec<DimId> = t.dims.iter().copied().filter(|&d| d != dim).collect();
        let v = Val {
            name: self.temp("tf_s"),
            dims: t.dims.clone(),
            cty,
            layout: l,
            raw: None,
            view: None,
        };
        let lay = self.layouts[l].clone();
        let Some(p) = lay.pos(dim) else {
            return Err(self.unsupported(
                at,
                "internal: the scanned tile is not in the scope's layout",
            ));
        };
        let (spt, per) = (lay.spt[p], lay.per_thread(p));
        let reps = per / spt;
        let (tpw, wpc) = (lay.tpw[p], lay.wpc[p]);
        let ls = lay.lane_stride(p);
        let identity = op.identity_c(cty);
        let comb = |a: &str, b: &str| fill(op.entry().cuda, &[("a", a), ("b", b)]);
        let ty = cty.c();
        // Per element of the other dimensions and repeat: the run's total
        // (then the warp's, the block's) and what comes before the run.
        let count = self.size(l, &others) * reps;
        let (tot, before) = (self.temp("tf_st"), self.temp("tf_sb"));
        let decl = self.decl(&v);
        self.w(depth, format!("{decl};  // {}", crate::emit::one_line(at)));
        // Runs' totals are read by a later step only where the dimension has
        // other lanes, warps or repeats (else NVRTC warns of a value never used).
        let totals = tpw > 1 || wpc > 1 || reps > 1;
        if totals {
            self.w(depth, format!("{ty} {tot}[{count}], {before}[{count}];"));
        } else {
            self.w(depth, format!("{ty} {before}[{count}];"));
        }
        let slot = |g: &Self, rep: &str| -> String {
            let o = g.flat(l, &others);
            let o = o.trim_start_matches('[').trim_end_matches(']');
            match o {
                "" => rep.to_string(),
                o => format!("({o}) * {reps} + {rep}"),
            }
        };
        // 1. Each run in registers.
        self.w(depth, "{");
        let d0 = depth + 1;
        let n = self.open(l, &others, d0);
        let d1 = d0 + n;
        self.w(d1, format!("{ty} tf_a = {identity};"));
        self.w(
            d1,
            format!(
                "#pragma unroll\n{}for (int r{dim} = 0; r{dim} < {per}; ++r{dim}) {{",
                indent(d1)
            ),
        );
        let (x, xt) = self.ctx(l, pre).emit(arg, at)?;
        let x = convert(&x, xt, cty);
        let live = self.live_c(l, &[dim]);
        let access = self.access(&v);
        let s = slot(self, &format!("r{dim} / {spt}"));
        if spt > 1 {
            self.w(
                d1 + 1,
                format!("if (r{dim} % {spt} == 0) tf_a = {identity};"),
            );
        } else {
            self.w(d1 + 1, format!("tf_a = {identity};"));
        }
        self.w(d1 + 1, format!("if ({live}) tf_a = {};", comb("tf_a", &x)));
        self.w(d1 + 1, format!("{access} = tf_a;"));
        if totals {
            self.w(
                d1 + 1,
                format!("if (r{dim} % {spt} == {}) {tot}[{s}] = tf_a;", spt - 1),
            );
        }
        self.w(d1, "}");
        self.close(n, d0);
        // 2. Across the lanes along the dimension.
        let each_rep = |g: &mut Self, depth: usize| -> usize {
            let n = g.open(l, &others, depth);
            g.w(
                depth + n,
                format!(
                    "#pragma unroll\n{}for (int tf_j = 0; tf_j < {reps}; ++tf_j) {{",
                    indent(depth + n)
                ),
            );
            n + 1
        };
        let n = each_rep(self, d0);
        let d1 = d0 + n;
        let s = slot(self, "tf_j");
        if tpw > 1 {
            let mut line =
                format!("const int tf_lc = (tf_lane / {ls}) % {tpw}; {ty} tf_x = {tot}[{s}];");
            let mut off = 1;
            while off < tpw {
                let _ = write!(
                    line,
                    " {{ {ty} tf_y = __shfl_up_sync(0xffffffffu, tf_x, {}); if (tf_lc >= {off}) tf_x = {}; }}",
                    off * ls,
                    comb("tf_x", "tf_y")
                );
                off *= 2;
            }
            self.w(d1, line);
            self.w(
                d1,
                format!(
                    "{ty} tf_e = __shfl_up_sync(0xffffffffu, tf_x, {ls}); {before}[{s}] = tf_lc == 0 ? {identity} : tf_e;"
                ),
            );
            self.w(
                d1,
                format!(
                    "{tot}[{s}] = __shfl_sync(0xffffffffu, tf_x, tf_lane + ({} - tf_lc) * {ls});",
                    tpw - 1
                ),
            );
        } else {
            self.w(d1, format!("{before}[{s}] = {identity};"));
        }
        self.close(n, d0);
        // 3. Across the warps along the dimension, through shared memory.
        if wpc > 1 {
            let super::reduce::WarpSlots {
                per: width,
                place,
                warp: wc,
                writer: first,
            } = self.warp_slots(l, p, &others);
            self.need_smem(reps * wpc * width * cty.size());
            let cell =
                |w: &str| format!("(({ty}*)tf_smem)[(tf_j * {wpc} + {w}) * {width} + {place}]");
            self.w(d0, "__syncthreads();");
            let n = each_rep(self, d0);
            self.w(d0 + n, format!("if ({first}) {} = {tot}[{s}];", cell(&wc)));
            self.close(n, d0);
            self.w(d0, "__syncthreads();");
            let n = each_rep(self, d0);
            let d1 = d0 + n;
            self.w(
                d1,
                format!("{ty} tf_p = {identity}, tf_q = {identity}; const int tf_wc = {wc};"),
            );
            self.w(
                d1,
                format!(
                    "#pragma unroll\n{}for (int tf_w = 0; tf_w < {wpc}; ++tf_w) {{ {ty} tf_y = {}; if (tf_w < tf_wc) tf_p = {}; tf_q = {}; }}",
                    indent(d1),
                    cell("tf_w"),
                    comb("tf_p", "tf_y"),
                    comb("tf_q", "tf_y")
                ),
            );
            self.w(
                d1,
                format!(
                    "{before}[{s}] = {}; {tot}[{s}] = tf_q;",
                    comb("tf_p", &format!("{before}[{s}]"))
                ),
            );
            self.close(n, d0);
        }
        // 4. The repeats in order, then every element adds what precedes its run.
        let n = self.open(l, &others, d0);
        let d1 = d0 + n;
        if reps > 1 {
            self.w(d1, format!("{ty} tf_r = {identity};"));
            self.w(
                d1,
                format!(
                    "#pragma unroll\n{}for (int tf_j = 0; tf_j < {reps}; ++tf_j) {{ {ty} tf_y = {tot}[{s}]; {before}[{s}] = {}; tf_r = {}; }}",
                    indent(d1),
                    comb("tf_r", &format!("{before}[{s}]")),
                    comb("tf_r", "tf_y")
                ),
            );
        }
        self.w(
            d1,
            format!(
                "#pragma unroll\n{}for (int r{dim} = 0; r{dim} < {per}; ++r{dim}) {access} = {};",
                indent(d1),
                comb(
                    &format!("{before}[{}]", slot(self, &format!("r{dim} / {spt}"))),
                    &access
                )
            ),
        );
        self.close(n, d0);
        self.w(depth, "}");
        Ok(v)
    }
}

#[cfg(test)]
// The mirror indexes threads and registers as the generated code does.
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::super::Layout;

    /// The emitted algorithm, step by step on every thread of a block (a
    /// mirror of the C above: runs, `__shfl_up_sync` steps, the warps'
    /// totals through shared memory, the repeats), for a scan of position
    /// `p` of `lay` (two dimensions) over rows of `extent` elements, on sums
    /// of integers: returns, per thread, other register and register along
    /// `p`, the value it ends with.
    fn emitted(lay: &Layout, p: usize, warps: usize, extent: usize) -> Vec<Vec<Vec<i64>>> {
        let o = 1 - p;
        let threads = warps * 32;
        let x = |row: usize, c: usize| ((row * 7919 + c * 104729) % 201) as i64 - 100;
        let (spt, per) = (lay.spt[p], lay.per_thread(p));
        let reps = per / spt;
        let (tpw, wpc, ls, ws) = (
            lay.tpw[p],
            lay.wpc[p],
            lay.lane_stride(p),
            lay.warp_stride(p),
        );
        let others = lay.per_thread(o);
        // The coordinate along `q` of register `r` (wrapped as `tf_o` is) and
        // whether it is a copy (`tf_u` false).
        let coord = |q: usize, t: usize, r: usize| {
            let c = lay.thread_base(q, t % 32, t / 32) + lay.reg_offset(q, r);
            (c % lay.block[q], c >= lay.block[q])
        };
        let mut s = vec![vec![vec![0i64; per]; others]; threads];
        let mut tot = vec![vec![vec![0i64; reps]; others]; threads];
        let mut before = tot.clone();
        // 1. Runs.
        for t in 0..threads {
            for q in 0..others {
                let (row, _) = coord(o, t, q);
                let mut a = 0;
                for r in 0..per {
                    if r % spt == 0 {
                        a = 0;
                    }
                    let (c, copy) = coord(p, t, r);
                    if c < extent && !copy {
                        a += x(row, c);
                    }
                    s[t][q][r] = a;
                    if r % spt == spt - 1 {
                        tot[t][q][r / spt] = a;
                    }
                }
            }
        }
        // 2. Lanes: every lane of a warp steps together.
        let lc = |t: usize| ((t % 32) / ls) % tpw;
        for q in 0..others {
            for j in 0..reps {
                let mut v: Vec<i64> = (0..threads).map(|t| tot[t][q][j]).collect();
                let mut off = 1;
                while off < tpw {
                    let prev = v.clone();
                    for t in 0..threads {
                        if lc(t) >= off {
                            v[t] += prev[t - off * ls];
                        }
                    }
                    off *= 2;
                }
                for t in 0..threads {
                    before[t][q][j] = if lc(t) == 0 { 0 } else { v[t - ls] };
                    tot[t][q][j] = v[t + (tpw - 1 - lc(t)) * ls];
                }
            }
        }
        // 3. Warps, through a shared array (a race would show as a slot
        // written twice with different values).
        if wpc > 1 {
            let width = lay.block[o];
            let mut smem: Vec<Option<i64>> = vec![None; reps * wpc * width];
            let wc = |t: usize| ((t / 32) / ws) % wpc;
            for t in 0..threads {
                for q in 0..others {
                    let (row, copy) = coord(o, t, q);
                    if lc(t) != 0 || (copy && lay.wraps(o)) {
                        continue;
                    }
                    for j in 0..reps {
                        let cell = &mut smem[(j * wpc + wc(t)) * width + row];
                        assert!(cell.is_none_or(|v| v == tot[t][q][j]), "a race: {lay:?}");
                        *cell = Some(tot[t][q][j]);
                    }
                }
            }
            for t in 0..threads {
                for q in 0..others {
                    let (row, _) = coord(o, t, q);
                    for j in 0..reps {
                        let (mut pre, mut all) = (0, 0);
                        for w in 0..wpc {
                            let y = smem[(j * wpc + w) * width + row].unwrap_or(0);
                            if w < wc(t) {
                                pre += y;
                            }
                            all += y;
                        }
                        before[t][q][j] += pre;
                        tot[t][q][j] = all;
                    }
                }
            }
        }
        // 4. Repeats, then each element.
        for t in 0..threads {
            for q in 0..others {
                let mut run = 0;
                for j in 0..reps {
                    before[t][q][j] += run;
                    run += tot[t][q][j];
                }
                for r in 0..per {
                    s[t][q][r] += before[t][q][r / spt];
                }
            }
        }
        // Every element in the extent, held by a thread that is not a copy,
        // ends with its prefix.
        for t in 0..threads {
            for q in 0..others {
                let (row, ocopy) = coord(o, t, q);
                for r in 0..per {
                    let (c, copy) = coord(p, t, r);
                    if copy || ocopy || c >= extent {
                        continue;
                    }
                    let want: i64 = (0..=c).map(|k| x(row, k)).sum();
                    assert_eq!(
                        s[t][q][r], want,
                        "thread {t}, row {row}, column {c}: {lay:?}"
                    );
                }
            }
        }
        s
    }

    #[test]
    fn the_emitted_scan_gives_every_prefix_in_every_layout() {
        let mut cases = 0;
        for warps in [1, 2, 4, 8] {
            for vec in [1, 2, 4, 8] {
                for (rows, cols) in [
                    (1, 8192),
                    (2, 2048),
                    (4, 1024),
                    (8, 64),
                    (16, 16),
                    (2, 4),
                    (1, 1),
                ] {
                    // Along the contiguous dimension (rows of a row scan), and
                    // along the other one (a column scan: lanes and warps at
                    // strides).
                    for p in [1, 0] {
                        let block = [rows, cols];
                        let reduced = [p];
                        let lay =
                            Layout::blocked(&[0, 1], &block, Some(1), vec, warps, &[0], &reduced);
                        for extent in [block[p], (block[p] * 3).div_ceil(4).max(1), 1] {
                            emitted(&lay, p, warps, extent);
                            cases += 1;
                        }
                    }
                }
            }
        }
        assert!(cases > 500);
    }
}
