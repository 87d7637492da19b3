//! The Hopper GEMM's TMA-store epilogue (`Config::tma_store`): instead of every
//! consumer thread storing its accumulator fragments to global memory (pairs of
//! columns in eight rows per warp instruction, so a tile costs thousands of
//! partial-line writes while the tensor cores idle), each warpgroup writes its 64
//! rows into shared memory one box of 64 × 64 elements at a time, and one thread
//! hands each box to the TMA unit (`cp.async.bulk.tensor` store), which clips it
//! to the tensor. The consumers go on to the next box, and after the last to the
//! next tile, while the TMA unit writes.
//!
//! Staging: a ring of two 8 KB boxes per warpgroup after the pipeline's stages,
//! 128-byte swizzled as the descriptor expects; a warp's pair stores then hit
//! eight rows in eight different 16-byte chunks, all 32 banks once. Box `j` uses
//! buffer `j & 1`: before a tile the issuing thread waits until the TMA unit has
//! read every earlier box, and after issuing box `j` until it has read box
//! `j - 1`, so the next box's buffer is free. Named barriers 2 and 3 (one per
//! warpgroup) pass that on to the warpgroup's other threads.
//!
//! A `signal` after the store (the op library's GEMMs count finished chunks for
//! the copy engine and the peers) must not count a tile the TMA unit has not
//! written yet: then each issuing thread waits for its stores to complete (not
//! just to be read out of staging) and fences the async proxy before the
//! signal's barrier, so the count moves only after the tile is in memory.

use super::GemmShape;
use crate::emit::{Emitter, TmaStore};
use crate::ir::*;

/// Shared memory of one warpgroup's staging ring: two boxes of 64 rows × 128 bytes.
pub(super) const WG_BYTES: usize = 2 * BOX_BYTES;
const BOX_BYTES: usize = 64 * 128;

/// The store [`crate::Config::tma_store`] sends through shared memory and the
/// TMA unit: the first store after the K loop of a whole `[M, N]` tile. Its
/// tensor must be a 2-D bf16 or f16 tensor with contiguous, 16-byte aligned
/// rows, stored once and not read after the store (the TMA unit writes it
/// later). Also whether a `signal` follows the store (it then waits for the
/// TMA unit's writes, see the module's doc).
pub(super) fn target(e: &Emitter, g: &GemmShape) -> Result<(TensorId, bool), String> {
    let rest = &e.k.body[g.k_loop + 1..];
    let Some((pos, t)) = rest.iter().enumerate().find_map(|(i, s)| match s {
        Stmt::Store { tensor, index, .. } if plain_index(index) == Some(vec![g.m, g.n]) => {
            Some((i, *tensor))
        }
        _ => None,
    }) else {
        return Err("the TMA-store epilogue stores a whole `[M, N]` output tile (`out[(tm, tn)] = ...`), and this kernel stores none; drop `tma_store`".into());
    };
    let (ts, name) = (&e.spec.tensors[t], &e.k.tensors[t].name);
    let mut wrong = Vec::new();
    if !ts.dtype.is_half() {
        wrong.push(format!("it is {}", ts.dtype));
    }
    if ts.rank != 2 {
        wrong.push(format!("it has {} dimensions", ts.rank));
    }
    if !ts.last_contiguous {
        wrong.push("its rows are strided".to_string());
    } else if ts.align < 16 {
        wrong.push(format!("its rows are {}-byte aligned", ts.align));
    }
    if !wrong.is_empty() {
        return Err(format!(
            "the TMA-store epilogue writes `{name}` with TMA, which needs a 2-D bf16 or f16 tensor with contiguous, 16-byte aligned rows, but {}; drop `tma_store`",
            wrong.join(" and ")
        ));
    }
    let mut later_use = false;
    for s in &rest[pos + 1..] {
        match s {
            Stmt::Store { tensor, .. } if *tensor == t => later_use = true,
            Stmt::Store { value, .. } | Stmt::Let { value, .. } | Stmt::Assign { value, .. } => {
                value.walk(&mut |x| {
                    later_use |= matches!(x, Expr::Load { tensor, .. } if *tensor == t)
                })
            }
            _ => {}
        }
    }
    if later_use {
        return Err(format!(
            "the TMA-store epilogue writes `{name}` after the kernel moves on, and a later statement stores or reads it again; drop `tma_store`"
        ));
    }
    let signal_after = rest[pos + 1..]
        .iter()
        .any(|s| matches!(s, Stmt::Signal { .. }));
    Ok((t, signal_after))
}

/// The fragment loop of a store group holding the staged store: `body` (the
/// group's stores for the pair at `row`, `col`, `acc[mi][ni][h * 2 ..]`; the
/// staged one writes to `tf_stage_at`) run box by box, each box staged and
/// handed to the TMA unit. A Hopper consumer thread holds `t.mi` fragment row
/// blocks of 64 rows (one per `wgmma` row) of `BN / 8` column blocks of 8.
pub(super) fn fragment_loop(t: &TmaStore, dm: DimId, dn: DimId, body: &str) -> String {
    let boxes = t.bn / 64;
    let (mi, total, box_row) = (t.mi, t.mi * boxes, t.box_row);
    let stage = format!("(sA + {}u)", t.offset);
    // A register barrier id makes ptxas reserve all sixteen (harmless at one
    // block per SM); immediate ids in a branch cost the gelu epilogue a spill.
    let sync = "asm volatile(\"bar.sync %0, 128;\" :: \"r\"(2 + wg) : \"memory\");";
    let issuer = "(tid & 127) == 0";
    let written = match t.signal_after {
        // The tile in memory, visible to the generic proxy, before the
        // signal's barrier lets the count move.
        true => format!("  // A signal follows: this warpgroup's boxes written, not just read.\n  if ({issuer}) asm volatile(\"cp.async.bulk.wait_group 0;\\n\\tfence.proxy.async.global;\" ::: \"memory\");\n"),
        false => String::new(),
    };
    format!(
        r#"  // TMA-store epilogue: every earlier box of this warpgroup read out of staging.
  if ({issuer}) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  {sync}
  // This thread's pair: row r = (wm0 & 63) + lane / 4 + 8h of the box, 16-byte
  // chunk (ni & 7) ^ (r & 7), 4 bytes per lane & 3.
  const tf_u32 tf_sb = {stage} + wg * {WG_BYTES}u + ((wm0 & 63) + (lane >> 2)) * 128u + ((lane & 3) << 2);
  #pragma unroll
  for (int mi = 0; mi < {mi}; ++mi)
  #pragma unroll
  for (int tf_box = 0; tf_box < {boxes}; ++tf_box) {{
  // The box's place in this warpgroup's sequence picks its staging buffer.
  const int tf_seq = mi * {boxes} + tf_box;
  #pragma unroll
  for (int ni = tf_box * 8; ni < tf_box * 8 + 8; ++ni)
  #pragma unroll
  for (int h = 0; h < 2; ++h) {{
      // The TMA unit clips the box, so only an epilogue that reads them needs these.
      [[maybe_unused]] const long long row = tb{dm} + wm0 + mi * 64 + (lane >> 2) + h * 8;
      [[maybe_unused]] const long long col = tb{dn} + wn0 + ni * 8 + (lane & 3) * 2;
      const tf_u32 tf_stage_at = tf_sb + h * 1024u + (tf_seq & 1) * {BOX_BYTES}u + (((ni & 7) << 4) ^ ((lane & 28) << 2));
{body}  }}
  // The box's writes visible to the TMA unit (the async proxy), then stored.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  {sync}
  if ({issuer}) {{
    tf_tma_store_2d(&tf_map_out, {stage} + wg * {WG_BYTES}u + (tf_seq & 1) * {BOX_BYTES}u, (int)(tb{dn} + tf_box * 64), (int)(tb{dm} + {box_row}));
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    // The next box's buffer: the one before this box was read.
    if (tf_seq + 1 < {total}) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
  }}
  if (tf_seq + 1 < {total}) {sync}
  }}
{written}"#
    )
}
