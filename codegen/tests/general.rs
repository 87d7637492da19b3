//! The general lowering: kernels of every shape the fast paths do not take
//! (gathers, offsets, jagged and nested loops, atomics, reductions anywhere,
//! random numbers, integers and bits) lower, with the layouts, vector accesses
//! and masks they need. NVRTC compiles these sources in `tests/nvrtc.rs` (with
//! the macro's kernels); `TILEFUSE_DUMP_DIR` writes them out here too. The
//! kernels built by name (`jagged_sum()`, …) are in `common/kernels.rs`, most
//! as text.

mod common;
use common::*;

/// Lowers `k` for `spec` and `cfg` through the general lowering.
fn general(k: &Kernel, spec: &Spec, cfg: &Config) -> Lowered {
    let l = lower(&plan(k), spec, cfg).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    assert_eq!(l.path, "general", "{}", k.name);
    if let Ok(dir) = std::env::var("TILEFUSE_DUMP_DIR") {
        // The source and how to launch it (for running it outside the runtime).
        let _ = std::fs::create_dir_all(&dir);
        let _ = std::fs::write(format!("{dir}/{}.cu", k.name), &l.source);
        let params: Vec<String> = l.params.iter().map(|p| format!("\"{p:?}\"")).collect();
        let grid: Vec<String> = l.grid.iter().map(|(s, b)| format!("[{s}, {b}]")).collect();
        let meta = format!(
            "{{\"entry\": \"{}\", \"threads\": {}, \"shared\": {}, \"grid\": [{}], \"params\": [{}], \"config\": \"{cfg}\"}}",
            l.entry,
            l.threads,
            l.shared_bytes,
            grid.join(", "),
            params.join(", ")
        );
        let _ = std::fs::write(format!("{dir}/{}.json", k.name), meta);
    }
    l
}

fn kernel(name: &str) -> Kernel {
    Kernel::empty(name)
}

fn ints(n: usize) -> Vec<ScalarKind> {
    vec![ScalarKind::Int; n]
}

#[test]
fn elementwise_2d_moves_16_bytes_a_thread() {
    let k = pointwise_2d();
    let cfg = Config::new(&[4, 1024]);
    let l = general(&k, &pointwise_2d_spec(), &cfg);
    assert_eq!(l.threads, 128);
    assert_eq!(l.grid, vec![(0, 4), (1, 1024)]);
    assert_eq!(l.shared_bytes, 0);
    let body = kernel_part(&l);
    // Runs of 4 (16 bytes of f32, the type that moves the most bytes): x and
    // y in one 16-byte piece a run, the bf16 output in 8 bytes.
    assert!(
        body.contains("const uint4 tf_w0 = *(const uint4*)(tf_p + 0);"),
        "{body}"
    );
    // Stored as an element of the output viewed as 8-byte words (NVVM keeps
    // such a store whole; it split some through `*(uint4*)(tf_p + 0)`).
    assert!(body.contains("((uint2*)t2)[("), "{body}");
    assert!(body.contains(" + 0) >> 2] = make_uint2("), "{body}");
    // Runs inside the extent go whole, the ragged edge element by element.
    assert!(body.contains(" + 4 <= s1"), "{body}");
    assert!(
        body.contains("for (int tf_j = 0; tf_j < 4; ++tf_j)"),
        "{body}"
    );
    // The launch checks sizes, so a tile's own index needs no bounds test.
    assert!(
        !body.contains("< t0_n1") && !body.contains("t0_n1)"),
        "{body}"
    );
    // A unit last stride is not multiplied; a tensor whose last stride may
    // not be 1 keeps its product.
    assert!(!body.contains("* t0_s1"), "{body}");
    let mut strided = pointwise_2d_spec();
    strided.tensors[0].last_contiguous = false;
    let l = general(&k, &strided, &cfg);
    let body = kernel_part(&l);
    assert!(body.contains("* t0_s1"), "{body}");
    assert!(!body.contains("* t1_s1"), "{body}");
}

#[test]
fn an_offset_and_a_gather_are_masked_by_the_tensor() {
    // out[(tt, td)] = w[(ids[tt], td)] + x[(tt, td + off)]
    let mut k = kernel("embed_shift");
    k.tensors = vec![
        tensor("ids", 1, Some(DType::I32)),
        tensor("w", 2, Some(DType::BF16)),
        tensor("x", 2, Some(DType::BF16)),
        tensor("out", 2, Some(DType::BF16)),
    ];
    k.scalars = vec![scalar("t"), scalar("d"), scalar("off")];
    k.dims = vec![dim("tt", 0), dim("td", 1)];
    k.grid = vec![0, 1];
    let gathered = load_ix(1, vec![load(0, &[0], "ids[tt]"), ti(1)], "w[(ids[tt], td)]");
    let shifted = load_ix(
        2,
        vec![ti(0), bin(BinOp::Add, ti(1), Expr::Scalar(2), "td + off")],
        "x[(tt, td + off)]",
    );
    k.body = vec![store(
        3,
        &[0, 1],
        bin(BinOp::Add, gathered, shifted, "+"),
        "out[(tt, td)] = …",
    )];
    let l = general(&k, &spec_of(&k, &ints(3)), &Config::new(&[4, 256]));
    let body = kernel_part(&l);
    // The gathered row and the shifted column are tested against the tensor.
    assert!(body.contains("< (unsigned long long)t1_n0"), "{body}");
    assert!(body.contains("<= t2_n1"), "{body}");
    // The shifted run is vectorized only where its start is aligned.
    assert!(body.contains("% 8 == 0"), "{body}");
    // The gathered rows' vector loads keep their lines in L2 (ids repeat);
    // the shifted tensor's are plain.
    assert_eq!(
        body.matches("tf_ld_l2_last((const uint4*)(tf_p").count(),
        1,
        "{body}"
    );
    assert_eq!(body.matches("= *(const uint4*)(tf_p").count(), 1, "{body}");
    let kept = body.find("tf_ld_l2_last(").unwrap_or(usize::MAX);
    let gathered_row = body.find("(long long)(tf_l").unwrap_or(0);
    assert!(gathered_row < kept, "{body}");
}

/// `x[(tm, idx[tn])]` reads many elements of each of the program's rows: the
/// kernel copies the rows into shared memory (16-byte `cp.async` pieces) when
/// the launch gives it room, and gathers from global memory otherwise. A
/// gather of one element a row (`x[(tm, labels[tm])]`) is not staged.
#[test]
fn a_gather_of_many_elements_a_row_stages_the_rows_in_shared_memory() {
    let k = parse(
        "kernel gather_cols(x: Tensor<bf16, 2>, idx: Tensor<i32, 1>, out: Tensor<bf16, 2>; m, n) {
           for (tm, tn) in tile([m, n]) {
             out[(tm, tn)] = x[(tm, idx[tn])];
           }
         }",
    );
    // Untuned, a program takes whole gathered rows' worth: each row is
    // copied once.
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(16384), Some(4096)]);
    assert_eq!(c.block_sizes, vec![1, 4096]);
    let l = general(&k, &spec_of(&k, &ints(2)), &Config::new(&[4, 1024]));
    use tilefuse_codegen::emit::general::GatherStage;
    use tilefuse_codegen::emit::Param;
    let stage = GatherStage {
        tensor: 0,
        axis: 1,
        rows: 4,
        per_row: 1024,
        elem_bytes: 2,
    };
    assert_eq!(l.gathers, vec![stage.clone()]);
    assert!(l.params.contains(&Param::StageCap));
    let body = kernel_part(&l);
    // The rows' copies issued, then the indices loaded (in flight together,
    // and the indices hold no registers across the copy loops), then the
    // staged branch's gather, then the direct one.
    let at = |s: &str| body.find(s).unwrap_or(usize::MAX);
    let issued = at("tf_cp_async_commit();");
    let indices = at("= *(const uint4*)(tf_p");
    let waited = at("tf_cp_async_wait<0>();");
    let direct = body.find("t0[(tb0 + tf_o0_0) * t0_s0 + ").unwrap_or(0);
    assert!(at("<= tf_stage_cap;") < issued, "{body}");
    assert!(
        issued < indices && indices < waited && waited < direct,
        "{body}"
    );
    // The copy loops count in ints (staged rows fit shared memory).
    for want in [
        "for (int tf_j = tid * 8; tf_j + 8 <= tf_rl; tf_j += 1024) \
         tf_cp_async16(tf_smem_u32(tf_dst + tf_j), tf_src + tf_j, 16u)",
        "const int tf_rl = (int)t0_n1;",
        // Gathered bf16 kept two to a 32-bit register, as loaded.
        "unsigned int tf_l1[",
        "? (unsigned int)(tf_u16)(tf_sg[(long long)(",
    ] {
        assert!(body.contains(want), "`{want}` missing:\n{body}");
    }
    // Worth it from one element in 16 of a row, in 16-byte multiples.
    assert!(stage.worth(8192) && stage.worth(16384) && !stage.worth(16385));
    assert_eq!(stage.bytes(8192), 4 * 8192 * 2);
    assert_eq!(stage.bytes(1001), (4 * 1001 * 2usize).next_multiple_of(16));
    // Its rows wait in shared memory, not registers: derived, the launch
    // bounds ask for 1536 threads an SM; a config's occupancy overrides it.
    assert!(
        l.source.contains("__launch_bounds__(128, 12)"),
        "{}",
        l.source
    );
    let bounded = Config::new(&[4, 1024]).occupancy(1024);
    let l = general(&k, &spec_of(&k, &ints(2)), &bounded);
    assert!(
        l.source.contains("__launch_bounds__(128, 8)"),
        "{}",
        l.source
    );
    // One element a row: read where it is.
    let k = parse(
        "kernel pick(x: Tensor<bf16, 2>, labels: Tensor<i32, 1>, out: Tensor<f32, 1>; m) {
           for tm in tile(m) {
             out[tm] = x[(tm, labels[tm])].cast::<f32>();
           }
         }",
    );
    let l = general(&k, &spec_of(&k, &ints(1)), &Config::new(&[128]));
    assert!(l.gathers.is_empty());
    assert!(!kernel_part(&l).contains("tf_stage_cap"));
    assert!(
        l.source.contains("__launch_bounds__(128, 1)"),
        "{}",
        l.source
    );
}

#[test]
fn a_jagged_loop_walks_bounds_the_program_loads() {
    let k = jagged_sum();
    let l = general(&k, &spec_of(&k, &ints(2)), &Config::new(&[1, 128, 32]));
    let body = kernel_part(&l);
    assert!(body.contains("const long long tf_end2 = "), "{body}");
    assert!(body.contains("tb2 < tf_end2; tb2 += B2"), "{body}");
    // The rows of a range are tested against the tensor (no size rule covers them).
    assert!(body.contains("t1_n0"), "{body}");
    // The sum along `tr` stays in each thread: the warps spread over `td`.
    assert!(!body.contains("__shfl_xor_sync"), "{body}");
}

#[test]
fn atomics_are_masked_and_done_once_per_element() {
    let k = histogram();
    let l = general(&k, &spec_of(&k, &ints(1)), &Config::new(&[1024]));
    let body = kernel_part(&l);
    // Counts go to the program's copy in shared memory when the launch gave
    // it room (`tf_priv`), else to the tensor; the copy is added into the
    // tensor at the program's end, after its walk over the grid.
    assert!(body.contains("const bool tf_pv = tf_priv != 0;"), "{body}");
    assert!(
        body.contains("if (tf_pv) tf_atomic_add(tf_bins1 + ("),
        "{body}"
    );
    assert!(body.contains("; else tf_atomic_add(t1 + ("), "{body}");
    assert!(
        body.contains("tf_w < tf_total; tf_w += gridDim.x"),
        "{body}"
    );
    let flush = &body[body.find("}  // the walk").expect("the walk closes")..];
    assert!(
        flush.contains("if (tf_c != (int)0) tf_atomic_add(t1 + (((tf_i / tf_pl1_0) % tf_pn1_0) * t1_s0), tf_c);"),
        "{body}"
    );
    assert!(body.contains("< (unsigned long long)t1_n0"), "{body}");
    // The launch sizes the copy: the kernel declares none of its own.
    assert_eq!(l.shared_bytes, 0);
    let p = l.private.as_ref().expect("a private copy");
    assert!(p.walk && p.kept == 0 && p.tile_elems == 1024, "{p:?}");
    assert_eq!(p.copies[0].entries(&[300]), 300);
    assert_eq!(p.copies[0].bytes(&[301]), 1216);
    // A kernel that also reads the counts keeps its atomics global.
    let mut reads = k.clone();
    reads.body.push(store(
        0,
        &[0],
        load_ix(1, vec![Expr::Int(0)], "counts[0]"),
        "bins[ti] = counts[0]",
    ));
    let l = general(&reads, &spec_of(&reads, &ints(1)), &Config::new(&[1024]));
    assert!(!kernel_part(&l).contains("tf_bins1"), "{}", kernel_part(&l));
    assert!(l.private.is_none());
    // A block smaller than the layout's reach: copies skip the atomic.
    let l = general(&k, &spec_of(&k, &ints(1)), &Config::new(&[64]));
    assert!(kernel_part(&l).contains("tf_u0_0"), "{}", kernel_part(&l));
}

/// `let s = atomic_add(…)`: one atomic an element, its old value into the
/// variable (0 where skipped); never a private copy or a vector reduction
/// (neither returns anything); where other threads hold the same element
/// (the row copy's column threads), the owner hands it over through shared
/// memory.
#[test]
fn an_atomics_old_values_go_to_every_thread_holding_them() {
    let k = slots();
    // Between the fetch and the slot's first use (its store).
    let handover = |cfg: &Config| {
        let l = general(&k, &spec_of(&k, &ints(2)), cfg);
        assert!(l.private.is_none());
        let body = kernel_part(&l).to_string();
        assert!(
            !body.contains("tf_bins1") && !body.contains("tf_red_add_v4"),
            "{body}"
        );
        let at = body.find("= tf_atomic_add(t1 + (").expect("the fetch");
        assert!(body[at..].contains("} else v"), "{body}");
        let used = at + body[at..].find("// slot[ti] = s").expect("the store");
        body[at..used].contains("__syncthreads();") && body[at..used].contains("tf_smem")
    };
    // Four rows a program, the row copy's layout (its threads along the
    // columns hold copies of each slot): the owners hand them over.
    assert!(handover(&Config::new(&[4, 1024])));
    // 1024 rows a program in a layout of their own: each thread its own.
    assert!(!handover(&Config::new(&[1024, 1])));
    // What depends on the atomics' order: the slots and the rows placed by
    // them, not the counts (the autotuner compares only the others).
    assert_eq!(k.order_dependent(), [2, 4]);
    assert!(histogram().order_dependent().is_empty());
}

/// An `each` grid dimension of thousands counts as programs: an
/// embedding gradient's rows (32000) keep 1024 columns a tile, where 2000
/// segments still halve theirs to 64 for programs.
#[test]
fn an_each_grid_of_thousands_keeps_its_columns_wide() {
    let k = jagged_sum();
    let at =
        |nb| tilefuse_codegen::emit::general::default_config(&k, &[Some(nb), Some(4096), None]);
    assert_eq!(at(32000).block_sizes[1], 1024, "{}", at(32000));
    assert_eq!(at(2000).block_sizes[1], 64, "{}", at(2000));
}

#[test]
fn a_segment_counts_copy_keeps_its_column_tile_and_the_programs_walk_the_rows() {
    let segments = |ty: &str| {
        parse(&format!(
            "kernel segments(values: Tensor<{ty}, 2>, ids: Tensor<i32, 1>, out: Tensor<{ty}, 2>; n, d) {{
               for (tn, td) in tile([n, d]) {{
                 atomic_add(out[(ids[tn], td)], values[(tn, td)]);
               }}
             }}"
        ))
    };
    let k = segments("i32");
    let l = general(&k, &spec_of(&k, &ints(2)), &Config::new(&[64, 16]));
    let body = kernel_part(&l);
    // The copy: every segment (the whole axis 0) by the program's 16 columns.
    assert!(
        body.contains("const long long tf_pn2_1 = (long long)B1, tf_pl2_1 = 1;"),
        "{body}"
    );
    assert!(
        body.contains("const long long tf_pn2_0 = t2_n0, tf_pl2_0 = tf_pn2_1 * tf_pl2_1;"),
        "{body}"
    );
    // An element goes to the copy at its column within the tile.
    assert!(
        body.contains("if (tf_pv) tf_atomic_add(tf_bins2 + ("),
        "{body}"
    );
    assert!(body.contains(" - tb1) * tf_pl2_1)"), "{body}");
    // The flush adds the copy's columns at the program's tile, within the tensor.
    assert!(
        body.contains("if (tb1 + (tf_i / tf_pl2_1) % tf_pn2_1 < t2_n1 && tf_c != (int)0)"),
        "{body}"
    );
    let p = l.private.as_ref().expect("a private copy");
    // The column tiles are the grid's innermost: the programs walk the rows.
    assert!(p.walk && p.kept == 1 && p.tile_elems == 64 * 16, "{p:?}");
    assert_eq!(p.copies[0].entries(&[2000, 128]), 2000 * 16);
    // f32 sums keep their atomics in global memory (a compare-and-swap loop
    // in shared memory), four at a time.
    let k = segments("f32");
    let l = general(&k, &spec_of(&k, &ints(2)), &Config::new(&[64, 16]));
    assert!(l.private.is_none());
    assert!(kernel_part(&l).contains("tf_red_add_v4(tf_p + 0,"));
    // Indexed by its tiles alone, a tensor gets no copy (nothing repeats).
    let own = parse(
        "kernel own(values: Tensor<i32, 2>, out: Tensor<i32, 2>; n, d) {
           for (tn, td) in tile([n, d]) {
             atomic_add(out[(tn, td)], values[(tn, td)]);
           }
         }",
    );
    let l = general(&own, &spec_of(&own, &ints(2)), &Config::new(&[64, 16]));
    assert!(l.private.is_none());
    assert!(!kernel_part(&l).contains("tf_total"), "{}", kernel_part(&l));
}

#[test]
fn reductions_along_any_tile() {
    let k = column_and_total_sums();
    let l = general(
        &k,
        &spec_of(&k, &ints(2)),
        &Config::new(&[256, 16]).num_warps(4),
    );
    let body = kernel_part(&l);
    // `acc.sum(tn)` crosses lanes and warps.
    assert!(body.contains("__shfl_xor_sync(0xffffffffu"), "{body}");
    assert!(body.contains("tf_smem"), "{body}");
    assert!(l.shared_bytes > 0);
}

#[test]
fn random_numbers_use_philox() {
    let k = dropout();
    let spec = spec_of(&k, &[ScalarKind::Int, ScalarKind::Int, ScalarKind::Float]);
    let l = general(&k, &spec, &Config::new(&[2048]));
    let body = kernel_part(&l);
    // A run of 8 draws twice, four values a call, where its offsets are
    // consecutive from a multiple of 4; else each element by itself. The
    // round keys are made once, before the runs, and the offsets in 32 bits.
    assert!(body.contains("tf_philox_keys_held(s1, tf_pk"), "{body}");
    assert!(body.contains("tf_o / 4u, tf_c);"), "{body}");
    // `rand(..) >= p`: the words against a bound made once from `p`, not
    // the floats against `p`, where the mask is used (a predicate).
    assert!(
        body.contains("= tf_uniform_bound(s2, false, false);"),
        "{body}"
    );
    assert!(body.contains("= tf_c[3];"), "{body}");
    assert!(body.contains("tf_select<float>((!tf_ub"), "{body}");
    assert!(!body.contains("tf_uniform(tf_c"), "{body}");
    assert!(body.contains("unsigned int tf_x"), "{body}");
    assert!(!body.contains("long long tf_x"), "{body}");
    assert!(body.contains("tf_randint(s1, tf_x"), "{body}");
    // A `let` of the mask is the same words, compared where it is used.
    let k = parse(
        "kernel dropout(x: Tensor<bf16, 1>, out: Tensor<bf16, 1>; n, seed, p) {
           for ti in tile(n) {
             let keep = rand(seed, ti.index()) > p;
             out[ti] = select(keep, x[ti] / (1.0 - p), 0.0).cast();
           }
         }",
    );
    let l = general(&k, &spec, &Config::new(&[2048]));
    let let_body = kernel_part(&l);
    assert!(let_body.contains("(compared where used)"), "{let_body}");
    assert!(let_body.contains("tf_select<float>((!tf_ub"), "{let_body}");
    // `x[ti]` is loaded before the draws, so its latency overlaps them.
    let load = body.find("// x[ti]").expect("the load of x");
    assert!(
        load < body.find("tf_philox_keys_held").unwrap_or(0),
        "{body}"
    );
}

#[test]
fn random_values_compared_with_tiles_or_used_as_values_stay_floats() {
    // The value itself, and a comparison with a tile rather than one value.
    for (k, cmp) in [
        (
            "kernel noise(x: Tensor<f32, 1>, out: Tensor<f32, 1>; n, seed) {
               for ti in tile(n) { out[ti] = x[ti] * rand(seed, ti.index()); }
             }",
            false,
        ),
        (
            "kernel keep(x: Tensor<f32, 1>, out: Tensor<f32, 1>; n, seed) {
               for ti in tile(n) { out[ti] = select(x[ti] < rand(seed, ti.index()), x[ti], 0.0); }
             }",
            true,
        ),
    ] {
        let k = common::parse(k);
        let l = general(&k, &spec_of(&k, &ints(2)), &Config::new(&[1024]));
        let body = kernel_part(&l);
        assert!(body.contains("= tf_uniform(tf_c[3]);"), "{body}");
        assert!(!body.contains("tf_uniform_bound"), "{body}");
        if cmp {
            assert!(body.contains(" < tf_rn"), "{body}");
        }
    }
    // `p < rand(..)` is `rand(..) > p`.
    let k = common::parse(
        "kernel keep(x: Tensor<f32, 1>, out: Tensor<f32, 1>; n, seed, p) {
           for ti in tile(n) { out[ti] = select(p < rand(seed, ti.index()), x[ti], 0.0); }
         }",
    );
    let spec = spec_of(&k, &[ScalarKind::Int, ScalarKind::Int, ScalarKind::Float]);
    let l = general(&k, &spec, &Config::new(&[1024]));
    let body = kernel_part(&l);
    assert!(
        body.contains("tf_uniform_bound(s2, true, false);"),
        "{body}"
    );
    assert!(body.contains("tf_select<float>((!tf_ub"), "{body}");
}

#[test]
fn integers_keep_their_width_and_ifs_branch_at_run_time() {
    let k = bits();
    let l = general(&k, &spec_of(&k, &ints(2)), &Config::new(&[1024]));
    let body = kernel_part(&l);
    assert!(
        body.contains("tf_shl(tf_l1[(tf_q * 4 + tf_j)], 3ll)"),
        "{body}"
    );
    assert!(body.contains("if ((s1 != 0)) {"), "{body}");
    assert!(body.contains("(~"), "{body}");
}

#[test]
fn a_reduction_in_a_kernel_of_several_grid_dimensions() {
    let k = batched_softmax();
    // The row in one block: the store is inside the loop, indexed by `tn`.
    let l = general(&k, &spec_of(&k, &ints(3)), &Config::new(&[1, 4, 1024]));
    let body = kernel_part(&l);
    assert!(body.contains("tf_exp_diff("), "{body}");
    assert!(body.contains("__shfl_xor_sync"), "{body}");
    // More warps than the tile: the row's warps wrap, and the copies' masked
    // partials stay out of the shared slots the real ones write.
    let l = general(
        &k,
        &spec_of(&k, &ints(3)),
        &Config::new(&[1, 1, 1024]).num_warps(8),
    );
    let body = kernel_part(&l);
    assert!(
        body.contains("== 0 && tf_u0_1) ((float*)tf_smem)"),
        "{body}"
    );
}

#[test]
fn storing_one_blocks_partial_reduction_in_its_loop_is_an_error() {
    // for tn in tile(n) { out[tm] = x[(tm, tn)].sum(tn) } keeps the last block only.
    let mut k = rows_inner_loop();
    k.tensors[1].rank = 1;
    let Stmt::Loop { body, .. } = &mut k.body[0] else {
        unreachable!()
    };
    *body = vec![store(
        1,
        &[0],
        reduce(
            ReduceOp::Sum,
            load(0, &[0, 1], "x[(tr, tc)]"),
            1,
            "x.sum(tc)",
        ),
        "out[tr] = x[(tr, tc)].sum(tc)",
    )];
    let mut spec = declared_spec(&k);
    spec.tensors[1].rank = 1;
    let msg = expect_type_err(check(&k, &spec), &["`tc`", "last block"]);
    assert!(msg.contains("accumulate"), "{msg}");
}

#[test]
fn general_configs_need_powers_of_two_and_each_blocks_of_one() {
    let k = pointwise_2d();
    expect_config_err(
        lower(&plan(&k), &pointwise_2d_spec(), &Config::new(&[4, 1000])),
        "power of two",
    );
    let k = jagged_sum();
    expect_config_err(
        lower(
            &plan(&k),
            &spec_of(&k, &ints(2)),
            &Config::new(&[2, 128, 32]),
        ),
        "must be 1",
    );
}

#[test]
fn the_default_fits_the_extents() {
    let k = histogram();
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(16_000_000)]);
    assert_eq!(c.block_sizes, vec![4096]);
    // 4096 a program would give 245 programs: halved, for 489.
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(1_000_000)]);
    assert_eq!(c.block_sizes, vec![2048]);
    // A short extent: rounded up to a power of two, then halved toward more
    // programs down to 64 elements.
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(100)]);
    assert_eq!(c.block_sizes, vec![64]);
    let k = jagged_sum();
    let c = tilefuse_codegen::emit::general::default_config(&k, &[None, Some(64), None]);
    assert_eq!(c.block_sizes[0], 1);
    assert_eq!(c.block_sizes[1], 64);
    // Its loop is the program's own: the next tile loads a step ahead.
    assert_eq!(c.num_stages, 2);
    assert!(kernel_part(&general(&k, &spec_of(&k, &ints(2)), &c)).contains("the next tile"));
}

/// `out = x + y` on bf16, the elementwise benchmark's kernel, at several blocks.
#[test]
fn add_lowers_at_the_tuning_seeds() {
    let mut k = kernel("add");
    k.tensors = vec![
        tensor("x", 2, Some(DType::BF16)),
        tensor("y", 2, Some(DType::BF16)),
        tensor("out", 2, Some(DType::BF16)),
    ];
    k.scalars = vec![scalar("m"), scalar("n")];
    k.dims = vec![dim("tm", 0), dim("tn", 1)];
    k.grid = vec![0, 1];
    k.body = vec![store(
        2,
        &[0, 1],
        cast(
            bin(
                BinOp::Add,
                load(0, &[0, 1], "x"),
                load(1, &[0, 1], "y"),
                "x + y",
            ),
            None,
        ),
        "out[(tm, tn)] = (x + y).cast()",
    )];
    let spec = spec_of(&k, &ints(2));
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(16384), Some(8192)]);
    for seed in tilefuse_codegen::emit::general::seeds(&k, &c) {
        lower(&plan(&k), &spec, &seed).unwrap_or_else(|e| panic!("{seed}: {e}"));
    }
    general(&k, &spec, &c);
    // Named variants, for measuring them outside the runtime.
    if std::env::var("TILEFUSE_DUMP_DIR").is_ok() {
        for (bm, bn, w) in [
            (4, 1024, 4),
            (8, 1024, 4),
            (4, 2048, 4),
            (8, 2048, 8),
            (2, 2048, 4),
            (1, 4096, 4),
            (16, 512, 4),
            (8, 1024, 8),
            (4, 1024, 2),
            (2, 1024, 4),
        ] {
            let mut v = k.clone();
            v.name = format!("add_{bm}x{bn}_w{w}");
            general(&v, &spec, &Config::new(&[bm, bn]).num_warps(w));
        }
    }
}

/// `out[(tn, tm)] = x[(tm, tn)]` on bf16: the default at a large shape takes
/// square tiles, and the load, whose contiguous index is not the store's,
/// moves 16 bytes a thread in a layout of its own and reaches the store's
/// layout through shared memory (rows padded against bank conflicts).
#[test]
fn a_transpose_moves_16_bytes_both_ways_through_shared_memory() {
    let mut k = kernel("transpose");
    k.tensors = vec![
        tensor("x", 2, Some(DType::BF16)),
        tensor("out", 2, Some(DType::BF16)),
    ];
    k.scalars = vec![scalar("m"), scalar("n")];
    k.dims = vec![dim("tm", 0), dim("tn", 1)];
    k.grid = vec![0, 1];
    k.body = vec![store_ix(
        1,
        vec![Expr::TileIndex(1), Expr::TileIndex(0)],
        load(0, &[0, 1], "x"),
        "out[(tn, tm)] = x[(tm, tn)]",
    )];
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(16384), Some(8192)]);
    assert_eq!(c.block_sizes, vec![64, 64]);
    let l = general(&k, &spec_of(&k, &ints(2)), &c);
    let body = kernel_part(&l);
    assert!(
        body.contains("const uint4 tf_w0 = *(const uint4*)(tf_p + 0);"),
        "{body}"
    );
    assert!(body.contains("((uint4*)t1)[("), "{body}");
    assert!(body.contains(" + 0) >> 3] = make_uint4("), "{body}");
    assert!(body.contains("in the scope's layout"), "{body}");
    assert!(body.contains(" * 65 + "), "{body}");
    assert_eq!(l.shared_bytes, 64 * 65 * 4);
    // Too narrow a tile for 16-byte runs along `tn`: loaded in place.
    let l = general(&k, &spec_of(&k, &ints(2)), &Config::new(&[1024, 4]));
    assert!(!kernel_part(&l).contains("in the scope's layout"));
}

/// A column sum at 16384 x 8192 has 128 column blocks at most: fewer programs
/// than the GPU wants, so each gets 16 warps and a 4x deeper row tile.
#[test]
fn a_launch_of_few_programs_gets_more_warps_and_deeper_tiles() {
    // The column sums with a store before the loop: no program can share it.
    let mut k = column_and_total_sums();
    k.body
        .insert(0, store(1, &[0], Expr::Float(0.0), "cols[tn] = 0.0"));
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(8192), Some(16384)]);
    assert_eq!(
        (c.block_sizes.as_slice(), c.num_warps, c.split),
        (&[64, 256][..], 16, 0)
    );
    let l = general(&k, &spec_of(&k, &ints(2)), &c);
    assert_eq!(l.threads, 512);
    assert!(l.split_loop.is_none());
    // Enough column blocks: 4 warps, as before.
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(65536), Some(16384)]);
    assert_eq!(c.num_warps, 4);
}

/// A loop down rows that walks two tensors' tiles (a weight gradient's
/// `x` and `dy`) gets wider, shorter tiles than a column sum's one tensor:
/// 256 columns by 8 rows, still one warp and 64 ways at most.
#[test]
fn a_shared_loop_over_two_tensors_takes_wider_tiles() {
    let k = parse(
        "kernel dw(x: Tensor<bf16, 2>, dy: Tensor<bf16, 2>, dw: Tensor<f32, 1>; m, n) {
           for tn in tile(n) {
             let mut acc = zeros::<f32>([tn]);
             for tm in tile(m) {
               acc = acc + (x[(tm, tn)].cast::<f32>() * dy[(tm, tn)].cast::<f32>()).sum(tm);
             }
             dw[tn] = acc;
           }
         }",
    );
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(8192), Some(16384)]);
    assert_eq!(
        (c.block_sizes.as_slice(), c.num_warps, c.split),
        (&[256, 8][..], 1, 64)
    );
}

/// A column sum over a tall matrix: programs share the walk down the rows
/// (the runtime picks how many); each writes its partial sums to scratch and
/// the last of a column tile's programs adds them in order and stores.
#[test]
fn a_column_sum_shares_its_loop_among_programs() {
    let k = column_and_total_sums();
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(8192), Some(16384)]);
    // Columns of 256 bytes of bf16, one warp: the sharing fills the GPU.
    assert_eq!(
        (c.block_sizes.as_slice(), c.num_warps, c.split),
        (&[128, 16][..], 1, 64)
    );
    let l = general(&k, &spec_of(&k, &ints(2)), &c);
    let split = l.split_loop.clone().expect("a shared loop");
    assert_eq!(
        (split.extent, split.block, split.most, split.share_bytes),
        (1, 16, 64, 128 * 4)
    );
    use tilefuse_codegen::emit::Param;
    for p in [Param::SplitWays, Param::SplitPartials, Param::SplitCounters] {
        assert!(l.params.contains(&p), "{p:?}");
    }
    let body = kernel_part(&l);
    for want in [
        "tf_beg1 = (((s1) + B1 - 1) / B1) * tf_part / tf_ways * B1",
        "tf_arrive_last(&tf_counters[tf_prog], (unsigned int)tf_ways)",
        "if (!tf_last) return;",
        "__ldcg(",
    ] {
        assert!(body.contains(want), "`{want}` missing:\n{body}");
    }
    // The loop adds each tile into a register tile; the rows are reduced
    // once, after the loop (no barrier or shuffle in it).
    let start = body.find("for (long long tb1").unwrap_or(0);
    let end = body.find("acc's deferred reduction").unwrap_or(0);
    assert!(start < end, "{body}");
    assert!(!body[start..end].contains("__syncthreads"), "{body}");
    assert!(!body[start..end].contains("__shfl"), "{body}");
    // The rows of `x[(tm, tn)]` stay as the 16-byte loads brought them (bf16
    // two to a register), though the value's first dimension is `tn`.
    assert!(body.contains("unsigned int tf_l"), "{body}");
    // The last program reads the shares in order, each share's elements at
    // once (the loop over elements inside the loop over shares).
    let shares = body
        .find("for (int tf_q = 1; tf_q < tf_ways; ++tf_q) {")
        .unwrap_or(usize::MAX);
    let elements = body[shares.min(body.len())..].find("for (int r0 = 0;");
    assert!(elements.is_some_and(|e| e < 120), "{body}");
    // The shares meet before the store and the atomic after the loop.
    let meet = body.find("tf_last").unwrap_or(usize::MAX);
    assert!(meet < body.find("// cols[tn] = acc").unwrap_or(0), "{body}");
    // Eight warps down the rows leave each column's sum in every warp: only
    // the owners (warp 0) read the shares, and the other warps take the sums
    // from them through shared memory.
    let eight = Config::new(&[256, 64]).num_warps(8).split(16);
    let l8 = general(&k, &spec_of(&k, &ints(2)), &eight);
    let body = kernel_part(&l8);
    let owners = body
        .find("if (tf_o0_1 == 0) {  // the owners read the shares")
        .unwrap_or_else(|| panic!("no owners' meet:\n{body}"));
    let shared = body[owners..]
        .find("__syncthreads();")
        .map(|i| i + owners)
        .unwrap_or(0);
    let reads = body[owners..]
        .find("__ldcg(")
        .map_or(usize::MAX, |i| i + owners);
    assert!(owners < reads && reads < shared, "{body}");
    assert!(
        body[shared..].contains("= ((float*)(tf_smem + 0))[(0) * 256 + tf_o0_0 + r0];"),
        "{body}"
    );
    // Without `split` the loop is the program's own.
    let l = general(&k, &spec_of(&k, &ints(2)), &c.clone().split(0));
    assert!(l.split_loop.is_none());
    assert!(!kernel_part(&l).contains("tf_ways"));
}

/// A column argmin (`at = select(lo < best, v.argmin(tm), at)` ahead of
/// `best = min(best, lo)`) shares its walk down the rows like a column sum:
/// the last program takes a later share's position only where that share's
/// minimum is strictly smaller than every share's before it (a tie keeps the
/// earlier row). `<=` (the last position) or the select after the update
/// would combine differently from the loop: no sharing there.
#[test]
fn a_column_argmin_shares_its_loop_and_keeps_the_first_position() {
    let text = |cmp: &str, order_min_first: bool| {
        let select = format!("at = select(lo {cmp} best, v.argmin(tm), at);");
        let update = "best = min(best, lo);";
        let (first, second) = if order_min_first {
            (update, select.as_str())
        } else {
            (select.as_str(), update)
        };
        format!(
            "kernel col_argmin(x: Tensor<bf16, 2>, out: Tensor<i64, 1>; m, n) {{
               for tn in tile(n) {{
                 let mut best = full::<f32>([tn], inf);
                 let mut at = zeros::<i64>([tn]);
                 for tm in tile(m) {{
                   let v = x[(tm, tn)].cast::<f32>();
                   let lo = v.min(tm);
                   {first}
                   {second}
                 }}
                 out[tn] = at;
               }}
             }}"
        )
    };
    let k = parse(&text("<", false));
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(8192), Some(16384)]);
    assert_eq!(c.split, 64);
    let l = general(&k, &spec_of(&k, &ints(2)), &c);
    let split = l.split_loop.clone().expect("a shared loop");
    // Per column: the i64 position, then the f32 minimum, 8-byte aligned.
    assert_eq!(split.share_bytes, 128 * 8 + 128 * 4);
    let body = kernel_part(&l);
    let shares = body.find("for (int tf_q = 1;").unwrap_or(usize::MAX);
    let take = body
        .find("if (tf_sb < tf_rb0[r0]) { tf_rb0[r0] = tf_sb;")
        .unwrap_or(0);
    let min = body.rfind("fminf(").unwrap_or(0);
    // Inside the loop over shares, ahead of the minimum's own combine.
    assert!(shares < take && take < min, "{body}");
    // `lo = v.min(tm)` is the argmin's pairs' value: one reduction a step.
    assert!(!body.contains("tf_a = tf_min("), "{body}");
    assert_eq!(body.matches("__shfl_xor_sync").count(), 2, "{body}");
    // `best > lo` reads the same; `lo > best` is the running maximum's.
    let k = parse(&text("<", false).replace("lo < best", "best > lo"));
    assert!(general(&k, &spec_of(&k, &ints(2)), &c).split_loop.is_some());
    let max = parse(
        &text("<", false)
            .replace("lo < best", "lo > best")
            .replace("min(best, lo)", "max(best, lo)")
            .replace("v.min(tm)", "v.max(tm)"),
    );
    let l = general(&max, &spec_of(&max, &ints(2)), &c);
    assert!(l.split_loop.is_some());
    assert!(
        kernel_part(&l).contains("if (tf_sb > tf_rb0"),
        "{}",
        kernel_part(&l)
    );
    for k in [parse(&text("<=", false)), parse(&text("<", true))] {
        refuses_split(&k, &c);
    }
}

/// A long row's sum and the first position of its largest element, each
/// row one walk its programs share: the accumulators are scalars (every
/// thread holds them), so the last program's threads take the shares
/// between them and combine across lanes and warps in a fixed order, the
/// position carrying its share's number for ties, instead of reading the
/// shares one after another.
#[test]
fn scalar_accumulators_meet_across_the_threads() {
    let k = parse(
        "kernel long_rows(x: Tensor<bf16, 2>, total: Tensor<f32, 1>, at: Tensor<i64, 1>; m, n) {
           for r in tile(each(m)) {
             let mut acc = zeros::<f32>([]);
             let mut best = full::<f32>([], -inf);
             let mut pos = zeros::<i64>([]);
             for tn in tile(n) {
               let v = x[(r, tn)].cast::<f32>();
               acc = acc + v.sum(tn);
               let hi = v.max(tn);
               pos = select(hi > best, v.argmax(tn), pos);
               best = max(best, hi);
             }
             total[r] = acc;
             at[r] = pos;
           }
         }",
    );
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(4), Some(1 << 22)]);
    assert!(c.split > 1, "{c}");
    let l = general(&k, &spec_of(&k, &ints(2)), &c);
    assert!(l.split_loop.is_some());
    let body = kernel_part(&l);
    // Each program's share of a row is read once, by it alone: streamed.
    assert!(body.contains("__ldcs((const uint4*)(tf_p + 0))"), "{body}");
    assert!(!body.contains("*(const uint4*)"), "{body}");
    let threads = c.num_warps * 32;
    for want in [
        format!("for (int tf_q = tid; tf_q < tf_ways; tf_q += {threads}) {{"),
        "for (int tf_s = 16; tf_s > 0; tf_s >>= 1) {".to_string(),
        // The position: the later share's only where its best is larger, or
        // equal at a lower share.
        "if (tf_sb > tf_mb1 || (tf_sb == tf_mb1 && tf_q < tf_mq1))".to_string(),
        "if (tf_xb > tf_mb1 || (tf_xb == tf_mb1 && tf_xq < tf_mq1))".to_string(),
    ] {
        assert!(body.contains(&want), "`{want}` missing:\n{body}");
    }
    // Warps meet in shared memory in warp order, after a barrier.
    if c.num_warps > 1 {
        assert!(body.contains("if (tf_lane == 0) {"), "{body}");
        assert!(
            body.contains(&format!(
                "for (int tf_w = 1; tf_w < {}; ++tf_w) {{",
                c.num_warps
            )),
            "{body}"
        );
    }
    // Not the loop over shares in order.
    assert!(
        !body.contains("for (int tf_q = 1; tf_q < tf_ways; ++tf_q)"),
        "{body}"
    );
}

/// Two stages: the loop loads its first tile before it starts, and each
/// step issues the next tile's loads, where the loop goes on, before it sums
/// this one; one stage (the default of a loop the programs share) loads each
/// tile at its step.
#[test]
fn a_loop_of_two_stages_loads_the_next_tile_before_it_computes() {
    let k = column_and_total_sums();
    let c = tilefuse_codegen::emit::general::default_config(&k, &[Some(8192), Some(16384)]);
    assert_eq!((c.split, c.num_stages), (64, 1));
    let c = c.num_stages(2);
    let l = general(&k, &spec_of(&k, &ints(2)), &c);
    let body = kernel_part(&l);
    let first = body.find("the next tile of `x`").unwrap_or(usize::MAX);
    let start = body.find("for (long long tb1").unwrap_or(0);
    let next = body.find("if (tb1 + 16 < tf_end1)").unwrap_or(usize::MAX);
    let sum = body.find("// acc = acc").unwrap_or(0);
    assert!(first < start && start < next && next < sum, "{body}");
    // The first tile only where the loop runs, the next one read as `tb1`.
    assert!(body.contains("if (tf_beg1 < tf_end1)"), "{body}");
    assert!(body.contains("const long long tb1 = tf_nb1;"), "{body}");
    // Each step's loads: the carried tile's, and the next one's.
    assert_eq!(
        body[start..sum].matches("*(const uint4*)").count(),
        1,
        "{body}"
    );
    let l = general(&k, &spec_of(&k, &ints(2)), &c.clone().num_stages(1));
    let single = kernel_part(&l);
    assert!(!single.contains("the next tile"), "{single}");
    assert!(!single.contains("tf_nb1"), "{single}");
    // No stages at all is an error that names the option.
    let err = lower(&plan(&k), &spec_of(&k, &ints(2)), &c.num_stages(0))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("num_stages must be at least 1"), "{err}");
}

/// A loop whose `until` bound the body moves learns its next step only after
/// this one: it loads no tile ahead. A fixed bound keeps the loads ahead.
#[test]
fn a_loop_whose_body_moves_its_bound_loads_no_tile_ahead() {
    let text = |bound: &str, step: &str| {
        format!(
            "kernel capped(x: Tensor<f32, 2>, out: Tensor<f32, 1>; m, n) {{
               for tm in tile(m) {{
                 let mut acc = zeros::<f32>([tm]);
                 let mut lim = n;
                 for tn in tile(n).until({bound}) {{
                   acc = acc + x[(tm, tn)].sum(tn);
                   {step}
                 }}
                 out[tm] = acc;
               }}
             }}"
        )
    };
    let cfg = Config::new(&[4, 256]).num_stages(2);
    let moving = parse(&text("lim", "lim = lim - 1;"));
    let l = general(&moving, &spec_of(&moving, &ints(2)), &cfg);
    let body = kernel_part(&l);
    assert!(!body.contains("the next tile"), "{body}");
    let fixed = parse(&text("lim", ""));
    let l = general(&fixed, &spec_of(&fixed, &ints(2)), &cfg);
    let body = kernel_part(&l);
    assert!(body.contains("the next tile"), "{body}");
}

/// Loops whose programs could not share them: `split` is refused there,
/// naming what a shared loop needs.
#[test]
fn a_loop_that_cannot_be_shared_refuses_split() {
    let base = column_and_total_sums();
    // A store before the loop would run in every share.
    let mut before = base.clone();
    before
        .body
        .insert(0, store(1, &[0], Expr::Float(0.0), "cols[tn] = 0.0"));
    // A tile loop after it would run in one program alone.
    let mut after = base.clone();
    after.body.push(loop_(1, vec![]));
    // A term that reads the accumulator depends on the shares before it.
    let mut reads = base.clone();
    if let Stmt::Loop { body, .. } = &mut reads.body[1] {
        body.insert(
            0,
            let_(
                1,
                bin(BinOp::Mul, Expr::Var(0), Expr::Float(2.0), "*"),
                "let t = acc * 2.0",
            ),
        );
    }
    reads.vars.push(var("t", false));
    for k in [before, after, reads] {
        refuses_split(&k, &Config::new(&[256, 16]).split(32));
    }
}

/// `cfg`'s `split` is an error for `k`, naming what a shared loop needs.
fn refuses_split(k: &Kernel, cfg: &Config) {
    let e = lower(&plan(k), &spec_of(k, &ints(2)), cfg)
        .err()
        .unwrap_or_else(|| panic!("`split` taken by {:?}", k.body));
    assert!(e.to_string().contains("no loop to share"), "{e}");
}

/// `atomic_add(out[(ids[tn], td)], values[(tn, td)])` on f32: each thread's
/// run goes out 16 bytes a reduction (`red.global.add.v4.f32` on sm_90),
/// element by element at the ragged edge; the gathered row index stays a
/// plain load (no trip through shared memory for a vector of the tile).
#[test]
fn a_segment_sum_adds_16_bytes_a_reduction() {
    let mut k = kernel("segment_sum");
    k.tensors = vec![
        tensor("values", 2, Some(DType::BF16)),
        tensor("ids", 1, Some(DType::I64)),
        tensor("out", 2, Some(DType::F32)),
    ];
    k.scalars = vec![scalar("n"), scalar("d")];
    k.dims = vec![dim("tn", 0), dim("td", 1)];
    k.grid = vec![0, 1];
    k.body = vec![atomic(
        AtomicOp::Add,
        2,
        vec![load(1, &[0], "ids[tn]"), Expr::TileIndex(1)],
        cast(load(0, &[0, 1], "values[(tn, td)]"), Some(DType::F32)),
        "atomic_add(out[(ids[tn], td)], values[(tn, td)].cast())",
    )];
    let l = general(&k, &spec_of(&k, &ints(2)), &Config::new(&[4, 1024]));
    let body = kernel_part(&l);
    // f32 moves the most bytes: runs of 4, one reduction each.
    assert!(
        body.contains("tf_red_add_v4(tf_p + 0, tf_s[0], tf_s[1], tf_s[2], tf_s[3]);"),
        "{body}"
    );
    assert!(
        body.contains("tf_atomic_add(tf_p + tf_j, tf_s[tf_j])"),
        "{body}"
    );
    assert!(!body.contains("in the scope's layout"), "{body}");
    assert!(l.source.contains("red.global.add.v4.f32"));
}

#[test]
fn the_grids_other_tiles_share_the_budget_evenly() {
    let k = parse(
        "kernel rope(x: Tensor<bf16, 4>, c: Tensor<f32, 2>, out: Tensor<bf16, 4>; b, s, h, half) {
           for (tb, ts, th, td) in tile([b, s, h, half]) {
             out[(tb, ts, th, td)] = (x[(tb, ts, th, td)] * c[(ts, td)]).cast();
           }
         }",
    );
    // 64 columns leave 64 of the 4096 elements: four batches, positions
    // and heads, not all to the batches and positions (`[4, 16, 1, 64]`).
    let ext = [Some(4), Some(4096), Some(32), Some(64)];
    let c = tilefuse_codegen::emit::general::default_config(&k, &ext);
    assert_eq!(c.block_sizes, vec![4, 4, 4, 64]);
    // What a short dimension cannot take goes to the next.
    let ext = [Some(1), Some(4096), Some(32), Some(64)];
    let c = tilefuse_codegen::emit::general::default_config(&k, &ext);
    assert_eq!(c.block_sizes, vec![1, 8, 8, 64]);
}

#[test]
fn a_whole_tile_reduces_without_masks_into_several_partials() {
    let k = batched_softmax();
    let l = general(&k, &spec_of(&k, &ints(3)), &Config::new(&[1, 4, 1024]));
    let body = kernel_part(&l);
    // The row's tiles but the last are whole: their elements go in unmasked,
    // the last's masked; four partials a thread, combined by a tree.
    let whole = "if (tb2 + 1024 <= s2) {";
    assert_eq!(body.matches(whole).count(), 2, "{body}");
    assert!(
        body.contains("tf_a[r2 % 4] = (tf_a[r2 % 4] + v2_7[r2]);"),
        "{body}"
    );
    assert!(
        body.contains("if ((tb2 + tf_o0_2 + (r2 / 8) * 256 + (r2 % 8)) < s2) tf_a[r2 % 4] = (tf_a[r2 % 4] + v2_7[r2]);"),
        "{body}"
    );
    assert!(body.contains("tf_a[1] = (tf_a[1] + tf_a[3]);"), "{body}");
}

/// A thread with few elements along the reduced dimension keeps one
/// accumulator and its masks: a second copy of the code, or partials, cost
/// more there than they save.
#[test]
fn a_reduction_of_few_elements_a_thread_keeps_its_masks() {
    let k = jagged_sum();
    let l = general(&k, &spec_of(&k, &ints(2)), &Config::new(&[1, 128, 4]));
    let body = kernel_part(&l);
    // One row a thread along the jagged loop: the accumulation and the
    // reduction after it keep their masks, one accumulator each.
    assert!(!body.contains("<= tf_end2) {"), "{body}");
    assert!(!body.contains("tf_a["), "{body}");
    assert!(
        body.contains("if ((tb2 + tf_o0_1) < tf_end2) tf_d2[r1] = (tf_d2[r1] + "),
        "{body}"
    );
    assert!(
        body.contains("if ((tb2 + tf_o0_1) < tf_end2) tf_a = (tf_a + tf_d2[r1]);"),
        "{body}"
    );
}

/// `pow` where its result is only rounded to a 16-bit float, and where not.
#[test]
fn a_power_rounded_to_16_bits_takes_the_special_function_units() {
    let k = parse(
        "kernel powers(x: Tensor<bf16, 1>, lo: Tensor<bf16, 1>, hi: Tensor<f32, 1>, twice: Tensor<f16, 1>; n, p) {
           for ti in tile(n) {
             let v = x[ti].cast::<f32>();
             let m = pow(v.abs(), p);
             lo[ti] = select(v < 0.0, -m, m).cast();
             let w = pow(v, 1.5);
             hi[ti] = w;
             twice[ti] = (pow(pow(v, p), p) + w).cast();
             lo[ti] = pow(pow(v, p), 2.0).cast::<bf16>();
           }
         }",
    );
    let mut kinds = ints(1);
    kinds.push(ScalarKind::Float);
    let l = general(&k, &spec_of(&k, &kinds), &Config::new(&[1024]));
    let body = kernel_part(&l);
    // `m` reaches the bf16 store through `-m`, `select` and `.cast()` only.
    assert!(
        body.contains("= tf_pow_narrow(fabsf(v0_1[r0]), s1);"),
        "{body}"
    );
    // `w` is stored as f32 too; an argument of `pow`, or of `+`, is not
    // narrow, however its result is stored.
    assert!(body.contains("= powf(v0_1[r0], 1.5f);"), "{body}");
    assert!(
        body.contains("(powf(powf(v0_1[(tf_q * 8 + tf_j)], s1), s1) + v2_3["),
        "{body}"
    );
    assert!(
        body.contains("tf_round_bf16(tf_pow_narrow(powf(v0_1[(tf_q * 8 + tf_j)], s1), 2.0f))"),
        "{body}"
    );
    assert_eq!(body.matches("tf_pow_narrow(").count(), 2, "{body}");
}

#[test]
fn a_bounded_integer_casts_without_the_conversion_unit() {
    // `round` then a clamp by integers: the value can only be an integer in
    // [-127, 127], so the i8 cast reads it from the float's bits; unclamped
    // (NaN, beyond i32), the i32 cast keeps Rust's saturating conversion.
    let k = parse(
        "kernel quant(x: Tensor<f32, 1>, q: Tensor<i8, 1>, r: Tensor<i32, 1>; n) {
           for ti in tile(n) {
             let v = (x[ti] * 3.0).round();
             q[ti] = v.max(-127.0).min(127.0).cast::<i8>();
             r[ti] = v.cast::<i32>();
           }
         }",
    );
    let l = general(&k, &spec_of(&k, &ints(1)), &Config::new(&[1024]));
    let body = kernel_part(&l);
    assert_eq!(
        body.matches("tf_f2i_exact(fminf(fmaxf(").count(),
        1,
        "{body}"
    );
    assert_eq!(body.matches("tf_f2i32(").count(), 1, "{body}");
    assert!(!body.contains("tf_f2i("), "{body}");
}
