//! Tensors a split loop's programs read once, each its own share: their loads
//! are streamed (`ld.global.cs`, evict-first in L1 and L2).
//!
//! A reduction's walk shared among programs (`acc = acc + x[(r, tn)].sum(tn)`
//! with [`crate::Config::split`]) reads each element once, and no other
//! program reads it. Normal loads leave its lines in L2 as long as anything
//! else's, so the walk replaces what L2 holds: a previous kernel's output,
//! dirty lines that must be written back first. After the benchmark's L2
//! flush (256 MB written), a 33.5 MB row sum took 12.3 µs from a clean L2 and
//! 18.5 µs after the flush; streamed, its lines are the first replaced, and
//! it runs 5% faster there (long_row_sum, long_row_sum_split,
//! long_row_argmax). Inductor marks a reduction loop's loads `evict_first`
//! for the same reason. Other walks keep normal loads, as measured: streamed,
//! the shared walks down columns ran as fast (col_sum, col_max_count,
//! col_argmin) or 3% slower (layer_norm_dwdb), and walks not shared 1–3%
//! slower (row_max_min, concat's copies; welford 2% faster)
//! (docs/perf-history.md, "Loads read once, streamed; staged rows' occupancy").
//!
//! A tensor qualifies when every load of it lies in the shared loop, at one
//! index whose last component moves with the loop's tile (the walk runs along
//! the tensor's rows), that names every grid tile (programs read disjoint
//! parts; the shares of the walk are disjoint too) and gathers nothing
//! (data-dependent indices may repeat), and the kernel does not write it. A
//! hint never changes what a load returns.

use crate::ir::{DimId, Expr, Kernel, Stmt, TensorId};

/// The tensors of `k` read once along the loop over `walk`.
pub(super) fn read_once(k: &Kernel, walk: DimId) -> Vec<TensorId> {
    let mut loads: Vec<Seen> = Vec::new();
    let mut written: Vec<TensorId> = Vec::new();
    visit(k, &k.body, None, &mut loads, &mut written);
    let mut out: Vec<TensorId> = Vec::new();
    for first in &loads {
        let t = first.tensor;
        // Read at one index of the walk only: a second walk, or neighbours
        // (`x[(r, tn)]` and `x[(r, tn + 1)]`), read its lines again.
        let once = first.walk == Some(walk)
            && loads
                .iter()
                .filter(|l| l.tensor == t)
                .all(|l| l.walk == first.walk && l.index == first.index);
        if once && !written.contains(&t) && !out.contains(&t) {
            out.push(t);
        }
    }
    out.sort_unstable();
    out
}

/// A load of `tensor` at `index`, with the tile loop it reads once along
/// (the rules above), if any.
struct Seen<'k> {
    tensor: TensorId,
    index: &'k [Expr],
    walk: Option<DimId>,
}

/// Records each load in `stmts` (inside the innermost tile loop `inner`) and
/// each tensor written.
fn visit<'k>(
    k: &'k Kernel,
    stmts: &'k [Stmt],
    inner: Option<DimId>,
    loads: &mut Vec<Seen<'k>>,
    written: &mut Vec<TensorId>,
) {
    for s in stmts {
        match s {
            Stmt::Store { tensor, .. }
            | Stmt::Atomic { tensor, .. }
            | Stmt::Wait { tensor, .. }
            | Stmt::Signal { tensor, .. } => written.push(*tensor),
            _ => {}
        }
        for e in s.exprs() {
            e.walk(&mut |x| {
                if let Expr::Load { tensor, index, .. } = x {
                    loads.push(Seen {
                        tensor: *tensor,
                        index,
                        walk: inner.filter(|&d| reads_once(k, index, d)),
                    });
                }
            });
        }
        match s {
            Stmt::Loop { dim, body, .. } => {
                let inner = if k.is_each(*dim) { inner } else { Some(*dim) };
                visit(k, body, inner, loads, written);
            }
            Stmt::If {
                then, otherwise, ..
            } => {
                visit(k, then, inner, loads, written);
                visit(k, otherwise, inner, loads, written);
            }
            _ => {}
        }
    }
}

/// Whether a load at `index` inside the loop over `walk` moves with it,
/// names every grid tile and gathers nothing.
fn reads_once(k: &Kernel, index: &[Expr], walk: DimId) -> bool {
    let mut named: Vec<DimId> = Vec::new();
    let mut gathers = false;
    for c in index {
        c.walk(&mut |x| match x {
            Expr::TileIndex(d) | Expr::TileBegin(d) => named.push(*d),
            Expr::Load { .. } => gathers = true,
            _ => {}
        });
    }
    // Along the tensor's rows: its last index moves with the walk.
    let mut along = false;
    if let Some(last) = index.last() {
        last.walk(&mut |x| along |= matches!(x, Expr::TileIndex(d) if *d == walk));
    }
    !gathers && along && k.grid.iter().all(|g| named.contains(g))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(src: &str) -> Kernel {
        Kernel::parse(src).expect("the test kernel parses")
    }

    #[test]
    fn a_row_walk_reads_once() {
        let k = kernel(
            "kernel row_sum(x: Tensor<bf16, 2>, out: Tensor<f32, 1>; m, n) {
               for r in tile(each(m)) {
                 let mut acc = zeros::<f32>([]);
                 for tn in tile(n) {
                   acc = acc + x[(r, tn)].cast::<f32>().sum(tn);
                 }
                 out[r] = acc;
               }
             }",
        );
        assert_eq!(read_once(&k, 1), vec![0]);
        // Only along the walk asked for.
        assert_eq!(read_once(&k, 0), Vec::<TensorId>::new());
        // A walk down the columns keeps normal loads.
        let k = kernel(
            "kernel col_sum(x: Tensor<bf16, 2>, out: Tensor<f32, 1>; m, n) {
               for tn in tile(n) {
                 let mut acc = zeros::<f32>([tn]);
                 for tm in tile(m) {
                   acc = acc + x[(tm, tn)].cast::<f32>().sum(tm);
                 }
                 out[tn] = acc;
               }
             }",
        );
        assert_eq!(read_once(&k, 1), Vec::<TensorId>::new());
    }

    #[test]
    fn shared_rows_gathers_and_grid_loads_are_not_streamed() {
        // `w[tn]` is read by every row's program; `x` beside it reads once.
        let k = kernel(
            "kernel dot_rows(x: Tensor<f32, 2>, w: Tensor<f32, 1>, out: Tensor<f32, 1>; m, n) {
               for r in tile(each(m)) {
                 let mut acc = zeros::<f32>([]);
                 for tn in tile(n) {
                   acc = acc + (x[(r, tn)] * w[tn]).sum(tn);
                 }
                 out[r] = acc;
               }
             }",
        );
        assert_eq!(read_once(&k, 1), vec![0]);
        // A gathered row may repeat; a load outside any loop is left alone.
        let k = kernel(
            "kernel gather_sum(x: Tensor<f32, 2>, ids: Tensor<i64, 1>, y: Tensor<f32, 1>, out: Tensor<f32, 1>; m, n) {
               for r in tile(each(m)) {
                 let mut acc = zeros::<f32>([]);
                 for tn in tile(n) {
                   acc = acc + x[(ids[r], tn)].sum(tn);
                 }
                 out[r] = acc + y[r];
               }
             }",
        );
        assert_eq!(read_once(&k, 1), Vec::<TensorId>::new());
    }

    #[test]
    fn a_tensor_read_twice_or_written_is_not_streamed() {
        // Two walks over the same row (a norm's statistics, then its output).
        let k = kernel(
            "kernel center(x: Tensor<f32, 2>, out: Tensor<f32, 2>; m, n) {
               for r in tile(each(m)) {
                 let mut acc = zeros::<f32>([]);
                 for tn in tile(n) {
                   acc = acc + x[(r, tn)].sum(tn);
                 }
                 for tn in tile(n) {
                   out[(r, tn)] = x[(r, tn)] - acc;
                 }
               }
             }",
        );
        assert_eq!(read_once(&k, 1), Vec::<TensorId>::new());
        assert_eq!(read_once(&k, 2), Vec::<TensorId>::new());
        let k = kernel(
            "kernel scale_in_place(x: Tensor<f32, 2>; m, n) {
               for r in tile(each(m)) {
                 for tn in tile(n) {
                   x[(r, tn)] = x[(r, tn)] * 2.0;
                 }
               }
             }",
        );
        assert_eq!(read_once(&k, 1), Vec::<TensorId>::new());
    }
}
