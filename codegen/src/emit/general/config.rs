//! The general lowering's configs: its untuned default, fitted to the extents
//! of a launch where they are known, and the space the autotuner searches.
//!
//! A block size is per tile dimension (powers of two; `each` dimensions 1,
//! `whole` ones fitted to their extent). The default aims at about 4096
//! elements per scope (32 per thread of 4 warps: four 16-byte loads of bf16
//! in flight per tensor), the dimensions that are some access's contiguous
//! last index first.

use super::memory::affine_dim;
use super::split::SplitLoop;
use crate::config::Config;
use crate::ir::{DimId, Expr, Kernel, Stmt};
use crate::space::Axis;

/// Elements of one scope's tile a program aims at.
const BUDGET: usize = 4096;
/// [`BUDGET`]'s multiple for a kernel whose programs each end in an atomic
/// that every program shares ([`shared_atomics`]): each program's block
/// reduction and its add into the same word are a fixed cost, which larger
/// tiles spread. A whole-tensor sum (16384×8192 bf16, H200) took 0.0891 ms at
/// `[4, 1024]` (32768 programs, 71% of copy) and 0.0751 at `[4, 2048]` (84%)
/// (docs/perf-history.md, "Config sweeps of two untuned rows").
const SHARED_ATOMIC_BUDGET: usize = 2;
/// Elements a thread holds of a `whole` tile wider than [`BUDGET`], untuned:
/// what a tile of 4096 over 4 warps gives.
const WHOLE_PER_THREAD: usize = 32;
/// The largest block a contiguous dimension takes untuned.
const MAX_CONTIGUOUS: usize = 4096;
/// Programs a launch should have at least (about two per SM of an H100 or
/// H200), where its extents allow: a grid tile is halved until there are
/// (a contiguous one down to [`MIN_CONTIGUOUS`], 128 bytes of bf16 a row).
const MIN_PROGRAMS: usize = 256;
const MIN_CONTIGUOUS: usize = 64;
/// Programs of an `each` grid dimension that count toward [`MIN_PROGRAMS`].
const EACH_FILLS: usize = 16 * MIN_PROGRAMS;
/// Warps of a program in a launch with too few programs for the GPU.
const STARVED_WARPS: usize = 16;
/// A grid tile's contiguous block when the runtime shares its loop among
/// programs: 512 bytes of bf16 a row, so each warp reads whole sectors in
/// 16-byte vectors; more programs come from sharing the loop, not from
/// narrower columns.
const SPLIT_MIN_CONTIGUOUS: usize = 256;
/// A shared loop's extent below which sharing it cannot fill the GPU (the
/// launch is then treated as starved, as without sharing).
const SPLIT_MIN_EXTENT: usize = 1024;
/// The most programs that share one grid tile's loop, untuned: enough for a
/// few column tiles to fill a wave of an H100/H200, while the last program
/// still adds the shares quickly.
const DEFAULT_SPLIT: usize = 32;
/// The same for scalar accumulators (a long row's sum), whose shares the
/// last program's threads read at once: a few rows need many programs each
/// to fill the GPU (4 rows of 4M elements: 128 ways, 4 tiles of 8192 a share).
const SCALAR_SPLIT: usize = 128;
/// A program that shares a loop down rows (not along its contiguous
/// dimension): one warp, so a thread holds all of its rows' loads in flight
/// at once and the accumulators meet across lanes only; more programs fit an
/// SM and the runtime shares the loop wider. Its tile holds 64 values a lane
/// (`SHARED_BUDGET`): 128 columns by 16 rows where the loop walks one tensor's
/// tiles, 256 by 8 where it walks several; up to `SHARED_SPLIT` programs share
/// each column tile's walk (the runtime stops at a wave). Measured on an H200
/// at 16384×8192 bf16 (docs/perf-history.md, "Column reductions: a tile for
/// one warp"), against `[256, 16]`, 1 warp, split 32 (ms): col_sum 0.083
/// against 0.091 (0.098 at `[256, 8]`), col_max_count 0.095 against 0.120
/// (0.123 at `[256, 8]`), layer_norm_dwdb (two tensors) 0.168 against 0.195
/// (0.283 at `[128, 16]`). A loop along a row takes [`ALONG_WARPS`] instead
/// (long_row_sum ran 0.0204 ms with 4 warps against 0.0228 with one).
const SHARED_WARPS: usize = 1;
/// A program that shares a loop along its row (long_row_sum's chunks of a
/// 4M-element row): 8 warps over 8192 columns a step. Each share ends in a
/// meet (its partial written, a counter taken, the last adding them), and
/// these loops are short, so fewer, larger shares pay: on an H200 at 4 rows
/// of 4M bf16, 0.0177–0.0178 ms against 0.0199 at 4096 columns and 4 warps
/// (2026-11-28; docs/perf-history.md, "Loads issued together in row steps;
/// defaults from the sweeps").
const ALONG_WARPS: usize = 8;
/// Elements of such a program's tile, and its contiguous block's largest.
const ALONG_BUDGET: usize = 8192;
/// Warps of a program that gathers along its rows (staged through shared
/// memory, `gather.rs`): the row's 16-byte copies and the gathered values
/// spread over twice the threads, each holding half as many registers, so
/// more rows are staged on an SM at once. index_select (16384×8192 bf16, 4096
/// columns gathered; H200): 0.1180 ms against 0.1528 with 4 warps (111
/// registers a thread, 60 with 8; 2026-11-28, docs/perf-history.md,
/// "Loads issued together in row steps; defaults from the sweeps").
const GATHER_WARPS: usize = 8;
const SHARED_MIN_CONTIGUOUS: usize = 128;
const SHARED_BUDGET: usize = 2048;
const SHARED_SPLIT: usize = 64;

/// Stages of a tile loop's loads, untuned: 2, the next tile's loads issued
/// before this one computes ([`super::pipeline`]), except in a loop the
/// programs share. Measured on an H200, untuned, against one stage (ms):
/// welford 0.091 against 0.108, jagged_softmax 0.441 against 0.530,
/// batched_softmax 0.204 against 0.217, cross_entropy 0.106 against 0.114;
/// in shared loops col_max_count 0.125 against 0.094, long_row_sum 0.0224
/// against 0.0203, rms_norm_dw 0.141 against 0.133 (docs/perf-history.md,
/// "Loads a step ahead in tile loops").
const AHEAD: usize = 2;

/// Whether the kernel walks a tile loop (whose stages the tuner may pick).
fn has_tile_loop(k: &Kernel) -> bool {
    let mut found = false;
    k.walk_stmts(&mut |s| found |= matches!(s, Stmt::Loop { dim, .. } if !k.is_each(*dim)));
    found
}

/// Dimensions the widest loads and stores index their contiguous last axis
/// with: `x[(tm, tn)]` makes `tn` one, and a row vector `s[tm]` beside it
/// does not make `tm` one (an access of fewer dimensions only counts where
/// no wider access shares its dimensions).
fn contiguous_dims(k: &Kernel) -> Vec<DimId> {
    // (last index's dimension, the access's tile dimensions)
    let mut seen: Vec<(DimId, Vec<DimId>)> = Vec::new();
    let mut note = |index: &[Expr]| {
        if let Some(d) = index.last().and_then(|c| affine_dim(k, c)) {
            let mut dims: Vec<DimId> = Vec::new();
            for c in index {
                c.walk(&mut |x| {
                    if let Expr::TileIndex(t) = x {
                        if !k.is_each(*t) && !dims.contains(t) {
                            dims.push(*t);
                        }
                    }
                });
            }
            seen.push((d, dims));
        }
    };
    k.walk_stmts(&mut |s| {
        if let Stmt::Store { index, .. } | Stmt::Atomic { index, .. } = s {
            note(index);
        }
    });
    k.walk_exprs(&mut |e| {
        if let Expr::Load { index, .. } = e {
            note(index);
        }
    });
    let mut out: Vec<DimId> = Vec::new();
    for (d, dims) in &seen {
        let wider = seen
            .iter()
            .any(|(e, w)| e != d && w.len() > dims.len() && dims.iter().all(|x| w.contains(x)));
        if !wider && !out.contains(d) {
            out.push(*d);
        }
    }
    out
}

/// Dimensions along which a load gathers many elements of each row it reads:
/// those of a gathered last index (`idx[tn]` in `x[(tm, idx[tn])]`) that the
/// other indices do not use. The kernel stages such rows in shared memory
/// (see `gather.rs`): the wider its tile along them, the fewer programs copy
/// the same row.
/// 2 where some load or store moves a tile of 8-byte elements (by its
/// declared dtype) along a contiguous dimension, else 1: such tiles take
/// twice the registers an element. (An index tile `ids[tt]` beside the rows
/// it gathers is not one.)
fn wide_factor(k: &Kernel, contiguous: &[DimId]) -> usize {
    let mut wide = false;
    let mut note = |t: usize, index: &[Expr]| {
        let eight = k.tensors[t].declared.is_some_and(|d| d.size() == 8);
        let along = index
            .last()
            .and_then(|c| affine_dim(k, c))
            .is_some_and(|d| contiguous.contains(&d));
        wide |= eight && along;
    };
    k.walk_stmts(&mut |s| {
        if let Stmt::Store { tensor, index, .. } | Stmt::Atomic { tensor, index, .. } = s {
            note(*tensor, index);
        }
    });
    k.walk_exprs(&mut |e| {
        if let Expr::Load { tensor, index, .. } = e {
            note(*tensor, index);
        }
    });
    if wide {
        2
    } else {
        1
    }
}

/// Whether `k` writes only by atomics whose index names no tile of the grid
/// and gathers nothing: every program adds into the same elements (a
/// whole-tensor sum's `atomic_add(out[0], …)`).
fn shared_atomics(k: &Kernel) -> bool {
    let mut atomics = 0;
    let mut other = false;
    crate::ir::walk_stmts(&k.body, &mut |s| match s {
        Stmt::Atomic { index, .. } => {
            let mut named = false;
            for c in index {
                c.walk(&mut |x| {
                    named |= matches!(x, Expr::TileIndex(d) | Expr::TileBegin(d) if k.grid.contains(d))
                        || matches!(x, Expr::Load { .. });
                });
            }
            match named {
                true => other = true,
                false => atomics += 1,
            }
        }
        Stmt::Store { .. } | Stmt::Wait { .. } | Stmt::Signal { .. } => other = true,
        _ => {}
    });
    atomics > 0 && !other
}

fn gathered_dims(k: &Kernel) -> Vec<DimId> {
    let tiles = |x: &Expr, out: &mut Vec<DimId>| {
        x.walk(&mut |y| {
            if let Expr::TileIndex(t) = y {
                if !k.is_each(*t) && !out.contains(t) {
                    out.push(*t);
                }
            }
        })
    };
    let mut out = Vec::new();
    k.walk_exprs(&mut |e| {
        let Expr::Load { index, .. } = e else {
            return;
        };
        let Some((last, rows)) = index.split_last() else {
            return;
        };
        let mut gathers = false;
        last.walk(&mut |y| gathers |= matches!(y, Expr::Load { .. }));
        if !gathers {
            return;
        }
        let (mut along, mut across) = (Vec::new(), Vec::new());
        tiles(last, &mut along);
        for r in rows {
            tiles(r, &mut across);
        }
        for d in along {
            if !across.contains(&d) && !out.contains(&d) {
                out.push(d);
            }
        }
    });
    out
}

/// How many tensors have loads that index both `dim` (a shared loop's) and a
/// contiguous dimension: the tiles a program sharing the loop walks.
fn tiles_walked(k: &Kernel, dim: DimId, contiguous: &[DimId]) -> usize {
    let mut tensors = Vec::new();
    k.walk_exprs(&mut |e| {
        if let Expr::Load { tensor, index, .. } = e {
            let (mut along, mut across) = (false, false);
            for c in index {
                c.walk(&mut |x| {
                    if let Expr::TileIndex(t) = x {
                        along |= *t == dim;
                        across |= contiguous.contains(t);
                    }
                });
            }
            if along && across && !tensors.contains(tensor) {
                tensors.push(*tensor);
            }
        }
    });
    tensors.len()
}

/// The tile dimensions active together in some scope: one list per path from
/// the grid to an innermost loop.
fn paths(k: &Kernel) -> Vec<Vec<DimId>> {
    fn go(k: &Kernel, stmts: &[Stmt], active: &[DimId], out: &mut Vec<Vec<DimId>>) {
        let mut leaf = true;
        walk_level(k, stmts, &mut |dim, body| {
            leaf = false;
            let mut inner = active.to_vec();
            inner.push(dim);
            go(k, body, &inner, out);
        });
        if leaf {
            out.push(active.to_vec());
        }
    }
    let active: Vec<DimId> = k.grid.iter().copied().filter(|&d| !k.is_each(d)).collect();
    let mut out = Vec::new();
    go(k, &k.body, &active, &mut out);
    out
}

/// Calls `f` on each tile loop (not `each`) reached from `stmts` without
/// entering another tile loop.
fn walk_level<'a>(k: &Kernel, stmts: &'a [Stmt], f: &mut dyn FnMut(DimId, &'a [Stmt])) {
    for s in stmts {
        match s {
            Stmt::Loop { dim, body, .. } if k.is_each(*dim) => walk_level(k, body, f),
            Stmt::Loop { dim, body, .. } => f(*dim, body),
            Stmt::If {
                then, otherwise, ..
            } => {
                walk_level(k, then, f);
                walk_level(k, otherwise, f);
            }
            _ => {}
        }
    }
}

/// The untuned config of a kernel the general lowering takes, for extents
/// `extents[d]` where known: 4 warps; each path of scopes gets about
/// 4096 elements (`BUDGET`), the contiguous dimensions first (up to the extent,
/// rounded up to a power of two; several in one path, as a transpose has,
/// share it evenly), then the others from the innermost loop out. A launch
/// that cannot have 256 programs (`MIN_PROGRAMS`; a column sum's few column
/// blocks, each walking every row) gets 16 warps (`STARVED_WARPS`) and loop
/// tiles as much larger, so each SM keeps as many bytes in flight; one whose
/// loop down rows the runtime shares among programs gets one warp and a
/// tile of its own (`SHARED_WARPS`).
/// A kernel with products (`addmm`) takes [`super::products::default_config`]'s.
pub fn default_config(k: &Kernel, extents: &[Option<usize>]) -> Config {
    match super::products::find(k) {
        Some(p) => super::products::default_config(k, &p, extents),
        None => fitted(k, extents, super::split::find(k).as_ref()),
    }
}

/// [`default_config`] for a kernel whose loop `split` its programs may share
/// (found once, by the lowering's plan): such a launch is not starved, the
/// runtime shares the loop instead, so the column tiles stay at least
/// [`SPLIT_MIN_CONTIGUOUS`] wide.
pub(crate) fn fitted(k: &Kernel, extents: &[Option<usize>], split: Option<&SplitLoop>) -> Config {
    let n = k.dims.len();
    let cap = |d: DimId, most: usize| -> usize {
        match extents.get(d).copied().flatten() {
            Some(e) => e.max(1).next_power_of_two().min(most),
            None => most,
        }
    };
    let mut bs = vec![0usize; n];
    for (d, dim) in k.dims.iter().enumerate() {
        if dim.each {
            bs[d] = 1;
        } else if dim.whole {
            // The block the launch fits it to (`fit_whole_dims`), where the
            // extent is known: the other tiles share the budget with it.
            bs[d] = match extents.get(d).copied().flatten() {
                Some(e) => e.max(16).next_power_of_two(),
                None => 16,
            };
        }
    }
    let paths = paths(k);
    let room = |bs: &[usize], d: DimId, budget: usize| -> usize {
        paths
            .iter()
            .filter(|p| p.contains(&d))
            .map(|p| {
                let used: usize = p.iter().map(|&x| bs[x].max(1)).product();
                (budget / used).max(1)
            })
            .min()
            .unwrap_or(budget)
    };
    let contiguous = contiguous_dims(k);
    // The contiguous dimensions a path shares its budget among.
    let sharing = |d: DimId| -> u32 {
        paths
            .iter()
            .filter(|p| p.contains(&d))
            .map(|p| p.iter().filter(|x| contiguous.contains(x)).count())
            .max()
            .unwrap_or(1)
            .max(1) as u32
    };
    let grid: Vec<DimId> = k.grid.iter().copied().filter(|&d| bs[d] == 0).collect();
    let count = |dims: &[DimId], bs: &[usize]| -> usize {
        dims.iter()
            .filter_map(|&d| {
                extents
                    .get(d)
                    .copied()
                    .flatten()
                    .map(|e| e.div_ceil(bs[d].max(1)))
            })
            .product()
    };
    // The tiles are halved for the grid's tiled dimensions' programs (an
    // `each` dimension's programs walk loops of their own: a weight
    // gradient's row shares measured faster with more column blocks), but
    // an `each` dimension of thousands fills the GPU by itself: an
    // embedding gradient's 32000 id rows kept their 4096 columns whole in
    // tiles of 64 (2M programs of a 64-row jagged tile, 4.6 ms), not 1024.
    let many: Vec<DimId> = k
        .grid
        .iter()
        .copied()
        .filter(|&d| {
            k.dims[d].each
                && extents
                    .get(d)
                    .copied()
                    .flatten()
                    .is_some_and(|e| e >= EACH_FILLS)
        })
        .collect();
    let programs = |bs: &[usize]| count(&grid, bs) * count(&many, bs);
    let known = grid
        .iter()
        .all(|&d| extents.get(d).copied().flatten().is_some());
    // The contiguous tiles first, the grid's then the loops' (each up to a
    // quarter of the budget, so the rows of a 2-D tile still get some), then
    // the grid's others, then halved until the launch has programs enough to
    // fill the GPU.
    let gathered = gathered_dims(k);
    // Tiles of 8-byte elements (i64) take half the elements: as many bytes
    // a thread, so as many registers (position ids at 4 × 1024 i64 spilled
    // 268 bytes).
    let shared = if shared_atomics(k) {
        SHARED_ATOMIC_BUDGET
    } else {
        1
    };
    let full = BUDGET * shared / wide_factor(k, &contiguous);
    for &d in grid.iter().chain(contiguous.iter()) {
        if bs[d] == 0 && contiguous.contains(&d) {
            let share = match sharing(d) {
                // A gather's rows are copied once a program: its tile takes
                // the whole budget along them.
                _ if gathered.contains(&d) => full,
                1 => full / 4,
                s => 1 << (full.trailing_zeros() / s),
            };
            bs[d] = cap(d, share.min(room(&bs, d, full))).max(1);
        }
    }
    // The grid's other tiles share what is left evenly (a tile of about equal
    // sides), what one cannot take going to the next: rope at 4×4096×32×128
    // gets `[4, 4, 4, 64]`, four batches that reuse each `cos`/`sin` value
    // and four heads side by side, where giving each in turn all it could
    // take made `[4, 16, 1, 64]` (75% of copy, against 87%; all heads in
    // one tile, `[1, 2, 32, 64]`, ran at 70%: docs/perf-history.md, "Rope's
    // tile of equal sides").
    let rest: Vec<DimId> = grid.iter().copied().filter(|&d| bs[d] == 0).collect();
    for (i, &d) in rest.iter().enumerate() {
        let left = full.min(room(&bs, d, full));
        let share = 1usize << (left.max(1).ilog2() as usize).div_ceil(rest.len() - i);
        bs[d] = cap(d, share).max(1);
    }
    // The runtime shares the loop among programs where it is long enough.
    let shares = split.is_some_and(|s| {
        extents
            .get(s.dim)
            .copied()
            .flatten()
            .is_none_or(|e| e >= SPLIT_MIN_EXTENT)
    });
    // Shared down rows: one warp's tile (`SHARED_WARPS`), narrower where the
    // loop walks a single tensor.
    let down_rows = shares && split.is_some_and(|s| !contiguous.contains(&s.dim));
    let shared_floor = match split {
        Some(s) if tiles_walked(k, s.dim, &contiguous) == 1 => SHARED_MIN_CONTIGUOUS,
        _ => SPLIT_MIN_CONTIGUOUS,
    };
    while known && programs(&bs) < MIN_PROGRAMS {
        let floor = |d: DimId| {
            if contiguous.contains(&d) {
                match (shares, down_rows) {
                    (true, true) => shared_floor,
                    (true, false) => SPLIT_MIN_CONTIGUOUS,
                    _ => MIN_CONTIGUOUS,
                }
            } else {
                1
            }
        };
        // Rows before columns: a contiguous tile keeps its long vectors.
        let Some(&d) = grid
            .iter()
            .filter(|&&d| bs[d] > floor(d))
            .max_by_key(|&&d| (!contiguous.contains(&d), bs[d] / floor(d), usize::MAX - d))
        else {
            break;
        };
        bs[d] /= 2;
    }
    // Starved: the whole launch, `each` dimensions too, has too few programs.
    let starved = !shares
        && k.grid
            .iter()
            .all(|&d| extents.get(d).copied().flatten().is_some())
        && count(&k.grid, &bs) < MIN_PROGRAMS;
    let along_row = shares && !down_rows;
    let (warps, budget) = match (starved, down_rows, along_row) {
        (true, _, _) => (STARVED_WARPS, full * STARVED_WARPS / 4),
        (false, true, _) => (SHARED_WARPS, SHARED_BUDGET),
        (false, false, true) => (ALONG_WARPS, ALONG_BUDGET),
        (false, false, false) if !gathered.is_empty() => (GATHER_WARPS, full),
        (false, false, false) => (4, full),
    };
    let max_contiguous = match along_row {
        true => ALONG_BUDGET,
        false => MAX_CONTIGUOUS,
    };
    // The loops' other tiles, innermost first.
    let mut order: Vec<DimId> = Vec::new();
    for p in &paths {
        for &d in p.iter().rev() {
            if !order.contains(&d) {
                order.push(d);
            }
        }
    }
    for d in order {
        if bs[d] == 0 {
            let most = if contiguous.contains(&d) {
                budget / 4
            } else {
                budget
            };
            bs[d] = cap(d, most.min(room(&bs, d, budget))).max(1);
        }
    }
    // What is left grows the contiguous dimensions (a 1-D kernel's block),
    // as long as the launch keeps its programs.
    for &d in &contiguous {
        if !k.dims[d].whole && !k.dims[d].each {
            let grow = room(&bs, d, budget);
            let before = bs[d];
            bs[d] = cap(d, (bs[d] * grow).min(max_contiguous)).max(bs[d]);
            while known && bs[d] > before && grid.contains(&d) && programs(&bs) < MIN_PROGRAMS {
                bs[d] /= 2;
            }
        }
    }
    for b in &mut bs {
        if *b == 0 {
            *b = 1;
        }
        *b = b.next_power_of_two();
    }
    // No more warps than the largest scope's tile keeps busy with 8
    // elements a thread (the others would hold copies).
    let widest = paths
        .iter()
        .map(|p| p.iter().map(|&d| bs[d]).product::<usize>())
        .max()
        .unwrap_or(1);
    let warps = match starved {
        true => {
            let fit = (widest / 256).clamp(4, warps);
            1 << fit.ilog2()
        }
        // A `whole` tile wider than the budget: warps enough for about
        // `WHOLE_PER_THREAD` elements a thread (cummax over 8192-wide rows
        // held 2048 a thread at 4 warps and 32 rows, and spilled 35 KB).
        false if widest > budget => (widest / (32 * WHOLE_PER_THREAD))
            .next_power_of_two()
            .clamp(warps, STARVED_WARPS),
        false => warps,
    };
    let ways = match (split, down_rows) {
        (None, _) => 0,
        (Some(_), true) => SHARED_SPLIT,
        (Some(s), false) if s.scalars(k) => SCALAR_SPLIT,
        (Some(_), false) => DEFAULT_SPLIT,
    };
    // A shared loop is a short walk of many programs: their number hides
    // the loads' latency, and a second tile's registers would cut how many
    // fit an SM.
    let stages = if ways > 0 { 1 } else { AHEAD };
    Config::new(&bs)
        .num_warps(warps)
        .num_stages(stages)
        .split(ways)
}

/// What the tuner may change: each tunable dimension's block (powers of two
/// from 1 to 8192), the warps, a loop's stages (1, or 2: a tile loaded
/// ahead) and the threads an SM that the registers must leave room for
/// (`occupancy`; 0 leaves it to the lowering: one block an SM, so ptxas takes
/// what it likes, or 1536 threads where the kernel stages gathered rows).
pub fn axes(k: &Kernel) -> Vec<Axis> {
    let contiguous = contiguous_dims(k);
    let mut axes = Vec::new();
    for (dim, d) in k.dims.iter().enumerate() {
        if d.each || d.whole {
            continue;
        }
        let values = if contiguous.contains(&dim) {
            vec![64, 128, 256, 512, 1024, 2048, 4096, 8192]
        } else {
            vec![1, 2, 4, 8, 16, 32, 64]
        };
        let axis = Axis::Block { dim, values };
        if contiguous.contains(&dim) {
            axes.insert(0, axis);
        } else {
            axes.push(axis);
        }
    }
    axes.push(Axis::Warps(vec![1, 2, 4, 8, 16]));
    if has_tile_loop(k) {
        axes.push(Axis::Stages(vec![1, 2]));
    }
    axes.push(Axis::Occupancy(vec![0, 768, 1024, 1536]));
    axes
}

/// Starting points around the default: the contiguous blocks halved and
/// doubled, 2 and 8 warps; and the default with the registers bounded for
/// 1024 threads an SM: dropout (16384×8192 bf16, H200) holds 84 registers a
/// thread at its default, 29% occupancy and 82% of the copy bandwidth, and
/// runs at 87% so (docs/perf-history.md, "Random masks as compared words;
/// registers bounded for occupancy"); rope spills there and runs at half
/// the speed, which the tuner measures.
pub fn seeds(k: &Kernel, default: &Config) -> Vec<Config> {
    let mut out = Vec::new();
    let contiguous = contiguous_dims(k);
    for w in [4, 8, 2] {
        for f in [1.0, 2.0, 0.5] {
            let mut c = default.clone().num_warps(w);
            for &d in &contiguous {
                if !k.dims[d].whole && !k.dims[d].each {
                    let b = (c.block_sizes[d] as f64 * f) as usize;
                    c.block_sizes[d] = b.clamp(1, 8192).next_power_of_two();
                }
            }
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    let bounded = default.clone().occupancy(1024);
    if default.threads() <= 1024 && !out.contains(&bounded) {
        out.push(bounded);
    }
    // Loads a step ahead hold a second tile's registers: the tuner weighs
    // them against one stage.
    let single = default.clone().num_stages(1);
    if has_tile_loop(k) && !out.contains(&single) {
        out.push(single);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::ir::*;

    fn dim(name: &str, extent: usize) -> TileDim {
        TileDim {
            name: name.into(),
            extent: Some(extent),
            whole: false,
            each: false,
        }
    }

    #[test]
    fn a_2d_elementwise_kernel_takes_long_rows_of_a_few_rows() {
        let k = Kernel {
            name: "add".into(),
            tensors: vec![TensorParam {
                name: "x".into(),
                rank: 2,
                declared: None,
            }],
            scalars: vec![ScalarParam::named("m"), ScalarParam::named("n")],
            constexprs: vec![],
            dims: vec![dim("tm", 0), dim("tn", 1)],
            grid: vec![0, 1],
            grid_start: vec![],
            vars: vec![],
            body: vec![Stmt::Store {
                tensor: 0,
                index: tile_index(&[0, 1]),
                value: Expr::Float(1.0),
                at: String::new(),
            }],
        };
        let c = default_config(&k, &[Some(16384), Some(8192)]);
        assert_eq!(c.block_sizes, vec![4, 1024]);
        let small = default_config(&k, &[Some(16384), Some(100)]);
        assert_eq!(small.block_sizes, vec![32, 128]);
        // Few rows: the row tile halves until the launch has 256 programs.
        let few = default_config(&k, &[Some(64), Some(8192)]);
        assert_eq!(few.block_sizes, vec![2, 1024]);
        // A row vector `s[tm]` beside `x[(tm, tn)]` does not make `tm` contiguous.
        let mut k = k;
        k.tensors.push(TensorParam {
            name: "s".into(),
            rank: 1,
            declared: None,
        });
        k.body = vec![Stmt::Store {
            tensor: 0,
            index: tile_index(&[0, 1]),
            value: Expr::Load {
                tensor: 1,
                index: tile_index(&[0]),
                at: String::new(),
            },
            at: String::new(),
        }];
        let c = default_config(&k, &[Some(16384), Some(8192)]);
        assert_eq!(c.block_sizes, vec![4, 1024]);
    }

    /// A whole-tensor sum (every program adds into `out[0]`) takes twice the
    /// tile; an atomic into the program's own columns keeps the default's.
    #[test]
    fn programs_sharing_an_atomic_take_larger_tiles() {
        let k = Kernel::parse(
            "kernel total_sum(x: Tensor<bf16, 2>, out: Tensor<f32, 1>; m, n) {
               for (tm, tn) in tile([m, n]) {
                 atomic_add(out[0], x[(tm, tn)].cast::<f32>().sum(tn).sum(tm));
               }
             }",
        )
        .expect("the test kernel parses");
        assert!(shared_atomics(&k));
        let c = default_config(&k, &[Some(16384), Some(8192)]);
        assert_eq!((c.block_sizes.clone(), c.num_warps), (vec![4, 2048], 4));
        let k = Kernel::parse(
            "kernel col_sums(x: Tensor<bf16, 2>, out: Tensor<f32, 1>; m, n) {
               for (tm, tn) in tile([m, n]) {
                 atomic_add(out[tn], x[(tm, tn)].cast::<f32>().sum(tm));
               }
             }",
        )
        .expect("the test kernel parses");
        assert!(!shared_atomics(&k));
        let c = default_config(&k, &[Some(16384), Some(8192)]);
        assert_eq!(c.block_sizes, vec![4, 1024]);
    }

    /// Tiles of i64 take half the elements of bf16 or f32 ones (the same
    /// bytes a thread); an i64 index tile beside the rows does not count.
    #[test]
    fn eight_byte_tiles_take_half_the_elements() {
        let store = |t: usize, dims: &[DimId]| Stmt::Store {
            tensor: t,
            index: tile_index(dims),
            value: Expr::Float(1.0),
            at: String::new(),
        };
        let k = |dtype: DType, body: Vec<Stmt>| Kernel {
            name: "k".into(),
            tensors: vec![
                TensorParam {
                    name: "x".into(),
                    rank: 2,
                    declared: Some(dtype),
                },
                TensorParam {
                    name: "ids".into(),
                    rank: 1,
                    declared: Some(DType::I64),
                },
            ],
            scalars: vec![ScalarParam::named("m"), ScalarParam::named("n")],
            constexprs: vec![],
            dims: vec![dim("tm", 0), dim("tn", 1)],
            grid: vec![0, 1],
            grid_start: vec![],
            vars: vec![],
            body,
        };
        let ext = [Some(16384), Some(8192)];
        let c = |k: &Kernel| default_config(k, &ext).block_sizes;
        assert_eq!(c(&k(DType::BF16, vec![store(0, &[0, 1])])), vec![4, 1024]);
        assert_eq!(c(&k(DType::I64, vec![store(0, &[0, 1])])), vec![4, 512]);
        let beside = vec![store(0, &[0, 1]), store(1, &[0])];
        assert_eq!(c(&k(DType::F32, beside)), vec![4, 1024]);
    }

    /// A `whole` row takes the block its launch fits it to, and the budget
    /// with it: one row a program, warps for about 32 elements a thread. Without
    /// extents it keeps the 16 `fit_whole_dims` widens at the launch.
    #[test]
    fn a_whole_row_shares_the_budget_and_gets_warps_for_it() {
        let mut whole = dim("tn", 1);
        whole.whole = true;
        let k = Kernel {
            name: "scan".into(),
            tensors: vec![TensorParam {
                name: "x".into(),
                rank: 2,
                declared: None,
            }],
            scalars: vec![ScalarParam::named("m"), ScalarParam::named("n")],
            constexprs: vec![],
            dims: vec![dim("tm", 0), whole],
            grid: vec![0, 1],
            grid_start: vec![],
            vars: vec![],
            body: vec![Stmt::Store {
                tensor: 0,
                index: tile_index(&[0, 1]),
                value: Expr::Float(1.0),
                at: String::new(),
            }],
        };
        for (n, warps) in [(4096, 4), (8192, 8), (16384, 16), (3000, 4)] {
            let c = default_config(&k, &[Some(16384), Some(n)]);
            assert_eq!(c.block_sizes, vec![1, n.next_power_of_two()], "{n}");
            assert_eq!(c.num_warps, warps, "{n}");
        }
        // Narrow rows: several a program, as an elementwise tile.
        let c = default_config(&k, &[Some(16384), Some(100)]);
        assert_eq!(c.block_sizes, vec![32, 128]);
        assert_eq!(default_config(&k, &[None, None]).block_sizes[1], 16);
    }
}
