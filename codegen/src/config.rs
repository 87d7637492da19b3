//! Launch and lowering parameters: block sizes, warps, pipeline stages, tile order.

use crate::plan::Planned;
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
///
/// A JSON config (`--config`, the tuner's cache) needs its block sizes; the
/// fields it leaves out take [`Config::new`]'s values:
///
/// ```
/// use tilefuse_codegen::Config;
/// let c: Config = serde_json::from_str(r#"{"block_sizes":[128,256,64],"num_warps":8}"#).unwrap();
/// assert_eq!(c, Config::new(&[128, 256, 64]).num_warps(8));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Config {
    pub block_sizes: Vec<usize>,
    /// Warps a block (4 where a JSON config leaves it out, as [`Config::new`]).
    #[serde(default = "four")]
    pub num_warps: usize,
    /// Tiles of a loop's loads in flight: the matmul paths' shared-memory
    /// ring; in the general lowering 1 (each tile loaded at its step) or 2
    /// and more (the next tile's loads issued before this one computes).
    /// 3 where a JSON config leaves it out.
    #[serde(default = "three")]
    pub num_stages: usize,
    /// Output tiles are visited in groups of this many tile rows, so blocks that run
    /// together share rows of A and columns of B in L2. 8 where a JSON config
    /// leaves it out.
    #[serde(default = "eight")]
    pub group_m: usize,
    /// Matmuls and attention: the Hopper path (TMA + `wgmma`, sm_90a only);
    /// `num_warps` then counts the consumer warps, and a producer warpgroup comes
    /// on top. Attention takes 16 rows a consumer warp, a key block that is a
    /// multiple of 16, and 2 to 4 stages of `k` and `v`.
    #[serde(default)]
    pub wgmma: bool,
    /// Hopper matmuls and the Hopper attention program's forward: a persistent
    /// grid (one wave of blocks, each looping over output tiles), so the producer
    /// loads the next tile while the consumers run the epilogue; otherwise one
    /// block per tile.
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
    ///
    /// On a persistent attention forward (with [`Config::persistent`]): the
    /// tiles of the last wave and the remainder share their key steps the same
    /// way, a split tile's two parts combining their online-softmax states
    /// through scratch; the key loop must be exactly the online softmax and
    /// every tile must walk the same keys (no causal order), else lowering
    /// says so. The default from 4096 keys where it applies.
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
    /// the default's four stages still fit on an H100/H200. On the Hopper
    /// attention program with an atomic product (the one-pass backward's dQ):
    /// each step's product staged in shared memory and added by the TMA unit
    /// (`cp.reduce.async.bulk.tensor … .add`) instead of by every thread
    /// (32 KB of staging at head dimension 128: two stages fit beside it).
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
    /// Hopper attention: a tile's softmax runs while the previous tile's
    /// `p·v` is still on the tensor cores (two `wgmma` groups a step, the
    /// output waited for only where the softmax rescales it), as
    /// FlashAttention-3 overlaps them within a warpgroup.
    #[serde(default)]
    pub overlap: bool,
    /// Row kernels and the general lowering: the resident threads per SM the
    /// launch bounds ask for, which caps each thread's registers at
    /// `65536 / occupancy`. More threads keep more loads in flight; fewer leave
    /// registers for wide rows. 0: derived by the lowering (the row lowering
    /// from the registers the kernel's loads hold; the general one asks for
    /// 1536 threads where it stages gathered rows, else for one block).
    #[serde(default)]
    pub occupancy: usize,
    /// General kernels whose first tile loop only accumulates (a column sum's
    /// walk down the rows): at most this many programs share each grid
    /// tile's loop, each a contiguous share of its tiles, the last to finish
    /// combining the shares in order. The runtime picks how many at launch,
    /// enough to fill the GPU. 0 or 1: each program walks its whole loop.
    #[serde(default)]
    pub split: usize,
    /// Lower with the general lowering even where a fast path takes the
    /// kernel ([`crate::Planned::for_config`]). A fast path whose kernels the
    /// general lowering may run faster (the row lowering) has the tuner try
    /// the general lowering's default beside its own configs
    /// ([`crate::ConfigSpace::seeds`]), so the faster of the two is kept.
    #[serde(default)]
    pub general: bool,
}

fn one() -> usize {
    1
}

fn three() -> usize {
    3
}

fn four() -> usize {
    4
}

fn eight() -> usize {
    8
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
            overlap: false,
            occupancy: 0,
            split: 0,
            general: false,
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

    /// [`Config::overlap`].
    pub fn overlap(mut self, on: bool) -> Config {
        self.overlap = on;
        self
    }

    /// The most programs that share a reduction loop; see [`Config::split`].
    pub fn split(mut self, ways: usize) -> Config {
        self.split = ways;
        self
    }

    /// Resident threads per SM for a row kernel; see [`Config::occupancy`].
    /// The general lowering whatever the registry would choose; see [`Config::general`].
    pub fn general(mut self, on: bool) -> Config {
        self.general = on;
        self
    }

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
        if self.overlap {
            write!(f, ", overlap")?;
        }
        if self.occupancy != 0 {
            write!(f, ", occupancy={}", self.occupancy)?;
        }
        if self.general {
            write!(f, ", general")?;
        }
        if self.split > 1 {
            write!(f, ", split={}", self.split)?;
        }
        Ok(())
    }
}

/// [`default_config`] fitted to a GPU that allows `shared_limit` bytes of shared
/// memory per block: a matmul drops pipeline stages (down to 2) until its ring
/// fits, so an A100 (164 KB) runs the default 128x256x64 blocks with 3 stages.
pub fn default_config_within(kernel: &Planned, shared_limit: usize) -> Config {
    kernel
        .chosen()
        .default_within(kernel, default_config(kernel), shared_limit)
}

/// What the lowering may use on the GPU in hand (facts, no device handle).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    /// Shared memory one block may use, in bytes.
    pub shared_limit: usize,
    /// The Hopper instructions (TMA, `wgmma`, `setmaxnreg`: sm_90a).
    pub wgmma: bool,
    /// Streaming multiprocessors: the blocks of one wave, a block per SM, for
    /// the Hopper matmul default's tiles ([`crate::hopper_tiles`]); 0 when
    /// not known.
    pub sms: usize,
}

/// The config a launch uses without tuning when its extents are not known:
/// [`default_config_at`] with none.
pub fn default_config_for(kernel: &Planned, spec: &crate::spec::Spec, target: Target) -> Config {
    default_config_at(kernel, spec, target, &[])
}

/// The config a launch of these extents (`extents[d]`: dimension `d`'s, where
/// known) uses without tuning, by the lowering the kernel takes: on a
/// [`Target`] with `wgmma`, a matmul's or attention kernel's Hopper program
/// when this specialization can take it (a matmul's with tiles that keep the
/// SMs busy, [`crate::hopper_tiles`], and the TMA-store epilogue where the
/// output takes it, [`Config::tma_store`]), else [`default_config_within`].
/// Row kernels and `whole(…)` tiles are fitted to the extents afterwards
/// ([`crate::fit_default`], [`crate::fit_whole_dims`]).
pub fn default_config_at(
    kernel: &Planned,
    spec: &crate::spec::Spec,
    target: Target,
    extents: &[Option<usize>],
) -> Config {
    let specialized = kernel.specialize(&spec.constexprs);
    let kernel = specialized.as_deref().unwrap_or(kernel);
    kernel.chosen().default_at(kernel, spec, target, extents)
}

/// A config that works for `kernel` without tuning, the default of the
/// lowering it takes.
///
/// Matmul kernels get 128x256x64 blocks (M x N x K), 8 warps (64x64 warp tiles)
/// and 4 stages: 192 KB of shared memory, the fastest of the swept configs on an
/// H200 at large shapes (docs/PERFORMANCE.md). GPUs with less shared memory per
/// block get fewer stages: see [`default_config_within`]. Kernels the general
/// lowering takes get its default ([`crate::emit::general::default_config`]).
pub fn default_config(kernel: &Planned) -> Config {
    kernel.chosen().default_config(kernel)
}
