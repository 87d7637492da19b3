//! Gathers along a row, staged through shared memory.
//!
//! `x[(tm, idx[tn])]` reads elements at computed columns of the program's
//! rows: read from global memory one by one, each costs a sector request
//! (32 bytes for 2), and index_select ran at 25% of the copy bandwidth with
//! the L1 and L2 pipes 87% busy. Once a program reads more than one element
//! in sixteen of a row, nearly every sector of the row is requested anyway:
//! copying the program's whole rows into shared memory in 16-byte pieces,
//! then gathering from there, moves the same bytes in a sixteenth of the
//! requests. Taken for a load whose last index is gathered along the
//! tensor's contiguous axis and whose other indices are tiles (plus
//! offsets) or scalars. The rows' length is known at launch only, so the
//! shared memory is sized there ([`GatherStage`]): the kernel stages when
//! the launch gave it room (`tf_stage_cap`) and gathers from global memory
//! otherwise.

use super::memory::Comp;
use super::{Gen, Val};
use crate::error::CodegenError;
use crate::ir::*;

/// A gather the kernel stages through shared memory when the launch gives
/// it [`GatherStage::bytes`] of it; the launch decides with
/// [`GatherStage::worth`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GatherStage {
    /// The tensor gathered from, and its axis the gathered index addresses.
    pub tensor: TensorId,
    pub axis: usize,
    /// Rows a program stages.
    pub rows: usize,
    /// Elements a program reads from each row.
    pub per_row: usize,
    pub elem_bytes: usize,
}

/// Elements of a 32-byte sector of the smallest type (a byte): a program
/// that reads fewer than one in this many of a row's elements requests
/// fewer sectors than the whole row holds.
const SPARSE: usize = 16;

/// Elements a program reads from each row, at least, for a gather to be
/// staged at all (one warp's worth).
const MIN_PER_ROW: usize = 32;

impl GatherStage {
    /// Shared memory the staged rows take, for rows of `row_len` elements.
    pub fn bytes(&self, row_len: usize) -> usize {
        (self.rows * row_len * self.elem_bytes).next_multiple_of(16)
    }

    /// Whether staging rows of `row_len` pays: the program reads at least one
    /// element in [`SPARSE`] of each row.
    pub fn worth(&self, row_len: usize) -> bool {
        row_len > 0 && row_len <= self.per_row.saturating_mul(SPARSE)
    }
}

impl Gen<'_, '_> {
    /// The staged gather of `v` (`tensor[comps]`) when the load is one, its
    /// global-memory gather in the other branch; false (nothing written)
    /// where it is not. `index_code` computes the gathered index (the last
    /// component): it goes after the rows' copies are issued, so the
    /// indices load while the copies are in flight and hold no registers
    /// across the copy loops (index_select spilled 52 bytes at its 40
    /// registers with them live there).
    pub(super) fn staged_gather(
        &mut self,
        v: &Val,
        t: TensorId,
        comps: &[Comp],
        l: usize,
        depth: usize,
        index_code: &str,
    ) -> Result<bool, CodegenError> {
        let ts = &self.e.spec.tensors[t];
        let (Some(Comp::Gather(_)), true) = (comps.last(), ts.last_contiguous) else {
            return Ok(false);
        };
        let dtype = ts.dtype;
        let lay = &self.layouts[l];
        // The rows: tiles of the layout (plus offsets), each once, or scalars.
        let mut row_dims: Vec<DimId> = Vec::new();
        for c in &comps[..comps.len() - 1] {
            match c {
                Comp::Affine { d, .. } if lay.pos(*d).is_some() && !row_dims.contains(d) => {
                    row_dims.push(*d)
                }
                Comp::Scalar(_) => {}
                _ => return Ok(false),
            }
        }
        let rows: usize = row_dims.iter().map(|&d| self.block(d)).product();
        let per_row: usize = v
            .dims
            .iter()
            .filter(|d| !row_dims.contains(d))
            .map(|&d| self.block(d))
            .product();
        // A program reading a few elements of a row stages rows of at most
        // `SPARSE` times as many, too short to pay for the launch bounds a
        // staging kernel asks (its registers cut for occupancy): an
        // embedding gradient's 4 list places a tile, from a 16384-long
        // list, spilled 328 bytes at 40 registers and never staged.
        if per_row < MIN_PER_ROW {
            return Ok(false);
        }
        let axis = comps.len() - 1;
        let es = dtype.size();
        let stage = GatherStage {
            tensor: t,
            axis,
            rows,
            per_row,
            elem_bytes: es,
        };
        if !self.gathers.contains(&stage) {
            self.gathers.push(stage);
        }
        self.staged += 1;
        let st = dtype.c_storage();
        let threads = self.threads;
        let len = format!("t{t}_n{axis}");
        // Staged rows fit the block's shared memory: their offsets are ints.
        self.w(
            depth,
            format!("const bool tf_stg = (long long){rows} * {len} * {es} <= tf_stage_cap;"),
        );
        self.w(depth, "if (tf_stg) {  // rows staged: their copies issued");
        let d1 = depth + 1;
        self.w(
            d1,
            "__syncthreads();  // the staged rows' earlier readers are done",
        );
        self.w(
            d1,
            format!("{st}* tf_sg = ({st}*)(tf_smem + tf_stage_base);"),
        );
        self.w(d1, format!("const int tf_rl = (int){len};"));
        self.w(d1, format!("for (int tf_r = 0; tf_r < {rows}; ++tf_r) {{"));
        let d2 = d1 + 1;
        // The row's index along each axis; rows past an extent or the
        // tensor are left unstaged (no gather reads them).
        let mut idx = Vec::new();
        let mut ok = Vec::new();
        let mut row_of = Vec::new();
        for c in &comps[..axis] {
            match c {
                Comp::Affine { d, off } => {
                    let pos = row_dims.iter().position(|x| x == d).unwrap_or(0);
                    let below: usize = row_dims[pos + 1..].iter().map(|&x| self.block(x)).product();
                    let b = self.block(*d);
                    let i = format!("(tf_r / {below}) % {b}");
                    let mut c = format!("(tb{d} + {i})");
                    ok.push(format!("{c} < {}", self.e.end(*d)));
                    if let Some(o) = off {
                        c = format!("({c} + {o})");
                    }
                    row_of.push((*d, below));
                    idx.push(c);
                }
                Comp::Scalar(s) => idx.push(s.clone()),
                Comp::Gather(_) => {}
            }
        }
        for (a, c) in idx.iter().enumerate() {
            ok.push(format!(
                "(unsigned long long){c} < (unsigned long long)t{t}_n{a}"
            ));
        }
        let src: Vec<String> = idx
            .iter()
            .enumerate()
            .map(|(a, c)| format!("{c} * t{t}_s{a}"))
            .collect();
        let ok = if ok.is_empty() {
            "true".to_string()
        } else {
            ok.join(" && ")
        };
        self.w(d2, format!("if (!({ok})) continue;"));
        let src = if src.is_empty() {
            "0".to_string()
        } else {
            src.join(" + ")
        };
        self.w(d2, format!("const {st}* tf_src = t{t} + ({src});"));
        self.w(d2, format!("{st}* tf_dst = tf_sg + tf_r * tf_rl;"));
        let v16 = 16 / es;
        self.w(
            d2,
            "if ((((unsigned long long)tf_src | (unsigned long long)tf_dst) & 15) == 0) {",
        );
        // Copies that go straight to shared memory: a thread's whole share
        // of the rows is in flight at once.
        self.w(
            d2 + 1,
            format!(
                "for (int tf_j = tid * {v16}; tf_j + {v16} <= tf_rl; tf_j += {}) \
                 tf_cp_async16(tf_smem_u32(tf_dst + tf_j), tf_src + tf_j, 16u);",
                threads * v16
            ),
        );
        self.w(
            d2 + 1,
            format!(
                "for (int tf_j = tf_rl / {v16} * {v16} + tid; tf_j < tf_rl; tf_j += {threads}) \
                 tf_dst[tf_j] = tf_src[tf_j];"
            ),
        );
        self.w(d2, "} else {");
        self.w(
            d2 + 1,
            format!(
                "#pragma unroll 4\n{}for (int tf_j = tid; tf_j < tf_rl; tf_j += {threads}) tf_dst[tf_j] = tf_src[tf_j];",
                super::indent(d2 + 1)
            ),
        );
        self.w(d2, "}");
        self.w(d1, "}");
        self.w(d1, "tf_cp_async_commit();");
        self.w(depth, "}");
        self.body.push_str(index_code);
        self.w(depth, "if (tf_stg) {  // each element from its staged row");
        self.w(
            d1,
            format!("const {st}* tf_sg = (const {st}*)(tf_smem + tf_stage_base);"),
        );
        self.w(d1, format!("const int tf_rl = (int){len};"));
        self.w(d1, "tf_cp_async_wait<0>();");
        self.w(d1, "__syncthreads();");
        // Each element from its staged row.
        let n = self.open(l, &v.dims, d1);
        let mut mask = vec![self.live_c(l, &v.dims)];
        mask.extend(self.bounds_c(t, comps, l, None));
        let row: Vec<String> = row_of
            .iter()
            .map(|(d, below)| format!("({}) * {below}", self.offset_c(l, *d)))
            .collect();
        let row = if row.is_empty() {
            "0".to_string()
        } else {
            row.join(" + ")
        };
        let col = self.comp_c(&comps[axis], l);
        let elem = format!("tf_sg[(long long)({row}) * tf_rl + {col}]");
        let put = self.put_masked(v, dtype, &mask.join(" && "), &elem);
        self.w(d1 + n, put);
        self.close(n, d1);
        self.w(depth, "} else {");
        self.gather_direct(v, t, comps, l, depth + 1);
        self.w(depth, "}");
        Ok(true)
    }
}
