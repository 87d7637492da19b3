//! IR builders shared by the codegen tests: kernels built the way `#[fused_kernel]`
//! builds them (tensors and scalars numbered in order of appearance, a store's value
//! before its target; tile dimensions in order of their `tile()` loops).
#![allow(dead_code, unused_imports)]

pub use tilefuse_codegen::config::Config;
pub use tilefuse_codegen::dtype::DType;
pub use tilefuse_codegen::emit::{AttentionShape, GemmShape};
pub use tilefuse_codegen::ir::*;
pub use tilefuse_codegen::spec::{ScalarKind, Spec, TensorSpec};
pub use tilefuse_codegen::{check, default_config, lower, CodegenError, Lowered, Planned};

mod kernels;
pub use kernels::*;

/// A spec with `k`'s declared dtypes (f32 where none is declared), contiguous
/// tensors, and these scalars.
pub fn spec_of(k: &Kernel, scalars: &[ScalarKind]) -> Spec {
    Spec {
        tensors: k
            .tensors
            .iter()
            .map(|t| TensorSpec::contiguous(t.declared.unwrap_or(DType::F32), t.rank))
            .collect(),
        scalars: scalars.to_vec(),
        constexprs: vec![],
    }
}

// ---------------------------------------------------------------- IR builders

pub fn tensor(name: &str, rank: usize, declared: Option<DType>) -> TensorParam {
    TensorParam {
        name: name.into(),
        rank,
        declared,
    }
}

pub fn scalar(name: &str) -> ScalarParam {
    ScalarParam::named(name)
}

pub fn dim(name: &str, extent: ScalarId) -> TileDim {
    TileDim {
        name: name.into(),
        extent: Some(extent),
        whole: false,
        each: false,
    }
}

/// A dimension whose loop computes its bounds (`tile(a..b)`).
pub fn range_dim(name: &str) -> TileDim {
    TileDim {
        name: name.into(),
        extent: None,
        whole: false,
        each: false,
    }
}

/// A dimension walked one index at a time (`each(n)`; `extent: None` for `for i in a..b`).
pub fn each_dim(name: &str, extent: Option<ScalarId>) -> TileDim {
    TileDim {
        name: name.into(),
        extent,
        whole: false,
        each: true,
    }
}

pub fn var(name: &str, mutable: bool) -> Var {
    Var {
        name: name.into(),
        mutable,
    }
}

pub fn load(tensor: TensorId, index: &[DimId], at: &str) -> Expr {
    Expr::Load {
        tensor,
        index: tile_index(index),
        at: at.into(),
    }
}

/// A load with any index components.
pub fn load_ix(tensor: TensorId, index: Vec<Expr>, at: &str) -> Expr {
    Expr::Load {
        tensor,
        index,
        at: at.into(),
    }
}

/// `d`'s own indices (`tn` in an index).
pub fn ti(d: DimId) -> Expr {
    Expr::TileIndex(d)
}

pub fn reduce(op: ReduceOp, arg: Expr, dim: DimId, at: &str) -> Expr {
    Expr::Reduce {
        op,
        arg: Box::new(arg),
        dim,
        at: at.into(),
    }
}

pub fn cmp(op: CmpOp, lhs: Expr, rhs: Expr) -> Expr {
    Expr::Compare {
        op,
        lhs: Box::new(lhs),
        rhs: Box::new(rhs),
        at: String::new(),
    }
}

pub fn select(mask: Expr, a: Expr, b: Expr) -> Expr {
    Expr::Select {
        mask: Box::new(mask),
        then: Box::new(a),
        otherwise: Box::new(b),
        at: String::new(),
    }
}

pub fn rand(kind: RandKind, seed: Expr, offset: Expr) -> Expr {
    Expr::Rand {
        kind,
        seed: Box::new(seed),
        offset: Box::new(offset),
        at: String::new(),
    }
}

pub fn zeros(dims: &[DimId]) -> Expr {
    Expr::Full {
        dims: dims.to_vec(),
        dtype: DType::F32,
        value: 0.0,
    }
}

pub fn bin(op: BinOp, lhs: Expr, rhs: Expr, at: &str) -> Expr {
    Expr::Binary {
        op,
        lhs: Box::new(lhs),
        rhs: Box::new(rhs),
        at: at.into(),
    }
}

pub fn un(op: UnOp, arg: Expr) -> Expr {
    Expr::Unary {
        op,
        arg: Box::new(arg),
    }
}

pub fn cast(arg: Expr, dtype: Option<DType>) -> Expr {
    Expr::Cast {
        arg: Box::new(arg),
        dtype,
    }
}

pub fn addmm(acc: Expr, a: Expr, b: Expr, at: &str) -> Expr {
    Expr::Addmm {
        acc: Box::new(acc),
        a: Box::new(a),
        b: Box::new(b),
        at: at.into(),
    }
}

pub fn let_(var: VarId, value: Expr, at: &str) -> Stmt {
    Stmt::Let {
        var,
        value,
        at: at.into(),
    }
}

pub fn assign(var: VarId, value: Expr, at: &str) -> Stmt {
    Stmt::Assign {
        var,
        value,
        at: at.into(),
    }
}

pub fn store(tensor: TensorId, index: &[DimId], value: Expr, at: &str) -> Stmt {
    Stmt::Store {
        tensor,
        index: tile_index(index),
        value,
        at: at.into(),
    }
}

/// A store with any index components.
pub fn store_ix(tensor: TensorId, index: Vec<Expr>, value: Expr, at: &str) -> Stmt {
    Stmt::Store {
        tensor,
        index,
        value,
        at: at.into(),
    }
}

pub fn atomic(op: AtomicOp, tensor: TensorId, index: Vec<Expr>, value: Expr, at: &str) -> Stmt {
    Stmt::Atomic {
        op,
        tensor,
        index,
        value,
        old: None,
        at: at.into(),
    }
}

/// `for d in tile(begin..end)` (or `for d in begin..end` for an `each` dimension).
pub fn range_loop(dim: DimId, begin: Expr, end: Expr, body: Vec<Stmt>) -> Stmt {
    Stmt::Loop {
        dim,
        body,
        until: None,
        range: Some(Box::new(LoopRange { begin, end })),
    }
}

pub fn loop_(dim: DimId, body: Vec<Stmt>) -> Stmt {
    Stmt::Loop {
        dim,
        body,
        until: None,
        range: None,
    }
}

// Matmul: tensors a=0, b=1, out=2 (bias=3); scalars m=0, n=1, k=2; dims tm=0, tn=1, tk=2; var acc=0.
pub const A: TensorId = 0;
pub const B: TensorId = 1;
pub const OUT: TensorId = 2;
pub const BIAS: TensorId = 3;
pub const TM: DimId = 0;
pub const TN: DimId = 1;
pub const TK: DimId = 2;
pub const ACC: VarId = 0;

pub const ADDMM_AT: &str = "acc = addmm(acc, a[(tm, tk)], b[(tk, tn)])";

/// The K loop `for tk in tile(k) { acc = addmm(acc, a[(tm, tk)], b[(tk, tn)]); }`.
pub fn k_loop() -> Stmt {
    loop_(
        TK,
        vec![assign(
            ACC,
            addmm(
                Expr::Var(ACC),
                load(A, &[TM, TK], "a[(tm, tk)]"),
                load(B, &[TK, TN], "b[(tk, tn)]"),
                "addmm(acc, a[(tm, tk)], b[(tk, tn)])",
            ),
            ADDMM_AT,
        )],
    )
}

/// `out[(tm, tn)] = acc.cast()` after `acc += a·b` over K.
pub fn matmul_with(dtype: DType) -> Kernel {
    Kernel {
        name: "matmul".into(),
        tensors: vec![
            tensor("a", 2, Some(dtype)),
            tensor("b", 2, Some(dtype)),
            tensor("out", 2, Some(dtype)),
        ],
        scalars: vec![scalar("m"), scalar("n"), scalar("k")],
        constexprs: vec![],
        dims: vec![dim("tm", 0), dim("tn", 1), dim("tk", 2)],
        grid: vec![TM, TN],
        grid_start: Vec::new(),
        vars: vec![var("acc", true)],
        body: vec![
            let_(
                ACC,
                zeros(&[TM, TN]),
                "let mut acc = zeros::<f32>([tm, tn]);",
            ),
            k_loop(),
            store(
                OUT,
                &[TM, TN],
                cast(Expr::Var(ACC), None),
                "out[(tm, tn)] = acc.cast()",
            ),
        ],
    }
}

pub fn matmul() -> Kernel {
    matmul_with(DType::BF16)
}

/// `out[(tm, tn)] = gelu(acc + bias[tn]).cast()`.
pub fn matmul_bias_gelu() -> Kernel {
    let mut k = matmul();
    k.name = "matmul_bias_gelu".into();
    k.tensors.push(tensor("bias", 1, Some(DType::BF16)));
    let value = un(
        UnOp::Gelu,
        bin(
            BinOp::Add,
            Expr::Var(ACC),
            load(BIAS, &[TN], "bias[tn]"),
            "acc + bias[tn]",
        ),
    );
    k.body[2] = store(
        OUT,
        &[TM, TN],
        cast(value, None),
        "out[(tm, tn)] = gelu(acc + bias[tn]).cast()",
    );
    k
}

pub fn spec_for(k: &Kernel, dtypes: &[DType]) -> Spec {
    assert_eq!(k.tensors.len(), dtypes.len());
    Spec {
        tensors: k
            .tensors
            .iter()
            .zip(dtypes)
            .map(|(t, &d)| TensorSpec::contiguous(d, t.rank))
            .collect(),
        scalars: vec![ScalarKind::Int; k.scalars.len()],
        constexprs: vec![0; k.constexprs.len()],
    }
}

/// All tensors contiguous and 16-byte aligned, with their declared dtypes.
pub fn declared_spec(k: &Kernel) -> Spec {
    let d: Vec<DType> = k.tensors.iter().map(|t| t.declared.unwrap()).collect();
    spec_for(k, &d)
}

/// [`declared_spec`] with every tensor's rows only 2-byte aligned (odd K or N):
/// rows TMA cannot load and 16-byte loads cannot read.
pub fn unaligned_spec(k: &Kernel) -> Spec {
    let mut spec = declared_spec(k);
    for t in &mut spec.tensors {
        t.align = 2;
    }
    spec
}

pub fn gemm_config() -> Config {
    Config::new(&[128, 256, 32]).num_warps(8).num_stages(4)
}

// Pointwise 2-D: x=0, y=1, out=2; scalars m=0, n=1, alpha=2 (float); dims tm=0, tn=1.
/// `out[(tm, tn)] = relu(x[(tm, tn)] * alpha + y[(tm, tn)])`.
pub fn pointwise_2d() -> Kernel {
    let value = un(
        UnOp::Relu,
        bin(
            BinOp::Add,
            bin(
                BinOp::Mul,
                load(0, &[0, 1], "x[(tm, tn)]"),
                Expr::Scalar(2),
                "x[(tm, tn)] * alpha",
            ),
            load(1, &[0, 1], "y[(tm, tn)]"),
            "x[(tm, tn)] * alpha + y[(tm, tn)]",
        ),
    );
    Kernel {
        name: "axpy_relu".into(),
        tensors: vec![
            tensor("x", 2, Some(DType::F32)),
            tensor("y", 2, Some(DType::F32)),
            tensor("out", 2, Some(DType::BF16)),
        ],
        scalars: vec![scalar("m"), scalar("n"), scalar("alpha")],
        constexprs: vec![],
        dims: vec![dim("tm", 0), dim("tn", 1)],
        grid: vec![0, 1],
        grid_start: Vec::new(),
        vars: vec![],
        body: vec![store(
            2,
            &[0, 1],
            value,
            "out[(tm, tn)] = relu(x[(tm, tn)] * alpha + y[(tm, tn)])",
        )],
    }
}

pub fn pointwise_2d_spec() -> Spec {
    let k = pointwise_2d();
    let mut s = declared_spec(&k);
    s.scalars[2] = ScalarKind::Float;
    s
}

// Pointwise 1-D: x=0, out=1; scalar n=0; dim ti=0; var len=0.
/// `let len = ti.end() - ti.begin(); out[ti] = x[ti] * len;`
pub fn pointwise_1d() -> Kernel {
    Kernel {
        name: "scale_by_len".into(),
        tensors: vec![
            tensor("x", 1, Some(DType::F32)),
            tensor("out", 1, Some(DType::F32)),
        ],
        scalars: vec![scalar("n")],
        constexprs: vec![],
        dims: vec![dim("ti", 0)],
        grid: vec![0],
        grid_start: Vec::new(),
        vars: vec![var("len", false)],
        body: vec![
            let_(
                0,
                bin(
                    BinOp::Sub,
                    Expr::TileEnd(0),
                    Expr::TileBegin(0),
                    "ti.end() - ti.begin()",
                ),
                "let len = ti.end() - ti.begin();",
            ),
            store(
                1,
                &[0],
                bin(
                    BinOp::Mul,
                    load(0, &[0], "x[ti]"),
                    Expr::Var(0),
                    "x[ti] * len",
                ),
                "out[ti] = x[ti] * len",
            ),
        ],
    }
}

// Row loop: x=0, out=1; scalars rows=0, cols=1; dims tr=0 (grid), tc=1 (inner).
/// `for tr in tile(rows) { for tc in tile(cols) { out[(tr, tc)] = x[(tr, tc)] + 1.0; } }`
pub fn rows_inner_loop() -> Kernel {
    Kernel {
        name: "rows".into(),
        tensors: vec![
            tensor("x", 2, Some(DType::F32)),
            tensor("out", 2, Some(DType::F32)),
        ],
        scalars: vec![scalar("rows"), scalar("cols")],
        constexprs: vec![],
        dims: vec![dim("tr", 0), dim("tc", 1)],
        grid: vec![0],
        grid_start: Vec::new(),
        vars: vec![],
        body: vec![loop_(
            1,
            vec![store(
                1,
                &[0, 1],
                bin(
                    BinOp::Add,
                    load(0, &[0, 1], "x[(tr, tc)]"),
                    Expr::Float(1.0),
                    "x[(tr, tc)] + 1.0",
                ),
                "out[(tr, tc)] = x[(tr, tc)] + 1.0",
            )],
        )],
    }
}

/// `k` planned: the lowering it takes chosen (for the functions that read
/// the choice).
pub fn plan(k: &Kernel) -> Planned {
    Planned::new(k.clone())
}

pub fn lowered(k: &Kernel, spec: &Spec, cfg: &Config) -> Lowered {
    match lower(&plan(k), spec, cfg) {
        Ok(l) => l,
        Err(e) => panic!("lowering `{}` with {cfg} failed: {e}", k.name),
    }
}

// ---------------------------------------------------------------- assertion helpers

/// Asserts a `Type` error whose message mentions every one of `names`; returns the message.
#[track_caller]
pub fn expect_type_err(r: Result<impl std::fmt::Debug, CodegenError>, names: &[&str]) -> String {
    match r {
        Err(CodegenError::Type {
            kernel, message, ..
        }) => {
            assert!(!kernel.is_empty());
            for n in names {
                assert!(message.contains(n), "message should mention {n}: {message}");
            }
            message
        }
        other => panic!("expected CodegenError::Type, got {other:?}"),
    }
}

#[track_caller]
pub fn expect_unsupported(r: Result<impl std::fmt::Debug, CodegenError>) -> (String, String) {
    match r {
        Err(CodegenError::Unsupported { at, message, .. }) => (at, message),
        other => panic!("expected CodegenError::Unsupported, got {other:?}"),
    }
}

#[track_caller]
pub fn expect_config_err(r: Result<Lowered, CodegenError>, needle: &str) -> String {
    match r {
        Err(CodegenError::Config {
            kernel,
            config,
            message,
        }) => {
            assert!(!kernel.is_empty() && !config.is_empty());
            assert!(
                message.contains(needle),
                "config message should mention {needle}: {message}"
            );
            message
        }
        Err(other) => panic!("expected CodegenError::Config, got {other:?}"),
        Ok(l) => panic!(
            "expected CodegenError::Config, lowering succeeded ({})",
            l.path
        ),
    }
}

/// The part of the source after the shared prelude: what this kernel generated.
pub fn kernel_part(l: &Lowered) -> &str {
    let start = l
        .source
        .find("// kernel `")
        .expect("source has a kernel header");
    &l.source[start..]
}

// ---------------------------------------------------------------- check()
