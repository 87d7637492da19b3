//! The autotuner's search space, derived from a kernel's IR: which block sizes,
//! warps, stages and tile-order groupings a kernel of this shape can use, which of
//! them fit a GPU (shared memory, registers, the lowering's own rules), a set of
//! proven starting points, and the neighbours of a config for a local search.
//! No GPU here: the runtime's tuner measures what this proposes.

use crate::config::{default_config_at, default_config_for, Config, Target};
use crate::emit::lower;
use crate::plan::Planned;
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
    /// General kernels with a loop their programs may share: the most
    /// programs per grid tile (1: none); see [`Config::split`].
    Split(Vec<usize>),
}

impl Axis {
    fn values(&self) -> &[usize] {
        match self {
            Axis::Block { values, .. } | Axis::Warps(values) => values,
            Axis::Stages(v)
            | Axis::GroupM(v)
            | Axis::ClusterM(v)
            | Axis::Occupancy(v)
            | Axis::Split(v) => v,
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
            Axis::Split(_) => c.split.max(1),
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
            Axis::Split(_) => c.split = v,
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
            Axis::Split(_) => "split".into(),
        }
    }
}

/// The configs a kernel can be tuned over on one GPU.
///
/// ```
/// # use tilefuse_codegen::Planned;
/// # fn demo(kernel: &Planned, spec: &tilefuse_codegen::Spec) {
/// let target = tilefuse_codegen::Target { shared_limit: 227 * 1024, wgmma: true, sms: 132 };
/// let space = tilefuse_codegen::ConfigSpace::new(kernel, spec, target);
/// let seeds = space.seeds(spec, true); // proven configs that fit, the default first
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct ConfigSpace {
    kernel: Planned,
    /// The specialization and GPU the space was made for (the default's inputs).
    spec: Spec,
    target: Target,
    /// The launch's extents, where known ([`ConfigSpace::with_extents`]).
    extents: Vec<Option<usize>>,
    axes: Vec<Axis>,
    default: Config,
    /// Some operand is unaligned and can be staged (the `stage` axis).
    stageable: bool,
}

impl ConfigSpace {
    /// The space of `kernel` for `spec` on `target`: with `wgmma`, matmuls also get
    /// the Hopper path's configs.
    pub fn new(kernel: &Planned, spec: &Spec, target: Target) -> ConfigSpace {
        let default = default_config_for(kernel, spec, target);
        let mut axes = kernel.chosen().axes(kernel, target);
        let stageable = !crate::staging::unaligned_operands(kernel, spec).is_empty();
        if stageable {
            axes.push(Axis::Stage);
        }
        ConfigSpace {
            kernel: kernel.clone(),
            spec: spec.clone(),
            target,
            extents: Vec::new(),
            axes,
            default,
            stageable,
        }
    }

    /// The space with its default fitted to a launch's extents (`extents[d]`:
    /// dimension `d`'s, where known), as an untuned launch of them would run it
    /// ([`crate::default_config_at`], [`crate::fit_default`],
    /// [`crate::fit_whole_dims`]).
    pub fn with_extents(mut self, extents: &[Option<usize>]) -> ConfigSpace {
        self.extents = extents.to_vec();
        let default = default_config_at(&self.kernel, &self.spec, self.target, extents);
        let default = crate::fit::fit_default(&self.kernel, default, extents);
        self.default = crate::fit::fit_whole_dims(&self.kernel, default, extents);
        self
    }

    /// What the tuner may change.
    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }

    /// The kernel the space was made for.
    pub fn kernel(&self) -> &Planned {
        &self.kernel
    }

    /// The GPU the space was made for.
    pub fn target(&self) -> Target {
        self.target
    }

    /// The launch's extents the default was fitted to (`extents[d]`:
    /// dimension `d`'s, where known); empty without [`ConfigSpace::with_extents`].
    pub fn extents(&self) -> &[Option<usize>] {
        &self.extents
    }

    /// Whether some operand is unaligned and can be staged ([`Config::stage`]).
    pub fn stageable(&self) -> bool {
        self.stageable
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
        let mut proposals = self.kernel.chosen().seeds(self, spec, quick);
        if self.kernel.chosen().compare_general() {
            proposals.push(self.general_default());
        }
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

    /// The general lowering's untuned config for this space's launch
    /// ([`Config::general`]), fitted as [`ConfigSpace::with_extents`] fits the
    /// default.
    pub fn general_default(&self) -> Config {
        let marker = Config::new(&[]).general(true);
        let g = self.kernel.for_config(&marker);
        let d = default_config_at(&g, &self.spec, self.target, &self.extents);
        let d = crate::fit::fit_default(&g, d, &self.extents);
        crate::fit::fit_whole_dims(&g, d.general(true), &self.extents)
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
}
