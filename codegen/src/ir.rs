//! The tile IR: what a `#[fused_kernel]` body means, independent of any GPU.
//!
//! A kernel is a set of parameters and a body of statements that runs once per
//! *program* (one tile of the outermost `tile()` loop, one CUDA block). Values are
//! tiles: a tile has a set of named tile dimensions and a dtype; a scalar is a tile
//! with no dimensions. Elementwise operations broadcast by dimension *name*, so
//! `acc + bias[tn]` adds the bias along `tn` whatever the order of dimensions.

use crate::dtype::DType;
use crate::spec::ScalarKind;
use serde::{Deserialize, Serialize};

/// Index of a tensor parameter in [`Kernel::tensors`].
pub type TensorId = usize;
/// Index of a runtime scalar in [`Kernel::scalars`].
pub type ScalarId = usize;
/// Index of a compile-time constant in [`Kernel::constexprs`].
pub type ConstId = usize;
/// Index of a tile dimension in [`Kernel::dims`]; also the index of its block size.
pub type DimId = usize;
/// Index of a local variable in [`Kernel::vars`].
pub type VarId = usize;

/// A kernel: parameters, tile dimensions and the per-program body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Kernel {
    pub name: String,
    pub tensors: Vec<TensorParam>,
    pub scalars: Vec<ScalarParam>,
    pub constexprs: Vec<ConstParam>,
    /// Tile dimensions in order of appearance; `Config::block_sizes[d]` is dimension `d`'s block.
    pub dims: Vec<TileDim>,
    /// Dimensions of the outermost `tile()` loop: the launch grid.
    pub grid: Vec<DimId>,
    /// `tile([...]).starting_at([...])`: per grid dimension, the index whose tile
    /// the first programs compute (the order wraps around); empty: from 0.
    #[serde(default)]
    pub grid_start: Vec<ScalarId>,
    pub vars: Vec<Var>,
    pub body: Vec<Stmt>,
}

/// A tensor the kernel reads or writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorParam {
    pub name: String,
    /// Number of dimensions, from how the kernel indexes it.
    pub rank: usize,
    /// The dtype written in the Rust source, when the macro could see it.
    pub declared: Option<DType>,
}

/// A value computed on the host and passed to the kernel at launch (an extent, a
/// captured `let`, a scalar argument).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScalarParam {
    /// The host expression, as written (`m`, `a.size(0)`).
    pub name: String,
    /// Its kind where the source says it (a parameter `alpha: f32`); a
    /// launch passes what the value is, and this is what a specialization
    /// made before any launch (`KernelDef::declared_spec`: NVRTC tests,
    /// `corpus --source`) assumes, `Int` where unsaid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<ScalarKind>,
}

impl Kernel {
    /// Each scalar's declared kind, `Int` where the source does not say.
    pub fn declared_scalar_kinds(&self) -> Vec<ScalarKind> {
        self.scalars
            .iter()
            .map(|s| s.declared.unwrap_or(ScalarKind::Int))
            .collect()
    }
}

impl ScalarParam {
    /// A scalar of no declared kind.
    pub fn named(name: impl Into<String>) -> ScalarParam {
        ScalarParam {
            name: name.into(),
            declared: None,
        }
    }
}

/// A `#[constexpr]` argument: its value is baked into the generated source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConstParam {
    pub name: String,
}

/// One dimension of a `tile()` loop.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TileDim {
    /// The loop variable (`tm`).
    pub name: String,
    /// The host scalar holding the extent `tile(n)` covers; `None` for a loop
    /// whose bounds the program computes (`tile(a..b)`, `for i in a..b`):
    /// see [`Stmt::Loop::range`].
    pub extent: Option<ScalarId>,
    /// `tile([.., whole(d)])`: a single tile covers the whole extent. Its block is
    /// not a tuning choice: the launch fits it to the extent
    /// ([`crate::fit_whole_dims`]). For a dimension an operation needs in one
    /// piece, like attention's head dimension (contracted by `q·kᵀ`, kept whole
    /// in the output accumulator).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole: bool,
    /// `each(n)` in a `tile([...])` list, or `for i in a..b`: one index at a
    /// time (block 1, not a tuning choice). The name is then an integer scalar
    /// (`offsets[b + 1]`), and no value has this dimension.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub each: bool,
}

/// The bounds of a loop the program computes: `tile(begin..end)` walks tiles
/// from `begin` (masked at `end`); `for i in begin..end` each index.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoopRange {
    pub begin: Expr,
    pub end: Expr,
}

/// A local variable bound with `let` inside the device code.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Var {
    pub name: String,
    pub mutable: bool,
}

/// Where something is in the kernel source, for messages: the code as written.
pub type Src = String;

/// A statement of the per-program body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Stmt {
    /// `let [mut] var = value;`
    Let { var: VarId, value: Expr, at: Src },
    /// `var = value;`
    Assign { var: VarId, value: Expr, at: Src },
    /// `tensor[index] = value;`: an element per element of the index, masked
    /// where a tile passes its extent or the index leaves the tensor.
    Store {
        tensor: TensorId,
        /// One integer expression per tensor dimension (see [`Expr::Load`]).
        index: Vec<Expr>,
        value: Expr,
        at: Src,
    },
    /// `atomic_add(tensor[index], value);` (and max, min): each element of
    /// `value` combined into its place atomically, masked as a store.
    /// `let old = atomic_add(…);` also binds `old` to the values each place
    /// held just before (0 where a place is skipped): a fetch-and-add, as
    /// for a token's slot in its expert's or its id's list.
    Atomic {
        op: AtomicOp,
        tensor: TensorId,
        index: Vec<Expr>,
        value: Expr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        old: Option<VarId>,
        at: Src,
    },
    /// `wait(tensor, index, value)`: block until `tensor[index] >= value`, bounded in time.
    /// `wait(tensor, lo..hi, value)` (or `lo..=hi`) waits for every flag in the range:
    /// `index` is then `lo` and `end` the exclusive end.
    Wait {
        tensor: TensorId,
        index: Expr,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        end: Option<Expr>,
        value: Expr,
        at: Src,
    },
    /// `signal(tensor, index, value)`: once every store of this program above it
    /// is done and visible to the whole system (other GPUs, copy engines), adds
    /// `value` to the 32-bit counter `tensor[index]` atomically (wrapping). An
    /// index outside the tensor, or a tile past the grid's end (a cluster's
    /// block beyond the extent), adds nothing. The host or another kernel reads the
    /// counter: e.g. each tile adds its area to its row chunk's counter, and the
    /// chunk is done when the counter has grown by the chunk's area.
    Signal {
        tensor: TensorId,
        index: Expr,
        value: Expr,
        at: Src,
    },
    /// A nested `for d in tile(extent) { body }`, run sequentially inside the program.
    /// `tile(extent).until(bound)` walks only the tiles that begin before `bound`
    /// (an integer scalar computed in the program, e.g. `tm.end()` for a causal
    /// mask's last useful tile); the tiles keep their extent, so the last one may
    /// reach past `bound`.
    Loop {
        dim: DimId,
        body: Vec<Stmt>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<Expr>,
        /// `tile(begin..end)` / `for i in begin..end`: bounds computed in the
        /// program (integer scalars); `None`: from 0 to the dimension's extent.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        range: Option<Box<LoopRange>>,
    },
    /// `if cond { then } else { otherwise }`: on `#[constexpr]` parameters it
    /// is decided when the kernel is specialized ([`Kernel::specialize`]), so
    /// only the taken branch is ever checked and lowered; on runtime scalars
    /// the whole program takes one branch.
    If {
        cond: Cond,
        then: Vec<Stmt>,
        otherwise: Vec<Stmt>,
        at: Src,
    },
}

pub use crate::prims::{AtomicOp, BinOp, CmpOp, RandKind, ReduceOp, UnOp};

/// A condition of a device `if`: over `#[constexpr]` parameters and literals
/// it is decided when the kernel is specialized; over runtime scalars (host
/// values, scalars computed in the program) it is a branch the whole
/// program takes together.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Cond {
    Cmp {
        op: CmpOp,
        lhs: Expr,
        rhs: Expr,
    },
    Not(Box<Cond>),
    And(Box<Cond>, Box<Cond>),
    Or(Box<Cond>, Box<Cond>),
    /// A bare value: true when not zero.
    NonZero(Expr),
}

/// A tile-valued expression.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Expr {
    Var(VarId),
    /// `tensor[index]`: a load, zero-filled outside the tensor. Each index
    /// component is an integer expression: a tile's indices
    /// ([`Expr::TileIndex`], written `tn`), offset (`tn + n1`), gathered
    /// (`ids[tt]`) or a scalar (`b`, `offsets[b]`); the value has the union
    /// of the components' tile dimensions.
    Load {
        tensor: TensorId,
        index: Vec<Expr>,
        at: Src,
    },
    /// `zeros::<T>([dims])` (value 0) or `full::<T>([dims], value)`.
    Full {
        dims: Vec<DimId>,
        dtype: DType,
        #[serde(with = "any_f64")]
        value: f64,
    },
    /// `addmm(acc, a, b)`: `acc + a·b` on tensor cores, f32 accumulation.
    Addmm {
        acc: Box<Expr>,
        a: Box<Expr>,
        b: Box<Expr>,
        at: Src,
    },
    Binary {
        op: BinOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
        at: Src,
    },
    Unary {
        op: UnOp,
        arg: Box<Expr>,
    },
    /// `rand(seed, offset)`, `randn(…)`, `randint(…)`: a counter-based random
    /// number per element of `offset` (an integer tile), keyed by `seed` (an
    /// integer scalar); see [`crate::prims::rand`].
    Rand {
        kind: RandKind,
        seed: Box<Expr>,
        offset: Box<Expr>,
        at: Src,
    },
    /// `.cast::<T>()`; `dtype: None` is `.cast()`, taking the type of the tensor it is stored to.
    Cast {
        arg: Box<Expr>,
        dtype: Option<DType>,
    },
    Int(i64),
    Float(#[serde(with = "any_f64")] f64),
    Scalar(ScalarId),
    Const(ConstId),
    /// `t.begin()`: first index the program's tile covers along `t`.
    TileBegin(DimId),
    /// `t.end()`: one past the last index, clipped to the extent.
    TileEnd(DimId),
    /// `t.size()`: `end - begin`.
    TileSize(DimId),
    /// `x.sum(t)`, `x.max(t)`, `x.min(t)`: `x` reduced along tile `t` (its in-bounds
    /// elements only), a tile without that dimension.
    Reduce {
        op: ReduceOp,
        arg: Box<Expr>,
        dim: DimId,
        at: Src,
    },
    /// `x.cumsum(t)`, `x.cummax(t)`, …: the inclusive scan of `x` along tile `t`
    /// by a reduction's operation (each element combined with those before it
    /// in the tile), the same tiles as `x`.
    Scan {
        op: ReduceOp,
        arg: Box<Expr>,
        dim: DimId,
        at: Src,
    },
    /// `x.argmax(t)`, `x.argmin(t)`: the index along tile `t` (as `t.index()`
    /// counts, i64) of the first element equal to `x.max(t)` (`x.min(t)`), a
    /// tile without `t`. NaNs are never picked; a block of NaNs only gives
    /// its first index.
    ArgReduce {
        op: ReduceOp,
        arg: Box<Expr>,
        dim: DimId,
        at: Src,
    },
    /// `t.index()`: each element's index along tile `t` (an integer tile over `t`),
    /// e.g. for a causal mask `tm.index() >= tn.index()`.
    TileIndex(DimId),
    /// `a < b`, `a == b`, …: a mask (`bool`) over both operands' tiles.
    Compare {
        op: CmpOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
        at: Src,
    },
    /// `select(mask, a, b)`: `a` where `mask` is not zero, else `b`, elementwise
    /// (broadcast by tile name).
    Select {
        mask: Box<Expr>,
        then: Box<Expr>,
        otherwise: Box<Expr>,
        at: Src,
    },
    /// `if cond { then } else { otherwise }` as a value: on `#[constexpr]`
    /// parameters decided when the kernel is specialized; on runtime scalars a
    /// `select`.
    IfConst {
        cond: Box<Cond>,
        then: Box<Expr>,
        otherwise: Box<Expr>,
        at: Src,
    },
}

impl Kernel {
    /// A kernel named `name` with nothing in it yet: what a test or a tool
    /// fills in field by field.
    pub fn empty(name: &str) -> Kernel {
        Kernel {
            name: name.into(),
            tensors: vec![],
            scalars: vec![],
            constexprs: vec![],
            dims: vec![],
            grid: vec![],
            grid_start: vec![],
            vars: vec![],
            body: vec![],
        }
    }

    /// A stable hash of the kernel's meaning, for cache keys.
    pub fn fingerprint(&self) -> u64 {
        crate::hash::fnv1a64(self.to_json().as_bytes())
    }

    /// The serialized form the macro embeds in the user's crate.
    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads back what [`Kernel::to_json`] wrote.
    pub fn from_json(text: &str) -> Result<Kernel, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Calls `f` on every statement, nested loops and branches included, in
    /// source order.
    pub fn walk_stmts<'a>(&'a self, f: &mut impl FnMut(&'a Stmt)) {
        walk_stmts(&self.body, f);
    }

    /// Calls `f` on every expression of the body and each of its
    /// sub-expressions (see [`Expr::walk`]).
    pub fn walk_exprs<'a>(&'a self, f: &mut impl FnMut(&'a Expr)) {
        self.walk_stmts(&mut |s| {
            for e in s.exprs() {
                e.walk(f);
            }
        });
    }

    /// The kernel with every `at` emptied: kernels that differ only in how
    /// their parts were written (a parsed kernel and the macro's) compare equal.
    pub fn without_at(&self) -> Kernel {
        fn expr(e: &Expr) -> Expr {
            let mut e = e.map_children(&mut expr);
            if let Some(at) = e.at_mut() {
                at.clear();
            }
            e
        }
        fn stmts(list: &[Stmt]) -> Vec<Stmt> {
            list.iter()
                .map(|s| {
                    let mapped: Result<Stmt, std::convert::Infallible> =
                        s.try_map(&mut |e| Ok(expr(e)), &mut |b| Ok(stmts(b)));
                    let mut s = match mapped {
                        Ok(s) => s,
                        Err(never) => match never {},
                    };
                    if let Some(at) = s.at_mut() {
                        at.clear();
                    }
                    s
                })
                .collect()
        }
        Kernel {
            body: stmts(&self.body),
            ..self.clone()
        }
    }

    /// Whether tile dimension `d` is walked one index at a time (`each`).
    pub fn is_each(&self, d: DimId) -> bool {
        self.dims.get(d).is_some_and(|x| x.each)
    }

    /// The tensors whose contents depend on the order atomics land in: those
    /// written with an atomic's old values (`let slot = atomic_add(…)`),
    /// in the value, the place or a branch's condition, directly or through
    /// variables. Two correct runs may differ there (a mixture-of-experts
    /// dispatch's slots, and which rows it keeps); everything else a kernel
    /// writes does not (up to a float sum's rounding).
    pub fn order_dependent(&self) -> Vec<TensorId> {
        fn reads(e: &Expr, vars: &[VarId]) -> bool {
            let mut found = false;
            e.walk(&mut |x| found |= matches!(x, Expr::Var(v) if vars.contains(v)));
            found
        }
        fn visit(stmts: &[Stmt], under: bool, vars: &mut Vec<VarId>, out: &mut Vec<TensorId>) {
            for s in stmts {
                let tainted = under || s.exprs().into_iter().any(|e| reads(e, vars));
                match s {
                    Stmt::Let { var, .. } | Stmt::Assign { var, .. }
                        if tainted && !vars.contains(var) =>
                    {
                        vars.push(*var)
                    }
                    Stmt::Atomic { old: Some(v), .. } if !vars.contains(v) => vars.push(*v),
                    _ => {}
                }
                match s {
                    Stmt::Store { tensor, .. } | Stmt::Atomic { tensor, .. }
                        if tainted && !out.contains(tensor) =>
                    {
                        out.push(*tensor)
                    }
                    Stmt::Loop { body, .. } => visit(body, tainted, vars, out),
                    Stmt::If {
                        then, otherwise, ..
                    } => {
                        visit(then, tainted, vars, out);
                        visit(otherwise, tainted, vars, out);
                    }
                    _ => {}
                }
            }
        }
        // Until nothing changes: a loop may carry a tainted value back to
        // the statements above the one that taints it.
        let (mut vars, mut out) = (Vec::new(), Vec::new());
        loop {
            let before = (vars.len(), out.len());
            visit(&self.body, false, &mut vars, &mut out);
            if (vars.len(), out.len()) == before {
                return out;
            }
        }
    }
}

/// Calls `f` on every statement of `stmts`, nested ones included, in source order.
pub fn walk_stmts<'a>(stmts: &'a [Stmt], f: &mut impl FnMut(&'a Stmt)) {
    for s in stmts {
        f(s);
        match s {
            Stmt::Loop { body, .. } => walk_stmts(body, f),
            Stmt::If {
                then, otherwise, ..
            } => {
                walk_stmts(then, f);
                walk_stmts(otherwise, f);
            }
            _ => {}
        }
    }
}

/// The dimensions of an index whose every component is a tile's own indices
/// (`t[(tm, tn)]`): what the fast lowerings take. `None` for offsets,
/// gathers and scalars.
pub fn plain_index(index: &[Expr]) -> Option<Vec<DimId>> {
    index
        .iter()
        .map(|e| match e {
            Expr::TileIndex(d) => Some(*d),
            _ => None,
        })
        .collect()
}

/// `t[(tm, tn)]`'s index: each component a tile's own indices.
pub fn tile_index(dims: &[DimId]) -> Vec<Expr> {
    dims.iter().map(|&d| Expr::TileIndex(d)).collect()
}

impl Cond {
    /// Whether the condition reads only `#[constexpr]` values and literals
    /// (specialization decides it).
    pub fn is_compile_time(&self) -> bool {
        let mut ok = true;
        for e in self.exprs() {
            e.walk(&mut |x| {
                ok &= matches!(
                    x,
                    Expr::Int(_) | Expr::Const(_) | Expr::Unary { .. } | Expr::Binary { .. }
                )
            });
        }
        ok
    }

    /// The expressions the condition compares.
    pub fn exprs(&self) -> Vec<&Expr> {
        match self {
            Cond::Cmp { lhs, rhs, .. } => vec![lhs, rhs],
            Cond::Not(c) => c.exprs(),
            Cond::And(a, b) | Cond::Or(a, b) => {
                let mut v = a.exprs();
                v.extend(b.exprs());
                v
            }
            Cond::NonZero(e) => vec![e],
        }
    }

    /// The condition with each expression replaced by `f(expr)`.
    pub fn try_map<E>(&self, f: &mut impl FnMut(&Expr) -> Result<Expr, E>) -> Result<Cond, E> {
        Ok(match self {
            Cond::Cmp { op, lhs, rhs } => Cond::Cmp {
                op: *op,
                lhs: f(lhs)?,
                rhs: f(rhs)?,
            },
            Cond::Not(c) => Cond::Not(Box::new(c.try_map(f)?)),
            Cond::And(a, b) => Cond::And(Box::new(a.try_map(f)?), Box::new(b.try_map(f)?)),
            Cond::Or(a, b) => Cond::Or(Box::new(a.try_map(f)?), Box::new(b.try_map(f)?)),
            Cond::NonZero(e) => Cond::NonZero(f(e)?),
        })
    }
}

/// The variants of [`Stmt`] that carry their source text (all but loops),
/// matched once for [`Stmt::at_mut`] and [`Stmt::at_text`].
macro_rules! stmt_at {
    ($s:expr) => {
        match $s {
            Stmt::Let { at, .. }
            | Stmt::Assign { at, .. }
            | Stmt::Store { at, .. }
            | Stmt::Atomic { at, .. }
            | Stmt::Wait { at, .. }
            | Stmt::Signal { at, .. }
            | Stmt::If { at, .. } => Some(at),
            Stmt::Loop { .. } => None,
        }
    };
}

/// The variants of [`Expr`] that carry their source text, matched once for
/// [`Expr::at`] and [`Expr::at_mut`].
macro_rules! expr_at {
    ($e:expr) => {
        match $e {
            Expr::Load { at, .. }
            | Expr::Addmm { at, .. }
            | Expr::Binary { at, .. }
            | Expr::Rand { at, .. }
            | Expr::Reduce { at, .. }
            | Expr::Scan { at, .. }
            | Expr::ArgReduce { at, .. }
            | Expr::Compare { at, .. }
            | Expr::Select { at, .. }
            | Expr::IfConst { at, .. } => Some(at),
            _ => None,
        }
    };
}

impl Stmt {
    /// The statement's own expressions (not those of nested statements):
    /// values, indices, flag parts, loop bounds, a condition's operands.
    pub fn exprs(&self) -> Vec<&Expr> {
        match self {
            Stmt::Let { value, .. } | Stmt::Assign { value, .. } => vec![value],
            Stmt::Store { index, value, .. } | Stmt::Atomic { index, value, .. } => {
                index.iter().chain([value]).collect()
            }
            Stmt::Wait {
                index, end, value, ..
            } => [index, value].into_iter().chain(end).collect(),
            Stmt::Signal { index, value, .. } => vec![index, value],
            Stmt::Loop { until, range, .. } => until
                .iter()
                .chain(range.iter().flat_map(|r| [&r.begin, &r.end]))
                .collect(),
            Stmt::If { cond, .. } => cond.exprs(),
        }
    }

    /// The statement with each of its own expressions replaced by `f(expr)`
    /// and each nested statement list by `g(list)`.
    pub fn try_map<E>(
        &self,
        f: &mut impl FnMut(&Expr) -> Result<Expr, E>,
        g: &mut impl FnMut(&[Stmt]) -> Result<Vec<Stmt>, E>,
    ) -> Result<Stmt, E> {
        let index = |ix: &[Expr], f: &mut dyn FnMut(&Expr) -> Result<Expr, E>| {
            ix.iter().map(f).collect::<Result<Vec<_>, E>>()
        };
        Ok(match self {
            Stmt::Let { var, value, at } => Stmt::Let {
                var: *var,
                value: f(value)?,
                at: at.clone(),
            },
            Stmt::Assign { var, value, at } => Stmt::Assign {
                var: *var,
                value: f(value)?,
                at: at.clone(),
            },
            Stmt::Store {
                tensor,
                index: ix,
                value,
                at,
            } => Stmt::Store {
                tensor: *tensor,
                index: index(ix, f)?,
                value: f(value)?,
                at: at.clone(),
            },
            Stmt::Atomic {
                op,
                tensor,
                index: ix,
                value,
                old,
                at,
            } => Stmt::Atomic {
                op: *op,
                tensor: *tensor,
                index: index(ix, f)?,
                value: f(value)?,
                old: *old,
                at: at.clone(),
            },
            Stmt::Wait {
                tensor,
                index,
                end,
                value,
                at,
            } => Stmt::Wait {
                tensor: *tensor,
                index: f(index)?,
                end: end.as_ref().map(&mut *f).transpose()?,
                value: f(value)?,
                at: at.clone(),
            },
            Stmt::Signal {
                tensor,
                index,
                value,
                at,
            } => Stmt::Signal {
                tensor: *tensor,
                index: f(index)?,
                value: f(value)?,
                at: at.clone(),
            },
            Stmt::Loop {
                dim,
                body,
                until,
                range,
            } => Stmt::Loop {
                dim: *dim,
                body: g(body)?,
                until: until.as_ref().map(&mut *f).transpose()?,
                range: match range {
                    Some(r) => Some(Box::new(LoopRange {
                        begin: f(&r.begin)?,
                        end: f(&r.end)?,
                    })),
                    None => None,
                },
            },
            Stmt::If {
                cond,
                then,
                otherwise,
                at,
            } => Stmt::If {
                cond: cond.try_map(f)?,
                then: g(then)?,
                otherwise: g(otherwise)?,
                at: at.clone(),
            },
        })
    }

    /// The statement's source text, for those that carry one (not a loop).
    pub fn at_mut(&mut self) -> Option<&mut Src> {
        stmt_at!(self)
    }

    /// Where the statement is in the source, for messages (a loop: a phrase).
    pub fn at_text(&self) -> &str {
        stmt_at!(self).map_or("a `tile()` loop", |at| at.as_str())
    }
}

impl Expr {
    /// The expression's source text, for those that carry one.
    pub fn at(&self) -> Option<&Src> {
        expr_at!(self)
    }

    /// [`Expr::at`], to change.
    pub fn at_mut(&mut self) -> Option<&mut Src> {
        expr_at!(self)
    }

    /// The direct sub-expressions (a load's index components included).
    pub fn children(&self) -> Vec<&Expr> {
        match self {
            Expr::Load { index, .. } => index.iter().collect(),
            Expr::Addmm { acc, a, b, .. } => vec![acc, a, b],
            Expr::Binary { lhs, rhs, .. } | Expr::Compare { lhs, rhs, .. } => vec![lhs, rhs],
            Expr::Select {
                mask,
                then,
                otherwise,
                ..
            } => vec![mask, then, otherwise],
            Expr::Unary { arg, .. }
            | Expr::Cast { arg, .. }
            | Expr::Reduce { arg, .. }
            | Expr::Scan { arg, .. }
            | Expr::ArgReduce { arg, .. } => vec![arg],
            Expr::Rand { seed, offset, .. } => vec![seed, offset],
            Expr::IfConst {
                cond,
                then,
                otherwise,
                ..
            } => {
                let mut v = cond.exprs();
                v.push(then);
                v.push(otherwise);
                v
            }
            Expr::Var(_)
            | Expr::Full { .. }
            | Expr::Int(_)
            | Expr::Float(_)
            | Expr::Scalar(_)
            | Expr::Const(_)
            | Expr::TileBegin(_)
            | Expr::TileEnd(_)
            | Expr::TileSize(_)
            | Expr::TileIndex(_) => Vec::new(),
        }
    }

    /// Calls `f` on this expression and every sub-expression, parents first.
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Expr)) {
        f(self);
        for c in self.children() {
            c.walk(f);
        }
    }

    /// The expression with each direct sub-expression replaced by `f(child)`.
    pub fn try_map_children<E>(
        &self,
        f: &mut impl FnMut(&Expr) -> Result<Expr, E>,
    ) -> Result<Expr, E> {
        let mut b = |x: &Expr| f(x).map(Box::new);
        Ok(match self {
            Expr::Load { tensor, index, at } => Expr::Load {
                tensor: *tensor,
                index: index.iter().map(&mut *f).collect::<Result<_, _>>()?,
                at: at.clone(),
            },
            Expr::Addmm { acc, a, b: bb, at } => Expr::Addmm {
                acc: b(acc)?,
                a: b(a)?,
                b: b(bb)?,
                at: at.clone(),
            },
            Expr::Binary { op, lhs, rhs, at } => Expr::Binary {
                op: *op,
                lhs: b(lhs)?,
                rhs: b(rhs)?,
                at: at.clone(),
            },
            Expr::Compare { op, lhs, rhs, at } => Expr::Compare {
                op: *op,
                lhs: b(lhs)?,
                rhs: b(rhs)?,
                at: at.clone(),
            },
            Expr::Select {
                mask,
                then,
                otherwise,
                at,
            } => Expr::Select {
                mask: b(mask)?,
                then: b(then)?,
                otherwise: b(otherwise)?,
                at: at.clone(),
            },
            Expr::Unary { op, arg } => Expr::Unary {
                op: *op,
                arg: b(arg)?,
            },
            Expr::Cast { arg, dtype } => Expr::Cast {
                arg: b(arg)?,
                dtype: *dtype,
            },
            Expr::Reduce { op, arg, dim, at } => Expr::Reduce {
                op: *op,
                arg: b(arg)?,
                dim: *dim,
                at: at.clone(),
            },
            Expr::Scan { op, arg, dim, at } => Expr::Scan {
                op: *op,
                arg: b(arg)?,
                dim: *dim,
                at: at.clone(),
            },
            Expr::ArgReduce { op, arg, dim, at } => Expr::ArgReduce {
                op: *op,
                arg: b(arg)?,
                dim: *dim,
                at: at.clone(),
            },
            Expr::Rand {
                kind,
                seed,
                offset,
                at,
            } => Expr::Rand {
                kind: *kind,
                seed: b(seed)?,
                offset: b(offset)?,
                at: at.clone(),
            },
            Expr::IfConst {
                cond,
                then,
                otherwise,
                at,
            } => Expr::IfConst {
                cond: Box::new(cond.try_map(f)?),
                then: Box::new(f(then)?),
                otherwise: Box::new(f(otherwise)?),
                at: at.clone(),
            },
            other => other.clone(),
        })
    }

    /// [`Expr::try_map_children`] for a replacement that cannot fail.
    pub fn map_children(&self, f: &mut impl FnMut(&Expr) -> Expr) -> Expr {
        let r: Result<Expr, std::convert::Infallible> = self.try_map_children(&mut |x| Ok(f(x)));
        match r {
            Ok(e) => e,
            Err(never) => match never {},
        }
    }
}

/// JSON has no infinities or NaN: those are written as the strings `"inf"`,
/// `"-inf"` and `"nan"` (a max's starting value is `-inf`), finite values as numbers.
mod any_f64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else if v.is_nan() {
            s.serialize_str("nan")
        } else if *v > 0.0 {
            s.serialize_str("inf")
        } else {
            s.serialize_str("-inf")
        }
    }

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Num(f64),
        Text(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Repr::deserialize(d)? {
            Repr::Num(v) => Ok(v),
            Repr::Text(t) => match t.as_str() {
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                "nan" => Ok(f64::NAN),
                other => Err(serde::de::Error::custom(format!(
                    "expected a number, \"inf\", \"-inf\" or \"nan\", got \"{other}\""
                ))),
            },
        }
    }
}
