//! Blocked layouts: how a tile value's elements are spread over a block's
//! threads and each thread's registers (Triton's `BlockedEncoding`, written
//! for this lowering).
//!
//! A layout is made for the active tile dimensions of a scope (the grid's
//! tiles and those of the enclosing loops). Along each dimension `d` a thread
//! holds `spt[d]` adjacent elements (a 16-byte vector along the contiguous
//! dimension), `tpw[d]` lanes of a warp and `wpc[d]` warps step across the
//! dimension, and the pattern repeats until the block `B[d]` is covered: so
//! `span = spt · tpw · wpc` and a thread holds `E = spt · max(1, B / span)`
//! elements along `d`. Where the span is larger than the block the pattern
//! wraps and some threads hold copies ("duplicates", which reductions,
//! stores and atomics skip).
//!
//! A value over a subset `S` of the dimensions is the layout *sliced* to `S`:
//! a thread holds the elements its coordinates along `S` select, whatever its
//! coordinates along the other dimensions, so broadcasting a reduced value
//! back (`x - x.max(tn)`) reads registers the thread already has.

use crate::ir::DimId;

/// A blocked layout over some tile dimensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The dimensions, sorted.
    pub dims: Vec<DimId>,
    /// Per entry of `dims`: block, elements per thread run, lanes, warps.
    pub block: Vec<usize>,
    pub spt: Vec<usize>,
    pub tpw: Vec<usize>,
    pub wpc: Vec<usize>,
    /// Positions in `dims`, fastest-varying first (the lane and warp ids are
    /// decomposed in this order).
    pub order: Vec<usize>,
}

impl Layout {
    /// A layout over `dims` (sorted, with blocks `block`, powers of two) for
    /// `warps` warps: `contiguous` (a position in `dims`) gets runs of `vec`
    /// elements and the lanes first; the warps go to the other dimensions
    /// first (so a reduction along the contiguous dimension stays in a warp),
    /// `others` giving the order of the others (innermost loop first), and to
    /// the positions in `reduced` last (a reduction across warps costs a
    /// trip through shared memory).
    pub fn blocked(
        dims: &[DimId],
        block: &[usize],
        contiguous: Option<usize>,
        vec: usize,
        warps: usize,
        others: &[usize],
        reduced: &[usize],
    ) -> Layout {
        let n = dims.len();
        let mut order: Vec<usize> = contiguous.into_iter().collect();
        order.extend(others.iter().copied().filter(|&p| Some(p) != contiguous));
        for p in 0..n {
            if !order.contains(&p) {
                order.push(p);
            }
        }
        let mut spt = vec![1; n];
        if let Some(c) = contiguous {
            spt[c] = vec.clamp(1, block[c].max(1));
        }
        let mut tpw = vec![1; n];
        let mut lanes = 32usize;
        for &p in &order {
            let t = lanes.min((block[p] / spt[p]).max(1));
            tpw[p] = t;
            lanes /= t;
        }
        let mut wpc = vec![1; n];
        let mut left = warps.max(1);
        let mut warp_order: Vec<usize> = order
            .iter()
            .copied()
            .skip(usize::from(contiguous.is_some()))
            .chain(contiguous)
            .collect();
        warp_order.sort_by_key(|p| reduced.contains(p));
        for &p in &warp_order {
            let w = left.min((block[p] / (spt[p] * tpw[p])).max(1));
            wpc[p] = w;
            left /= w;
        }
        if let Some(&first) = order.first() {
            // Lanes and warps the blocks cannot use repeat the fastest dimension
            // (copies), as Triton's layouts do.
            tpw[first] *= lanes;
            let last = *warp_order.first().unwrap_or(&first);
            wpc[last] *= left;
        }
        Layout {
            dims: dims.to_vec(),
            block: block.to_vec(),
            spt,
            tpw,
            wpc,
            order,
        }
    }

    /// Every layout like [`Layout::blocked`]'s for these arguments (the same
    /// runs and lanes along `contiguous`, the same lane order) but with the
    /// other lanes and all the warps spread over the dimensions in every way
    /// their blocks take: the candidates a level that multiplies tiles picks
    /// from by the registers its values need ([`Layout::held`]). The first is
    /// [`Layout::blocked`]'s own.
    pub fn spreads(
        dims: &[DimId],
        block: &[usize],
        contiguous: Option<usize>,
        vec: usize,
        warps: usize,
        others: &[usize],
        reduced: &[usize],
    ) -> Vec<Layout> {
        let base = Layout::blocked(dims, block, contiguous, vec, warps, others, reduced);
        let n = dims.len();
        let log2 = |x: usize| x.max(1).trailing_zeros() as usize;
        // Lanes along the contiguous dimension stay as the base has them
        // (16-byte runs, lanes across them: the accesses stay coalesced).
        let fixed = contiguous.map_or(1, |c| base.tpw[c].min((block[c] / base.spt[c]).max(1)));
        let lanes = 32 / fixed;
        let mut out = vec![base.clone()];
        let lane_caps: Vec<usize> = (0..n)
            .map(|p| {
                if Some(p) == contiguous {
                    0
                } else {
                    log2(block[p] / base.spt[p])
                }
            })
            .collect();
        for lane_split in splits(log2(lanes), &lane_caps) {
            let mut tpw = vec![1; n];
            for p in 0..n {
                tpw[p] = 1 << lane_split[p];
            }
            if let Some(c) = contiguous {
                tpw[c] = fixed;
            }
            let warp_caps: Vec<usize> = (0..n)
                .map(|p| log2(block[p] / (base.spt[p] * tpw[p])))
                .collect();
            let lanes_used: usize = tpw.iter().product();
            for warp_split in splits(log2(warps.max(1)), &warp_caps) {
                let mut wpc: Vec<usize> = warp_split.iter().map(|&e| 1 << e).collect();
                let mut t = tpw.clone();
                // Lanes and warps the blocks cannot use: copies, as in `blocked`.
                if let Some(&first) = base.order.first() {
                    t[first] *= 32 / lanes_used;
                    let used: usize = wpc.iter().product();
                    wpc[first] *= warps.max(1) / used;
                }
                let l = Layout {
                    dims: dims.to_vec(),
                    block: block.to_vec(),
                    spt: base.spt.clone(),
                    tpw: t,
                    wpc,
                    order: base.order.clone(),
                };
                if !out.contains(&l) {
                    out.push(l);
                }
            }
        }
        out
    }

    /// Registers (in 4-byte words) a thread needs for values over each of
    /// `values` (their dimensions and element bytes) in this layout: what a
    /// level's candidate layouts are compared by.
    pub fn held(&self, values: &[(Vec<DimId>, usize)]) -> usize {
        values
            .iter()
            .map(|(dims, bytes)| {
                let elems: usize = dims
                    .iter()
                    .filter_map(|&d| self.pos(d))
                    .map(|p| self.per_thread(p))
                    .product();
                (elems * bytes).div_ceil(4)
            })
            .sum()
    }

    /// The position of `d` in the layout's dimensions.
    pub fn pos(&self, d: DimId) -> Option<usize> {
        self.dims.iter().position(|&x| x == d)
    }

    pub fn span(&self, p: usize) -> usize {
        self.spt[p] * self.tpw[p] * self.wpc[p]
    }

    /// Elements a thread holds along position `p`.
    pub fn per_thread(&self, p: usize) -> usize {
        self.spt[p] * (self.block[p] / self.span(p)).max(1)
    }

    /// Whether the pattern along `p` is wider than the block (some threads
    /// hold copies).
    pub fn wraps(&self, p: usize) -> bool {
        self.span(p) > self.block[p]
    }

    /// Lane-id stride of position `p` (lanes decompose in `order`).
    pub fn lane_stride(&self, p: usize) -> usize {
        let mut s = 1;
        for &q in &self.order {
            if q == p {
                return s;
            }
            s *= self.tpw[q];
        }
        s
    }

    /// Warp-id stride of position `p` (warps decompose in `order` too).
    pub fn warp_stride(&self, p: usize) -> usize {
        let mut s = 1;
        for &q in &self.order {
            if q == p {
                return s;
            }
            s *= self.wpc[q];
        }
        s
    }

    /// The offset within the run pattern of register `r` along `p`.
    pub fn reg_offset(&self, p: usize, r: usize) -> usize {
        (r / self.spt[p]) * self.span(p) + r % self.spt[p]
    }

    /// The thread's first element along `p` before wrapping (a thread of
    /// `lane`, `warp`).
    pub fn thread_base(&self, p: usize, lane: usize, warp: usize) -> usize {
        let l = (lane / self.lane_stride(p)) % self.tpw[p];
        let w = (warp / self.warp_stride(p)) % self.wpc[p];
        (w * self.tpw[p] + l) * self.spt[p]
    }

    /// Which in-block coordinates along `d`, for each register, thread
    /// `(lane, warp)` holds without duplicates (`None`: a copy).
    pub fn coords(&self, p: usize, lane: usize, warp: usize) -> Vec<Option<usize>> {
        let base = self.thread_base(p, lane, warp);
        (0..self.per_thread(p))
            .map(|r| {
                let c = base + self.reg_offset(p, r);
                (c < self.block[p]).then_some(c)
            })
            .collect()
    }

    /// Whether values over `dims` (a subset of both layouts' dimensions) sit
    /// in the same registers of the same threads in `self` and `other`: then
    /// moving one from a scope of one layout to a scope of the other is free.
    pub fn same_slice(&self, other: &Layout, dims: &[DimId], threads: usize) -> bool {
        for &d in dims {
            let (Some(p), Some(q)) = (self.pos(d), other.pos(d)) else {
                return false;
            };
            if self.block[p] != other.block[q] || self.per_thread(p) != other.per_thread(q) {
                return false;
            }
            for t in 0..threads {
                let (lane, warp) = (t % 32, t / 32);
                let a = self.coords(p, lane, warp);
                let b = other.coords(q, lane, warp);
                // Copies may differ (they are skipped); held elements may not.
                let held = |x: &Vec<Option<usize>>, y: &Vec<Option<usize>>| {
                    x.iter().zip(y).all(|(u, v)| u.is_none() || u == v)
                };
                if a.len() != b.len() || !held(&a, &b) || !held(&b, &a) {
                    return false;
                }
            }
        }
        true
    }

    /// The C expression of the thread's base offset along `p` (before
    /// wrapping), from `tf_lane` and `tf_warp`.
    pub fn base_c(&self, p: usize) -> String {
        let mut terms = Vec::new();
        if self.tpw[p] > 1 {
            terms.push(format!(
                "((tf_lane / {}) % {}) * {}",
                self.lane_stride(p),
                self.tpw[p],
                self.spt[p]
            ));
        }
        if self.wpc[p] > 1 {
            terms.push(format!(
                "((tf_warp / {}) % {}) * {}",
                self.warp_stride(p),
                self.wpc[p],
                self.spt[p] * self.tpw[p]
            ));
        }
        if terms.is_empty() {
            "0".into()
        } else {
            terms.join(" + ")
        }
    }

    /// A short description for the generated code's comments.
    pub fn describe(&self, names: &dyn Fn(DimId) -> String) -> String {
        let parts: Vec<String> = (0..self.dims.len())
            .map(|p| {
                format!(
                    "{}: block {} = {} x {} lanes x {} warps{}",
                    names(self.dims[p]),
                    self.block[p],
                    self.spt[p],
                    self.tpw[p],
                    self.wpc[p],
                    if self.wraps(p) {
                        " (wraps)".to_string()
                    } else if self.per_thread(p) > self.spt[p] {
                        format!(", {} runs", self.per_thread(p) / self.spt[p])
                    } else {
                        String::new()
                    }
                )
            })
            .collect();
        parts.join("; ")
    }
}

/// Every way to split `total` (an exponent of two) over positions, at most
/// `caps[p]` at position `p`; where the caps sum to less, the leftover is
/// not placed (the caller makes it copies).
fn splits(total: usize, caps: &[usize]) -> Vec<Vec<usize>> {
    let room: usize = caps.iter().sum();
    let total = total.min(room);
    let mut out = Vec::new();
    let mut cur = vec![0; caps.len()];
    fn go(p: usize, left: usize, caps: &[usize], cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if p == caps.len() {
            if left == 0 {
                out.push(cur.clone());
            }
            return;
        }
        for e in 0..=caps[p].min(left) {
            cur[p] = e;
            go(p + 1, left - e, caps, cur, out);
        }
        cur[p] = 0;
    }
    go(0, total, caps, &mut cur, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_layout_puts_lanes_on_columns_and_warps_on_rows() {
        // [tm: 4, tn: 1024], bf16: 8 per run, 32 lanes on tn, 4 warps on tm.
        let l = Layout::blocked(&[0, 1], &[4, 1024], Some(1), 8, 4, &[0], &[]);
        assert_eq!((l.spt[1], l.tpw[1], l.wpc[1]), (8, 32, 1));
        assert_eq!((l.spt[0], l.tpw[0], l.wpc[0]), (1, 1, 4));
        assert_eq!(l.per_thread(1), 32);
        assert_eq!(l.per_thread(0), 1);
        assert!(!l.wraps(0) && !l.wraps(1));
        // Every element is held exactly once.
        let mut seen = vec![0; 4 * 1024];
        for t in 0..128 {
            let (lane, warp) = (t % 32, t / 32);
            for r in l.coords(0, lane, warp).into_iter().flatten() {
                for c in l.coords(1, lane, warp).into_iter().flatten() {
                    seen[r * 1024 + c] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
    }

    #[test]
    fn warps_avoid_a_reduced_dimension() {
        // A column sum: [tm: 16, tn: 1024] reduced along tm, tn contiguous.
        let l = Layout::blocked(&[0, 1], &[16, 1024], Some(1), 8, 4, &[0], &[0]);
        assert_eq!((l.wpc[0], l.tpw[0]), (1, 1));
        assert_eq!(l.per_thread(0), 16);
        assert_eq!((l.tpw[1], l.wpc[1]), (32, 4));
    }

    #[test]
    fn a_small_block_wraps_and_marks_copies() {
        let l = Layout::blocked(&[0], &[16], Some(0), 8, 4, &[], &[]);
        assert!(l.wraps(0));
        let held: usize = (0..128)
            .map(|t| l.coords(0, t % 32, t / 32).iter().flatten().count())
            .sum();
        assert_eq!(held, 16);
    }

    /// Every element of the block is held exactly once (copies aside).
    fn covers_once(l: &Layout, threads: usize) -> bool {
        let total: usize = l.block.iter().product();
        let mut seen = vec![0u32; total];
        for t in 0..threads {
            let (lane, warp) = (t % 32, t / 32);
            let per: Vec<Vec<Option<usize>>> =
                (0..l.dims.len()).map(|p| l.coords(p, lane, warp)).collect();
            let mut idx = vec![0usize; per.len()];
            'elems: loop {
                let mut flat = Some(0usize);
                for p in 0..per.len() {
                    flat = match (flat, per[p][idx[p]]) {
                        (Some(f), Some(c)) => Some(f * l.block[p] + c),
                        _ => None,
                    };
                }
                if let Some(f) = flat {
                    seen[f] += 1;
                }
                for p in (0..per.len()).rev() {
                    idx[p] += 1;
                    if idx[p] < per[p].len() {
                        continue 'elems;
                    }
                    idx[p] = 0;
                }
                break;
            }
        }
        seen.iter().all(|&n| n == 1)
    }

    #[test]
    fn every_spread_holds_each_element_once_and_keeps_the_runs() {
        // Attention's backward key loop: [tm: 32, td: 64, tn: 32], td contiguous.
        for warps in [1, 4, 8] {
            let c = Layout::spreads(&[0, 1, 2], &[32, 64, 32], Some(1), 8, warps, &[0, 2], &[]);
            assert_eq!(
                c[0],
                Layout::blocked(&[0, 1, 2], &[32, 64, 32], Some(1), 8, warps, &[0, 2], &[])
            );
            assert!(c.len() >= 3, "{} spreads at {warps} warps", c.len());
            for l in &c {
                assert!(covers_once(l, warps * 32), "{l:?}");
                assert_eq!((l.spt[1], l.tpw[1]), (8, 8), "the runs stay: {l:?}");
                assert_eq!(l.tpw.iter().product::<usize>(), 32);
                assert_eq!(l.wpc.iter().product::<usize>(), warps);
            }
        }
        // Blocks too small for the threads: the rest are copies.
        for l in Layout::spreads(&[0, 1], &[2, 16], Some(1), 8, 4, &[0], &[]) {
            assert!(covers_once(&l, 128), "{l:?}");
        }
    }

    #[test]
    fn the_registers_held_pick_a_spread_that_splits_both_tiles() {
        // Scores [tm, tn] and an accumulator [tm, td] with operands [tn, td]:
        // threads only on tm (the grid-first spread) hold every key in every
        // thread; a split between tm and tn holds fewer.
        let c = Layout::spreads(&[0, 1, 2], &[32, 64, 32], Some(1), 8, 4, &[0, 2], &[]);
        let values = vec![
            (vec![0, 2], 4),
            (vec![0, 2], 4),
            (vec![0, 1], 4),
            (vec![2, 1], 2),
            (vec![2, 1], 2),
        ];
        // Grid-first: 2 rows and 32 keys a thread, 8 of the head dimension:
        // 2 · 64 + 16 + 2 · 128 words.
        let base = c[0].held(&values);
        assert_eq!(base, 400);
        let best = c.iter().map(|l| l.held(&values)).min().unwrap();
        assert!(best * 3 <= base * 2, "{best} against {base}");
    }

    #[test]
    fn slices_agree_when_the_shared_dimension_is_spread_alike() {
        let a = Layout::blocked(&[0, 1], &[4, 1024], Some(1), 8, 4, &[0], &[]);
        let b = Layout::blocked(&[0, 2], &[4, 1024], Some(1), 8, 4, &[0], &[]);
        assert!(a.same_slice(&b, &[0], 128));
        let c = Layout::blocked(&[0, 2], &[4, 64], Some(1), 8, 4, &[0], &[]);
        assert!(!a.same_slice(&c, &[0], 128));
    }
}
