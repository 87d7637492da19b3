//! Stateful distributed matmuls, planned once and executed many times (in the
//! style of nvmath-python's `Matmul`): `D = epilogue(alpha · op(A) · op(B) + beta · C)`
//! over the ranks of a [`ProcessGroup`].
//!
//! Construct with each rank's operands and the [`Distribution`]s of A, B and D
//! (the matrices after the transpose qualifiers); the distributions pick the
//! algorithm, as in cuBLASMp:
//!
//! | A | B | D | algorithm |
//! |---|---|---|---|
//! | Rows | Cols | Cols | all-gather A + GEMM (tensor-parallel column-linear, sequence parallel) |
//! | Cols | Replicated | Replicated | all-gather A + GEMM |
//! | Rows | Replicated | Replicated | GEMM + all-gather D |
//! | Cols | Rows | Rows or Cols | GEMM + reduce-scatter (row-linear, sequence parallel) |
//! | Cols | Rows | Replicated | GEMM + all-reduce (row-linear) |
//! | Rows, Replicated | Replicated, Cols | Rows, Cols | local GEMM |
//!
//! [`DistributedMatmul::plan`] takes the epilogue and its inputs, builds the
//! workspace, JIT-compiles and (with [`Algorithm::Auto`]) times the fused and the
//! unfused path, every rank making the same choice. [`DistributedMatmul::execute`]
//! then only launches; [`DistributedMatmul::reset_operands`] points the plan at new
//! operands of the same shapes. Planning is collective, and so is each execute.
//!
//! **Replay.** On the fused path (and the local GEMM), the first `execute`
//! after `plan` or `reset_operands` queues its work as usual and then captures
//! it as CUDA graphs (one per parity of the exchange's calls, see
//! [`tilefuse_runtime::dist::Exchange`]); later calls replay them, so an
//! `execute` costs the host one graph launch however many kernels, copies and
//! flag operations it queues. `MatmulOptions::graph = false` queues each call
//! anew. The unfused path (NCCL + cuBLAS) is never captured.
//!
//! **Bias** is a vector along D's columns (one value per output feature), this
//! rank's columns of D: added once, after any reduction. **Aux**: the `_aux`
//! epilogues also store the pre-activation `alpha·AB + beta·C + bias` (D's local
//! shape) for the backward `DRelu`/`DGelu`, which multiply by the activation's
//! derivative at the aux passed as an input.
//!
//! **Replicated D** (GEMM + all-gather, GEMM + all-reduce): each rank computes
//! one slab of D, with its own bias and C, and the slabs are exchanged, so the
//! bias and C must be the same on every rank (as any replicated operand).
//! `plan` checks the bias and refuses one that differs between ranks; C is not
//! compared (it is D's size), and neither are operands passed to
//! `reset_operands`.
//!
//! ```no_run
//! # fn main() -> tilefuse::Result<()> {
//! use tilefuse::prelude::*;
//! use tilefuse::ops::plan::{DistributedMatmul, Distribution, EpilogueInputs, MatmulEpilogue, MatmulOptions};
//! use tilefuse::runtime::dist::ProcessGroup;
//! let pg = ProcessGroup::init()?;
//! let w = pg.world_size();
//! // Row-parallel linear: x[M, K/w] · w[K/w, N], all-reduced, plus bias, GELU.
//! let x = Tensor::<bf16>::zeros([4096, 16384 / w])?;
//! let weight = Tensor::<bf16>::zeros([16384 / w, 6656])?;
//! let bias = Tensor::<bf16>::zeros([6656])?;
//! use Distribution::*;
//! let mut mm = DistributedMatmul::new(&pg, &x, &weight, None, [Cols, Rows, Replicated], MatmulOptions::default())?;
//! mm.plan(MatmulEpilogue::GeluBias, EpilogueInputs { bias: Some(&bias), aux: None })?;
//! for _ in 0..10 {
//!     let y = mm.execute()?; // the same D each time, overwritten
//! }
//! pg.synchronize("the matmuls")?;
//! # Ok(()) }
//! ```

mod layout;

pub use layout::PlanAlgorithm;

use super::epilogue::{self, Epilogue, Gemm};
use super::kernels::{act, transpose};
use super::workspace::{FusedNeeds, Workspace};
use super::{all_gather_matmul as agm, matmul_all_gather as mag, reduce};
use super::{check, unfused, Algorithm, GatherDim, ScatterDim};
use crate::{bf16, Config, Result, Tensor};
use std::time::Instant;
use tilefuse_runtime::dist::ProcessGroup;
use tilefuse_runtime::graph::Replay;

const OP: &str = "DistributedMatmul";

/// How a matrix is spread over the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Distribution {
    /// Every rank holds all of it.
    Replicated,
    /// Rank `r` holds rows `r·R/w ..` (a row slab).
    Rows,
    /// Rank `r` holds columns `r·C/w ..` (a column slab).
    Cols,
}

/// The epilogue applied to `alpha·AB + beta·C` before D is stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulEpilogue {
    #[default]
    None,
    Bias,
    Relu,
    ReluBias,
    Gelu,
    GeluBias,
    /// Relu, storing the pre-activation as aux (for `DRelu`).
    ReluAux,
    ReluAuxBias,
    /// Gelu (erf), storing the pre-activation as aux (for `DGelu`).
    GeluAux,
    GeluAuxBias,
    /// Backward: `D = (alpha·AB + beta·C) · relu'(aux)`, aux an input.
    DRelu,
    /// Backward: `D = (alpha·AB + beta·C) · gelu'(aux)`, aux an input.
    DGelu,
}

impl MatmulEpilogue {
    fn bias(self) -> bool {
        use MatmulEpilogue::*;
        matches!(self, Bias | ReluBias | GeluBias | ReluAuxBias | GeluAuxBias)
    }

    fn aux_out(self) -> bool {
        use MatmulEpilogue::*;
        matches!(self, ReluAux | ReluAuxBias | GeluAux | GeluAuxBias)
    }

    fn aux_in(self) -> bool {
        matches!(self, MatmulEpilogue::DRelu | MatmulEpilogue::DGelu)
    }

    fn act(self) -> usize {
        use MatmulEpilogue::*;
        match self {
            None | Bias => act::NONE,
            Relu | ReluBias | ReluAux | ReluAuxBias => act::RELU,
            Gelu | GeluBias | GeluAux | GeluAuxBias => act::GELU,
            DRelu => act::DRELU,
            DGelu => act::DGELU,
        }
    }
}

/// The tensors an epilogue reads: the bias (`[D's local columns]`) and, for
/// `DRelu`/`DGelu`, the aux a forward `_aux` epilogue stored (D's local shape).
#[derive(Clone, Copy, Debug, Default)]
pub struct EpilogueInputs<'a> {
    pub bias: Option<&'a Tensor<bf16>>,
    pub aux: Option<&'a Tensor<bf16>>,
}

/// Scalars, qualifiers and tuning of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct MatmulOptions {
    pub alpha: f32,
    /// Multiplies `C` (ignored without one).
    pub beta: f32,
    /// The operand passed is the transpose of A (resp. B): `op(A) = aᵀ`.
    pub transpose_a: bool,
    pub transpose_b: bool,
    /// Fused, unfused, or the faster of the two (timed at `plan`).
    pub algorithm: Algorithm,
    /// Chunks of each transfer (default: as the ops, see `OpConfig::chunks`).
    pub chunks: Option<usize>,
    /// The fused path's GEMM config (default: the kernel's own).
    pub gemm: Option<Config>,
    /// `execute` returns once every rank has finished (a barrier), instead of
    /// once queued on the launch stream.
    pub blocking: bool,
    /// Replay `execute` from CUDA graphs captured on its first call (see the
    /// module docs); on by default.
    pub graph: bool,
}

impl Default for MatmulOptions {
    fn default() -> Self {
        MatmulOptions {
            alpha: 1.0,
            beta: 0.0,
            transpose_a: false,
            transpose_b: false,
            algorithm: Algorithm::Auto,
            chunks: None,
            gemm: None,
            blocking: false,
            graph: true,
        }
    }
}

/// The operands a plan holds (released by [`DistributedMatmul::release_operands`]).
#[derive(Clone)]
struct Operands {
    a: Tensor<bf16>,
    b: Tensor<bf16>,
    c: Option<Tensor<bf16>>,
    bias: Option<Tensor<bf16>>,
    aux_in: Option<Tensor<bf16>>,
}

/// What `plan` made.
struct Planned {
    epilogue: MatmulEpilogue,
    /// Both `Some` once built.
    ws: Option<Workspace>,
    path: Algorithm,
    run: Option<Run>,
    /// Row-major copies of transposed operands.
    a_t: Option<Tensor<bf16>>,
    b_t: Option<Tensor<bf16>>,
    aux_out: Option<Tensor<bf16>>,
    /// The captured calls, by parity of the exchange's calls (one without an
    /// exchange); empty until the first execute, or when not replaying.
    replays: Vec<Replay>,
    /// A capture failed: queue every call (logged once).
    no_replay: bool,
}

/// The schedule `execute` runs.
enum Run {
    AllGather(agm::Schedule),
    MatmulAllGather(mag::Schedule),
    Reduce(reduce::Schedule),
    Local {
        out: Tensor<bf16>,
        a: Tensor<bf16>,
        b: Tensor<bf16>,
        epi: Epilogue,
        gemm_config: Option<Config>,
    },
}

/// A distributed matmul: construct, [`plan`](Self::plan) once,
/// [`execute`](Self::execute) many times (see the module docs).
pub struct DistributedMatmul<'pg> {
    pg: &'pg ProcessGroup,
    dists: [Distribution; 3],
    algorithm: PlanAlgorithm,
    options: MatmulOptions,
    /// Global `[M, K, N]`.
    mkn: [usize; 3],
    /// This rank's `op(A)`, `op(B)` and D shapes.
    local: [[usize; 2]; 3],
    operands: Option<Operands>,
    has_c: bool,
    d: Tensor<bf16>,
    planned: Option<Planned>,
}

impl std::fmt::Debug for DistributedMatmul<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedMatmul")
            .field("distributions", &self.dists)
            .field("algorithm", &self.algorithm)
            .field("mkn", &self.mkn)
            .field(
                "planned",
                &self.planned.as_ref().map(|p| (p.epilogue, p.path)),
            )
            .finish()
    }
}

impl<'pg> DistributedMatmul<'pg> {
    /// A matmul of this rank's `a` and `b` (and `c`, D's local shape, scaled by
    /// `options.beta`) with `distributions` `[A, B, D]` of `op(A)`, `op(B)`, D.
    /// Checks every shape; allocates D. Collective only from `plan` on.
    pub fn new(
        pg: &'pg ProcessGroup,
        a: &Tensor<bf16>,
        b: &Tensor<bf16>,
        c: Option<&Tensor<bf16>>,
        distributions: [Distribution; 3],
        options: MatmulOptions,
    ) -> Result<DistributedMatmul<'pg>> {
        let w = pg.world_size();
        let algorithm = layout::algorithm(OP, distributions)?;
        let [da, db, dd] = distributions;
        let op_shape = |name: &str, t: &Tensor<bf16>, transposed: bool| -> Result<[usize; 2]> {
            let [r, c] = stored_shape(pg, name, t)?;
            Ok(if transposed { [c, r] } else { [r, c] })
        };
        let la = op_shape("a", a, options.transpose_a)?;
        let lb = op_shape("b", b, options.transpose_b)?;
        let [m, k] = layout::global(da, la, w);
        let [kb, n] = layout::global(db, lb, w);
        if kb != k {
            return Err(check::arg(
                OP,
                "b",
                format!(
                    "op(B) has {kb} rows in all ({db:?}, local {lb:?}), but op(A) has {k} columns ({da:?}, local {la:?})"
                ),
            ));
        }
        let ld = layout::local(OP, "d", dd, [m, n], w)?;
        // The local pieces must be what the global shapes split into.
        for (name, dist, got, global) in [("a", da, la, [m, k]), ("b", db, lb, [k, n])] {
            let want = layout::local(OP, name, dist, global, w)?;
            if got != want {
                return Err(check::arg(
                    OP,
                    name,
                    format!("expected local shape {want:?}, got {got:?}"),
                ));
            }
        }
        if let Some(c) = c {
            let got = stored_shape(pg, "c", c)?;
            check::shape_is(OP, "c", got, ld, "D's local shape")?;
        }
        let d = Tensor::<bf16>::empty_on(pg.device(), ld)?;
        tracing::info!(
            rank = pg.rank(),
            ?distributions,
            ?algorithm,
            m,
            n,
            k,
            "distributed matmul constructed"
        );
        Ok(DistributedMatmul {
            pg,
            dists: distributions,
            algorithm,
            options,
            mkn: [m, k, n],
            local: [la, lb, ld],
            operands: Some(Operands {
                a: a.clone(),
                b: b.clone(),
                c: c.cloned(),
                bias: None,
                aux_in: None,
            }),
            has_c: c.is_some(),
            d,
            planned: None,
        })
    }

    /// The algorithm the distributions chose.
    pub fn algorithm(&self) -> PlanAlgorithm {
        self.algorithm
    }

    /// The path `plan` settled on (`None` before `plan`).
    pub fn path(&self) -> Option<Algorithm> {
        self.planned.as_ref().map(|p| p.path)
    }

    /// This rank's D (written by each `execute`).
    pub fn result(&self) -> &Tensor<bf16> {
        &self.d
    }

    /// The aux a forward `_aux` epilogue stores (D's local shape), after `plan`.
    pub fn aux(&self) -> Option<&Tensor<bf16>> {
        self.planned.as_ref().and_then(|p| p.aux_out.as_ref())
    }

    /// Chooses the path, builds the workspace and compiles (collective: every
    /// rank calls it with the same epilogue). Planning again replaces the plan.
    pub fn plan(&mut self, epilogue: MatmulEpilogue, inputs: EpilogueInputs<'_>) -> Result<()> {
        let started = Instant::now();
        self.planned = None;
        let ops = self.operands.as_mut().ok_or_else(released)?;
        let ld = self.local[2];
        ops.bias = check_input(
            self.pg,
            "inputs.bias",
            epilogue.bias(),
            inputs.bias,
            &[ld[1]],
            "needs a bias of D's local columns",
        )?;
        ops.aux_in = check_input(
            self.pg,
            "inputs.aux",
            epilogue.aux_in(),
            inputs.aux,
            &ld,
            "needs the aux of the forward pass, D's local shape",
        )?;
        if let (Some(bias), false) = (&ops.bias, self.algorithm.computes_local_d()) {
            same_on_every_rank(self.pg, "inputs.bias", bias, self.algorithm)?;
        }
        if epilogue.aux_out() && !self.algorithm.computes_local_d() {
            return Err(check::arg(
                OP,
                "epilogue",
                format!(
                    "{epilogue:?} stores an aux of D, but with D replicated by {:?} each rank computes only part of it; use a sliced D or the epilogue without _aux",
                    self.algorithm
                ),
            ));
        }
        let aux_out = if epilogue.aux_out() {
            Some(Tensor::<bf16>::empty_on(self.pg.device(), ld)?)
        } else {
            None
        };
        let [la, lb, _] = self.local;
        let dev = self.pg.device();
        let a_t = match self.options.transpose_a {
            true => Some(Tensor::<bf16>::empty_on(dev, la)?),
            false => None,
        };
        let b_t = match self.options.transpose_b {
            true => Some(Tensor::<bf16>::empty_on(dev, lb)?),
            false => None,
        };
        let mut planned = Planned {
            epilogue,
            ws: None,
            path: Algorithm::Unfused,
            run: None,
            a_t,
            b_t,
            aux_out,
            replays: Vec::new(),
            no_replay: false,
        };
        self.build(&mut planned)?;
        let pg = self.pg;
        let path = match (&planned.run, planned.ws.as_mut()) {
            (Some(run), Some(ws)) => ws.path(pg, self.options.algorithm, |ws, p| {
                run_schedule(run, ws, pg, p)
            })?,
            _ => unreachable_plan()?,
        };
        planned.path = path;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        tracing::info!(
            rank = pg.rank(),
            algorithm = ?self.algorithm,
            path = ?planned.path,
            ?epilogue,
            plan_ms = ms,
            "distributed matmul planned"
        );
        self.planned = Some(planned);
        Ok(())
    }

    /// Whether `execute` replays captured CUDA graphs (after the first call
    /// since `plan` or `reset_operands`, on the fused path or the local GEMM,
    /// unless `MatmulOptions::graph` is off or a capture failed).
    pub fn replays(&self) -> bool {
        self.planned.as_ref().is_some_and(|p| !p.replays.is_empty())
    }

    /// Runs the plan; returns this rank's D (the same tensor each time). With
    /// `blocking: false` it returns once queued on the launch stream.
    pub fn execute(&mut self) -> Result<Tensor<bf16>> {
        let planned = self
            .planned
            .as_mut()
            .ok_or_else(|| check::arg(OP, "plan", "execute() needs plan() first"))?;
        let ops = self.operands.as_ref().ok_or_else(released)?;
        // Interpret mode has no CUDA graphs: each call runs as queued.
        let replay = self.options.graph
            && planned.path != Algorithm::Unfused
            && !planned.no_replay
            && !self.pg.device().is_host();
        if replay && planned.replays.iter().any(Replay::is_stale) {
            planned.replays.clear();
        }
        match planned.replays.as_slice() {
            [] => {
                queue(planned, ops, self.pg)?;
                if replay {
                    capture(planned, ops, self.pg);
                }
            }
            replays => {
                let Some(ws) = planned.ws.as_mut() else {
                    return unreachable_plan();
                };
                let calls = ws.exchange.as_ref().map_or(0, |e| e.calls());
                replays[(calls % replays.len() as u64) as usize].launch()?;
                if let Some(ex) = ws.exchange.as_mut() {
                    ex.replayed();
                }
            }
        }
        if self.options.blocking {
            self.pg.synchronize(OP)?;
            self.pg.barrier(OP)?;
        }
        Ok(self.d.clone())
    }

    /// Points the plan at new operands of the same shapes (`None` keeps the
    /// current one; after [`release_operands`](Self::release_operands) `a`, `b`,
    /// `c` and the inputs the epilogue reads are all needed). Cheap: nothing is
    /// compiled or allocated.
    pub fn reset_operands(
        &mut self,
        a: Option<&Tensor<bf16>>,
        b: Option<&Tensor<bf16>>,
        c: Option<&Tensor<bf16>>,
        inputs: EpilogueInputs<'_>,
    ) -> Result<()> {
        let pg = self.pg;
        let [la, lb, ld] = self.local;
        let (ta, tb) = (self.options.transpose_a, self.options.transpose_b);
        let stored = |l: [usize; 2], t: bool| if t { [l[1], l[0]] } else { l };
        let fits = |name: &str, t: &Tensor<bf16>, want: [usize; 2]| -> Result<Tensor<bf16>> {
            let got = stored_shape(pg, name, t)?;
            check::shape_is(OP, name, got, want, "the shape the plan was made for")?;
            Ok(t.clone())
        };
        let epilogue = self.planned.as_ref().map(|p| p.epilogue);
        let mut ops = match self.operands.take() {
            Some(ops) => ops,
            None => {
                let need = |t: Option<&Tensor<bf16>>, name: &str| {
                    t.cloned().ok_or_else(|| {
                        check::arg(OP, name, "the operands were released: reset_operands needs every one the plan reads")
                    })
                };
                Operands {
                    a: need(a, "a")?,
                    b: need(b, "b")?,
                    c: if self.has_c {
                        Some(need(c, "c")?)
                    } else {
                        None
                    },
                    bias: if epilogue.is_some_and(|e| e.bias()) {
                        Some(need(inputs.bias, "inputs.bias")?)
                    } else {
                        None
                    },
                    aux_in: if epilogue.is_some_and(|e| e.aux_in()) {
                        Some(need(inputs.aux, "inputs.aux")?)
                    } else {
                        None
                    },
                }
            }
        };
        let checked = (|| -> Result<()> {
            if let Some(a) = a {
                ops.a = fits("a", a, stored(la, ta))?;
            }
            if let Some(b) = b {
                ops.b = fits("b", b, stored(lb, tb))?;
            }
            if let Some(c) = c {
                if !self.has_c {
                    return Err(check::arg(
                        OP,
                        "c",
                        "the plan was made without C; construct one with C",
                    ));
                }
                ops.c = Some(fits("c", c, ld)?);
            }
            if let Some(bias) = inputs.bias {
                ops.bias = check_input(
                    pg,
                    "inputs.bias",
                    epilogue.is_some_and(|e| e.bias()),
                    Some(bias),
                    &[ld[1]],
                    "the planned epilogue takes no bias",
                )?;
            }
            if let Some(aux) = inputs.aux {
                ops.aux_in = check_input(
                    pg,
                    "inputs.aux",
                    epilogue.is_some_and(|e| e.aux_in()),
                    Some(aux),
                    &ld,
                    "the planned epilogue takes no aux",
                )?;
            }
            Ok(())
        })();
        self.operands = Some(ops);
        checked?;
        if let Some(mut planned) = self.planned.take() {
            let built = self.build(&mut planned);
            self.planned = Some(planned);
            built?;
        }
        Ok(())
    }

    /// Drops the plan's references to the operands (the plan, its workspace
    /// and D stay); `execute` then needs `reset_operands` with all of them.
    pub fn release_operands(&mut self) {
        self.operands = None;
    }
}

impl DistributedMatmul<'_> {
    /// The workspace (reused when it fits) and the schedule for the current
    /// operands.
    fn build(&self, planned: &mut Planned) -> Result<()> {
        let ops = self.operands.as_ref().ok_or_else(released)?;
        let pg = self.pg;
        let w = pg.world_size();
        let o = &self.options;
        let a = planned.a_t.as_ref().unwrap_or(&ops.a);
        let b = planned.b_t.as_ref().unwrap_or(&ops.b);
        let d = &self.d;
        let given = planned.ws.take();
        // The epilogue in the coordinates of `[rows, cols]` (D's local block
        // or this rank's product), `row0` its first row of D.
        let epi =
            |zeros: &Tensor<bf16>, rows: usize, cols: usize, row0: usize| -> Result<Epilogue> {
                let d_rows = |t: &Tensor<bf16>| t.narrow(0, row0, rows);
                Ok(Epilogue {
                    alpha: o.alpha,
                    bias_m: zeros.narrow(0, 0, rows)?,
                    bias_n: match &ops.bias {
                        Some(bias) => bias.clone(),
                        None => zeros.narrow(0, 0, cols)?,
                    },
                    biased: ops.bias.is_some(),
                    c: ops
                        .c
                        .as_ref()
                        .map(|c| d_rows(c).map(|c| (o.beta, c)))
                        .transpose()?,
                    aux_out: planned.aux_out.clone(),
                    act: planned.epilogue.act(),
                    aux_in: ops.aux_in.as_ref().map(d_rows).transpose()?,
                })
            };
        let [ld_rows, ld_cols] = self.local[2];
        let (ws, run) = match self.algorithm {
            PlanAlgorithm::AllGatherRows | PlanAlgorithm::AllGatherCols => {
                let dim = match self.algorithm {
                    PlanAlgorithm::AllGatherRows => GatherDim::Rows,
                    _ => GatherDim::Cols,
                };
                let shapes = agm::Shapes::check(
                    pg,
                    OP,
                    [("d", d), ("a", a), ("b", b)],
                    dim,
                    o.chunks,
                    None,
                )?;
                let ws = shapes.workspace(pg, given, o.algorithm)?;
                let e = epi(&ws.zeros, ld_rows, ld_cols, 0)?;
                let run = Run::AllGather(shapes.schedule([d, a, b], e, o.gemm.clone()));
                (ws, run)
            }
            PlanAlgorithm::MatmulAllGather => {
                let shapes =
                    mag::Shapes::check(pg, OP, [("d", d), ("a", a), ("b", b)], o.chunks, None)?;
                let ws = shapes.workspace(pg, given, o.algorithm)?;
                let [m, n] = shapes.product();
                let e = epi(&ws.zeros, m, n, pg.rank() * m)?;
                let run = Run::MatmulAllGather(shapes.schedule([d, a, b], e, o.gemm.clone()));
                (ws, run)
            }
            PlanAlgorithm::ReduceScatterRows
            | PlanAlgorithm::ReduceScatterCols
            | PlanAlgorithm::AllReduce => {
                let (kind, dim) = match self.algorithm {
                    PlanAlgorithm::ReduceScatterRows => {
                        (reduce::Kind::ReduceScatter, ScatterDim::Rows)
                    }
                    PlanAlgorithm::ReduceScatterCols => {
                        (reduce::Kind::ReduceScatter, ScatterDim::Cols)
                    }
                    _ => (reduce::Kind::AllReduce, ScatterDim::Rows),
                };
                let shapes = reduce::Shapes::check(
                    pg,
                    OP,
                    kind,
                    [("d", d), ("a", a), ("b", b)],
                    dim,
                    o.chunks,
                    None,
                )?;
                let ws = shapes.workspace(pg, OP, given, o.algorithm)?;
                // Bias, C and aux in D's coordinates, added once after the reduction.
                let e = epi(&ws.zeros, ld_rows, ld_cols, 0)?;
                let run = Run::Reduce(shapes.schedule([d, a, b], e, false, o.gemm.clone(), &ws));
                (ws, run)
            }
            PlanAlgorithm::Local => {
                let [m, k, n] = [ld_rows, a.size(1), ld_cols];
                let key = format!("{OP}/local/a{m}x{k}/b{k}x{n}/world{w}");
                let ws = Workspace::prepare(given, pg, key, Algorithm::Unfused, m.max(n), || {
                    FusedNeeds {
                        data_bytes: 0,
                        flag_slots: 0,
                    }
                })?;
                let e = epi(&ws.zeros, m, n, 0)?;
                let run = Run::Local {
                    out: d.clone(),
                    a: a.clone(),
                    b: b.clone(),
                    epi: e,
                    gemm_config: o.gemm.clone(),
                };
                (ws, run)
            }
        };
        planned.ws = Some(ws);
        planned.run = Some(run);
        // New operands or workspace: the next execute captures again.
        planned.replays.clear();
        Ok(())
    }
}

/// Queues one call of the plan: the transposed operands made row-major for
/// the GEMM, then the schedule.
fn queue(planned: &mut Planned, ops: &Operands, pg: &ProcessGroup) -> Result<()> {
    if let Some(t) = &planned.a_t {
        transpose(&ops.a, t)?;
    }
    if let Some(t) = &planned.b_t {
        transpose(&ops.b, t)?;
    }
    let (Some(run), Some(ws)) = (&planned.run, planned.ws.as_mut()) else {
        return unreachable_plan();
    };
    run_schedule(run, ws, pg, planned.path)
}

/// Captures the plan's call as CUDA graphs, one per parity of the exchange's
/// calls (see the module docs), after a call queued outside a capture (so
/// nothing compiles or allocates inside one). A capture that fails leaves the
/// plan queueing every call, with a warning.
fn capture(planned: &mut Planned, ops: &Operands, pg: &ProcessGroup) {
    let started = Instant::now();
    let before = planned
        .ws
        .as_ref()
        .and_then(|ws| ws.exchange.as_ref())
        .map(|e| e.calls());
    let parities = if before.is_some() { 2 } else { 1 };
    let mut replays = Vec::with_capacity(parities);
    for _ in 0..parities {
        match Replay::capture(pg.device(), || queue(planned, ops, pg)) {
            Ok(r) => replays.push(r),
            Err(e) => {
                if let (Some(calls), Some(ex)) = (
                    before,
                    planned.ws.as_mut().and_then(|ws| ws.exchange.as_mut()),
                ) {
                    ex.discard_failed_capture(calls);
                }
                tilefuse_runtime::log::warn(format_args!(
                    "rank {}: capturing the plan as a CUDA graph failed ({e}): every execute() queues its work",
                    pg.rank()
                ));
                planned.no_replay = true;
                return;
            }
        }
    }
    // Captured at calls c and c + 1: the replay for parity c % 2 comes first.
    if before.is_some_and(|c| c % 2 == 1) {
        replays.reverse();
    }
    tracing::debug!(
        rank = pg.rank(),
        graphs = replays.len(),
        ms = started.elapsed().as_secs_f64() * 1e3,
        "plan captured for replay"
    );
    planned.replays = replays;
}

/// Runs `run` on `path` (the local GEMM needs no exchange: its fused path is
/// the tilefuse kernel alone).
fn run_schedule(run: &Run, ws: &mut Workspace, pg: &ProcessGroup, path: Algorithm) -> Result<()> {
    match run {
        Run::AllGather(s) => s.run(ws, pg, path),
        Run::MatmulAllGather(s) => s.run(ws, pg, path),
        Run::Reduce(s) => s.run(ws, pg, path),
        Run::Local {
            out,
            a,
            b,
            epi,
            gemm_config,
        } => match path {
            Algorithm::Unfused => unfused::matmul_epilogue(out, a, b, epi, &ws.unused),
            _ => epilogue::gemm(
                Gemm {
                    a,
                    b,
                    out,
                    copies: &[],
                    addend: None,
                    signal: None,
                },
                epi,
                None,
                &ws.unused,
                gemm_config,
            ),
        },
    }
}

/// `t`'s stored `[rows, cols]`: a 2-D, row-major bf16 matrix on this rank's GPU.
fn stored_shape(pg: &ProcessGroup, name: &str, t: &Tensor<bf16>) -> Result<[usize; 2]> {
    check::matrix(pg, OP, name, t)
}

/// An epilogue input: present exactly when `wanted`, of shape `shape`.
fn check_input(
    pg: &ProcessGroup,
    name: &str,
    wanted: bool,
    given: Option<&Tensor<bf16>>,
    shape: &[usize],
    why: &str,
) -> Result<Option<Tensor<bf16>>> {
    match (wanted, given) {
        (false, None) => Ok(None),
        (false, Some(_)) => Err(check::arg(OP, name, format!("was given, but {why}"))),
        (true, None) => Err(check::arg(
            OP,
            name,
            format!("is missing: the epilogue {why}"),
        )),
        (true, Some(t)) => {
            if t.dims() != shape {
                return Err(check::arg(
                    OP,
                    name,
                    format!("expected shape {shape:?}, got {:?}", t.dims()),
                ));
            }
            if t.rank() == 2 {
                check::matrix(pg, OP, name, t)?;
            } else {
                check::on_rank_gpu(pg, OP, name, t)?;
            }
            Ok(Some(t.clone()))
        }
    }
}

/// Refuses a replicated input `t` whose values differ between the ranks
/// (collective: every rank compares every rank's hash, so all agree).
fn same_on_every_rank(
    pg: &ProcessGroup,
    name: &str,
    t: &Tensor<bf16>,
    algorithm: PlanAlgorithm,
) -> Result<()> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for x in t.to_vec()? {
        x.to_bits().hash(&mut h);
    }
    let all = pg.all_gather_bytes("plan-replicated", &h.finish().to_le_bytes())?;
    match all.iter().position(|b| *b != all[0]) {
        None => Ok(()),
        Some(r) => Err(check::arg(
            OP,
            name,
            format!(
                "differs between rank 0 and rank {r}: with D replicated ({algorithm:?}) each rank computes a slab of D with its own copy and the slabs are exchanged, so it must be the same on every rank"
            ),
        )),
    }
}

fn released() -> crate::Error {
    check::arg(
        OP,
        "operands",
        "the operands were released; call reset_operands with new ones first",
    )
}

fn unreachable_plan<T>() -> Result<T> {
    Err(check::arg(
        OP,
        "plan",
        "the plan is incomplete; call plan() again",
    ))
}

#[cfg(test)]
mod tests {
    /// A plan (with its captured graphs) moves between threads, as it did
    /// before replay: this fails to compile otherwise.
    #[test]
    fn plans_are_send() {
        fn is_send<T: Send>() {}
        is_send::<super::DistributedMatmul<'static>>();
    }
}
