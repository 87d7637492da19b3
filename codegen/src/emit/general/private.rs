//! Atomics privatized in shared memory. A histogram's `atomic_add(counts[bin],
//! 1)` sends every element of the launch to a few hundred addresses, which
//! the L2 serializes. Where a 32-bit integer tensor only receives
//! `atomic_add`s, at least one of its indices gathered (or not the grid's own
//! tile), each program adds into its own copy of the part of the tensor it
//! can reach, in shared memory, and adds the copy's nonzero entries into the
//! tensor once, at its end.
//!
//! Integers only: shared memory adds them in one instruction, but an f32 add
//! there is a compare-and-swap loop (`ATOMS.CAST.SPIN` on sm_90). A segment
//! sum (2M rows of 128 into 2000 segments, H200) ran 3.4× slower through
//! private copies (1.34–2.71 ms) than with `red.global.add.v4.f32` into the
//! tensor (0.39 ms); f32 tensors keep their global atomics.
//!
//! The part a program reaches ([`PrivateCopy`]): the whole of each axis,
//! except where every atomic indexes the axis by a grid tile as itself
//! (`td` in a segment count's `out[(ids[tn], td)]`), whose block then
//! suffices. Its size is known
//! at launch only: the launch gives the copies shared memory when they fit
//! and a program's work outweighs zeroing and flushing them, and says so in
//! `tf_priv`; the atomics go to global memory otherwise.
//!
//! Programs then walk the grid (`tf_w += gridDim.x`, one wave of them) when
//! the kept tiles are the grid's innermost: the launch makes the grid a
//! multiple of their count, so a program's kept tiles stay the same and its
//! copy sums over every tile it walks before the one flush.

use super::Gen;
use crate::dtype::DType;
use crate::ir::*;
use crate::prims::AtomicOp;
use crate::spec::Spec;
use std::fmt::Write;

/// An axis of a program's private copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrivateAxis {
    /// The tensor's whole axis (its size at launch).
    Whole,
    /// The block of a grid tile that indexes the axis as itself (the
    /// program's tile of it).
    Tile { block: usize },
}

/// One tensor's private copy: 4-byte entries over its axes, row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrivateCopy {
    pub tensor: TensorId,
    pub axes: Vec<PrivateAxis>,
}

impl PrivateCopy {
    /// Entries of the copy for a tensor of `shape`.
    pub fn entries(&self, shape: &[usize]) -> usize {
        self.axes
            .iter()
            .enumerate()
            .map(|(a, x)| match x {
                PrivateAxis::Whole => shape.get(a).copied().unwrap_or(0),
                PrivateAxis::Tile { block } => *block,
            })
            .fold(1usize, |n, x| n.saturating_mul(x))
    }

    /// Shared memory the copy takes (16-byte aligned, as the kernel lays the
    /// copies out).
    pub fn bytes(&self, shape: &[usize]) -> usize {
        self.entries(shape).saturating_mul(4).next_multiple_of(16)
    }
}

/// What a launch needs to know of a kernel's private copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrivateLaunch {
    pub copies: Vec<PrivateCopy>,
    /// Programs walk the grid: the launch may start fewer programs than
    /// tiles, a multiple of the tile count of the last `kept` entries of
    /// [`crate::emit::Lowered::grid`].
    pub walk: bool,
    pub kept: usize,
    /// Elements of one grid tile (the product of the grid's blocks).
    pub tile_elems: usize,
}

/// An axis of a private tensor as the IR indexes it (before blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Axis {
    Whole,
    Tile(DimId),
}

/// The tensors whose atomics a program keeps in shared memory, with their
/// axes: i32 or u32, written only by `atomic_add` (none keeping its old
/// values), at least one
/// axis not indexed by a grid tile as itself, never loaded or stored; none in
/// a kernel that waits or signals (a flag could publish sums still in shared
/// memory).
pub(super) fn private_tensors(k: &Kernel, spec: &Spec) -> Vec<(TensorId, Vec<Axis>)> {
    let mut sync = false;
    let mut plain: Vec<TensorId> = Vec::new();
    let mut adds: Vec<(TensorId, Vec<Axis>)> = Vec::new();
    k.walk_stmts(&mut |s| match s {
        Stmt::Wait { .. } | Stmt::Signal { .. } => sync = true,
        Stmt::Store { tensor, .. } => plain.push(*tensor),
        Stmt::Atomic {
            op,
            tensor,
            index,
            old,
            ..
        } => {
            // A fetch's old values are the tensor's, not a copy's.
            if *op != AtomicOp::Add || old.is_some() {
                plain.push(*tensor);
                return;
            }
            let axes = index
                .iter()
                .map(|c| match c {
                    Expr::TileIndex(d) if k.grid.contains(d) && !k.is_each(*d) => Axis::Tile(*d),
                    _ => Axis::Whole,
                })
                .collect();
            adds.push((*tensor, axes));
        }
        _ => {}
    });
    k.walk_exprs(&mut |e| {
        if let Expr::Load { tensor, .. } = e {
            plain.push(*tensor);
        }
    });
    if sync {
        return Vec::new();
    }
    let mut out: Vec<(TensorId, Vec<Axis>)> = Vec::new();
    for (t, axes) in adds {
        if plain.contains(&t) || !matches!(spec.tensors[t].dtype, DType::I32 | DType::U32) {
            continue;
        }
        match out.iter_mut().find(|(u, _)| *u == t) {
            // Atomics that disagree on an axis keep it whole.
            Some((_, have)) => {
                for (h, a) in have.iter_mut().zip(&axes) {
                    if h != a {
                        *h = Axis::Whole;
                    }
                }
            }
            None => out.push((t, axes)),
        }
    }
    out.retain(|(_, axes)| axes.contains(&Axis::Whole));
    out
}

/// How many of the grid's innermost dimensions the copies keep (index by
/// their tile), when those are exactly the kept ones: the programs may then
/// walk the grid. `None` where they may not.
pub(super) fn kept_inner(k: &Kernel, private: &[(TensorId, Vec<Axis>)]) -> Option<usize> {
    let mut kept: Vec<DimId> = Vec::new();
    for (_, axes) in private {
        for a in axes {
            if let Axis::Tile(d) = a {
                if !kept.contains(d) {
                    kept.push(*d);
                }
            }
        }
    }
    let n = kept.len();
    let inner = &k.grid[k.grid.len().checked_sub(n)?..];
    inner.iter().all(|d| kept.contains(d)).then_some(n)
}

impl Gen<'_, '_> {
    fn private_axes(&self, t: TensorId) -> Option<&[Axis]> {
        self.private
            .iter()
            .find(|(u, _)| *u == t)
            .map(|(_, a)| a.as_slice())
    }

    /// The element of `t`'s private copy that index `comps` (as C, one per
    /// axis) address, where `t` has one.
    pub(super) fn private_offset(&self, t: TensorId, comps: &[String]) -> Option<String> {
        let axes = self.private_axes(t)?;
        let terms: Vec<String> = axes
            .iter()
            .zip(comps)
            .enumerate()
            .map(|(a, (x, c))| match x {
                Axis::Whole => format!("{c} * tf_pl{t}_{a}"),
                Axis::Tile(d) => format!("({c} - tb{d}) * tf_pl{t}_{a}"),
            })
            .collect();
        Some(terms.join(" + "))
    }

    /// The atomic `op` of `v` on `t`: into the program's copy at `local`
    /// ([`Gen::private_offset`]) where it has one and the launch gave room
    /// (a pointer the compiler sees is shared), else into `t` at `offset`.
    pub(super) fn atomic_stmt(
        &self,
        t: TensorId,
        op: AtomicOp,
        local: Option<&str>,
        offset: &str,
        v: &str,
    ) -> String {
        let dtype = self.e.spec.tensors[t].dtype;
        let global = op.cuda(dtype, &format!("t{t} + ({offset})"), v);
        match local {
            Some(i) => format!(
                "if (tf_pv) {}; else {global};",
                op.cuda(dtype, &format!("tf_bins{t} + ({i})"), v)
            ),
            None => format!("{global};"),
        }
    }

    /// The copies' start, at `base` bytes of shared memory: each axis's
    /// length and stride, the pointers and the zeroing (every thread reaches
    /// it).
    pub(super) fn private_head(&self, base: usize) -> String {
        let mut s = String::new();
        if self.private.is_empty() {
            return s;
        }
        let _ = writeln!(
            s,
            "  const bool tf_pv = tf_priv != 0;\n  long long tf_pofs = {base};"
        );
        for (t, axes) in &self.private {
            let ty = self.e.spec.tensors[*t].dtype.c_storage();
            for (a, x) in axes.iter().enumerate().rev() {
                let len = match x {
                    Axis::Whole => format!("t{t}_n{a}"),
                    Axis::Tile(d) => format!("(long long)B{d}"),
                };
                let stride = match a + 1 == axes.len() {
                    true => "1".to_string(),
                    false => format!("tf_pn{t}_{} * tf_pl{t}_{}", a + 1, a + 1),
                };
                let _ = writeln!(
                    s,
                    "  const long long tf_pn{t}_{a} = {len}, tf_pl{t}_{a} = {stride};"
                );
            }
            let _ = writeln!(
                s,
                "  {ty}* tf_bins{t} = ({ty}*)(tf_smem + tf_pofs);\n  \
                 const long long tf_pe{t} = tf_pn{t}_0 * tf_pl{t}_0;\n  \
                 tf_pofs += (tf_pe{t} * 4 + 15) / 16 * 16;\n  \
                 if (tf_pv) for (long long tf_i = tid; tf_i < tf_pe{t}; tf_i += {}) tf_bins{t}[tf_i] = 0;",
                self.threads
            );
        }
        s.push_str("  (void)tf_pofs;\n  __syncthreads();\n");
        s
    }

    /// The program's end: each private copy's nonzero entries added into the
    /// tensor (a kept tile's entries past the tensor's end are zero: no
    /// atomic reached them).
    pub(super) fn private_flush(&self) -> String {
        let mut s = String::new();
        if self.private.is_empty() {
            return s;
        }
        s.push_str("  __syncthreads();\n  if (tf_pv) {\n");
        for (t, axes) in &self.private {
            let ty = self.e.spec.tensors[*t].dtype.c_storage();
            let mut at = Vec::new();
            let mut ok = Vec::new();
            for (a, x) in axes.iter().enumerate() {
                let c = format!("(tf_i / tf_pl{t}_{a}) % tf_pn{t}_{a}");
                match x {
                    Axis::Whole => at.push(format!("({c}) * t{t}_s{a}")),
                    Axis::Tile(d) => {
                        ok.push(format!("tb{d} + {c} < t{t}_n{a}"));
                        at.push(format!("(tb{d} + {c}) * t{t}_s{a}"));
                    }
                }
            }
            ok.push(format!("tf_c != ({ty})0"));
            let _ = writeln!(
                s,
                "    for (long long tf_i = tid; tf_i < tf_pe{t}; tf_i += {}) {{\n      \
                 const {ty} tf_c = tf_bins{t}[tf_i];\n      \
                 if ({}) tf_atomic_add(t{t} + ({}), tf_c);\n    }}",
                self.threads,
                ok.join(" && "),
                at.join(" + ")
            );
        }
        s.push_str("  }\n");
        s
    }

    /// The copies as the launch sizes them.
    pub(super) fn private_launch(&self, walk: Option<usize>) -> Option<PrivateLaunch> {
        if self.private.is_empty() {
            return None;
        }
        let copies = self
            .private
            .iter()
            .map(|(t, axes)| PrivateCopy {
                tensor: *t,
                axes: axes
                    .iter()
                    .map(|x| match x {
                        Axis::Whole => PrivateAxis::Whole,
                        Axis::Tile(d) => PrivateAxis::Tile {
                            block: self.block(*d),
                        },
                    })
                    .collect(),
            })
            .collect();
        let k = self.e.k;
        Some(PrivateLaunch {
            copies,
            walk: walk.is_some(),
            kept: walk.unwrap_or(0),
            tile_elems: k.grid.iter().map(|&d| self.block(d)).product(),
        })
    }
}
