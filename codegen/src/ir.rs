//! The tile IR: what a `#[fused_kernel]` body means, independent of any GPU.
//!
//! A kernel is a set of parameters and a body of statements that runs once per
//! *program* (one tile of the outermost `tile()` loop, one CUDA block). Values are
//! tiles: a tile has a set of named tile dimensions and a dtype; a scalar is a tile
//! with no dimensions. Elementwise operations broadcast by dimension *name*, so
//! `acc + bias[tn]` adds the bias along `tn` whatever the order of dimensions.

use crate::dtype::DType;
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
    /// The scalar holding the extent the loop covers.
    pub extent: ScalarId,
    /// `tile([.., whole(d)])`: a single tile covers the whole extent. Its block is
    /// not a tuning choice: the launch fits it to the extent
    /// ([`crate::fit_whole_dims`]). For a dimension an operation needs in one
    /// piece, like attention's head dimension (contracted by `q·kᵀ`, kept whole
    /// in the output accumulator).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole: bool,
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
    /// `tensor[index] = value;`, masked on ragged edges.
    Store {
        tensor: TensorId,
        index: Vec<DimId>,
        value: Expr,
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
    },
    /// `if cond { then } else { otherwise }` on `#[constexpr]` parameters: decided
    /// when the kernel is specialized ([`Kernel::specialize`]), so only the taken
    /// branch is ever checked and lowered.
    If {
        cond: Cond,
        then: Vec<Stmt>,
        otherwise: Vec<Stmt>,
        at: Src,
    },
}

/// Comparisons in a compile-time condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CmpOp {
    /// The operator as C and Rust write it.
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

/// A condition over `#[constexpr]` parameters and integer literals.
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

/// Elementwise binary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Min,
    Max,
}

/// Elementwise unary operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnOp {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Abs,
    Relu,
    Gelu,
    GeluTanh,
    Silu,
    Sigmoid,
    Tanh,
    /// The derivative of `relu`: 1 where the argument is above 0, else 0.
    ReluGrad,
    /// The derivative of (erf) `gelu`: `Φ(x) + x·φ(x)`.
    GeluGrad,
}

impl UnOp {
    /// The DSL name (`relu`), as a user writes it.
    pub fn name(self) -> &'static str {
        match self {
            UnOp::Neg => "neg",
            UnOp::Exp => "exp",
            UnOp::Log => "log",
            UnOp::Sqrt => "sqrt",
            UnOp::Rsqrt => "rsqrt",
            UnOp::Abs => "abs",
            UnOp::Relu => "relu",
            UnOp::Gelu => "gelu",
            UnOp::GeluTanh => "gelu_tanh",
            UnOp::Silu => "silu",
            UnOp::Sigmoid => "sigmoid",
            UnOp::Tanh => "tanh",
            UnOp::ReluGrad => "relu_grad",
            UnOp::GeluGrad => "gelu_grad",
        }
    }

    /// Every unary op the DSL knows, for parsing and for messages.
    pub const ALL: [UnOp; 14] = [
        UnOp::Neg,
        UnOp::Exp,
        UnOp::Log,
        UnOp::Sqrt,
        UnOp::Rsqrt,
        UnOp::Abs,
        UnOp::Relu,
        UnOp::Gelu,
        UnOp::GeluTanh,
        UnOp::Silu,
        UnOp::Sigmoid,
        UnOp::Tanh,
        UnOp::ReluGrad,
        UnOp::GeluGrad,
    ];

    pub fn from_name(name: &str) -> Option<UnOp> {
        UnOp::ALL.into_iter().find(|op| op.name() == name)
    }
}

/// Reductions along one tile dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

impl ReduceOp {
    /// The DSL method (`x.sum(tn)`).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// A tile-valued expression.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Expr {
    Var(VarId),
    /// `tensor[index]`: a tile load, zero-filled outside the tensor.
    Load {
        tensor: TensorId,
        index: Vec<DimId>,
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
    /// `t.index()`: each element's index along tile `t` (an integer tile over `t`),
    /// e.g. for a causal mask `tm.index() >= tn.index()`.
    TileIndex(DimId),
    /// `a < b`, `a == b`, …: 1 where the comparison holds, else 0 (an integer tile
    /// over both operands' tiles).
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
    /// `if cond { then } else { otherwise }` as a value, on `#[constexpr]`
    /// parameters: decided when the kernel is specialized.
    IfConst {
        cond: Box<Cond>,
        then: Box<Expr>,
        otherwise: Box<Expr>,
        at: Src,
    },
}

impl Kernel {
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

    /// Calls `f` on every statement, nested loops included, in source order.
    pub fn walk_stmts<'a>(&'a self, f: &mut impl FnMut(&'a Stmt)) {
        fn go<'a>(stmts: &'a [Stmt], f: &mut impl FnMut(&'a Stmt)) {
            for s in stmts {
                f(s);
                match s {
                    Stmt::Loop { body, .. } => go(body, f),
                    Stmt::If {
                        then, otherwise, ..
                    } => {
                        go(then, f);
                        go(otherwise, f);
                    }
                    _ => {}
                }
            }
        }
        go(&self.body, f);
    }
}

impl Expr {
    /// Calls `f` on this expression and every sub-expression.
    pub fn walk<'a>(&'a self, f: &mut impl FnMut(&'a Expr)) {
        f(self);
        match self {
            Expr::Addmm { acc, a, b, .. } => {
                acc.walk(f);
                a.walk(f);
                b.walk(f);
            }
            Expr::Binary { lhs, rhs, .. } | Expr::Compare { lhs, rhs, .. } => {
                lhs.walk(f);
                rhs.walk(f);
            }
            Expr::Select {
                mask,
                then,
                otherwise,
                ..
            } => {
                mask.walk(f);
                then.walk(f);
                otherwise.walk(f);
            }
            Expr::Unary { arg, .. } | Expr::Cast { arg, .. } | Expr::Reduce { arg, .. } => {
                arg.walk(f)
            }
            Expr::IfConst {
                then, otherwise, ..
            } => {
                then.walk(f);
                otherwise.walk(f);
            }
            _ => {}
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
