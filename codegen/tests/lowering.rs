//! Checks, classification and lowering of hand-built tile IR: no GPU, no NVRTC.
//!
//! The kernels are built the way `#[fused_kernel]` builds them: tensors and scalars
//! are numbered in order of appearance (a store's value before its target), tile
//! dimensions in order of their `tile()` loops.

mod common;

use common::*;

#[test]
fn check_accepts_matmul_and_bias_epilogue() {
    let k = matmul();
    let c = check(&k, &declared_spec(&k)).expect("matmul checks");
    assert_eq!(c.vars.len(), 1);
    assert_eq!(c.vars[ACC].dims, vec![TM, TN]);
    assert_eq!(c.vars[ACC].dtype, DType::F32);

    let k = matmul_bias_gelu();
    check(&k, &declared_spec(&k)).expect("matmul + bias + gelu checks");
}

/// `addmm` contracts by name: `b[(tn, tk)]` (a K-major B, `a·bᵀ`) type-checks,
/// and the matmul lowering says it does not take that layout yet; with no
/// shared tile to contract over, the checker says which tiles it saw.
#[test]
fn addmm_contracts_by_name() {
    // The matmul with its B operand loaded as `index`.
    let with_b = |index: &[DimId], at: &str| {
        let mut k = matmul();
        let Stmt::Loop { body, .. } = &mut k.body[1] else {
            unreachable!()
        };
        let Stmt::Assign { value, .. } = &mut body[0] else {
            unreachable!()
        };
        let Expr::Addmm { b, .. } = value else {
            unreachable!()
        };
        **b = load(B, index, at);
        k
    };
    // A K-major B (`a·bᵀ`) checks, and the general lowering takes it.
    let k = with_b(&[TN, TK], "b[(tn, tk)]");
    check(&k, &declared_spec(&k)).expect("a·bᵀ checks");
    let l = lower(&plan(&k), &declared_spec(&k), &default_config(&plan(&k))).unwrap();
    assert_eq!(l.path, "general");

    let k = with_b(&[TN, TM], "b[(tn, tm)]");
    let msg = expect_type_err(check(&k, &declared_spec(&k)), &["[tm, tk]"]);
    assert!(msg.contains("contracts over the one tile"), "{msg}");
}

#[test]
fn check_rejects_f32_addmm_operands() {
    let k = matmul();
    let spec = spec_for(&k, &[DType::F32, DType::F32, DType::F32]);
    let mut k = k;
    for t in &mut k.tensors {
        t.declared = Some(DType::F32);
    }
    let err = check(&k, &spec).unwrap_err();
    let CodegenError::Type { at, message, .. } = &err else {
        panic!("expected a type error, got {err:?}")
    };
    assert!(at.contains("addmm"), "at: {at}");
    assert!(message.contains("bf16 or f16"), "{message}");
    assert!(message.contains("got f32 and f32"), "{message}");
    assert!(err.to_string().contains("`matmul`"), "{err}");
}

#[test]
fn check_rejects_mixed_half_addmm_operands() {
    let k = matmul();
    let spec = spec_for(&k, &[DType::BF16, DType::F16, DType::BF16]);
    let mut k = k;
    k.tensors[B].declared = None;
    expect_type_err(check(&k, &spec), &["bf16", "f16"]);
}

#[test]
fn check_rejects_accumulator_with_wrong_dims() {
    let mut k = matmul();
    k.body[0] = let_(ACC, zeros(&[TM]), "let mut acc = zeros::<f32>([tm]);");
    let msg = expect_type_err(check(&k, &declared_spec(&k)), &["[tm, tn]", "over [tm]"]);
    assert!(msg.contains("accumulator"), "{msg}");
}

#[test]
fn check_rejects_bf16_accumulator() {
    let mut k = matmul();
    k.body[0] = let_(
        ACC,
        Expr::Full {
            dims: vec![TM, TN],
            dtype: DType::BF16,
            value: 0.0,
        },
        "let mut acc = zeros::<bf16>([tm, tn]);",
    );
    expect_type_err(check(&k, &declared_spec(&k)), &["f32 tile", "got a bf16"]);
}

#[test]
fn check_rejects_store_of_value_with_extra_dims() {
    // out[tm] = x[(tm, tn)]
    let mut k = pointwise_2d();
    k.tensors[2].rank = 1;
    k.body = vec![store(
        2,
        &[0],
        load(0, &[0, 1], "x[(tm, tn)]"),
        "out[tm] = x[(tm, tn)]",
    )];
    let mut spec = pointwise_2d_spec();
    spec.tensors[2].rank = 1;
    let msg = expect_type_err(check(&k, &spec), &["`out`", "[tm, tn]", "[tm]"]);
    assert!(msg.contains("every dimension of the value"), "{msg}");
}

#[test]
fn check_accepts_broadcast_store() {
    // out[(tm, tn)] = x[tn] * 2.0: fewer dimensions than the index is fine.
    let mut k = pointwise_2d();
    k.tensors[0].rank = 1;
    k.body = vec![store(
        2,
        &[0, 1],
        bin(
            BinOp::Mul,
            load(0, &[1], "x[tn]"),
            Expr::Float(2.0),
            "x[tn] * 2.0",
        ),
        "out[(tm, tn)] = x[tn] * 2.0",
    )];
    let mut spec = pointwise_2d_spec();
    spec.tensors[0].rank = 1;
    check(&k, &spec).expect("broadcast along tm");
}

#[test]
fn check_rejects_wrong_number_of_index_tiles() {
    // `x` is 2-D but loaded as x[tm].
    let mut k = pointwise_2d();
    k.body = vec![store(
        2,
        &[0, 1],
        load(0, &[0], "x[tm]"),
        "out[(tm, tn)] = x[tm]",
    )];
    let msg = expect_type_err(
        check(&k, &pointwise_2d_spec()),
        &["`x`", "2-D", "1 component"],
    );
    assert!(msg.contains("indexed"), "{msg}");
}

/// `out[(tm, tm)]` indexes both axes by `tm`'s indices: the diagonal.
#[test]
fn a_tile_indexing_two_axes_is_a_diagonal() {
    let mut k = pointwise_2d();
    k.body = vec![store(2, &[0, 0], Expr::Float(1.0), "out[(tm, tm)] = 1.0")];
    check(&k, &pointwise_2d_spec()).expect("a diagonal store checks");
    let l = lowered(&k, &pointwise_2d_spec(), &Config::new(&[16, 16]));
    assert!(
        kernel_part(&l).contains("* t2_s0 + (tb0"),
        "{}",
        kernel_part(&l)
    );
}

#[test]
fn check_rejects_tile_outside_its_loop() {
    // After the K loop: out[(tm, tn)] = acc.cast() + a[(tm, tk)] uses `tk` out of scope.
    let mut k = matmul();
    k.body[2] = store(
        OUT,
        &[TM, TN],
        bin(
            BinOp::Add,
            Expr::Var(ACC),
            load(A, &[TM, TK], "a[(tm, tk)]"),
            "acc + a[(tm, tk)]",
        ),
        "out[(tm, tn)] = acc + a[(tm, tk)]",
    );
    let err = check(&k, &declared_spec(&k)).unwrap_err();
    let CodegenError::Type { at, message, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(message.contains("tile `tk`"), "{message}");
    assert!(message.contains("outside the loop"), "{message}");
    assert_eq!(at, "a[(tm, tk)]");

    // `tk.begin()` after the loop, and zeros over `tk`: same error.
    for e in [Expr::TileBegin(TK), Expr::TileSize(TK), zeros(&[TM, TK])] {
        let mut k = matmul();
        k.vars.push(var("late", false));
        k.body.push(let_(1, e, "let late = …;"));
        expect_type_err(check(&k, &declared_spec(&k)), &["tile `tk`", "outside"]);
    }
}

#[test]
fn check_rejects_wait_on_2d_or_f32_flags() {
    // wait(flags, tm.begin(), 1) with flags 2-D or f32.
    let base = |rank: usize, dtype: DType| {
        let mut k = pointwise_1d();
        k.tensors.push(tensor("flags", rank, None));
        k.body.insert(
            0,
            Stmt::Wait {
                tensor: 2,
                end: None,
                index: Expr::TileBegin(0),
                value: Expr::Int(1),
                at: "wait(flags, ti.begin(), 1)".into(),
            },
        );
        let mut spec = declared_spec(&Kernel {
            tensors: k.tensors[..2].to_vec(),
            ..k.clone()
        });
        spec.tensors.push(TensorSpec::contiguous(dtype, rank));
        (k, spec)
    };
    let (k, spec) = base(1, DType::U32);
    check(&k, &spec).expect("1-D u32 flags are fine");
    let (k, spec) = base(1, DType::I32);
    check(&k, &spec).expect("1-D i32 flags are fine");

    let (k, spec) = base(2, DType::U32);
    let msg = expect_type_err(check(&k, &spec), &["`flags`", "2-D Tensor<u32>"]);
    assert!(msg.contains("`wait`"), "{msg}");
    let (k, spec) = base(1, DType::F32);
    expect_type_err(check(&k, &spec), &["`flags`", "1-D Tensor<f32>"]);
}

#[test]
fn check_rejects_wait_with_tile_or_float_index() {
    let mut k = pointwise_1d();
    k.tensors.push(tensor("flags", 1, Some(DType::U32)));
    k.body.insert(
        0,
        Stmt::Wait {
            tensor: 2,
            end: None,
            index: load(0, &[0], "x[ti]"),
            value: Expr::Int(1),
            at: "wait(flags, x[ti], 1)".into(),
        },
    );
    let spec = declared_spec(&k);
    expect_type_err(check(&k, &spec), &["index of `wait`", "[ti]"]);

    let Stmt::Wait { index, value, .. } = &mut k.body[0] else {
        unreachable!()
    };
    *index = Expr::Int(0);
    *value = Expr::Float(1.5);
    expect_type_err(check(&k, &spec), &["value of `wait`", "f32"]);
}

#[test]
fn check_rejects_untyped_cast_outside_store() {
    // let y = x[ti].cast(); out[ti] = y;
    let mut k = pointwise_1d();
    k.vars = vec![var("y", false)];
    k.body = vec![
        let_(
            0,
            cast(load(0, &[0], "x[ti]"), None),
            "let y = x[ti].cast();",
        ),
        store(1, &[0], Expr::Var(0), "out[ti] = y"),
    ];
    let err = check(&k, &declared_spec(&k)).unwrap_err();
    let CodegenError::Type { at, message, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(at, "let y = x[ti].cast();");
    assert!(message.contains("`.cast()` without a type"), "{message}");

    // Nested inside a store's value (not the whole value) is rejected too.
    let mut k = pointwise_1d();
    k.body[1] = store(
        1,
        &[0],
        bin(
            BinOp::Add,
            cast(load(0, &[0], "x[ti]"), None),
            Expr::Float(1.0),
            "x[ti].cast() + 1.0",
        ),
        "out[ti] = x[ti].cast() + 1.0",
    );
    expect_type_err(check(&k, &declared_spec(&k)), &["`.cast()` without a type"]);
}

#[test]
fn check_rejects_assigning_a_non_mut_var() {
    let mut k = matmul();
    k.vars[ACC].mutable = false;
    let err = check(&k, &declared_spec(&k)).unwrap_err();
    let CodegenError::Type { at, message, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(at, ADDMM_AT);
    assert!(message.contains("`acc`"), "{message}");
    assert!(message.contains("let mut"), "{message}");
}

#[test]
fn check_rejects_assignment_that_changes_dims() {
    // let mut y = x[(tm, tn)]; y = x[tm… ] — here: y = 1.0 (a scalar).
    let mut k = pointwise_2d();
    k.vars = vec![var("y", true)];
    k.body = vec![
        let_(
            0,
            load(0, &[0, 1], "x[(tm, tn)]"),
            "let mut y = x[(tm, tn)];",
        ),
        assign(0, Expr::Float(1.0), "y = 1.0"),
    ];
    expect_type_err(check(&k, &pointwise_2d_spec()), &["`y`", "[tm, tn]", "[]"]);
}

#[test]
fn float_remainder_is_fmod_and_floats_do_not_go_into_int_tensors() {
    let mut k = pointwise_1d();
    k.body[1] = store(
        1,
        &[0],
        bin(
            BinOp::Rem,
            load(0, &[0], "x[ti]"),
            Expr::Int(2),
            "x[ti] % 2",
        ),
        "out[ti] = x[ti] % 2",
    );
    let l = lowered(&k, &declared_spec(&k), &default_config(&plan(&k)));
    assert!(kernel_part(&l).contains("fmodf("), "{}", kernel_part(&l));

    let mut k = pointwise_1d();
    k.tensors[1].declared = Some(DType::I32);
    expect_type_err(
        check(&k, &declared_spec(&k)),
        &["`out`", "Tensor<i32>", ".cast::<i32>()"],
    );
}

#[test]
fn check_rejects_bad_arguments() {
    // Declared dtype differs from the launch's.
    let k = matmul();
    let spec = spec_for(&k, &[DType::BF16, DType::F16, DType::BF16]);
    match check(&k, &spec) {
        Err(CodegenError::Argument { arg, message, .. }) => {
            assert_eq!(arg, "b");
            assert!(message.contains("Tensor<bf16>") && message.contains("Tensor<f16>"));
        }
        other => panic!("{other:?}"),
    }
    // Rank differs.
    let mut spec = declared_spec(&k);
    spec.tensors[A].rank = 3;
    match check(&k, &spec) {
        Err(CodegenError::Argument { arg, message, .. }) => {
            assert_eq!(arg, "a");
            assert!(
                message.contains("2-D") && message.contains("3-D"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A float extent.
    let mut spec = declared_spec(&k);
    spec.scalars[2] = ScalarKind::Float;
    match check(&k, &spec) {
        Err(CodegenError::Argument { arg, message, .. }) => {
            assert_eq!(arg, "k");
            assert!(message.contains("`tk`"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Wrong number of tensors.
    let mut spec = declared_spec(&k);
    spec.tensors.pop();
    assert!(matches!(
        check(&k, &spec),
        Err(CodegenError::Argument { .. })
    ));
}

// ---------------------------------------------------------------- Planned

#[test]
fn a_matmul_is_planned_as_a_gemm() {
    let want = GemmShape {
        m: TM,
        n: TN,
        k: TK,
        acc: ACC,
        a: A,
        b: B,
        k_loop: 1,
    };
    for k in [plan(&matmul()), plan(&matmul_bias_gelu())] {
        assert_eq!(k.lowering(), "gemm");
        assert_eq!(k.plan::<GemmShape>(), Some(&want));
    }
}

#[test]
fn elementwise_kernels_are_planned_as_general() {
    for k in [pointwise_2d(), pointwise_1d(), rows_inner_loop()] {
        assert_eq!(plan(&k).lowering(), "general");
    }
}

/// A matmul outside the GEMM lowering's form takes the general lowering,
/// which lowers it (and names its path).
fn general_takes(k: &Kernel) {
    let k = plan(k);
    assert_eq!(k.lowering(), "general");
    let spec = matmul_spec(&k);
    let c = default_config(&k);
    let l = lower(&k, &spec, &c).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(l.path, "general");
}

/// A spec with the matmul's dtypes for every tensor of `k`.
fn matmul_spec(k: &Kernel) -> Spec {
    spec_of(k, &vec![ScalarKind::Int; k.scalars.len()])
}

#[test]
fn two_matmul_loops_take_the_general_lowering() {
    let mut k = matmul();
    k.body.insert(2, k_loop());
    general_takes(&k);
}

/// The matmul of `dtype` with a second statement in its K loop
/// (`side[(tm, tk)] = a[(tm, tk)]`), which the GEMM lowering does not take.
fn matmul_with_side_store(dtype: DType) -> Kernel {
    let mut k = matmul_with(dtype);
    k.tensors.push(tensor("side", 2, Some(dtype)));
    let Stmt::Loop { body, .. } = &mut k.body[1] else {
        unreachable!()
    };
    body.push(store(
        3,
        &[TM, TK],
        load(A, &[TM, TK], "a[(tm, tk)]"),
        "side[(tm, tk)] = a[(tm, tk)]",
    ));
    k
}

#[test]
fn addmm_not_alone_in_its_loop_takes_the_general_lowering() {
    general_takes(&matmul_with_side_store(DType::BF16));
}

/// The general lowering's `addmm` runs on the tensor cores (`ldmatrix` +
/// `mma.sync`) where the blocks of M, N and K are multiples of 16, for bf16
/// and f16 operands alike, and sums with FMAs elsewhere.
#[test]
fn general_addmm_takes_the_tensor_cores_where_the_blocks_allow() {
    for (dtype, mma) in [
        (DType::BF16, "tf_mma_bf16(tf_c0"),
        (DType::F16, "tf_mma_f16(tf_c0"),
    ] {
        let k = plan(&matmul_with_side_store(dtype));
        let spec = matmul_spec(&k);
        for (bs, tensor_cores) in [
            ([64, 64, 32], true),
            ([32, 16, 16], true),
            ([64, 64, 8], false),
            ([64, 8, 32], false),
        ] {
            let c = Config::new(&bs).num_warps(4);
            let l = lower(&k, &spec, &c).unwrap_or_else(|e| panic!("{bs:?}: {e}"));
            assert_eq!(l.path, "general", "{bs:?}");
            assert_eq!(l.source.contains(mma), tensor_cores, "{dtype:?} {bs:?}");
            assert_eq!(
                l.source.contains("fmaf(((float*)tf_smem)"),
                !tensor_cores,
                "{dtype:?} {bs:?}"
            );
        }
    }
}

/// A reduction of the accumulator after the loop (a matmul fused with a
/// row norm: `acc.sum(tn)`) is no epilogue of the GEMM lowering's.
#[test]
fn a_matmul_whose_epilogue_reduces_takes_the_general_lowering() {
    let mut k = matmul();
    k.vars.push(var("mean", false));
    let mean = k.vars.len() - 1;
    let at = k.body.len() - 1;
    k.body.insert(
        at,
        let_(
            mean,
            Expr::Reduce {
                op: ReduceOp::Sum,
                arg: Box::new(Expr::Var(ACC)),
                dim: TN,
                at: "acc.sum(tn)".into(),
            },
            "let mean = acc.sum(tn);",
        ),
    );
    k.dims[TN].whole = true;
    general_takes(&k);
}

#[test]
fn matmul_with_other_accumulator_takes_the_general_lowering() {
    let mut k = matmul();
    k.vars.push(var("acc2", true));
    k.body
        .insert(1, let_(1, zeros(&[TM, TN]), "let mut acc2 = …;"));
    let Stmt::Loop { body, .. } = &mut k.body[2] else {
        unreachable!()
    };
    let Stmt::Assign { var, .. } = &mut body[0] else {
        unreachable!()
    };
    *var = 1;
    general_takes(&k);
}

#[test]
fn matmul_with_a_batch_grid_takes_the_general_lowering() {
    // A 3-D grid (tm, tn, tb) around a matmul.
    let mut k = matmul();
    k.scalars.push(scalar("batch"));
    k.dims.push(dim("tb", 3));
    k.grid.push(3);
    general_takes(&k);
}

// ---------------------------------------------------------------- lower(): GEMM

#[test]
fn lower_matmul_bf16() {
    let k = matmul();
    let l = lowered(&k, &declared_spec(&k), &gemm_config());
    let src = &l.source;
    assert!(src.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16"));
    assert!(src.contains("ldmatrix"));
    assert!(src.contains("cp.async.cg.shared.global"));
    assert!(!src.contains("#include"), "NVRTC has no CUDA headers");
    // Those are in the prelude of every kernel: the mainloop must *use* them.
    let body = kernel_part(&l);
    assert!(
        body.contains("tf_mma_bf16(acc["),
        "bf16 mma in the mainloop"
    );
    assert!(!body.contains("tf_mma_f16("));
    assert!(body.contains("tf_ldmatrix_x4(af[buf][i]"));
    assert!(body.contains("tf_ldmatrix_x4_trans("));
    assert!(body.contains("tf_cp_async16(da + a_s"));
    assert!(body.contains("tf_cp_async16(db + b_s"));
    assert!(!body.contains("element loads"));
    assert!(
        body.contains("tf_cp_async_wait<2>()"),
        "4 stages wait for 2"
    );
    assert!(body.contains("#define B0 128") && body.contains("#define B1 256"));
    assert!(body.contains("#define B2 32"));
    assert!(body.contains("__launch_bounds__(256, 1)"));
    assert!(body.contains(&format!(" {}(\n", l.entry)));
    assert_eq!(l.entry, "tf_matmul");
    assert_eq!(l.path, "gemm/mma.sync");

    assert_eq!(l.threads, 256);
    assert_eq!(l.shared_bytes, 4 * (128 * 32 + 32 * 256) * 2);
    // The grid covers the m and n extents with the M and N blocks.
    assert_eq!(l.grid.len(), 2);
    let named: Vec<(&str, usize)> = l
        .grid
        .iter()
        .map(|&(s, b)| (k.scalars[s].name.as_str(), b))
        .collect();
    assert_eq!(named, vec![("m", 128), ("n", 256)]);
    assert!(l.wait_sites.is_empty());

    // Parameters: each tensor's pointer, sizes and strides, the scalars, the
    // status block, timeout and site base, then the split-tail parameters.
    use tilefuse_codegen::Param;
    assert_eq!(l.params.len(), 3 * 5 + 3 + 3 + 4);
    assert_eq!(l.params[0], Param::TensorPtr(0));
    assert_eq!(l.params[1], Param::TensorDim(0, 0));
    assert_eq!(l.params[4], Param::TensorStride(0, 1));
    assert_eq!(l.params[15], Param::Scalar(0));
    assert_eq!(
        l.params[18..21],
        [Param::Status, Param::WaitTimeoutNs, Param::SiteBase]
    );
    assert_eq!(
        l.params[21..],
        [
            Param::SplitWhole,
            Param::SplitWays,
            Param::SplitPartials,
            Param::SplitCounters
        ]
    );
    let st = l
        .split_tail
        .as_ref()
        .expect("a GEMM takes the split-tail parameters");
    assert_eq!((st.bm, st.bn, st.bk), (128, 256, 32));
    assert_eq!(k.scalars[st.k].name, "k");
}

#[test]
fn lower_matmul_f16_uses_f16_mma() {
    let k = matmul_with(DType::F16);
    let l = lowered(&k, &declared_spec(&k), &gemm_config());
    let body = kernel_part(&l);
    assert!(l
        .source
        .contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"));
    assert!(body.contains("tf_mma_f16(acc["), "f16 mma in the mainloop");
    assert!(!body.contains("tf_mma_bf16("));
    assert!(body.contains("tf_f32_to_f16("), "f16 output rounding");
    assert!(!body.contains("tf_f32_to_bf16("));
}

#[test]
fn lower_matmul_unaligned_uses_element_loads() {
    let k = matmul();
    let spec = unaligned_spec(&k);
    let l = lowered(&k, &spec, &gemm_config());
    let body = kernel_part(&l);
    assert!(body.contains("A rows are not 16-byte aligned: element loads"));
    assert!(body.contains("B rows are not 16-byte aligned: element loads"));
    assert!(!body.contains("tf_cp_async16("), "no cp.async for operands");
    // Output stores cannot be paired into 32-bit accesses at 2-byte alignment.
    assert!(!body.contains("*(tf_u32*)(t2"));

    // Only A unaligned: B still goes through cp.async.
    let mut spec = declared_spec(&k);
    spec.tensors[A].align = 8;
    let l = lowered(&k, &spec, &gemm_config());
    let body = kernel_part(&l);
    assert!(body.contains("A rows are not 16-byte aligned"));
    assert!(!body.contains("B rows are not 16-byte aligned"));
    assert!(!body.contains("tf_cp_async16(da + a_s"));
    assert!(body.contains("tf_cp_async16(db + b_s"));
    // Aligned output: paired stores.
    assert!(body.contains("*(tf_u32*)(t2"));
}

#[test]
fn lower_matmul_rejects_non_contiguous_operand() {
    let k = matmul();
    let mut spec = declared_spec(&k);
    spec.tensors[B].last_contiguous = false;
    match lower(&plan(&k), &spec, &gemm_config()) {
        Err(CodegenError::Argument { arg, message, .. }) => {
            assert_eq!(arg, "b");
            assert!(message.contains("second operand"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn lower_matmul_bias_gelu_epilogue() {
    let k = matmul_bias_gelu();
    let l = lowered(&k, &declared_spec(&k), &gemm_config());
    let body = kernel_part(&l);
    assert!(body.contains("tf_gelu("));
    // The epilogue reads the bias (tensor 3) along the column index, masked.
    assert!(body.contains("t3[(col) * t3_s0]"), "{body}");
    assert!(body.contains("(col) < t3_n0"));
    assert!(body.contains("t3[((col + 1)) * t3_s0]"));
    // Evaluated on the accumulator fragments.
    assert!(body.contains("acc[mi][ni][h * 2]"));
    assert!(body.contains("acc[mi][ni][h * 2 + 1]"));
    // The epilogue comes after the mainloop.
    let mainloop = body.find("tf_mma_bf16(acc[").unwrap();
    let epilogue = body.find("tf_gelu(").unwrap();
    assert!(mainloop < epilogue);
}

#[test]
fn lower_matmul_with_wait() {
    // wait(flags, tm.begin() / 128, 1) before the K loop.
    let mut k = matmul();
    k.tensors.push(tensor("flags", 1, Some(DType::U32)));
    let at = "wait(flags, tm.begin() / 128, 1)";
    k.body.insert(
        1,
        Stmt::Wait {
            tensor: 3,
            end: None,
            index: bin(
                BinOp::Div,
                Expr::TileBegin(TM),
                Expr::Int(128),
                "tm.begin() / 128",
            ),
            value: Expr::Int(1),
            at: at.into(),
        },
    );
    let l = lowered(&k, &declared_spec(&k), &gemm_config());
    let body = kernel_part(&l);
    assert!(body.contains("tf_wait_flag((const tf_u32*)t3, t3_n0, (tb0 / 128ll), 1ll"));
    assert!(body.contains(&format!("// {at}")));
    assert_eq!(l.wait_sites, vec![at.to_string()]);
    assert_eq!(body.matches("tf_wait_flag(").count(), 1);
    // The wait precedes the mainloop.
    assert!(body.find("tf_wait_flag(").unwrap() < body.find("tf_mma_bf16(acc[").unwrap());

    // Non-contiguous flags are an argument error.
    let mut spec = declared_spec(&k);
    spec.tensors[3].last_contiguous = false;
    match lower(&plan(&k), &spec, &gemm_config()) {
        Err(CodegenError::Argument { arg, .. }) => assert_eq!(arg, "flags"),
        other => panic!("{other:?}"),
    }
}

/// The Hopper GEMM never hangs on its barriers: the producer's waits are
/// bounded (`tf_mbar_wait` traps after 9-13 s), and the consumers' spins in the
/// K loop are watched: every consumer warp arrives on `tf_done` when it leaves,
/// and the producer waits for that, bounded, before it leaves.
#[test]
fn lower_wgmma_barrier_waits_are_bounded() {
    let cfg = Config::new(&[128, 256, 64])
        .num_warps(8)
        .num_stages(4)
        .wgmma(true)
        .persistent(true);
    let k = matmul();
    let mut pp = cfg.clone().pingpong(true);
    pp.block_sizes[TN] = 128;
    for cfg in [cfg, pp] {
        let l = lowered(&k, &declared_spec(&k), &cfg);
        let src = &l.source;
        let helper = &src[src.find("void tf_mbar_wait(").unwrap()..];
        let helper = &helper[..helper.find("\n}").unwrap()];
        // Bounded by the clock, and stopped by a store outside shared memory,
        // not a `trap` (see the helper).
        assert!(
            helper.contains("%%globaltimer_hi")
                && helper.contains("st.volatile.shared.u32 [d], d;")
                && !helper.contains("trap;"),
            "{helper}"
        );
        let split = src.find("setmaxnreg.inc").unwrap();
        let producer = &src[src.find("if (warp < 4) {").unwrap()..split];
        assert!(producer.contains("tf_mbar_wait(tf_empty + s * 8,"), "{cfg}");
        assert!(!producer.contains("tf_mbar_spin("), "{cfg}");
        let done = producer
            .find("tf_mbar_wait(tf_done(), 0);")
            .expect("the watch");
        assert!(
            done > producer.rfind("tf_tma_2d").unwrap(),
            "{cfg}: after the loads"
        );
        assert!(
            src.contains("tf_mbar_init(tf_done(), 8);"),
            "{cfg}: every consumer warp"
        );
        assert!(src.contains("tf_mbar_spin(tf_full + s * 8, (it / 4) & 1);"));
        let consumers = &src[split..];
        assert!(
            consumers.ends_with("    if (lane == 0) tf_mbar_arrive(tf_done());\n  }\n}\n"),
            "{cfg}: {consumers}"
        );
    }
}

#[test]
fn lower_wait_on_a_range_loops_over_its_flags() {
    // wait(flags, tm.begin() / 32..tm.end() / 32, 1) in the GEMM.
    let mut k = matmul();
    k.tensors.push(tensor("flags", 1, Some(DType::U32)));
    // Source text over two lines must not comment out the generated code after it.
    let at = "wait(flags, tm.begin() / 32..tm.end() / 32,\n    1)";
    k.body.insert(
        1,
        Stmt::Wait {
            tensor: 3,
            index: bin(
                BinOp::Div,
                Expr::TileBegin(TM),
                Expr::Int(32),
                "tm.begin() / 32",
            ),
            end: Some(bin(
                BinOp::Div,
                Expr::TileEnd(TM),
                Expr::Int(32),
                "tm.end() / 32",
            )),
            value: Expr::Int(1),
            at: at.into(),
        },
    );
    let l = lowered(&k, &declared_spec(&k), &gemm_config());
    let body = kernel_part(&l);
    assert!(
        body.contains("for (long long tf_i = (tb0 / 32ll); tf_i < tf_hi && !tf_abort; ++tf_i)"),
        "{body}"
    );
    assert!(
        body.contains("tf_wait_flag((const tf_u32*)t3, t3_n0, tf_i, 1ll"),
        "{body}"
    );
    assert!(
        body.contains("// wait(flags, tm.begin() / 32..tm.end() / 32, 1)\n"),
        "{body}"
    );
    assert_eq!(l.wait_sites, vec![at.to_string()]);
    // The IR without a range serializes as before (kernel hashes stay put).
    let json = serde_json::to_string(&Stmt::Wait {
        tensor: 0,
        index: Expr::Int(0),
        end: None,
        value: Expr::Int(1),
        at: "w".into(),
    })
    .unwrap();
    assert!(!json.contains("end"), "{json}");
}

#[test]
fn lower_elementwise_with_two_waits_numbers_sites() {
    let mut k = pointwise_1d();
    k.tensors.push(tensor("flags", 1, Some(DType::I32)));
    for (i, at) in ["wait(flags, 0, 1)", "wait(flags, 1, 2)"]
        .iter()
        .enumerate()
    {
        k.body.insert(
            i,
            Stmt::Wait {
                tensor: 2,
                end: None,
                index: Expr::Int(i as i64),
                value: Expr::Int(i as i64 + 1),
                at: (*at).into(),
            },
        );
    }
    let cfg = default_config(&plan(&k));
    let l = lowered(&k, &declared_spec(&k), &cfg);
    assert_eq!(l.wait_sites, vec!["wait(flags, 0, 1)", "wait(flags, 1, 2)"]);
    let body = kernel_part(&l);
    assert!(body.contains("tf_site_base + 0ull"));
    assert!(body.contains("tf_site_base + 1ull"));
}

#[test]
fn lower_config_errors() {
    let k = matmul();
    let spec = declared_spec(&k);
    let msg = expect_config_err(
        lower(&plan(&k), &spec, &Config::new(&[128, 256])),
        "2 block sizes",
    );
    assert!(msg.contains("tm, tn, tk"), "{msg}");
    expect_config_err(
        lower(&plan(&k), &spec, &Config::new(&[128, 256, 48]).num_warps(8)),
        "K block (48)",
    );
    expect_config_err(
        lower(&plan(&k), &spec, &gemm_config().num_stages(1)),
        "num_stages (1)",
    );
    expect_config_err(
        lower(&plan(&k), &spec, &gemm_config().num_warps(3)),
        "num_warps",
    );
    expect_config_err(
        lower(&plan(&k), &spec, &Config::new(&[256, 256, 32]).num_warps(2)),
        "1024 accumulators",
    );
    expect_config_err(
        lower(&plan(&k), &spec, &Config::new(&[128, 96, 32]).num_warps(4)),
        "N block (96)",
    );
    expect_config_err(
        lower(&plan(&k), &spec, &Config::new(&[120, 128, 32]).num_warps(4)),
        "M block (120)",
    );
    expect_config_err(
        lower(&plan(&k), &spec, &Config::new(&[16, 16, 32]).num_warps(16)),
        "16 warps cannot split a 16x16 block",
    );
    expect_config_err(
        lower(&plan(&k), &spec, &Config::new(&[128, 0, 32])),
        "block size 0",
    );
    // The config is named in the error.
    match lower(&plan(&k), &spec, &gemm_config().num_stages(9)) {
        Err(e @ CodegenError::Config { .. }) => {
            let text = e.to_string();
            assert!(text.contains("`matmul`"), "{text}");
            assert!(text.contains("num_stages=9"), "{text}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn lower_matmul_other_valid_configs() {
    let k = matmul_bias_gelu();
    let spec = declared_spec(&k);
    for (bs, w, s) in [
        ([128, 256, 64], 8, 3),
        ([128, 128, 32], 4, 4),
        ([64, 64, 32], 4, 2),
        ([256, 128, 64], 8, 3),
        ([32, 32, 16], 1, 3),
        ([16, 16, 16], 1, 2),
        ([64, 32, 128], 2, 8),
    ] {
        let cfg = Config::new(&bs).num_warps(w).num_stages(s);
        let l = lowered(&k, &spec, &cfg);
        assert_eq!(l.threads as usize, w * 32);
        assert_eq!(
            l.shared_bytes as usize,
            s * (bs[0] * bs[2] + bs[2] * bs[1]) * 2,
            "{cfg}"
        );
        let body = kernel_part(&l);
        assert!(
            body.contains(&format!("tf_cp_async_wait<{}>()", s - 2)),
            "{cfg}"
        );
        assert_eq!(
            body.matches('{').count(),
            body.matches('}').count(),
            "{cfg}"
        );
    }
}

#[test]
fn lower_matmul_transposed_grid_order() {
    // for (tn, tm) in tile([n, m]): same kernel, grid listed n-first.
    let mut k = matmul();
    k.grid = vec![TN, TM];
    let l = lowered(&k, &declared_spec(&k), &gemm_config());
    assert_eq!(l.grid, vec![(1, 256), (0, 128)]);
}

#[test]
fn lower_matmul_accumulator_init_from_tensor() {
    // let mut acc = c[(tm, tn)].cast::<f32>(): initialized per fragment element.
    let mut k = matmul();
    k.tensors.push(tensor("c", 2, Some(DType::BF16)));
    k.body[0] = let_(
        ACC,
        cast(load(3, &[TM, TN], "c[(tm, tn)]"), Some(DType::F32)),
        "let mut acc = c[(tm, tn)].cast::<f32>();",
    );
    let l = lowered(&k, &declared_spec(&k), &gemm_config());
    let body = kernel_part(&l);
    assert!(body.contains("acc[mi][ni][r] = "), "{body}");
    assert!(body.contains("tf_bf16_to_f32(t3["));
    assert!(body.find("acc[mi][ni][r] = ").unwrap() < body.find("tf_mma_bf16(acc[").unwrap());
}

#[test]
fn lower_matmul_rejects_reassigning_acc_after_loop() {
    let mut k = matmul();
    k.body.insert(
        2,
        assign(ACC, un(UnOp::Relu, Expr::Var(ACC)), "acc = relu(acc)"),
    );
    let (at, message) = expect_unsupported(lower(&plan(&k), &declared_spec(&k), &gemm_config()));
    assert_eq!(at, "acc = relu(acc)");
    assert!(message.contains("let y = relu(acc)"), "{message}");
}

// ---------------------------------------------------------------- lower(): pointwise

#[test]
fn lower_elementwise_2d() {
    let k = pointwise_2d();
    let cfg = default_config(&plan(&k));
    assert_eq!(cfg.block_sizes, vec![4, 1024]);
    let l = lowered(&k, &pointwise_2d_spec(), &cfg);
    assert_eq!(l.path, "general");
    assert_eq!(l.shared_bytes, 0);
    assert_eq!(l.threads, 128);
    assert_eq!(l.grid, vec![(0, 4), (1, 1024)]);
    let body = kernel_part(&l);
    // No tensor-core or async-copy code in an elementwise kernel.
    assert!(!body.contains("tf_mma_") && !body.contains("tf_cp_async16("));
    // Masked at the extents: rows per element, columns per run (of 4: the
    // f32 inputs move the most bytes).
    assert!(body.contains("(tb0 + tf_o0_0) < s0"), "{body}");
    assert!(body.contains(" + 4 <= s1"), "{body}");
    // alpha is a float scalar, relu is fmaxf, the store rounds to bf16 two
    // values at a time (one at a time at a ragged edge).
    assert!(body.contains("float s2"));
    assert!(body.contains("* s2)"));
    assert!(body.contains("fmaxf("));
    assert!(body.contains("tf_pack_bf16x2(tf_s[0], tf_s[1])"), "{body}");
    assert!(
        body.contains("tf_p[tf_j] = tf_f32_to_bf16(tf_s[tf_j])"),
        "{body}"
    );
    // Program id decode: the last grid dimension moves fastest; the first
    // is the quotient left, with no modulo.
    let d1 = body
        .find("    tb1 = (long long)(tf_pid % tf_t) * B1;")
        .unwrap();
    let d0 = body.find("  tb0 = (long long)tf_pid * B0;").unwrap();
    assert!(d1 < d0, "{body}");
    assert_eq!(body.matches("tf_pid % tf_t").count(), 1, "{body}");

    // `tile([m, n]).starting_at([i, j])`: each index shifts its dimension, wrapping.
    let mut k = k;
    k.scalars.push(ScalarParam::named("i"));
    k.scalars.push(ScalarParam::named("j"));
    k.grid_start = vec![3, 4];
    let mut spec = declared_spec(&k);
    spec.scalars[3] = ScalarKind::Int;
    spec.scalars[4] = ScalarKind::Int;
    let body = lowered(&k, &spec, &cfg).source;
    assert!(
        body.contains(
            "tb0 = (long long)(((long long)(tf_pid % tf_t) + (s3 / B0) % tf_t + tf_t) % tf_t) * B0"
        ),
        "{body}"
    );
    assert!(
        body.contains(
            "tb1 = (long long)(((long long)(tf_pid % tf_t) + (s4 / B1) % tf_t + tf_t) % tf_t) * B1"
        ),
        "{body}"
    );
    // A float start index is an error naming it.
    spec.scalars[3] = ScalarKind::Float;
    let e = lower(&plan(&k), &spec, &cfg).unwrap_err().to_string();
    assert!(e.contains("`i`") && e.contains("integer"), "{e}");
}

#[test]
fn lower_elementwise_1d() {
    let k = pointwise_1d();
    let cfg = default_config(&plan(&k));
    assert_eq!(cfg.block_sizes, vec![4096]);
    let l = lowered(&k, &declared_spec(&k), &cfg);
    assert_eq!(l.shared_bytes, 0);
    assert_eq!(l.grid, vec![(0, 4096)]);
    let body = kernel_part(&l);
    // The scalar `len` is a block-uniform C local using the clipped tile end.
    assert!(
        body.contains(" = (long long)((tf_min_i(tb0 + B0, s0) - tb0));"),
        "{body}"
    );
    assert!(body.contains("* (float)(v0_"), "{body}");
    // No inner loops.
    assert!(!body.contains("for (long long"));
}

#[test]
fn lower_elementwise_inner_loop() {
    let k = rows_inner_loop();
    let cfg = default_config(&plan(&k));
    assert_eq!(cfg.block_sizes, vec![4, 1024]);
    let l = lowered(&k, &declared_spec(&k), &cfg);
    assert_eq!(l.shared_bytes, 0);
    // Only the row dimension is in the grid; columns are a sequential loop.
    assert_eq!(l.grid, vec![(0, 4)]);
    let body = kernel_part(&l);
    let inner = body
        .find("for (long long tb1 = 0ll; tb1 < s1; tb1 += B1) {")
        .expect("inner tile loop");
    let store = body.find("((uint4*)t1)[(").expect("a vector store");
    assert!(inner < store);
    assert!(body.contains("1.0f"));
}

#[test]
fn lower_int_ops_keep_the_type_of_the_tensor() {
    // out[ti] = max(x[ti] % 3, -x[ti]) on i32: computed in `int`.
    let mut k = pointwise_1d();
    k.tensors[0].declared = Some(DType::I32);
    k.tensors[1].declared = Some(DType::I32);
    k.vars.clear();
    let x = || load(0, &[0], "x[ti]");
    k.body = vec![store(
        1,
        &[0],
        bin(
            BinOp::Max,
            bin(BinOp::Rem, x(), Expr::Int(3), "x[ti] % 3"),
            un(UnOp::Neg, x()),
            "max(x[ti] % 3, -x[ti])",
        ),
        "out[ti] = max(x[ti] % 3, -x[ti])",
    )];
    let l = lowered(&k, &declared_spec(&k), &default_config(&plan(&k)));
    let body = kernel_part(&l);
    assert!(body.contains("const int tf_v = tf_max("), "{body}");
    assert!(body.contains("% (int)(3ll))"), "{body}");
}

#[test]
fn a_value_carried_across_a_loop_stays_in_registers() {
    // let mut s = x[tr]; for tc { s += 1.0; out[(tr, tc)] = s; }
    let mut k = rows_inner_loop();
    k.tensors[0].rank = 1;
    k.vars = vec![var("s", true)];
    let x = || load(0, &[0], "x[tr]");
    k.body.insert(0, let_(0, x(), "let mut s = x[tr];"));
    let Stmt::Loop { body, .. } = &mut k.body[1] else {
        unreachable!()
    };
    *body = vec![
        assign(
            0,
            bin(BinOp::Add, Expr::Var(0), Expr::Float(1.0), "s + 1.0"),
            "s += 1.0",
        ),
        store(1, &[0, 1], Expr::Var(0), "out[(tr, tc)] = s"),
    ];
    let mut spec = declared_spec(&k);
    spec.tensors[0].rank = 1;
    let l = lowered(&k, &spec, &default_config(&plan(&k)));
    let body = kernel_part(&l);
    let decl = body.find("float v0_").expect("s declared");
    let lp = body.find("for (long long tb1").expect("the loop");
    assert!(decl < lp, "{body}");
    let name = &body[decl + "float ".len()..]
        .split('[')
        .next()
        .unwrap_or("");
    assert!(
        body.contains(&format!("{name}[0] = ({name}[0] + 1.0f);")),
        "{body}"
    );
}

// ---------------------------------------------------------------- default_config

#[test]
fn default_config_matmul() {
    let k = matmul();
    let c = default_config(&plan(&k));
    assert_eq!(c.block_sizes, vec![128, 256, 64]);
    assert_eq!(c.num_warps, 8);
    assert_eq!(c.num_stages, 4);
    let l = lowered(&k, &declared_spec(&k), &c);
    assert_eq!(l.shared_bytes, 4 * 48 * 1024);

    // Fitted to a GPU's shared memory: an H100/H200 keeps 4 stages, an A100
    // (164 KB) gets 3, and a 100 KB GPU 2; never fewer than 2.
    use tilefuse_codegen::default_config_within;
    assert_eq!(default_config_within(&plan(&k), 227 * 1024).num_stages, 4);
    assert_eq!(default_config_within(&plan(&k), 164 * 1024).num_stages, 3);
    assert_eq!(default_config_within(&plan(&k), 100 * 1024).num_stages, 2);
    assert_eq!(default_config_within(&plan(&k), 1024).num_stages, 2);
    let fitted = default_config_within(&plan(&k), 164 * 1024);
    assert!(lowered(&k, &declared_spec(&k), &fitted).shared_bytes as usize <= 164 * 1024);

    // Dimension order does not matter: tk declared first.
    let mut k = matmul();
    k.dims = vec![dim("tk", 2), dim("tm", 0), dim("tn", 1)];
    let remap = |d: DimId| [1, 2, 0][d];
    k.grid = vec![remap(TM), remap(TN)];
    k.body = vec![
        let_(ACC, zeros(&[remap(TM), remap(TN)]), "let mut acc = …;"),
        loop_(
            remap(TK),
            vec![assign(
                ACC,
                addmm(
                    Expr::Var(ACC),
                    load(A, &[remap(TM), remap(TK)], "a[(tm, tk)]"),
                    load(B, &[remap(TK), remap(TN)], "b[(tk, tn)]"),
                    "addmm",
                ),
                ADDMM_AT,
            )],
        ),
        store(
            OUT,
            &[remap(TM), remap(TN)],
            cast(Expr::Var(ACC), None),
            "out[(tm, tn)] = acc.cast()",
        ),
    ];
    let c = default_config(&plan(&k));
    assert_eq!(c.block_sizes, vec![64, 128, 256]);
    lowered(&k, &declared_spec(&k), &c);
}

#[test]
fn default_config_pointwise_is_valid() {
    for (k, spec) in [
        (pointwise_2d(), pointwise_2d_spec()),
        (pointwise_1d(), declared_spec(&pointwise_1d())),
        (rows_inner_loop(), declared_spec(&rows_inner_loop())),
    ] {
        let c = default_config(&plan(&k));
        assert_eq!(c.block_sizes.len(), k.dims.len(), "{}", k.name);
        assert!(matches!(c.num_warps, 1 | 2 | 4 | 8 | 16));
        let l = lowered(&k, &spec, &c);
        assert_eq!(l.threads as usize, c.num_warps * 32);
    }
}

// ---------------------------------------------------------------- serialization

#[test]
fn json_round_trip() {
    for k in [
        matmul(),
        matmul_bias_gelu(),
        pointwise_2d(),
        pointwise_1d(),
        rows_inner_loop(),
    ] {
        let json = k.to_json();
        let back = Kernel::from_json(&json).expect("reads back");
        assert_eq!(back, k);
        assert_eq!(back.fingerprint(), k.fingerprint());
        assert_eq!(back.to_json(), json);
    }
    assert!(Kernel::from_json("{\"name\": 1}").is_err());
}

#[test]
fn fingerprint_tracks_meaning() {
    let k = rows_inner_loop();
    let f = k.fingerprint();
    assert_eq!(f, k.clone().fingerprint(), "stable");

    // 1.0 -> 2.0 in `x[(tr, tc)] + 1.0`.
    let mut k2 = k.clone();
    let Stmt::Loop { body, .. } = &mut k2.body[0] else {
        unreachable!()
    };
    let Stmt::Store {
        value: Expr::Binary { rhs, .. },
        ..
    } = &mut body[0]
    else {
        unreachable!()
    };
    **rhs = Expr::Float(2.0);
    assert_ne!(k2, k);
    assert_ne!(k2.fingerprint(), f);

    // Other changes: the kernel name, an op.
    let mut k3 = k.clone();
    k3.name = "rows2".into();
    assert_ne!(k3.fingerprint(), f);
    let mut k4 = pointwise_2d();
    let f4 = k4.fingerprint();
    let Stmt::Store {
        value: Expr::Unary { op, .. },
        ..
    } = &mut k4.body[0]
    else {
        unreachable!()
    };
    *op = UnOp::Silu;
    assert_ne!(k4.fingerprint(), f4);
}

// ---------------------------------------------------------------- known bugs
//
// Regression tests for bugs found while writing this suite.

/// A tile `let` that reads a `let mut` variable must see the value it had at the
/// `let`, not a later reassignment.
#[test]
fn a_let_keeps_its_value_at_binding() {
    // let mut a = x[ti]; let b = a * 2.0; a = a + 1.0; out[ti] = b;
    // must store x[ti] * 2, not (x[ti] + 1) * 2: `b` is computed where bound.
    let mut k = pointwise_1d();
    k.vars = vec![var("a", true), var("b", false)];
    k.body = vec![
        let_(0, load(0, &[0], "x[ti]"), "let mut a = x[ti];"),
        let_(
            1,
            bin(BinOp::Mul, Expr::Var(0), Expr::Float(2.0), "a * 2.0"),
            "let b = a * 2.0;",
        ),
        assign(
            0,
            bin(BinOp::Add, Expr::Var(0), Expr::Float(1.0), "a + 1.0"),
            "a = a + 1.0",
        ),
        store(1, &[0], Expr::Var(1), "out[ti] = b"),
    ];
    let l = lowered(&k, &declared_spec(&k), &default_config(&plan(&k)));
    let body = kernel_part(&l);
    let b = body.find("* 2.0f)").expect("b");
    let a = body.find("+ 1.0f)").expect("a's update");
    assert!(b < a, "{body}");
    assert!(
        body.contains("const float tf_v = v1_"),
        "the store reads b:\n{body}"
    );
}

/// `.cast()` at a store takes the tensor's type, integer tensors included.
#[test]
fn untyped_cast_into_int_tensor() {
    // out_i32[ti] = x_f32[ti].cast()
    let mut k = pointwise_1d();
    k.tensors[1].declared = Some(DType::I32);
    k.vars.clear();
    k.body = vec![store(
        1,
        &[0],
        cast(load(0, &[0], "x[ti]"), None),
        "out[ti] = x[ti].cast()",
    )];
    check(&k, &declared_spec(&k)).expect("`.cast()` to the tensor's i32");
}

/// A matmul accumulator initialized to a non-finite value must give valid C.
#[test]
fn gemm_non_finite_accumulator_init() {
    let mut k = matmul();
    k.body[0] = let_(
        ACC,
        Expr::Full {
            dims: vec![TM, TN],
            dtype: DType::F32,
            value: f64::NEG_INFINITY,
        },
        "let mut acc = full::<f32>([tm, tn], -1e400);",
    );
    let l = lowered(&k, &declared_spec(&k), &gemm_config());
    let body = kernel_part(&l);
    assert!(!body.contains("inff"), "not a C literal:\n{body}");
}

/// A store before the K loop that reads the accumulator must see its initial value.
#[test]
fn gemm_store_before_loop_sees_initialized_acc() {
    let mut k = matmul();
    k.tensors.push(tensor("init", 2, Some(DType::F32)));
    k.body.insert(
        1,
        store(3, &[TM, TN], Expr::Var(ACC), "init[(tm, tn)] = acc"),
    );
    let l = lowered(&k, &declared_spec(&k), &gemm_config());
    let body = kernel_part(&l);
    let init = body.find("acc[i][j][r] = 0.0f").expect("init");
    let read = body.find("acc[mi][ni][h * 2]").expect("store");
    assert!(
        init < read,
        "the accumulator is read before it is set:\n{body}"
    );
}

/// A tile `let` of the accumulator before the K loop would need a snapshot of the
/// accumulator; it is rejected, not silently given the final value.
#[test]
fn gemm_let_of_acc_before_loop_is_rejected() {
    // let mut acc = zeros; let base = acc + 1.0; for tk {…} out[(tm, tn)] = base.cast();
    let mut k = matmul();
    k.vars.push(var("base", false));
    k.body.insert(
        1,
        let_(
            1,
            bin(BinOp::Add, Expr::Var(ACC), Expr::Float(1.0), "acc + 1.0"),
            "let base = acc + 1.0;",
        ),
    );
    k.body[3] = store(
        OUT,
        &[TM, TN],
        cast(Expr::Var(1), None),
        "out[(tm, tn)] = base.cast()",
    );
    match lower(&plan(&k), &declared_spec(&k), &gemm_config()) {
        Err(CodegenError::Unsupported { at, message, .. }) => {
            assert!(at.contains("let base"), "{at}");
            assert!(message.contains("before the K loop"), "{message}");
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

/// A 16-wide K block has one k-step per tile: fragments are read after each stage
/// barrier, single-buffered (double-buffering by k-step parity would read the wrong
/// buffer on every other tile).
#[test]
fn lower_matmul_k16_uses_single_step_loop() {
    let k = matmul();
    let l = lowered(
        &k,
        &declared_spec(&k),
        &Config::new(&[32, 32, 16]).num_warps(1).num_stages(3),
    );
    let body = kernel_part(&l);
    assert!(body.contains("load_frags(rs, 0, 0);"), "{body}");
    assert!(!body.contains("(ki + 1) & 1"), "{body}");
    let l = lowered(&k, &declared_spec(&k), &gemm_config());
    assert!(kernel_part(&l).contains("(ki + 1) & 1"));
}

#[test]
fn matmul_grid_starting_at_rotates_the_tile_order() {
    let mut k = matmul();
    k.scalars.push(ScalarParam::named("first_row"));
    let s = k.scalars.len() - 1;
    // Only M is shifted; N starts at the tile holding index `m` (its extent), i.e. 0 mod tiles.
    k.grid_start = vec![s, 0];
    let mut spec = declared_spec(&k);
    spec.scalars[s] = ScalarKind::Int;
    let src = lowered(&k, &spec, &default_config(&plan(&k))).source;
    assert!(
        src.contains(&format!(
            "tile_m = (tile_m + ((s{s} / 128) % tiles_m + tiles_m)) % tiles_m;"
        )),
        "{src}"
    );
    assert!(
        src.contains("tile_n = (tile_n + ((s0 / 256) % tiles_n + tiles_n)) % tiles_n;"),
        "{src}"
    );
    assert!(src.contains("const long long tb0 = tile_m * 128;"), "{src}");
}

#[test]
fn lower_matmul_on_the_wgmma_path() {
    let k = matmul();
    let spec = declared_spec(&k);
    let cfg = Config::new(&[128, 256, 64])
        .num_warps(8)
        .num_stages(4)
        .wgmma(true);
    let l = lowered(&k, &spec, &cfg);
    assert_eq!(l.path, "gemm/wgmma");
    assert_eq!(l.threads, 384, "a producer and two consumer warpgroups");
    assert!(l
        .source
        .contains("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"));
    assert!(l.source.contains("cp.async.bulk.tensor.2d"));
    assert!(l.source.contains("setmaxnreg.dec.sync.aligned.u32 56"));
    assert!(!l.persistent && l.cluster == 1);
    // The last wave is split along K as on the portable path (the parts meet among
    // the consumer warps).
    assert_eq!(
        l.split_tail.as_ref().map(|t| (t.bm, t.bn)),
        Some((128, 256))
    );
    assert!(l.source.contains("bar.sync 1, 256;"));
    let maps: Vec<_> = l
        .params
        .iter()
        .filter(|p| matches!(p, tilefuse_codegen::Param::TensorMap { .. }))
        .collect();
    assert_eq!(
        maps,
        [
            &tilefuse_codegen::Param::TensorMap {
                tensor: A,
                box_inner: 64,
                box_outer: 128,
                rows_axis: None
            },
            &tilefuse_codegen::Param::TensorMap {
                tensor: B,
                box_inner: 64,
                box_outer: 64,
                rows_axis: None
            }
        ]
    );
    // 4 stages of 48 KB, barriers and the alignment slack.
    assert_eq!(l.shared_bytes as usize, 4 * 48 * 1024 + 64 + 1024);

    expect_config_err(
        lower(&plan(&k), &spec, &cfg.clone().num_warps(4)),
        "M block",
    );
    let mut bad = cfg.clone();
    bad.block_sizes[TK] = 32;
    expect_config_err(lower(&plan(&k), &spec, &bad), "K block of 64");
    let mut ragged = spec.clone();
    ragged.tensors[A].align = 2;
    expect_config_err(lower(&plan(&k), &ragged, &cfg), "TMA");
}

/// Persistent blocks loop over the tiles; a cluster of two blocks along M shares
/// B through multicast, and the grid counts cluster tiles (256 rows each).
#[test]
fn lower_wgmma_persistent_and_clustered() {
    let k = matmul();
    let spec = declared_spec(&k);
    let cfg = Config::new(&[128, 256, 64])
        .num_warps(8)
        .num_stages(4)
        .wgmma(true)
        .persistent(true);
    let l = lowered(&k, &spec, &cfg);
    assert!(l.persistent);
    assert!(l
        .source
        .contains("for (long long unit = blockIdx.x; unit < tf_units; unit += gridDim.x)"));
    assert!(!l.source.contains("__cluster_dims__"));

    let l = lowered(&k, &spec, &cfg.clone().cluster_m(2));
    assert_eq!(l.cluster, 2);
    assert!(l.source.contains("__cluster_dims__(2, 1, 1)"));
    assert!(l.source.contains(".multicast::cluster"));
    assert!(l
        .source
        .contains("unit = blockIdx.x / 2; unit < tf_units; unit += gridDim.x / 2"));
    // Split-tile scratch per cluster tile holds both blocks' accumulators.
    assert_eq!(l.split_tail.as_ref().map(|t| t.bm), Some(256));
    assert!(l
        .source
        .contains("tf_mbar_arrive_in(tf_empty + prev * 8, r)"));
    // Both blocks' consumer warps release a stage.
    assert!(l.source.contains("tf_mbar_init(tf_empty + s * 8, 16)"));
    assert!(
        l.source.ends_with("  tf_cluster_sync();\n}\n"),
        "{}",
        l.source
    );
    let m_block: Vec<usize> = l.grid.iter().map(|&(_, b)| b).collect();
    assert_eq!(
        m_block,
        [256, 256],
        "M block doubled for the pair, N block as is"
    );

    let mut narrow = cfg.clone().cluster_m(2);
    narrow.block_sizes[TN] = 192;
    expect_config_err(lower(&plan(&k), &spec, &narrow), "128 or 256");
    expect_config_err(
        lower(&plan(&k), &spec, &cfg.clone().cluster_m(4)),
        "cluster_m takes 1, or 2",
    );
    let portable = Config::new(&[128, 256, 64]).num_warps(8);
    expect_config_err(
        lower(&plan(&k), &spec, &portable.clone().persistent(true)),
        "persistent grid",
    );
    expect_config_err(
        lower(&plan(&k), &spec, &portable.cluster_m(2)),
        "cluster_m takes 1, or 2",
    );
    // Matmul options on an elementwise kernel: an error, not a cluster launch that
    // the driver refuses.
    let pw = pointwise_2d();
    let pw_spec = pointwise_2d_spec();
    let pw_cfg = Config::new(&[4, 256]).wgmma(true).cluster_m(2);
    expect_config_err(lower(&plan(&pw), &pw_spec, &pw_cfg), "leave them unset");
}

/// Stream-K: the split-tail parameters plus the count of shared units, and a unit
/// that walks segments of consecutive tiles (the producer and the consumers the
/// same ones); only the Hopper path has it.
#[test]
fn lower_wgmma_stream_k() {
    let k = matmul();
    let spec = declared_spec(&k);
    let cfg = Config::new(&[128, 256, 64])
        .num_warps(8)
        .num_stages(4)
        .wgmma(true)
        .persistent(true);
    let plain = lowered(&k, &spec, &cfg);
    let l = lowered(&k, &spec, &cfg.clone().stream_k(true));
    assert_eq!(plain.split_tail.as_ref().map(|t| t.stream_k), Some(false));
    assert_eq!(l.split_tail.as_ref().map(|t| t.stream_k), Some(true));
    // One kernel serves both plans (the runtime passes how the units share K):
    // the sources differ in the comment naming the config only.
    let code = |src: &str| -> String {
        src.lines()
            .filter(|line| !line.starts_with("// kernel `matmul`, config:"))
            .collect()
    };
    assert_eq!(code(&l.source), code(&plain.source));
    use tilefuse_codegen::Param;
    assert!(l.params.contains(&Param::SplitParts));
    assert_eq!(l.source.matches("} while (tf_it < tf_end);").count(), 2);
    assert!(l
        .source
        .contains("const long long tf_units = tf_whole + tf_parts;"));
    assert!(cfg
        .clone()
        .stream_k(true)
        .to_string()
        .ends_with(", stream_k"));

    let portable = Config::new(&[128, 256, 64]).num_warps(8).stream_k(true);
    expect_config_err(lower(&plan(&k), &spec, &portable), "stream-K");
}

/// Ping-pong: each consumer warpgroup walks every segment, counts the other's
/// K steps and computes its own tiles (two `wgmma` rows of 64 at 128×128), a
/// stage is released by one warpgroup's warps, each warpgroup synchronizes
/// alone; the runtime learns that a block holds two tiles at once. Configs it
/// cannot run say why.
#[test]
fn lower_wgmma_pingpong() {
    let k = matmul();
    let spec = declared_spec(&k);
    let cfg = Config::new(&[128, 128, 64])
        .num_warps(8)
        .num_stages(5)
        .wgmma(true)
        .persistent(true);
    let coop = lowered(&k, &spec, &cfg);
    let l = lowered(&k, &spec, &cfg.clone().pingpong(true));
    assert_eq!((coop.tiles_in_flight, l.tiles_in_flight), (1, 2));
    assert_eq!(l.threads, coop.threads);
    assert!(l.source.contains("if ((tf_seg++ & 1) != wg) {"));
    assert!(l.source.contains("float acc[2][16][4];"));
    assert!(coop.source.contains("float acc[1][16][4];"));
    // Two 64-row wgmmas per 16 of K, the second on A's rows 64..127.
    assert_eq!(l.source.matches("tf_wgmma(&acc[1][0][0]").count(), 4);
    assert!(l.source.contains("tf_wgmma_desc(a_s + 8192u, 16u, 1024u)"));
    // A stage is released by the 4 warps of the warpgroup that read it.
    assert!(l.source.contains("tf_mbar_init(tf_empty + s * 8, 4);"));
    assert!(coop.source.contains("tf_mbar_init(tf_empty + s * 8, 8);"));
    assert!(!l.source.contains("bar.sync 1, 256;"));
    // Turns: a K loop waits for the other warpgroup's, and gives the next.
    assert!(l
        .source
        .contains("if (tf_seg > 1) asm volatile(\"bar.sync %0, 256;\" :: \"r\"(4 + wg)"));
    assert!(l.source.contains("bar.arrive %0, 256;\" :: \"r\"(5 - wg)"));
    assert!(!coop.source.contains("bar.arrive"));
    assert!(cfg
        .clone()
        .pingpong(true)
        .to_string()
        .ends_with(", pingpong"));
    // 64×256: one wgmma row; with a cluster pair and the TMA-store epilogue.
    let wide = Config::new(&[64, 256, 64])
        .num_warps(8)
        .num_stages(4)
        .wgmma(true)
        .persistent(true)
        .pingpong(true);
    let l = lowered(&k, &spec, &wide.clone().cluster_m(2).tma_store(true));
    assert!(l.source.contains("float acc[1][32][4];"));
    assert!(l.source.contains("tf_mbar_init(tf_empty + s * 8, 8);"));
    assert!(l.source.contains(" + mi * 64));"));

    expect_config_err(
        lower(
            &plan(&k),
            &spec,
            &cfg.clone().persistent(false).pingpong(true),
        ),
        "set num_warps 8 and persistent",
    );
    expect_config_err(
        lower(&plan(&k), &spec, &wide.clone().num_warps(4)),
        "set num_warps 8 and persistent",
    );
    let big = Config::new(&[128, 256, 64])
        .num_warps(8)
        .wgmma(true)
        .persistent(true)
        .pingpong(true);
    expect_config_err(lower(&plan(&k), &spec, &big), "64x256 or 128x128");
    let portable = Config::new(&[128, 128, 64]).num_warps(8).pingpong(true);
    expect_config_err(
        lower(&plan(&k), &spec, &portable),
        "set `wgmma` and `persistent`",
    );
}

/// The TMA-store epilogue: the output's descriptor among the parameters,
/// staging boxes after the ring, the fragments written to shared memory and one
/// thread per warpgroup storing boxes; kernels it cannot serve are config errors.
#[test]
fn lower_wgmma_tma_store() {
    let k = matmul();
    let spec = declared_spec(&k);
    let cfg = Config::new(&[128, 256, 64])
        .num_warps(8)
        .num_stages(3)
        .wgmma(true)
        .persistent(true)
        .cluster_m(2);
    let plain = lowered(&k, &spec, &cfg);
    let l = lowered(&k, &spec, &cfg.clone().tma_store(true));
    use tilefuse_codegen::Param;
    let maps = |l: &tilefuse_codegen::Lowered| {
        l.params
            .iter()
            .filter_map(|p| match p {
                Param::TensorMap {
                    tensor,
                    box_inner,
                    box_outer,
                    ..
                } => Some((*tensor, *box_inner, *box_outer)),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(maps(&plain).len(), 2);
    assert_eq!(maps(&l)[2], (2, 64, 64), "the output's map: 64 × 64 boxes");
    assert_eq!(
        l.shared_bytes - plain.shared_bytes,
        2 * 2 * 64 * 64 * 2,
        "two staging boxes per consumer warpgroup"
    );
    // The Hopper default's four stages still fit an H100's 227 KB.
    let four = lowered(&k, &spec, &cfg.clone().num_stages(4).tma_store(true));
    assert!(four.shared_bytes <= 227 * 1024, "{}", four.shared_bytes);
    let src = kernel_part(&l);
    assert!(src.contains("st.shared.b32 [%0], %1;"));
    assert!(
        !src.contains("*(tf_u32*)(t2 +"),
        "no global stores of the tile"
    );
    assert_eq!(src.matches("tf_tma_store_2d(&tf_map_out").count(), 1);
    assert!(src.contains("cp.async.bulk.wait_group.read 0;"));
    assert!(src.contains("cp.async.bulk.wait_group 0;"));
    assert!(cfg
        .clone()
        .tma_store(true)
        .to_string()
        .ends_with(", tma_store"));

    // Only the Hopper path has it, and only for a TMA-able output.
    let portable = Config::new(&[128, 256, 64]).num_warps(8).tma_store(true);
    expect_config_err(lower(&plan(&k), &spec, &portable), "TMA-store");
    let mut f32_out = matmul();
    f32_out.tensors[OUT].declared = Some(DType::F32);
    expect_config_err(
        lower(
            &plan(&f32_out),
            &declared_spec(&f32_out),
            &cfg.clone().tma_store(true),
        ),
        "but it is f32",
    );
    // A `signal` after the store counts the tile only once the TMA unit wrote it:
    // the issuing threads wait for their stores to complete, then fence.
    assert!(!src.contains("fence.proxy.async.global"));
    let mut signalled = matmul();
    signalled
        .tensors
        .push(tensor("counts", 1, Some(DType::U32)));
    signalled.body.push(Stmt::Signal {
        tensor: 3,
        index: Expr::Int(0),
        value: Expr::Int(1),
        at: "signal(counts, 0, 1)".into(),
    });
    let l = lowered(
        &signalled,
        &declared_spec(&signalled),
        &cfg.clone().tma_store(true),
    );
    let src = kernel_part(&l);
    let written = src
        .find("cp.async.bulk.wait_group 0;\\n\\tfence.proxy.async.global;")
        .expect("the stores awaited before the signal");
    let counted = src.find("atomicAdd_system").expect("the signal's count");
    assert!(
        written < counted,
        "the count moves after the tile is written"
    );
    let mut unaligned = spec.clone();
    unaligned.tensors[2].align = 4;
    expect_config_err(
        lower(&plan(&k), &unaligned, &cfg.clone().tma_store(true)),
        "rows are 4-byte aligned",
    );
}

#[test]
fn a_row_kernels_repeated_computation_is_computed_once_per_element() {
    // jsd's shape: `lm` is used twice, and `exp(a)` three times; inlined as
    // text, `logf` ran twice per element (the compiler does not merge it).
    let k = Kernel::parse(
        "kernel jsd(lp: Tensor<f32, 2>, lq: Tensor<f32, 2>, out: Tensor<f32, 1>; m, n) {
           for tm in tile(m) {
             let mut acc = zeros::<f32>([tm]);
             for tn in tile(n) {
               let a = lp[(tm, tn)];
               let b = lq[(tm, tn)];
               let lm = log(0.5 * (exp(a) + exp(b)));
               acc = acc + (exp(a) * (a - lm) + exp(b) * (b - lm)).sum(tn);
             }
             out[tm] = acc;
           }
         }",
    )
    .expect("the kernel parses");
    let cfg = default_config(&plan(&k));
    let l = lowered(&k, &declared_spec(&k), &cfg);
    assert_eq!(l.path, "rows");
    let body = kernel_part(&l);
    let line = body
        .lines()
        .find(|x| x.contains("for (int j = 0;") && x.contains("tf_a = "))
        .expect("the reduction's loop over a thread's columns");
    assert_eq!(line.matches("logf(").count(), 1, "{line}");
    assert_eq!(line.matches("tf_exp(").count(), 2, "{line}");
    assert!(line.contains("const float tf_c"), "{line}");
}
