//! Launch and lowering parameters: block sizes, warps, pipeline stages, tile order.

use crate::fit::HopperTiles;
use serde::{Deserialize, Serialize};

/// How a kernel is lowered: one block size per tile dimension (in order of
/// appearance in the source), warps per block, `cp.async` pipeline stages and the
/// L2-friendly grouping of output tiles.
///
/// ```
/// use tilefuse_codegen::Config;
/// let c = Config::new(&[128, 256, 64]).num_warps(8).num_stages(3);
/// assert_eq!(c.block_sizes, vec![128, 256, 64]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Config {
    pub block_sizes: Vec<usize>,
    pub num_warps: usize,
    pub num_stages: usize,
    /// Output tiles are visited in groups of this many tile rows, so blocks that run
    /// together share rows of A and columns of B in L2.
    pub group_m: usize,
    /// Matmuls and attention: the Hopper path (TMA + `wgmma`, sm_90a only);
    /// `num_warps` then counts the consumer warps, and a producer warpgroup comes
    /// on top. Attention takes 16 rows a consumer warp, a key block that is a
    /// multiple of 16, and 2 to 4 stages of `k` and `v`.
    #[serde(default)]
    pub wgmma: bool,
    /// Hopper matmuls: a persistent grid (one block per SM, each looping over output
    /// tiles), so the producer loads the next tile while the consumers run the
    /// epilogue; otherwise one block per tile.
    #[serde(default)]
    pub persistent: bool,
    /// Hopper matmuls: blocks per thread-block cluster along M (1 or 2). A pair of
    /// blocks computes vertically adjacent tiles, and each loads half of their
    /// common B tile for both (TMA multicast): a third less L2 traffic.
    #[serde(default = "one")]
    pub cluster_m: usize,
    /// Matmuls whose operands are not 16-byte aligned (an odd row length, an
    /// offset view): the runtime copies those operands into aligned scratch before
    /// the launch, so they load with TMA or 16-byte copies instead of 2 or 4 bytes
    /// at a time. Costs a read and a write of each copied operand and the scratch;
    /// does nothing when the operands are aligned. See [`crate::staging`].
    #[serde(default)]
    pub stage: bool,
    /// Hopper matmuls: the output tiles left over after the last whole wave share
    /// their K iterations evenly among one wave of programs (stream-K), a program
    /// crossing from one tile into the next; partial sums meet in scratch and
    /// are added in a fixed order. Without it such a partial wave is split along
    /// K only when it leaves half the SMs idle or more. See `runtime::split_tail`.
    #[serde(default)]
    pub stream_k: bool,
    /// Hopper matmuls: the epilogue writes the output tile into shared memory
    /// and the TMA unit stores it (`cp.async.bulk.tensor`), instead of every
    /// thread storing its fragments to global memory: far fewer store
    /// instructions, and the consumers go on to the next tile while the TMA
    /// unit writes. Needs a bf16/f16 output stored as the whole `[M, N]` tile,
    /// with 16-byte aligned rows (a `signal` after the store then waits until
    /// the TMA unit has written the tile); takes 16 KB
    /// of shared memory per consumer warpgroup (two 64 × 64 staging boxes), so
    /// the default's four stages still fit on an H100/H200.
    #[serde(default)]
    pub tma_store: bool,
    /// Hopper matmuls, with a persistent grid and two consumer warpgroups: each
    /// warpgroup computes whole tiles of its own (the M block is 64 or 128 rows,
    /// one or two `wgmma` rows of 64), and the two take the block's tiles in
    /// turn, so one warpgroup's epilogue runs while the other's K loop keeps the
    /// tensor cores busy ("ping-pong"). Without it both warpgroups share each
    /// tile (64 rows each) and the tensor cores wait out every epilogue.
    #[serde(default)]
    pub pingpong: bool,
    /// Row kernels (reductions): the resident threads per SM the launch bounds ask
    /// for, which caps each thread's registers at `65536 / occupancy`. More
    /// threads keep more loads in flight; fewer leave registers for wide rows.
    /// 0: derived from the registers the kernel's loads hold.
    #[serde(default)]
    pub occupancy: usize,
}

fn one() -> usize {
    1
}

impl Config {
    pub fn new(block_sizes: &[usize]) -> Config {
        Config {
            block_sizes: block_sizes.to_vec(),
            num_warps: 4,
            num_stages: 3,
            group_m: 8,
            wgmma: false,
            persistent: false,
            cluster_m: 1,
            stage: false,
            stream_k: false,
            tma_store: false,
            pingpong: false,
            occupancy: 0,
        }
    }

    pub fn num_warps(mut self, w: usize) -> Config {
        self.num_warps = w;
        self
    }

    pub fn num_stages(mut self, s: usize) -> Config {
        self.num_stages = s;
        self
    }

    pub fn group_m(mut self, g: usize) -> Config {
        self.group_m = g;
        self
    }

    /// The Hopper (`wgmma`) lowering for a matmul or attention; see [`Config::wgmma`].
    pub fn wgmma(mut self, on: bool) -> Config {
        self.wgmma = on;
        self
    }

    /// A persistent grid on the Hopper path; see [`Config::persistent`].
    pub fn persistent(mut self, on: bool) -> Config {
        self.persistent = on;
        self
    }

    /// Blocks per cluster along M on the Hopper path; see [`Config::cluster_m`].
    pub fn cluster_m(mut self, n: usize) -> Config {
        self.cluster_m = n;
        self
    }

    /// Copies of unaligned matmul operands; see [`Config::stage`].
    pub fn stage(mut self, on: bool) -> Config {
        self.stage = on;
        self
    }

    /// Stream-K for the last partial wave of a Hopper matmul; see [`Config::stream_k`].
    pub fn stream_k(mut self, on: bool) -> Config {
        self.stream_k = on;
        self
    }

    /// The TMA-store epilogue of a Hopper matmul; see [`Config::tma_store`].
    pub fn tma_store(mut self, on: bool) -> Config {
        self.tma_store = on;
        self
    }

    /// Tiles taken in turn by the consumer warpgroups of a Hopper matmul; see
    /// [`Config::pingpong`].
    pub fn pingpong(mut self, on: bool) -> Config {
        self.pingpong = on;
        self
    }

    /// Resident threads per SM for a row kernel; see [`Config::occupancy`].
    pub fn occupancy(mut self, threads: usize) -> Config {
        self.occupancy = threads;
        self
    }

    /// Threads per block.
    pub fn threads(&self) -> usize {
        self.num_warps * 32
    }
}

impl std::fmt::Display for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "block_sizes={:?}, num_warps={}, num_stages={}, group_m={}{}{}",
            self.block_sizes,
            self.num_warps,
            self.num_stages,
            self.group_m,
            if self.wgmma { ", wgmma" } else { "" },
            if self.persistent { ", persistent" } else { "" }
        )?;
        if self.cluster_m != 1 {
            write!(f, ", cluster_m={}", self.cluster_m)?;
        }
        if self.stage {
            write!(f, ", stage")?;
        }
        if self.stream_k {
            write!(f, ", stream_k")?;
        }
        if self.tma_store {
            write!(f, ", tma_store")?;
        }
        if self.pingpong {
            write!(f, ", pingpong")?;
        }
        if self.occupancy != 0 {
            write!(f, ", occupancy={}", self.occupancy)?;
        }
        Ok(())
    }
}

/// [`default_config`] fitted to a GPU that allows `shared_limit` bytes of shared
/// memory per block: a matmul drops pipeline stages (down to 2) until its ring
/// fits, so an A100 (164 KB) runs the default 128x256x64 blocks with 3 stages.
pub fn default_config_within(kernel: &crate::ir::Kernel, shared_limit: usize) -> Config {
    let mut c = default_config(kernel);
    if let crate::plan::Shape::Gemm(g) = crate::plan::classify(kernel) {
        let b = &c.block_sizes;
        // The GEMM's ring of stages, bf16/f16 operands (see emit::gemm).
        let per_stage = (b[g.m] * b[g.k] + b[g.k] * b[g.n]) * 2;
        while c.num_stages > 2 && c.num_stages * per_stage > shared_limit {
            c.num_stages -= 1;
        }
    }
    c
}

/// What the lowering may use on the GPU in hand (facts, no device handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Shared memory one block may use, in bytes.
    pub shared_limit: usize,
    /// The Hopper instructions (TMA, `wgmma`, `setmaxnreg`: sm_90a).
    pub wgmma: bool,
    /// Streaming multiprocessors: the blocks of one wave, a block per SM, for
    /// the Hopper matmul default's tiles ([`crate::fit::hopper_tiles`]); 0 when
    /// not known.
    pub sms: usize,
}

/// The Hopper path's default matmul config for `tiles` (see [`HopperTiles`]),
/// two consumer warpgroups, 64 K a step, a persistent grid:
/// - [`HopperTiles::Pairs`]: 128x256 blocks, 4 stages (3 where shared memory is
///   short), in pairs that share B tiles through multicast, the fastest of the
///   Hopper configs measured on an H200 at large bf16 shapes; with the
///   TMA-store epilogue ([`default_config_for`] adds it where the output
///   allows) 100-108% of cuBLAS there (docs/PERFORMANCE.md);
/// - [`HopperTiles::Wide`]: the same blocks without the pairs;
/// - [`HopperTiles::Narrow`]: 128x128 blocks, 6 stages (fewer where shared
///   memory is short).
pub fn default_wgmma_config(
    kernel: &crate::ir::Kernel,
    shared_limit: usize,
    tiles: HopperTiles,
) -> Option<Config> {
    let crate::plan::Shape::Gemm(g) = crate::plan::classify(kernel) else {
        return None;
    };
    let (bn, max_stages, cluster) = match tiles {
        HopperTiles::Pairs => (256, 4, 2),
        HopperTiles::Wide => (256, 4, 1),
        HopperTiles::Narrow => (128, 6, 1),
    };
    let mut bs = vec![64; kernel.dims.len()];
    bs[g.m] = 128;
    bs[g.n] = bn;
    bs[g.k] = 64;
    let per_stage = (128 + bn) * 64 * 2;
    let stages = (2..=max_stages)
        .rev()
        .find(|s| s * per_stage + 2048 <= shared_limit)?;
    Some(
        Config::new(&bs)
            .num_warps(8)
            .num_stages(stages)
            .wgmma(true)
            .persistent(true)
            .cluster_m(cluster),
    )
}

/// The Hopper attention program's default (FlashAttention-3's shape for head
/// dimensions up to 128): two consumer warpgroups of 64 query rows, 128 keys a
/// step, three stages of `k` and `v` (a stage is released one tile late, when
/// its `p·v` completes with the next tile's `q·kᵀ`: with two, every tile waited
/// for its loads, 430 TFLOP/s against 544 at batch 8 × 16 heads × 4096 × 128 on
/// an H200). [`crate::fit::fit_whole_dims`] takes 64 keys a step and two stages for head
/// dimensions past 128 (the output accumulators and the tiles grow).
pub fn default_wgmma_attention(kernel: &crate::ir::Kernel) -> Option<Config> {
    let crate::plan::Shape::Attention(a) = crate::plan::classify(kernel) else {
        return None;
    };
    let mut bs = vec![1; kernel.dims.len()];
    bs[a.m] = 128;
    bs[a.n] = 128;
    bs[a.d] = 128;
    Some(Config::new(&bs).num_warps(8).num_stages(3).wgmma(true))
}

/// The config a launch uses without tuning when its extents are not known:
/// [`default_config_at`] with none.
pub fn default_config_for(
    kernel: &crate::ir::Kernel,
    spec: &crate::spec::Spec,
    target: Target,
) -> Config {
    default_config_at(kernel, spec, target, &[])
}

/// The config a launch of these extents (`extents[d]`: dimension `d`'s, where
/// known) uses without tuning: on a [`Target`] with `wgmma`, the Hopper path
/// when this specialization can take it (16-bit operands with rows TMA can
/// load, or that can be staged into such rows: [`Config::stage`]), with tiles
/// that keep the SMs busy ([`crate::fit::hopper_tiles`]) and the TMA-store
/// epilogue where the output takes it ([`Config::tma_store`]), else
/// [`default_config_within`]. Row kernels and `whole(…)` tiles are fitted to
/// the extents afterwards ([`crate::fit_default`], [`crate::fit_whole_dims`]).
pub fn default_config_at(
    kernel: &crate::ir::Kernel,
    spec: &crate::spec::Spec,
    target: Target,
    extents: &[Option<usize>],
) -> Config {
    let specialized = kernel.specialize(&spec.constexprs);
    let kernel = specialized.as_deref().unwrap_or(kernel);
    if target.wgmma {
        if let Some(c) = default_wgmma_attention(kernel) {
            if crate::emit::lower(kernel, spec, &c).is_ok() {
                return c;
            }
        }
        // The TMA-store epilogue where the output allows it and it fits:
        // faster at every shape measured, 1.006-1.41x on an H200
        // (docs/PERFORMANCE.md, session 14).
        let with_tma = |c: Config| {
            let t = c.clone().tma_store(true);
            match crate::emit::lower(kernel, spec, &t) {
                Ok(l) if l.shared_bytes as usize <= target.shared_limit => t,
                _ => c,
            }
        };
        let hopper = |tiles| {
            let c = default_wgmma_config(kernel, target.shared_limit, tiles)?;
            if crate::emit::lower(kernel, spec, &c).is_ok() {
                return Some(with_tma(c));
            }
            // Operands TMA cannot load as they are: copied into aligned scratch,
            // the Hopper path still beats the portable one's narrow loads by far.
            let staged = c.stage(true);
            (!crate::staging::unaligned_operands(kernel, spec).is_empty()
                && crate::emit::lower(kernel, spec, &staged).is_ok())
            .then(|| with_tma(staged))
        };
        let tiles = crate::fit::hopper_tiles(kernel, extents, target.sms);
        if let Some(c) = hopper(tiles).or_else(|| hopper(HopperTiles::Pairs)) {
            return c;
        }
    }
    default_config_within(kernel, target.shared_limit)
}

/// A config that works for `kernel` without tuning.
///
/// Matmul kernels get 128x256x64 blocks (M x N x K), 8 warps (64x64 warp tiles)
/// and 4 stages: 192 KB of shared memory, the fastest of the swept configs on an
/// H200 at large shapes (docs/PERFORMANCE.md). GPUs with less shared memory per
/// block get fewer stages: see [`default_config_within`]. Other kernels take
/// the general lowering's default ([`crate::emit::general::default_config`]).
pub fn default_config(kernel: &crate::ir::Kernel) -> Config {
    use crate::plan::{classify, Shape};
    match classify(kernel) {
        Shape::Gemm(g) => {
            let mut bs = vec![64; kernel.dims.len()];
            bs[g.m] = 128;
            bs[g.n] = 256;
            bs[g.k] = 64;
            Config::new(&bs).num_warps(8).num_stages(4)
        }
        Shape::Attention(a) => {
            // FlashAttention-2's shape for head dimensions up to 128: 4 warps of
            // 32 query rows, 64 keys a step.
            let mut bs = vec![1; kernel.dims.len()];
            bs[a.m] = 128;
            bs[a.n] = 64;
            bs[a.d] = 128;
            Config::new(&bs).num_warps(4)
        }
        Shape::Rows => {
            // A warp per row, 1024 columns per step: 32 values a thread (bf16),
            // loaded 16 bytes at a time; one pass for rows of up to 1024.
            let bs: Vec<usize> = (0..kernel.dims.len())
                .map(|d| if kernel.grid.contains(&d) { 4 } else { 1024 })
                .collect();
            Config::new(&bs).num_warps(4)
        }
        Shape::General => crate::emit::general::default_config(kernel, &[]),
    }
}
