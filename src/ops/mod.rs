//! Fused GEMM + collective ops for tensor parallelism, ready to call.
//!
//! Each op runs on a [`ProcessGroup`], writes into a caller-provided output and
//! overlaps its communication with its GEMM: the copy engine moves data between
//! the GPUs of one node on a backend stream ([`Exchange`]), and tilefuse GEMM
//! kernels `wait` on per-chunk flags before they read what arrived, so they
//! compute on the first chunks while later ones are in flight. Each op also has
//! the unfused NCCL + cuBLAS path; [`Algorithm::Auto`] (the default) times both
//! on the first call and keeps the faster, so a call is never slower than unfused.
//!
//! | op | each rank passes | computes |
//! |---|---|---|
//! | [`all_gather_matmul`] | `a_shard`, `b[K, N]`, `out[M, N]` | `all_gather(A) · B + bias`, A's shards along rows (`[M/w, K]`) or columns (`[M, K/w]`, then `b` is `[K, N]` whole) |
//! | [`matmul_all_gather`] | `a[M, K]`, `b[K, N]`, `out[w·M, N]` | `all_gather(A·B + bias)` along rows (or, up to 4 ranks, the GEMM stores each tile into the peers' memory itself: [`GatherVariant`]) |
//! | [`matmul_reduce_scatter`] | `a[M, K]`, `b[K, N]`, `out[M, N/w]` (or `[M/w, N]`) | `reduce_scatter(A·B + bias)` along columns (or rows) |
//! | [`matmul_all_reduce`] | `a[M, K]`, `b[K, N]`, `out[M, N]` | `all_reduce(A·B + bias)` |
//!
//! **Bias.** A vector along the output's rows ([`Bias::Rows`]) or columns
//! ([`Bias::Cols`]), of the length of that dimension of the product the rank
//! computes. In `all_gather_matmul` and `matmul_all_gather` every output element
//! is computed once, so the bias is added once (in `matmul_all_gather` each rank
//! adds its own bias to its own rows). In `matmul_reduce_scatter` and
//! `matmul_all_reduce` the formula is `reduce(A·B + bias)`: **each rank's bias is
//! added, so a bias passed on every rank counts `world` times**; to add it once,
//! pass it on one rank only (the others pass [`Bias::None`]).
//!
//! **Workspace.** The first call builds a [`Workspace`] (symmetric buffers, flags,
//! a backend stream, zero biases, the algorithm choice) and returns it; pass it
//! back to later calls to skip that work. A workspace built for another op,
//! shape or chunking is rebuilt (with a log line), never reused for a call it
//! does not fit. Building one is collective: every rank must make the same calls.
//!
//! **Ordering.** Everything is queued on the device's launch stream. With
//! `async_op: false` (the default) the call returns once every rank has finished
//! it (a barrier at the end, as in the reference API); with `async_op: true` it
//! returns once queued, and the caller orders later work (the launch stream does).
//!
//! ```no_run
//! # fn main() -> tilefuse::Result<()> {
//! use tilefuse::prelude::*;
//! use tilefuse::ops::{self, GatherDim, OpOptions};
//! use tilefuse::runtime::dist::ProcessGroup;
//! let pg = ProcessGroup::init()?;
//! let w = pg.world_size();
//! let (m, n, k) = (4096, 6656, 16384);
//! let a_shard = Tensor::<bf16>::zeros([m / w, k])?;
//! let b = Tensor::<bf16>::zeros([k, n])?;
//! let out = Tensor::<bf16>::empty([m, n])?;
//! let opts = OpOptions::default().async_op(true);
//! let mut ws = ops::all_gather_matmul(&pg, &out, &a_shard, &b, GatherDim::Rows, &opts, None)?;
//! for _ in 0..10 {
//!     ws = ops::all_gather_matmul(&pg, &out, &a_shard, &b, GatherDim::Rows, &opts, Some(ws))?;
//! }
//! pg.synchronize("the matmuls")?;
//! # Ok(()) }
//! ```

mod all_gather_matmul;
pub(crate) mod check;
mod epilogue;
pub mod kernels;
mod matmul_all_gather;
pub mod plan;
mod reduce;
mod unfused;
mod workspace;

pub use all_gather_matmul::all_gather_matmul;
pub use matmul_all_gather::matmul_all_gather;
pub use reduce::{matmul_all_reduce, matmul_reduce_scatter};
pub use workspace::Workspace;

use crate::{bf16, Config, Tensor};
use tilefuse_runtime::dist::ProcessGroup;

#[doc(no_inline)]
pub use tilefuse_runtime::dist::Exchange;

/// A bias added in the op's epilogue (see the module docs for how often).
#[derive(Clone, Copy, Debug, Default)]
pub enum Bias<'a> {
    #[default]
    None,
    /// One value per output row: length M of the product this rank computes.
    Rows(&'a Tensor<bf16>),
    /// One value per output column: length N.
    Cols(&'a Tensor<bf16>),
}

/// How an op runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Time the fused and the unfused path on the first call (every rank the
    /// same choice: the slower rank's times decide) and keep the faster.
    #[default]
    Auto,
    /// The overlapped tilefuse schedule (one node only).
    Fused,
    /// NCCL + cuBLAS (+ a bias kernel), one after the other.
    Unfused,
}

/// Along which dimension `all_gather_matmul`'s A is sharded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GatherDim {
    /// `a_shard[M/w, K]`, rank `r` holding rows `r·M/w ..` (PyTorch's async-TP).
    Rows,
    /// `a_shard[M, K/w]`, rank `r` holding columns `r·K/w ..` (the fused-ops API).
    Cols,
}

/// Along which dimension `matmul_reduce_scatter` scatters its output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ScatterDim {
    /// `out[M/w, N]`: rank `r` gets rows `r·M/w ..`.
    Rows,
    /// `out[M, N/w]`: rank `r` gets columns `r·N/w ..`.
    #[default]
    Cols,
}

/// How the fused `matmul_all_reduce` sums the ranks' partial products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AllReduceVariant {
    /// Each rank's GEMM computes its whole partial product in one launch, and
    /// the backend pushes each chunk to every peer as it is done; a last pass
    /// adds the peers' partials and applies the epilogue. Moves `(w − 1)·M·N`
    /// elements per rank. Slower than the ring on 2×H200 at 4096×6656×16384
    /// (0.843 against 0.802 ms) and 8192³ (1.301 against 1.141 ms): the doubled
    /// NVLink traffic and the last pass cost more than whole-product GEMMs gain.
    OneShot,
    /// A ring over row slabs (the default): `w` GEMMs of one slab each, each adding the
    /// partial the previous rank pushed; then every finished slab pushed to
    /// every peer. Moves `2·(w − 1)/w·M·N` elements per rank, but its
    /// per-slab GEMMs lose efficiency to partial last waves.
    Ring,
}

/// How the fused `matmul_all_gather` moves each rank's rows to its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GatherVariant {
    /// The GEMM's epilogue stores each tile into every peer's buffer too
    /// (NVLink stores, spread over the GEMM), and each rank then copies the
    /// peers' rows into `out` from its own memory. At most 4 ranks (the GEMM
    /// stores 3 copies at most). Meant for GEMMs of about one wave, whose tiles
    /// all finish at once, so that the copy engine's pulls all come after
    /// them; not yet timed on GPUs, hence not the default.
    PeerStores,
    /// The GEMM stores into a staging buffer of its own and counts its finished
    /// chunks of rows; the backend stream pulls each chunk of every peer's with
    /// the copy engine as it is done. The default.
    CopyEngine,
}

/// Tuning knobs of an op.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OpConfig {
    pub algorithm: Algorithm,
    /// Chunks each transfer is cut into (each with its own flag), so a GEMM starts
    /// on the first while the rest are in flight; rounded to whole bands of 256
    /// rows. `None`: 2 for the ring all-reduce, 4 for the others. An all-gather
    /// matmul of few rows pulls bands of columns instead ([`chunks_along_k`]):
    /// this many bands of whole 64-column k-tiles, 8 by default.
    pub chunks: Option<usize>,
    /// Whether `all_gather_matmul` along rows pulls A in bands of columns
    /// (waited for per k-tile) rather than of rows; `None`: as
    /// [`chunks_along_k`] says for the shape and the GPU.
    pub chunks_along_k: Option<bool>,
    /// The fused path's GEMM config; `None`: the kernels' own (default or tuned).
    pub gemm: Option<Config>,
    /// `matmul_all_reduce`'s fused variant; `None`: the ring.
    pub all_reduce: Option<AllReduceVariant>,
    /// `matmul_all_gather`'s fused variant; `None`: the copy engine.
    pub gather: Option<GatherVariant>,
}

/// What every op takes besides its tensors.
#[derive(Clone, Debug, Default)]
pub struct OpOptions<'a> {
    pub bias: Bias<'a>,
    /// `false`: the call returns once every rank finished it; `true`: once queued.
    pub async_op: bool,
    pub config: OpConfig,
}

impl<'a> OpOptions<'a> {
    pub fn bias(mut self, bias: Bias<'a>) -> Self {
        self.bias = bias;
        self
    }

    pub fn async_op(mut self, async_op: bool) -> Self {
        self.async_op = async_op;
        self
    }

    /// `matmul_all_reduce`'s fused variant (see [`AllReduceVariant`]).
    pub fn all_reduce(mut self, variant: AllReduceVariant) -> Self {
        self.config.all_reduce = Some(variant);
        self
    }

    /// `matmul_all_gather`'s fused variant (see [`GatherVariant`]).
    pub fn gather(mut self, variant: GatherVariant) -> Self {
        self.config.gather = Some(variant);
        self
    }

    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.config.algorithm = algorithm;
        self
    }

    pub fn chunks(mut self, chunks: usize) -> Self {
        self.config.chunks = Some(chunks);
        self
    }

    /// See [`OpConfig::chunks_along_k`].
    pub fn chunks_along_k(mut self, along_k: bool) -> Self {
        self.config.chunks_along_k = Some(along_k);
        self
    }
    pub fn gemm_config(mut self, config: Config) -> Self {
        self.config.gemm = Some(config);
        self
    }
}

/// Whether a GEMM of `m × n` on `sms` SMs is better fed by an all-gather in
/// bands of columns (K) than in bands of rows: when its 128×256 tiles make
/// one wave. Then every tile starts at once, and with bands of rows the tiles
/// of peers' rows wait for whole shards before their first MMA; with bands of
/// columns each waits per k-tile and all run on the first columns while the
/// later ones arrive. From the second wave on, the tile order finishes this
/// rank's rows first and the peers' in the order they arrive (a rank's rows at
/// a time), which bands of rows feed best. The per-k-tile test runs on a warp
/// of its own and costs the GEMM under 1%. Measured with the seed (N 6656,
/// K 16384) on 2 and 4 H200: columns faster at 512 rows (one wave; 4 ranks
/// 1.58× the GEMM alone against 1.90×), rows at 1024 and 2048 (4 ranks 1.28×
/// against 1.43×, 1.18× against 1.33×; level on 2 ranks) and above. The
/// all-gather matmul and the seed example use it.
pub fn chunks_along_k(m: usize, n: usize, sms: usize) -> bool {
    m.div_ceil(128) * n.div_ceil(256) <= sms.max(1)
}

/// SMs that should copy an all-gather feeding a GEMM of `m × n` on `sms` SMs
/// ([`crate::runtime::dist::AllGather::copy_with_sms`]), or 0 for the copy
/// engine: 16 where the Hopper default's tiles ([`crate::codegen::hopper_tiles_for`])
/// make one wave with 16 SMs to spare, so the copies take no SM the GEMM would
/// use. SM copies pull faster
/// than the copy engine (24 MiB into an H200 from 3 peers in 0.10 ms against
/// 0.19), but a GEMM of more waves loses more on the SMs it gives up than the
/// copies win. Measured with the seed (N 6656, K 16384) on H200s, each pair in
/// one call: 512 rows on 4 ranks 0.94× NCCL + cuBLAS against 1.12× with the
/// copy engine (1.32× the GEMM alone against 1.59×), on 2 ranks 0.89× against
/// 0.92×; 1024 rows on 4 ranks 1.64× the GEMM alone against 1.54×.
pub fn copy_sms_for(m: usize, n: usize, sms: usize) -> usize {
    const COPY_SMS: usize = 16;
    let tiles = crate::codegen::hopper_tiles_for(m, n, sms).count(m, n);
    match tiles.saturating_add(COPY_SMS) <= sms {
        true => COPY_SMS,
        false => 0,
    }
}

/// Runs a call on the path `opts` asks for (timing both first for `Auto`),
/// then ends it as `async_op` asks: with `false`, this rank's GPU work is done
/// and every rank got this far.
fn run_call(
    mut ws: Workspace,
    pg: &ProcessGroup,
    op: &str,
    opts: &OpOptions<'_>,
    mut run: impl FnMut(&mut Workspace, Algorithm) -> crate::Result<()>,
) -> crate::Result<Workspace> {
    let path = ws.path(pg, opts.config.algorithm, &mut run)?;
    run(&mut ws, path)?;
    if !opts.async_op {
        pg.synchronize(op)?;
        pg.barrier(op)?;
    }
    Ok(ws)
}

/// Runs `f` with `def` launched under `config` when one is given.
fn with_gemm_config<R>(
    def: &crate::KernelDef,
    config: &Option<Config>,
    f: impl FnOnce() -> R,
) -> R {
    match config {
        Some(c) => def.with_config(c.clone(), f),
        None => f(),
    }
}

#[cfg(test)]
mod tests {
    /// The measured shapes on an H200's 132 SMs fall where they ran faster.
    #[test]
    fn bands_of_columns_for_one_wave() {
        for (m, cols) in [
            (512, true),
            (1024, false),
            (2048, false),
            (4096, false),
            (8192, false),
        ] {
            assert_eq!(super::chunks_along_k(m, 6656, 132), cols, "{m} rows");
        }
    }

    #[test]
    fn sms_copy_only_beside_a_gemm_of_one_wave_with_room() {
        for (m, sms) in [(512, 16), (1024, 0), (2048, 0), (8192, 0)] {
            assert_eq!(super::copy_sms_for(m, 6656, 132), sms, "{m} rows");
        }
        // One wave, but no room for the copies beside it: 104 tiles on 110
        // SMs, and 128 tiles of 128×128 (the default's there) on 132.
        assert_eq!(super::copy_sms_for(512, 6656, 110), 0);
        assert_eq!(super::copy_sms_for(1024, 2048, 132), 0);
    }
}
