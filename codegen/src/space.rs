//! The autotuner's search space, derived from a kernel's IR: which block sizes,
//! warps, stages and tile-order groupings a kernel of this shape can use, which of
//! them fit a GPU (shared memory, registers, the lowering's own rules), a set of
//! proven starting points, and the neighbours of a config for a local search.
//! No GPU here: the runtime's tuner measures what this proposes.

use crate::config::{default_config_at, default_config_for, Config, Target};
use crate::emit::lower;
use crate::fit::HopperTiles;
use crate::ir::Kernel;
use crate::plan::{classify, AttentionShape, GemmShape, Shape};
use crate::spec::Spec;

/// One tunable parameter and its values, in increasing order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Axis {
    /// The block size of tile dimension `dim`.
    Block {
        dim: usize,
        values: Vec<usize>,
    },
    Warps(Vec<usize>),
    Stages(Vec<usize>),
    GroupM(Vec<usize>),
    /// Hopper matmuls: one block per tile (0) or a persistent grid (1).
    Persistent,
    /// Hopper matmuls: blocks per cluster along M (B tiles multicast in a pair).
    ClusterM(Vec<usize>),
    /// Hopper matmuls: the last partial wave split as the runtime's split tail
    /// does (0), or shared by one wave of programs, stream-K (1); see
    /// [`Config::stream_k`].
    StreamK,
    /// Matmuls with unaligned operands: load them as they are (0) or copy them
    /// into aligned scratch first (1); see [`Config::stage`].
    Stage,
    /// Hopper matmuls: the epilogue stores fragments (0) or stages boxes for
    /// the TMA unit to store (1); see [`Config::tma_store`].
    TmaStore,
    /// Hopper matmuls: the consumer warpgroups share each tile (0) or take
    /// whole tiles in turn (1); see [`Config::pingpong`].
    PingPong,
    /// Row kernels: resident threads per SM (0: derived); see [`Config::occupancy`].
    Occupancy(Vec<usize>),
}

impl Axis {
    fn values(&self) -> &[usize] {
        match self {
            Axis::Block { values, .. } | Axis::Warps(values) => values,
            Axis::Stages(v) | Axis::GroupM(v) | Axis::ClusterM(v) | Axis::Occupancy(v) => v,
            Axis::Persistent | Axis::Stage | Axis::StreamK | Axis::TmaStore | Axis::PingPong => {
                &[0, 1]
            }
        }
    }

    fn get(&self, c: &Config) -> usize {
        match self {
            Axis::Block { dim, .. } => c.block_sizes[*dim],
            Axis::Warps(_) => c.num_warps,
            Axis::Stages(_) => c.num_stages,
            Axis::GroupM(_) => c.group_m,
            Axis::Persistent => usize::from(c.persistent),
            Axis::ClusterM(_) => c.cluster_m,
            Axis::Stage => usize::from(c.stage),
            Axis::StreamK => usize::from(c.stream_k),
            Axis::TmaStore => usize::from(c.tma_store),
            Axis::PingPong => usize::from(c.pingpong),
            Axis::Occupancy(_) => c.occupancy,
        }
    }

    fn set(&self, c: &mut Config, v: usize) {
        match self {
            Axis::Block { dim, .. } => c.block_sizes[*dim] = v,
            Axis::Warps(_) => c.num_warps = v,
            Axis::Stages(_) => c.num_stages = v,
            Axis::GroupM(_) => c.group_m = v,
            Axis::Persistent => c.persistent = v != 0,
            Axis::ClusterM(_) => c.cluster_m = v,
            Axis::Stage => c.stage = v != 0,
            Axis::StreamK => c.stream_k = v != 0,
            Axis::TmaStore => c.tma_store = v != 0,
            Axis::PingPong => c.pingpong = v != 0,
            Axis::Occupancy(_) => c.occupancy = v,
        }
    }

    /// The parameter's name, for logs.
    pub fn name(&self) -> String {
        match self {
            Axis::Block { dim, .. } => format!("block_sizes[{dim}]"),
            Axis::Warps(_) => "num_warps".into(),
            Axis::Stages(_) => "num_stages".into(),
            Axis::GroupM(_) => "group_m".into(),
            Axis::Persistent => "persistent".into(),
            Axis::ClusterM(_) => "cluster_m".into(),
            Axis::Stage => "stage".into(),
            Axis::StreamK => "stream_k".into(),
            Axis::TmaStore => "tma_store".into(),
            Axis::PingPong => "pingpong".into(),
            Axis::Occupancy(_) => "occupancy".into(),
        }
    }
}

/// The configs a kernel can be tuned over on one GPU.
///
/// ```
/// # use tilefuse_codegen::ir::Kernel;
/// # fn demo(kernel: &Kernel, spec: &tilefuse_codegen::Spec) {
/// let target = tilefuse_codegen::Target { shared_limit: 227 * 1024, wgmma: true, sms: 132 };
/// let space = tilefuse_codegen::ConfigSpace::new(kernel, spec, target);
/// let seeds = space.seeds(spec, true); // proven configs that fit, the default first
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ConfigSpace {
    kernel: Kernel,
    /// The specialization and GPU the space was made for (the default's inputs).
    spec: Spec,
    target: Target,
    /// The Hopper tiles of the launch's extents ([`ConfigSpace::with_extents`]).
    tiles: HopperTiles,
    axes: Vec<Axis>,
    default: Config,
    gemm: Option<GemmShape>,
    /// Some matmul operand is unaligned and can be staged (the `stage` axis).
    stageable: bool,
}

const GEMM_BLOCKS_MN: [usize; 4] = [32, 64, 128, 256];
const GEMM_BLOCKS_K: [usize; 3] = [32, 64, 128];

impl ConfigSpace {
    /// The space of `kernel` for `spec` on `target`: with `wgmma`, matmuls also get
    /// the Hopper path's configs.
    pub fn new(kernel: &Kernel, spec: &Spec, target: Target) -> ConfigSpace {
        let default = default_config_for(kernel, spec, target);
        let gemm = match classify(kernel) {
            Shape::Gemm(g) => Some(g),
            _ => None,
        };
        let mut axes = match &gemm {
            Some(g) => vec![
                Axis::Block {
                    dim: g.m,
                    values: GEMM_BLOCKS_MN.to_vec(),
                },
                Axis::Block {
                    dim: g.n,
                    values: GEMM_BLOCKS_MN.to_vec(),
                },
                Axis::Block {
                    dim: g.k,
                    values: GEMM_BLOCKS_K.to_vec(),
                },
                Axis::Warps(vec![2, 4, 8, 16]),
                Axis::Stages(vec![2, 3, 4, 5, 6]),
                Axis::GroupM(vec![1, 4, 8, 16]),
            ],
            None => match classify(kernel) {
                Shape::Rows => rows_axes(kernel),
                Shape::Attention(a) => vec![
                    Axis::Block {
                        dim: a.m,
                        values: vec![64, 128, 256],
                    },
                    Axis::Block {
                        dim: a.n,
                        values: vec![32, 64, 128],
                    },
                    Axis::Warps(vec![4, 8]),
                ],
                Shape::General => crate::emit::general::axes(kernel),
                Shape::Gemm(_) => Vec::new(),
            },
        };
        if gemm.is_some() && target.wgmma {
            axes.push(Axis::Persistent);
            axes.push(Axis::ClusterM(vec![1, 2]));
            axes.push(Axis::StreamK);
            axes.push(Axis::TmaStore);
            axes.push(Axis::PingPong);
        }
        let stageable = !crate::staging::unaligned_operands(kernel, spec).is_empty();
        if stageable {
            axes.push(Axis::Stage);
        }
        ConfigSpace {
            kernel: kernel.clone(),
            spec: spec.clone(),
            target,
            tiles: HopperTiles::Pairs,
            axes,
            default,
            gemm,
            stageable,
        }
    }

    /// The space with its default fitted to a launch's extents (`extents[d]`:
    /// dimension `d`'s, where known), as an untuned launch of them would run it
    /// ([`crate::default_config_at`], [`crate::fit_default`],
    /// [`crate::fit_whole_dims`]).
    pub fn with_extents(mut self, extents: &[Option<usize>]) -> ConfigSpace {
        self.tiles = crate::fit::hopper_tiles(&self.kernel, extents, self.target.sms);
        let default = default_config_at(&self.kernel, &self.spec, self.target, extents);
        let default = crate::fit::fit_default(&self.kernel, default, extents);
        self.default = crate::fit::fit_whole_dims(&self.kernel, default, extents);
        self
    }

    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }

    /// The config used without tuning (fitted to the GPU's shared memory).
    pub fn default_config(&self) -> &Config {
        &self.default
    }

    /// How many configs the axes span, before pruning.
    pub fn size(&self) -> usize {
        self.axes.iter().map(|a| a.values().len()).product()
    }

    /// Why `c` cannot run on this GPU for `spec`, or `Ok` when it can: the lowering's
    /// rules (block shapes, warp tiles, the accumulator register budget) and the
    /// shared memory limit. Costs one lowering (no compile).
    pub fn fits(&self, c: &Config, spec: &Spec) -> Result<(), String> {
        let l = lower(&self.kernel, spec, c).map_err(|e| e.to_string())?;
        if l.shared_bytes as usize > self.target.shared_limit {
            return Err(format!(
                "needs {} bytes of shared memory per block; the GPU allows {}",
                l.shared_bytes, self.target.shared_limit
            ));
        }
        Ok(())
    }

    /// Proven starting points that fit, the default first, without duplicates.
    /// `quick` keeps the few that won most often on H100/H200 class GPUs.
    pub fn seeds(&self, spec: &Spec, quick: bool) -> Vec<Config> {
        let mut out = vec![self.default.clone()];
        let proposals = match &self.gemm {
            Some(g) => {
                let mut p = Vec::new();
                if self.target.wgmma {
                    // Unaligned operands: every Hopper seed staged (TMA needs it).
                    let hopper = wgmma_seeds(self.kernel.dims.len(), g, quick, self.tiles)
                        .into_iter()
                        .map(|c| c.stage(self.stageable));
                    // The TMA-store epilogue where the output takes it (faster
                    // at every shape measured, docs/PERFORMANCE.md session 14);
                    // the fastest seed also storing fragments, so the search
                    // still weighs the two.
                    for (i, c) in hopper.enumerate() {
                        let t = c.clone().tma_store(true);
                        let twin = self.fits(&t, spec).is_ok();
                        if twin {
                            p.push(t);
                        }
                        if !twin || i == 0 {
                            p.push(c);
                        }
                    }
                }
                let portable = gemm_seeds(self.kernel.dims.len(), g, quick);
                if self.stageable {
                    // Unaligned operands: the portable seeds staged, and the best
                    // one also as it is, so the search weighs the copies against
                    // the narrow loads.
                    p.extend(portable.iter().map(|c| c.clone().stage(true)));
                    p.extend(portable.into_iter().take(1));
                } else {
                    p.extend(portable);
                }
                p
            }
            None => match classify(&self.kernel) {
                Shape::Rows => self.rows_seeds(),
                Shape::Attention(a) => self.attention_seeds(&a),
                Shape::General => crate::emit::general::seeds(&self.kernel, &self.default),
                Shape::Gemm(_) => Vec::new(),
            },
        };
        for c in proposals {
            if !out.contains(&c) && self.fits(&c, spec).is_ok() {
                out.push(c);
            }
        }
        if self.fits(&self.default, spec).is_err() {
            out.remove(0);
        }
        out
    }

    /// The configs one step away from `c` along one axis (a pattern search's moves),
    /// that fit.
    pub fn neighbors(&self, c: &Config, spec: &Spec) -> Vec<Config> {
        let mut out = Vec::new();
        for axis in &self.axes {
            let vals = axis.values();
            let cur = axis.get(c);
            // The nearest values below and above the current one (it may lie off the grid).
            let below = vals.iter().rev().find(|&&v| v < cur);
            let above = vals.iter().find(|&&v| v > cur);
            for &v in below.into_iter().chain(above) {
                let mut n = c.clone();
                axis.set(&mut n, v);
                if !out.contains(&n) && self.fits(&n, spec).is_ok() {
                    out.push(n);
                }
            }
        }
        out
    }

    /// Row kernels: a warp per row for short rows, a whole block per row (one
    /// pass, the row in registers) for long ones. (rows per program, columns per
    /// step, warps.)
    fn rows_seeds(&self) -> Vec<Config> {
        const PROVEN: [(usize, usize, usize); 8] = [
            (4, 1024, 4),
            (1, 4096, 8),
            (1, 8192, 8),
            (1, 8192, 16),
            (2, 4096, 8),
            (8, 1024, 8),
            (1, 2048, 4),
            (16, 512, 16),
        ];
        PROVEN
            .iter()
            .map(|&(rows, cols, w)| {
                let mut c = self.default.clone().num_warps(w);
                for (d, b) in c.block_sizes.iter_mut().enumerate() {
                    *b = if self.kernel.grid.contains(&d) {
                        rows
                    } else {
                        cols
                    };
                }
                c
            })
            .collect()
    }

    /// Attention: on Hopper, the wgmma program's (rows, keys a step, stages),
    /// FlashAttention-3's shapes first (176 keys: its non-causal choice at head
    /// dimension 128); then the `mma.sync` program's (rows, keys a step, warps),
    /// FlashAttention-2's shapes first.
    fn attention_seeds(&self, a: &AttentionShape) -> Vec<Config> {
        const HOPPER: [(usize, usize, usize); 6] = [
            (128, 128, 3),
            (128, 176, 2),
            (128, 64, 4),
            (128, 128, 2),
            (64, 128, 3),
            (64, 64, 4),
        ];
        const PROVEN: [(usize, usize, usize); 7] = [
            (128, 64, 4),
            (128, 32, 4),
            (128, 128, 8),
            (128, 64, 8),
            (64, 64, 4),
            (256, 64, 8),
            (64, 128, 4),
        ];
        let seed = |bm: usize, bn: usize, warps: usize, wgmma: bool| {
            let mut c = Config {
                wgmma,
                ..self.default.clone()
            }
            .num_warps(warps);
            c.block_sizes[a.m] = bm;
            c.block_sizes[a.n] = bn;
            c
        };
        let hopper = HOPPER
            .iter()
            .filter(|_| self.target.wgmma)
            .map(|&(bm, bn, stages)| seed(bm, bn, bm / 16, true).num_stages(stages));
        let portable = PROVEN.iter().map(|&(bm, bn, w)| seed(bm, bn, w, false));
        hopper.chain(portable).collect()
    }
}

/// Proven GEMM configs (M block, N block, K block, warps, stages), fastest first
/// at large bf16 shapes on an H200 (docs/PERFORMANCE.md, the swept configs).
fn gemm_seeds(dims: usize, g: &GemmShape, quick: bool) -> Vec<Config> {
    const PROVEN: [(usize, usize, usize, usize, usize); 12] = [
        (128, 256, 64, 8, 4),
        (256, 128, 64, 8, 4),
        (128, 256, 32, 8, 4),
        (128, 256, 64, 8, 3),
        (256, 128, 32, 8, 4),
        (128, 128, 64, 4, 3),
        (128, 128, 32, 4, 4),
        (128, 128, 64, 8, 4),
        (64, 128, 64, 4, 4),
        (128, 64, 64, 4, 4),
        (64, 64, 64, 4, 3),
        (64, 256, 64, 8, 4),
    ];
    let take = if quick { 6 } else { PROVEN.len() };
    PROVEN[..take]
        .iter()
        .map(|&(bm, bn, bk, w, s)| {
            let mut bs = vec![64; dims];
            bs[g.m] = bm;
            bs[g.n] = bn;
            bs[g.k] = bk;
            Config::new(&bs).num_warps(w).num_stages(s)
        })
        .collect()
}

/// Hopper configs (M block, N block, consumer warps, stages, persistent, blocks
/// per cluster, ping-pong), fastest first on an H200: BK is 64 and the M block
/// 16 x warps, or with ping-pong each warpgroup's (64 or 128 rows). Ping-pong
/// comes last: it measured 3–18% slower than the default at nine of ten shapes
/// (docs/PERFORMANCE.md, session 18), so only the full level tries it.
fn wgmma_seeds(dims: usize, g: &GemmShape, quick: bool, tiles: HopperTiles) -> Vec<Config> {
    type Seed = (usize, usize, usize, usize, bool, usize, bool);
    const PROVEN: [Seed; 12] = [
        (128, 256, 8, 4, true, 2, false),
        (128, 256, 8, 4, false, 1, false),
        (128, 192, 8, 4, true, 1, false),
        (128, 256, 8, 4, false, 2, false),
        (128, 128, 8, 6, true, 2, false),
        (128, 256, 8, 3, false, 1, false),
        (128, 128, 8, 5, false, 1, false),
        (64, 256, 4, 4, false, 1, false),
        (128, 192, 8, 4, false, 1, false),
        (128, 128, 8, 5, true, 1, true),
        (128, 128, 8, 5, true, 2, true),
        (64, 256, 8, 4, true, 2, true),
    ];
    // Launches whose 128×128 tiles fit one wave (the default's own tiles
    // there): the configs of small tiles that came closest to it or beat it
    // at nine such shapes on an H200 (docs/PERFORMANCE.md, session 22), first.
    const ONE_WAVE: [Seed; 3] = [
        (64, 256, 4, 4, false, 1, false),
        (128, 128, 8, 5, false, 1, false),
        (128, 192, 8, 4, true, 1, false),
    ];
    // Quick: four proven configs, or where those tiles leave SMs idle the three
    // above and the pairs (the default of larger launches) for scale.
    let take = match (quick, tiles) {
        (false, _) => PROVEN.len(),
        (true, HopperTiles::Narrow) => 1,
        (true, _) => 4,
    };
    let first: &[Seed] = match tiles {
        HopperTiles::Narrow => &ONE_WAVE,
        _ => &[],
    };
    first
        .iter()
        .chain(PROVEN.iter().filter(|s| !first.contains(s)).take(take))
        .map(|&(bm, bn, w, s, p, cl, pp)| {
            let mut bs = vec![64; dims];
            bs[g.m] = bm;
            bs[g.n] = bn;
            bs[g.k] = 64;
            Config::new(&bs)
                .num_warps(w)
                .num_stages(s)
                .wgmma(true)
                .persistent(p)
                .cluster_m(cl)
                .pingpong(pp)
        })
        .collect()
}

/// Row (reducing) kernels: the columns per step of each `tile()` loop, the rows
/// per program, and warps.
fn rows_axes(kernel: &Kernel) -> Vec<Axis> {
    let mut axes = Vec::new();
    for d in 0..kernel.dims.len() {
        if !kernel.grid.contains(&d) {
            axes.push(Axis::Block {
                dim: d,
                values: vec![256, 512, 1024, 2048, 4096, 8192],
            });
        }
    }
    for &d in &kernel.grid {
        axes.push(Axis::Block {
            dim: d,
            values: vec![1, 2, 4, 8, 16],
        });
    }
    axes.push(Axis::Warps(vec![1, 2, 4, 8, 16]));
    axes.push(Axis::Occupancy(vec![0, 512, 768, 1024]));
    axes
}
