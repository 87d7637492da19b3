//! The attention form without a GPU: the example's kernel is recognised as
//! attention and lowered; configs the lowering cannot run and loops it does
//! not bound are errors that say why; a `whole` tile's block follows the
//! extent.

mod common;

use common::examples::{attention, softmax};
use tilefuse::codegen::{
    default_config, default_config_for, default_wgmma_attention, emit::AttentionShape,
    fit_whole_dims, ir::Expr, ir::Stmt, lower, Config, Param, Planned, Spec, Target,
};

/// The forward example's planned kernel and its declared spec, causal (1)
/// or not (0).
fn forward(causal: i64) -> (&'static Planned, Spec) {
    let def = attention::attention::kernel();
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![causal];
    (def.ir().unwrap(), spec)
}

/// dims: tb, th, tm, td, tn
const TM: usize = 2;
const TD: usize = 3;
const TN: usize = 4;

#[test]
fn the_example_is_attention_shaped_and_lowers() {
    let def = attention::attention::kernel();
    let ir = def.ir().unwrap();
    let Some(a) = ir.plan::<AttentionShape>() else {
        panic!("not attention: {ir:?}");
    };
    assert_eq!((a.m, a.d, a.n, a.batch.clone()), (TM, TD, TN, vec![0, 1]));
    assert!(ir.dims[TD].whole && !ir.dims[TM].whole);
    let mut spec = def.declared_spec().unwrap();
    for causal in [0, 1] {
        spec.constexprs = vec![causal];
        let l = lower(ir, &spec, &default_config(ir)).expect("default lowers");
        assert!(l.path.starts_with("attention"), "{}", l.path);
        assert_eq!(l.threads, 128);
        // q (128 rows), two k and two v tiles of 64 rows, 256 bytes each.
        assert_eq!(l.shared_bytes, (128 + 4 * 64) * 256);
        // Causal: the loop ends at the row tile's end, and a tile under the
        // diagonal runs the copy without the mask.
        assert_eq!(l.source.contains("tf_min_i(tb2 + B2, s2)"), causal == 1);
        assert_eq!(l.source.contains(">= (tb4 + 63"), causal == 1);
    }
}

/// Grouped-query attention (`k[(tb, th / group, tn, td)]`) is attention-shaped
/// too: both programs read the keys and values of the query head's group, the
/// queries and output of its own head.
#[test]
fn grouped_query_attention_takes_the_attention_lowering() {
    let def = attention::attention_gqa::kernel();
    let ir = def.ir().unwrap();
    let Some(a) = ir.plan::<AttentionShape>() else {
        panic!("not attention: {ir:?}");
    };
    assert_eq!(a.batch, vec![0, 1]);
    assert!(
        matches!(a.kv_group.as_slice(), [None, Some(Expr::Scalar(_))]),
        "{:?}",
        a.kv_group
    );
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![1];
    for cfg in [default_config(ir), default_wgmma_attention(ir).unwrap()] {
        let l = lower(ir, &spec, &cfg).unwrap();
        assert!(l.path.starts_with("attention"), "{}", l.path);
        assert!(l.source.contains("tb1 / tf_grp1"), "{}", l.source);
        if cfg.wgmma {
            assert!(l
                .source
                .contains("&tf_map_k, 0, (int)(tf_row), (int)tf_kv1, (int)tb0"));
            assert!(l
                .source
                .contains("&tf_map_q, 0, (int)(tb2), (int)tb1, (int)tb0"));
        } else {
            assert!(l
                .source
                .contains("tf_k = t1 + tb0 * t1_s0 + tf_kv1 * t1_s1;"));
            assert!(l.source.contains("tf_q = t0 + tb0 * t0_s0 + tb1 * t0_s1;"));
        }
    }
    // A query (or any other load) indexed by a group is not the form: the
    // general lowering takes it.
    let text = ir.to_string();
    let grouped_q = text.replace("q[(tb, th, tm, td)]", "q[(tb, (th / group), tm, td)]");
    assert_ne!(grouped_q, text);
    let other = Planned::new(tilefuse::codegen::ir::Kernel::parse(&grouped_q).unwrap());
    assert!(other.plan::<AttentionShape>().is_none());
}

#[test]
fn configs_the_lowering_cannot_run_say_why() {
    let (ir, spec) = forward(0);
    let err = |c: Config| lower(ir, &spec, &c).unwrap_err().to_string();
    assert!(err(Config::new(&[2, 1, 128, 128, 64]).num_warps(4)).contains("block size 1"));
    assert!(err(Config::new(&[1, 1, 128, 96, 64]).num_warps(4)).contains("power of two"));
    assert!(err(Config::new(&[1, 1, 96, 128, 64]).num_warps(4)).contains("16 or 32 rows a warp"));
    assert!(err(Config::new(&[1, 1, 128, 128, 48]).num_warps(4)).contains("key block"));
    assert!(err(Config::new(&[1, 1, 128, 256, 128]).num_warps(4)).contains("registers"));
    assert!(err(Config::new(&[1, 1, 128, 128, 64]).num_warps(2)).contains("4 or 8 warps"));
}

/// `.until(…)` on a loop outside attention: the general lowering stops the
/// loop at the bound (the row lowering does not take it).
#[test]
fn a_bound_on_another_loop_takes_the_general_lowering() {
    let def = softmax::softmax::kernel();
    let mut ir = def.ir().unwrap().kernel().clone();
    let Some(Stmt::Loop { until, .. }) =
        ir.body.iter_mut().find(|s| matches!(s, Stmt::Loop { .. }))
    else {
        panic!("softmax has a column loop");
    };
    *until = Some(Expr::Int(100));
    let ir = Planned::new(ir);
    let spec = def.declared_spec().unwrap();
    let l = lower(&ir, &spec, &default_config(&ir)).unwrap();
    assert_eq!(l.path, "general");
    assert!(
        l.source.contains("tb1 < tf_min_i(s1, 100ll)"),
        "{}",
        l.source
    );
}

#[test]
fn a_whole_tile_takes_its_extent() {
    let ir = attention::attention::kernel().ir().unwrap();
    let ext = |d: usize| [Some(8), Some(16), Some(4096), Some(d), Some(4096)];
    let fitted = |d: usize| fit_whole_dims(ir, default_config(ir), &ext(d));
    assert_eq!(fitted(80).block_sizes, vec![1, 1, 128, 128, 64]);
    assert_eq!(fitted(64).block_sizes[TD], 64);
    assert_eq!(fitted(7).block_sizes[TD], 16);
    assert_eq!(fitted(128).num_warps, 4);
    // Past 128 the default's rows go to 8 warps, so its accumulators fit.
    assert_eq!(
        (fitted(256).block_sizes[TD], fitted(256).num_warps),
        (256, 8)
    );
    // A pinned config's whole block is refitted too; its warps stay.
    let pinned = Config::new(&[1, 1, 64, 8, 32]).num_warps(4);
    let f = fit_whole_dims(ir, pinned, &ext(200));
    assert_eq!((f.block_sizes[TD], f.num_warps), (256, 4));
}

/// The Hopper program (`wgmma`): a producer warpgroup loading q, k and v by
/// 4-D TMA, consumers multiplying with `wgmma` (`p` from registers, `v`
/// transposed), the two warpgroups taking turns, each tile's `p·v` issued with
/// the next tile's `q·kᵀ`, and the cast of `p` done by the packing alone.
#[test]
fn the_hopper_program_lowers() {
    let (ir, spec) = forward(1);
    let h200 = H200;
    let c = default_config_for(ir, &spec, h200);
    assert_eq!(Some(&c), default_wgmma_attention(ir).as_ref());
    let l = lower(ir, &spec, &c).unwrap();
    assert_eq!(l.path, "attention (wgmma)");
    assert_eq!(l.threads, 384, "a producer and two consumer warpgroups");
    // q (128 rows), three stages of k and v (128 rows), 256 bytes a row; 13 barriers; alignment slack.
    assert_eq!(
        l.shared_bytes as usize,
        (128 + 6 * 128) * 256 + 8 * 13 + 1024
    );
    for needle in [
        "cp.async.bulk.tensor.4d",
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16",
        "setmaxnreg.inc.sync.aligned.u32 240",
        "bar.sync 2, 256",
        "bar.arrive 3, 256",
        "tf_exp_diff(",
    ] {
        assert!(l.source.contains(needle), "no `{needle}` in\n{}", l.source);
    }
    // The previous tile's `p·v` waits for the next `q·kᵀ`; `p` is rounded once, by the packing.
    assert!(l.source.contains("if (tf_it > 0) {"));
    assert_eq!(
        l.source.matches("tf_round_bf16(").count(),
        1,
        "the prelude's definition only"
    );
    // Without the Hopper target: the mma.sync program.
    let plain = Target {
        wgmma: false,
        ..H200
    };
    assert!(!default_config_for(ir, &spec, plain).wgmma);
}

/// `persistent` on the forward's Hopper program: one wave of blocks, each
/// walking the grid's programs (`tf_tile`), both roles decoding a tile's
/// indices and key bounds; the ring's steps counted across tiles (`tf_r0`),
/// `q`'s barrier a phase a tile, the consumers releasing `q` once every
/// `q·kᵀ` of the tile is done (before its last `p·v` and stores) and the
/// producer loading the next tile's `q` after that, the last tile's `v`
/// stage released for the next tile, and that `p·v` issued even for a tile
/// without keys (`p` zero); causal blocks taking their tiles from a counter;
/// the warpgroups' turns at the tensor cores running on across tiles. NVRTC
/// compiles it without spills at head dimension 128 (causal and not), and
/// without serializing the `wgmma`s (C7520). Elsewhere an error says where
/// it applies.
#[test]
fn the_hopper_forward_walks_its_tiles_when_persistent() {
    for causal in [0, 1] {
        let (ir, spec) = forward(causal);
        let ext = extents(ir, 128, 4096);
        let plain = fit_whole_dims(ir, default_wgmma_attention(ir).unwrap(), &ext);
        let c = plain.clone().persistent(true);
        let (l0, l) = (
            lower(ir, &spec, &plain).unwrap(),
            lower(ir, &spec, &c).unwrap(),
        );
        assert!(l.persistent && !l0.persistent);
        // q's release barrier; causal: the two words of the tiles taken.
        assert_eq!(
            l.shared_bytes,
            l0.shared_bytes + 8 + 8 * causal as u32,
            "q's release barrier"
        );
        let src = &l.source;
        if causal == 0 {
            let walk = "for (long long tf_tile = blockIdx.x; tf_tile < tf_tiles; tf_tile += gridDim.x, ++tf_tc) {";
            assert_eq!(src.matches(walk).count(), 2, "{src}");
            assert!(!l.params.contains(&Param::TileCounter));
        } else {
            // Causal: the producer takes each next tile from the counter and
            // publishes it (or the end) with `q`'s arrival; the consumers read
            // it after their wait on `q`.
            assert!(l.params.contains(&Param::TileCounter));
            let (take, end, publish, read) = (
                "tf_tile = (long long)gridDim.x + atomicInc(tf_counter, (unsigned)(tf_tiles - 1));",
                "\"r\"(0xffffffffu) : \"memory\");",
                "\"r\"((tf_u32)tf_tile) : \"memory\");",
                "if (tf_tn == 0xffffffffu) break;",
            );
            for x in [take, end, publish, read] {
                assert_eq!(src.matches(x).count(), 1, "{x} in {src}");
            }
            let at = |x: &str| src.find(x).unwrap();
            assert!(at(take) < at(end) && at(end) < at(publish), "{src}");
            assert!(
                at(publish) < at("tf_mbar_expect_tx(tf_bq, ")
                    && at("tf_mbar_spin(tf_bq, tf_tc & 1);  // the tile's q") < at(read),
                "{src}"
            );
        }
        assert_eq!(
            src.matches("long long tf_pid = (unsigned)tf_tile;").count()
                + src.matches("(int)((unsigned)tf_tile >> tf_lg)").count(),
            2,
            "{src}"
        );
        let at = |x: &str| src.find(x).unwrap_or_else(|| panic!("{x} in {src}"));
        let (q_wait, q_load) = (
            at("if (tf_tc > 0) tf_mbar_wait(tf_eq, (tf_tc - 1) & 1);"),
            at("tf_mbar_expect_tx(tf_bq, "),
        );
        assert!(q_wait < q_load, "{src}");
        assert!(src.contains("tf_mbar_init(tf_eq, 8);"), "{src}");
        assert!(src.contains("tf_mbar_spin(tf_bq, tf_tc & 1);"), "{src}");
        assert!(src.contains("const int tf_ri = tf_r0 + tf_it;"), "{src}");
        assert!(
            src.contains("const int tf_st = tf_nt > 0 ? (tf_r0 + tf_nt - 1) % 3 : 0;"),
            "{src}"
        );
        let (q_free, last_pv, v_free, stores) = (
            at("if (lane == 0) tf_mbar_arrive(tf_eq);"),
            src.rfind("tf_wgmma_pv(").unwrap(),
            at("if (lane == 0 && tf_nt > 0) tf_mbar_arrive(tf_ev + tf_st * 8);"),
            src.rfind("tf_ob[tf_col * t3_s3] = tf_f32_to_bf16(tf_ov[0]);")
                .unwrap(),
        );
        assert!(
            q_free < last_pv && last_pv < v_free && v_free < stores,
            "{src}"
        );
        assert_eq!(src.matches("tf_r0 += tf_nt;").count(), 2, "{src}");
        // The warpgroups' turns run on across tiles: the first is given once,
        // before the walk; the second gives one after every step (the last
        // tile's too), and the first takes that one after its walk.
        let consumers = at("setmaxnreg.inc");
        let (first_turn, walk, last_turn) = (
            at("if (tf_cw >= 4) asm volatile(\"bar.arrive 2, 256;\""),
            consumers + src[consumers..].find("int tf_r0 = 0, tf_tc = 0;").unwrap(),
            at("if (tf_cw < 4) asm volatile(\"bar.sync 2, 256;\" ::: \"memory\");  // the turn given after the last step"),
        );
        assert!(
            consumers < first_turn && first_turn < walk && walk < last_turn,
            "{src}"
        );
        assert!(
            !src.contains("tf_nt > 0) asm volatile(\"bar.arrive 2"),
            "{src}"
        );
        assert!(
            !src.contains("if (tf_it + 1 < tf_nt) asm volatile(\"bar.arrive 2"),
            "{src}"
        );
        assert_eq!(
            src.matches("else asm volatile(\"bar.arrive 2, 256;\"")
                .count(),
            2,
            "the fast and the masked step: {src}"
        );
        if common::nvrtc_or_skip() {
            let log =
                tilefuse::runtime::jit::resource_report("tf_attention", src, "sm_90a").unwrap();
            assert!(log.contains(" 0 bytes spill stores"), "{causal}: {log}");
            assert!(!log.contains("C7520"), "wgmma serialized: {log}");
        }
        // The last tile's `p·v` issued whether or not the tile had keys (a
        // guarded issue inside the tile loop serialized every `wgmma`).
        assert!(src.contains("tf_u32 tf_pa[8][4] = {};"), "{src}");
        assert!(
            src.contains("if (tf_nt > 0) tf_mbar_spin(tf_bv + tf_st * 8"),
            "{src}"
        );
    }
    // The default on Hopper up to 4096 keys at head dimensions up to 128
    // (64: three consumer warpgroups still), causal or not, and past 4096
    // keys at 128 without a causal order (176 keys a step); the split tail
    // from 4096 keys without a causal order; the tuner's seeds keep the
    // one-tile grid.
    use tilefuse::codegen::config::default_config_at;
    for (causal, d, s, on, split) in [
        (0, 128, 4096, true, true),
        (0, 64, 1024, true, false),
        (0, 64, 4096, true, true),
        (1, 128, 4096, true, false),
        (1, 64, 2048, true, false),
        (1, 128, 16384, false, false),
        (0, 256, 4096, false, false),
        (0, 128, 16384, true, true),
        (0, 128, 1024, true, false),
    ] {
        let (ir, spec) = forward(causal);
        let ext = extents(ir, d, s);
        let c = fit_whole_dims(ir, default_config_at(ir, &spec, H200, &ext), &ext);
        assert_eq!(c.persistent, on, "causal {causal}, d {d}, {s} keys: {c}");
        assert_eq!(c.stream_k, split, "causal {causal}, d {d}, {s} keys: {c}");
        if (causal, d, s) == (0, 128, 16384) {
            assert_eq!((c.block_sizes[4], c.num_stages), (176, 2), "{c}");
        }
        if d == 64 {
            assert_eq!((c.block_sizes[TM], c.num_warps), (192, 12), "{c}");
        }
        if on {
            let space = tilefuse::codegen::ConfigSpace::new(ir, &spec, H200).with_extents(&ext);
            let seeds = space.seeds(&spec, false);
            assert!(seeds.iter().any(|c| c.wgmma && !c.persistent), "{seeds:?}");
            assert!(seeds.iter().all(|c| c.wgmma || !c.persistent), "{seeds:?}");
        }
    }
    // Not on the backward's kernels, nor off the Hopper program.
    let (ir, spec) = forward(0);
    let portable = Config::new(&[1, 1, 128, 128, 64])
        .num_warps(4)
        .persistent(true);
    let err = lower(ir, &spec, &portable).unwrap_err().to_string();
    assert!(err.contains("set `wgmma`"), "{err}");
    let dkdv = common::examples::attention_backward::attention_dkdv::kernel();
    let err = hopper_default_error(dkdv, 0, |c| c.persistent(true));
    assert!(
        err.contains("`persistent` walks a forward attention kernel"),
        "{err}"
    );
}

/// `stream_k` on the persistent forward (the split tail, see `attention::split`
/// in codegen): the walk shares the last tiles' steps, a split tile's parts
/// meet through scratch, and the combination writes the output accumulator
/// outside any branch (written in one, ptxas serialized every `wgmma`). Where
/// the tiles' keys differ (causal) or the program is not persistent, an error
/// says what it takes.
#[test]
fn the_split_tail_walks_shared_steps_and_meets_through_scratch() {
    let (ir, spec) = forward(0);
    let cfg = Config::new(&[1, 1, 128, 128, 128])
        .num_warps(8)
        .num_stages(3)
        .wgmma(true)
        .overlap(true)
        .persistent(true)
        .stream_k(true);
    let l = lower(ir, &spec, &cfg).unwrap();
    let src = &l.source;
    // Per thread: 2 rows' m and l, and 64 accumulators; 256 consumer threads.
    assert_eq!(l.split_tiles, Some(2 * 256 * (4 + 64)), "{src}");
    for needle in [
        "float* tf_partials",
        "unsigned* tf_counters",
        "const long long tf_dp = tf_rem == 0 || tf_nt == 0 ? tf_tiles : tf_tiles - gridDim.x - tf_rem;",
        "for (int tf_it = tf_j0; tf_it < tf_j1; ++tf_it) {",
        "const int tf_ri = tf_r0 + (tf_it - tf_j0);",
        "tf_arrive_last(tf_counters + (tf_tile - tf_dp), 2u)",
        "tf_keep = __shfl_sync(0xffffffffu, tf_second, 0) != 0;",
    ] {
        assert!(src.contains(needle), "{needle}: {src}");
    }
    // The combination after the branches: `acc * a + theirs * b` on every tile.
    let (meet, combine, stores) = (
        src.find("if (tf_j1 - tf_j0 < tf_nt) {").unwrap(),
        src.find("tf_acc[tf_k] = tf_acc[tf_k] * tf_sa[tf_r] + tf_theirs[tf_k] * tf_sb[tf_r];")
            .unwrap(),
        src.find("    if (tf_keep) {\n").unwrap(),
    );
    assert!(meet < combine && combine < stores, "{src}");
    if common::nvrtc_or_skip() {
        let log = tilefuse::runtime::jit::resource_report("tf_attention", src, "sm_90a").unwrap();
        assert!(log.contains(" 0 bytes spill stores"), "{log}");
        assert!(!log.contains("C7520"), "wgmma serialized: {log}");
    }
    let (causal, spec1) = forward(1);
    let err = lower(causal, &spec1, &cfg).unwrap_err().to_string();
    assert!(err.contains("no causal order"), "{err}");
    // The backward's forward: its output and log-sum-exp stored once a split
    // tile's states are combined.
    use common::examples::attention_backward::attention_lse;
    let lse = attention_lse::kernel();
    let mut lse_spec = lse.declared_spec().unwrap();
    lse_spec.constexprs = vec![0];
    let src = lse.lower(&lse_spec, &cfg).unwrap().source;
    let (meet, keep) = (
        src.find("tf_arrive_last(tf_counters").unwrap(),
        src.find("    if (tf_keep) {\n").unwrap(),
    );
    assert!(meet < keep, "{src}");
    assert!(
        src[keep..].contains("logf("),
        "the log-sum-exp after the meet: {src}"
    );
    let err = lower(ir, &spec, &cfg.clone().persistent(false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("set `persistent` too"), "{err}");
}

#[test]
fn hopper_configs_the_lowering_cannot_run_say_why() {
    let (ir, spec) = forward(0);
    let err = |c: Config| lower(ir, &spec, &c.wgmma(true)).unwrap_err().to_string();
    let c = |bm, bd, bn, w, s| Config::new(&[1, 1, bm, bd, bn]).num_warps(w).num_stages(s);
    assert!(err(c(128, 128, 128, 4, 3)).contains("row block of 16 × num_warps"));
    assert!(err(c(128, 128, 72, 8, 3)).contains("multiple of 16"));
    assert!(err(c(128, 256, 128, 8, 2)).contains("accumulator registers"));
    // Three consumer warpgroups hold 96 accumulators a thread at most.
    assert!(err(c(192, 128, 128, 12, 2)).contains("3 consumer warpgroups"));
    assert!(err(c(256, 64, 128, 16, 2)).contains("4, 8 or 12 consumer warps"));
    assert!(err(c(128, 128, 128, 8, 5)).contains("2 to 4 stages"));
    assert!(err(c(128, 128, 128, 8, 3).cluster_m(2)).contains("leave them unset"));
    // `overlap` needs the Hopper program.
    let portable = lower(ir, &spec, &c(128, 128, 64, 4, 3).overlap(true));
    assert!(portable
        .unwrap_err()
        .to_string()
        .contains("set `wgmma` too"));
}

/// The Hopper default overlaps the softmax with the last `p·v` in a forward
/// kernel up to head dimension 128 (measured there); the backward's kernels,
/// with more products a step, and head dimensions past 128 go without.
#[test]
fn the_hopper_default_overlaps_where_it_was_measured() {
    use common::examples::attention_backward::{attention_dkdv, attention_dq};
    let forward = attention::attention::kernel().ir().unwrap();
    let c = default_wgmma_attention(forward).unwrap();
    assert!(c.overlap && c.wgmma);
    let wide = fit_whole_dims(forward, c, &[None, None, None, Some(256), None]);
    assert!(!wide.overlap, "{wide}");
    for ir in [
        attention_dq::kernel().ir().unwrap(),
        attention_dkdv::kernel().ir().unwrap(),
    ] {
        if let Some(c) = default_wgmma_attention(ir) {
            assert!(!c.overlap, "{c}");
        }
    }
}

/// `overlap`: the step's scores and the last tile's `p·v` go in two `wgmma`
/// groups, the scores first; the step waits for the scores only, runs the
/// softmax, and waits for `p·v` (releasing its `v`) before it rescales the
/// output. Other kernels refuse the option.
#[test]
fn the_hopper_program_overlaps_the_softmax_with_the_last_product() {
    let def = attention::attention::kernel();
    let ir = def.ir().unwrap();
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![0];
    let c = default_wgmma_attention(ir).unwrap().overlap(true);
    let whole = lower(ir, &spec, &c).unwrap().source;
    // The kernel, after the helpers' definitions.
    let src = &whole[whole.find("extern \"C\"").unwrap_or(0)..];
    let at = |needle: &str| {
        src.find(needle)
            .unwrap_or_else(|| panic!("no `{needle}` in\n{src}"))
    };
    let (scores, pv) = (at("tf_wgmma_qk(&tf_s"), at("tf_wgmma_pv("));
    let (one, softmax, zero) = (
        at("wait_group.sync.aligned 1;"),
        at("tf_exp_diff("),
        at("the last tile's p·v"),
    );
    assert!(
        scores < pv && pv < one && one < softmax && softmax < zero,
        "{src}"
    );
    assert!(!src[one..zero].contains("tf_mbar_arrive(tf_ev"), "{src}");
    // A row kernel refuses it.
    let def = softmax::softmax::kernel();
    let (ir, spec) = (def.ir().unwrap(), def.declared_spec().unwrap());
    let c = default_config(ir).overlap(true);
    let err = lower(ir, &spec, &c).unwrap_err().to_string();
    assert!(
        err.contains("`overlap` is an option of the Hopper attention program"),
        "{err}"
    );
}

#[test]
fn the_hopper_default_fits_large_head_dimensions() {
    let ir = attention::attention::kernel().ir().unwrap();
    let hopper = default_wgmma_attention(ir).unwrap();
    let ext = |d: usize| [Some(8), Some(16), Some(4096), Some(d), Some(4096)];
    let f = fit_whole_dims(ir, hopper.clone(), &ext(128));
    assert_eq!(
        (f.block_sizes.clone(), f.num_stages),
        (vec![1, 1, 128, 128, 128], 3)
    );
    // Up to 64: three consumer warpgroups, 192 rows, two stages.
    let f = fit_whole_dims(ir, hopper.clone(), &ext(64));
    assert_eq!(
        (f.block_sizes.clone(), f.num_warps, f.num_stages, f.overlap),
        (vec![1, 1, 192, 64, 128], 12, 2, true)
    );
    let mut spec = attention::attention::kernel().declared_spec().unwrap();
    for causal in [0, 1] {
        spec.constexprs = vec![causal];
        let src = lower(ir, &spec, &f).unwrap().source;
        assert!(
            src.contains("setmaxnreg.inc.sync.aligned.u32 160;"),
            "{src}"
        );
        // The warpgroups take turns in order: 0 gives 1 its turn, 1 gives 2, 2 gives 0.
        for turn in ["bar.sync 4, 256", "bar.arrive 4, 256", "bar.arrive 2, 256"] {
            assert!(src.contains(turn), "{turn}");
        }
    }
    // Past 128: 64 keys a step and two stages, so registers and shared memory hold.
    let f = fit_whole_dims(ir, hopper, &ext(200));
    assert_eq!(
        (f.block_sizes.clone(), f.num_stages),
        (vec![1, 1, 128, 256, 64], 2)
    );
    spec.constexprs = vec![0];
    let l = lower(ir, &spec, &f).unwrap();
    assert!(l.shared_bytes as usize <= 227 * 1024, "{}", l.shared_bytes);
}

/// A key loop that reads the output accumulator between the two products of
/// successive tiles keeps each tile's `p·v` in its own tile (no deferral, no
/// turn-taking), and releases the stage after both.
#[test]
fn the_hopper_program_keeps_p_v_in_its_tile_when_the_loop_reads_the_accumulator() {
    let def = attention::attention::kernel();
    let Some(a) = def.ir().unwrap().plan::<AttentionShape>().cloned() else {
        panic!("attention-shaped");
    };
    let mut ir = def.ir().unwrap().kernel().clone();
    let Some(Stmt::Loop { body, .. }) = ir.body.get_mut(a.kv_loop) else {
        panic!("the key loop");
    };
    body.push(Stmt::Assign {
        var: a.acc,
        value: Expr::Var(a.acc),
        at: "acc = acc".into(),
    });
    let ir = Planned::new(ir);
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![1];
    let l = lower(&ir, &spec, &default_wgmma_attention(&ir).unwrap()).unwrap();
    assert!(l.source.contains("both products read the stage"));
    assert!(!l.source.contains("bar.sync 2, 256") && !l.source.contains("if (tf_it > 0) {"));
    // It compiles for sm_90a, without spills (where NVRTC is present).
    if common::nvrtc_or_skip() {
        let log = tilefuse::jit::resource_report(def.name(), &l.source, "sm_90a")
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(log.contains(" 0 bytes spill stores"), "{log}");
    }
}

/// Programs whose key loop grows with their row tile (causal attention, dQ)
/// take the longest row tiles first, in groups of slices; causal dK/dV (its
/// loop starts at the row tile) the first row tiles first; programs of one
/// length (not causal) the last row tiles first, as before.
#[test]
fn causal_programs_take_their_longest_row_tiles_first() {
    use common::examples::attention_backward::{attention_dkdv, attention_dq};
    let longest = "longest first across groups of slices";
    for causal in [0, 1] {
        let (ir, spec) = forward(causal);
        for c in [default_config(ir), default_wgmma_attention(ir).unwrap()] {
            let src = lower(ir, &spec, &c).unwrap().source;
            assert_eq!(src.contains(longest), causal == 1, "{c}");
            assert_eq!(
                src.contains("(tf_mt - 1 - tf_u % tf_mt) * B2"),
                causal == 1,
                "{c}"
            );
        }
    }
    for (def, grouped, rank) in [
        (
            attention_dq::kernel(),
            true,
            "(tf_mt - 1 - tf_u % tf_mt) * B2",
        ),
        (attention_dkdv::kernel(), false, "(tf_pid % tf_mt) * B2"),
    ] {
        let ir = def.ir().unwrap();
        let mut spec = def.declared_spec().unwrap();
        spec.constexprs = vec![1];
        let src = lower(ir, &spec, &default_config(ir)).unwrap().source;
        assert_eq!(src.contains(longest), grouped, "{}", def.name());
        assert!(src.contains(rank), "{}", def.name());
    }
}

/// The order above, as the generated code computes it: every program index
/// takes one (slice, row tile) and every pair is taken; within a group the
/// row tiles go in rank order, and a group holds `2^lg` slices (a power of two
/// dividing their number, at most 8).
#[test]
fn the_longest_first_order_takes_every_program_once() {
    for (slices, mt, fit) in [
        (128i64, 32i64, 8i64),
        (3, 5, 8),
        (12, 4, 8),
        (7, 1, 2),
        (1, 9, 1),
        (64, 3, 2),
    ] {
        let lg = 3.min(slices.trailing_zeros()).min(63 - fit.leading_zeros());
        let mut seen = vec![false; (slices * mt) as usize];
        let mut last_rank = vec![-1i64; slices as usize];
        for pid in 0..slices * mt {
            let u = pid >> lg;
            let (rank, slice) = (u % mt, ((u / mt) << lg) | (pid & ((1 << lg) - 1)));
            assert!(rank < mt && slice < slices, "{pid}: {rank} {slice}");
            assert!(rank > last_rank[slice as usize], "{pid}: ranks in order");
            last_rank[slice as usize] = rank;
            let i = (slice * mt + rank) as usize;
            assert!(!seen[i], "{slices} {mt}: ({slice}, {rank}) twice");
            seen[i] = true;
        }
        assert!(seen.iter().all(|&x| x));
    }
}

/// The scores `x = q·kᵀ * scale` stay unscaled (FlashAttention-3's softmax):
/// the row max is taken over them and scaled once (where the scale is
/// positive and finite; else over the scaled values), and `exp(x - m)` takes
/// the scale in its FMA, on both programs and in the backward's products.
/// A causal kernel's tiles off the diagonal too; a kernel that reassigns the
/// scores multiplies them as written.
#[test]
fn the_scores_scale_folds_into_the_max_and_the_exponent() {
    use common::examples::attention_backward::attention_dq;
    let folded = "tf_exp_diff_scaled(tf_s[tf_mi][tf_j][tf_h * 2 + tf_e]";
    let guard = "> 0.0f && ";
    for causal in [0, 1] {
        let (ir, spec) = forward(causal);
        for c in [default_config(ir), default_wgmma_attention(ir).unwrap()] {
            let src = lower(ir, &spec, &c).unwrap().source;
            assert!(src.contains(folded) && src.contains(guard), "{c}\n{src}");
        }
    }
    let def = attention_dq::kernel();
    let ir = def.ir().unwrap();
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![0];
    let src = lower(ir, &spec, &default_config(ir)).unwrap().source;
    assert!(src.contains(folded), "{src}");
    // `let mut x` and `x = x` in the key loop: reassigned, so computed as written.
    let (planned, spec) = forward(0);
    let a = planned.plan::<AttentionShape>().cloned().unwrap();
    let mut k = planned.kernel().clone();
    let Some(Stmt::Loop { body, .. }) = k.body.get_mut(a.kv_loop) else {
        panic!("the key loop");
    };
    let Stmt::Let { var, .. } = body[a.scores].clone() else {
        panic!("the scores' let");
    };
    k.vars[var].mutable = true;
    body.insert(
        a.scores + 1,
        Stmt::Assign {
            var,
            value: Expr::Var(var),
            at: "x = x".into(),
        },
    );
    let ir = Planned::new(k);
    let src = lower(&ir, &spec, &default_wgmma_attention(&ir).unwrap())
        .unwrap()
        .source;
    // The kernel's own code: the prelude's helpers compare with 0 too.
    let body = &src[src.find("extern \"C\"").expect("a kernel")..];
    assert!(!body.contains(folded) && !body.contains(guard), "{body}");
}

/// The causal mask `tm.index() >= tn.index()` and the keys' extent in a
/// masked step compare in-block offsets in 32 bits against the tiles' starts'
/// difference on the Hopper program (two 64-bit adds and compares an element
/// before: 32×16×1024 causal 0.329 -> 0.318 ms on an H200). The portable
/// program keeps the whole indices: at head dimension 128 its dK/dV kernel
/// holds 254 registers, and spilled with the 32-bit forms.
#[test]
fn the_hopper_masked_step_compares_in_32_bits() {
    let (ir, spec) = forward(1);
    let mask = format!(
        "(int)(tf_wr + tf_mi * 16 + tf_h * 8 + tf_g) - (int)(tf_j * 8 + 2 * tf_t + tf_e) >= tf_sat30(tb{TN} - tb{TM})"
    );
    let keys = format!("((int)(tf_j * 8 + 2 * tf_t + tf_e) < tf_sat30((s{TN}) - tb{TN}))");
    let wide = format!("(long long)((tb{TM} + tf_wr");
    for (c, hopper) in [
        (default_wgmma_attention(ir).unwrap(), true),
        (default_config(ir), false),
    ] {
        let src = lower(ir, &spec, &c).unwrap().source;
        let body = &src[src.find("extern \"C\"").expect("a kernel")..];
        assert_eq!(body.contains(&mask), hopper, "{c}\n{body}");
        assert_eq!(body.contains(&keys), hopper, "{c}\n{body}");
        assert_eq!(body.contains(&wide), !hopper, "{c}\n{body}");
    }
}

/// Attention's dK/dV kernel planned by the general lowering
/// ([`Planned::general`]), for the general lowering's tests.
fn dkdv_on_the_general_lowering() -> Planned {
    use common::examples::attention_backward::attention_dkdv;
    let k = Planned::general(attention_dkdv::kernel().ir().unwrap().kernel().clone());
    assert_eq!(k.lowering(), "general");
    k
}

/// Attention's dK/dV on the general lowering (see
/// [`dkdv_on_the_general_lowering`]). Its `addmm`s run
/// on the tensor cores, and the loop's layout spreads the threads over both
/// the grid's tile (the keys of dK/dV's accumulators) and the loop's
/// queries, the head dimension keeping its 16-byte runs: at 32×64 tiles with
/// 4 warps a thread holds 32 values of dK and of dV and 128 of each of the
/// loop's `q` and `dO` tiles (16 and 256 with every thread on the keys, 256
/// and 16 with every thread on the queries), and the kernel spills 1.1 KB
/// instead of 2.4 (ptxas, sm_90a).
#[test]
fn attention_backward_spreads_its_threads_over_the_accumulators() {
    use common::examples::attention_backward::attention_dkdv;
    let k = dkdv_on_the_general_lowering();
    let mut spec = attention_dkdv::kernel().declared_spec().unwrap();
    spec.constexprs = vec![0];
    // dims: tb, th, tn, td, g (the group's query heads), tm
    let cfg = Config::new(&[1, 1, 32, 64, 1, 32]).num_warps(4);
    let l = lower(&k, &spec, &cfg).unwrap();
    assert_eq!(l.path, "general");
    assert_eq!(l.source.matches("tf_mma_bf16(tf_c0").count(), 4);
    let layout = l
        .source
        .lines()
        .find(|s| s.contains("// layout 0:"))
        .expect("the loop's layout");
    assert!(
        layout.contains("tn: block 32 = 1 x 2 lanes x 4 warps")
            && layout.contains("tm: block 32 = 1 x 2 lanes x 1 warps")
            && layout.contains("td: block 64 = 8 x 8 lanes x 1 warps"),
        "{layout}"
    );
}

/// The untuned defaults of the general lowering's kernels that multiply
/// tiles: the products' rows, columns and contracted tiles at 32 (the tensor
/// cores' pieces), one head a program, 8 warps. (The memory-bound default
/// gave attention's backward `[4, 8, 8, 128, 1]`: single-key products off the
/// tensor cores, 32 heads a program.)
#[test]
fn kernels_that_multiply_default_to_tensor_core_tiles() {
    use common::examples::attention_backward::attention_dkdv;
    use tilefuse::codegen::config::default_config_at;
    use tilefuse::codegen::{fit_default, fit_whole_dims};
    let hopper = H200;
    // dims: tb, th, tn, td, g, tm (dK/dV).
    let cases = [
        (
            attention_dkdv::kernel(),
            DKDV_4X16X2048X128.to_vec(),
            vec![1, 1, 32, 128, 1, 32],
        ),
        // Short sequences: the tiles shrink to the extent, not below 16.
        (
            attention_dkdv::kernel(),
            vec![Some(1), Some(2), Some(10), Some(40), Some(1), Some(10)],
            vec![1, 1, 16, 64, 1, 16],
        ),
    ];
    let k = &dkdv_on_the_general_lowering();
    for (def, ext, want) in cases {
        let mut spec = def.declared_spec().unwrap();
        spec.constexprs = vec![1];
        let c = default_config_at(k, &spec, hopper, &ext);
        let c = fit_whole_dims(k, fit_default(k, c, &ext), &ext);
        assert_eq!(c.block_sizes, want, "{}: {c}", def.name());
        assert_eq!(c.num_warps, 8, "{}: {c}", def.name());
        let l = lower(k, &spec, &c).unwrap();
        assert_eq!(l.path, "general");
        assert!(
            l.source.contains("tf_mma_bf16("),
            "{}: products off the tensor cores at {c}",
            def.name()
        );
    }
}

/// The backward's forward (`attention_lse`) reads a grouped head's keys
/// (`th / group`) and stays on the attention lowering, portable and Hopper.
#[test]
fn the_backwards_grouped_forward_keeps_the_attention_lowering() {
    use common::examples::attention_backward::attention_lse;
    let def = attention_lse::kernel();
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![1];
    let portable = def.lower(&spec, &def.config().unwrap()).unwrap();
    assert!(portable.path.starts_with("attention"), "{}", portable.path);
    let hopper = default_wgmma_attention(def.ir().unwrap()).expect("a Hopper config");
    assert_eq!(def.lower(&spec, &hopper).unwrap().path, "attention (wgmma)");
}

/// The tuner's space for a kernel that multiplies tiles: the products' tiles
/// from 16 to 64 only (smaller ones leave the tensor cores, larger ones
/// spill), no axis for the head's tile (one index a program), 4 or 8 warps;
/// its seeds stay on the tensor cores and lower.
#[test]
fn the_products_tuning_space_stays_on_the_tensor_cores() {
    use common::examples::attention_backward::attention_dkdv;
    use tilefuse::codegen::{Axis, ConfigSpace};
    let def = attention_dkdv::kernel();
    let k = dkdv_on_the_general_lowering();
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![0];
    let h200 = H200;
    // dims: tb, th, tn, td, g, tm
    let space = ConfigSpace::new(&k, &spec, h200).with_extents(&[
        Some(4),
        Some(16),
        Some(2048),
        Some(64),
        Some(1),
        Some(2048),
    ]);
    let blocks: Vec<(usize, Vec<usize>)> = space
        .axes()
        .iter()
        .filter_map(|a| match a {
            Axis::Block { dim, values } => Some((*dim, values.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        blocks,
        vec![(2, vec![16, 32, 64]), (5, vec![16, 32, 64])],
        "{:?}",
        space.axes()
    );
    assert!(space.axes().contains(&Axis::Warps(vec![4, 8])));
    let seeds = space.seeds(&spec, true);
    assert!(seeds.len() >= 3, "{seeds:?}");
    for c in &seeds {
        let l = lower(&k, &spec, c).unwrap();
        assert!(
            l.source.contains("tf_mma_bf16("),
            "{c}: off the tensor cores"
        );
    }
}

/// Packed sequences (`attention_varlen`: `[total, H, D]` operands, a program's
/// rows a loop of one tile from `cu_seqlens[b] + tq.begin()`) take the
/// attention lowering: rows along the operands' first axis, TMA boxes of one
/// head's rows, a program past its sequence's end stopping at once, keys from
/// the sequence's start, stores masked at the rows' end; the row loop's block
/// follows the grid tile's, and one smaller than it is an error that says so.
#[test]
fn packed_sequences_take_the_attention_lowering() {
    use tilefuse::codegen::Param;
    let def = attention::attention_varlen::kernel();
    let ir = def.ir().unwrap();
    // dims: b, th, tq, td, tm, tn.
    let Some(a) = ir.plan::<AttentionShape>() else {
        panic!("not attention: {}", ir.kernel());
    };
    assert_eq!((a.m, a.n, a.d, a.row_axis), (4, 5, 3, 0));
    assert_eq!(a.batch, vec![1]);
    assert_eq!(a.packed.as_ref().map(|p| p.rows), Some(2));
    assert_eq!((a.row_tile(), a.programs(ir)), (2, vec![0, 1]));
    let ext = [Some(8), Some(16), Some(4096), Some(128), None, None];
    let fitted = fit_whole_dims(ir, default_config(ir), &ext);
    assert_eq!(fitted.block_sizes, vec![1, 1, 128, 128, 128, 64]);
    // A pinned config's row loop follows its grid tile.
    let pinned = Config::new(&[1, 1, 64, 64, 16, 64]).num_warps(4);
    assert_eq!(fit_whole_dims(ir, pinned, &ext).block_sizes[4], 64);
    let mut spec = def.declared_spec().unwrap();
    for causal in [0, 1] {
        spec.constexprs = vec![causal];
        for cfg in [fitted.clone(), default_wgmma_attention(ir).unwrap()] {
            let l = lower(ir, &spec, &cfg).unwrap_or_else(|e| panic!("{cfg}: {e}"));
            assert!(l.path.starts_with("attention"), "{}", l.path);
            let src = &l.source;
            assert!(src.contains("const long long tb4 = (v0 + tb2);"), "{src}");
            assert!(src.contains("if (tb4 >= tf_end4) return;"), "{src}");
            assert!(src.contains("const long long tf_beg5 = v0;"), "{src}");
            // The stores by rows, on both programs: a row's mask stops at the
            // packed rows' end.
            assert!(
                src.contains(") >= 0 && ((tb4 + tf_wr + tf_mi * 16 + tf_h * 8 + tf_g)) < tf_end4;")
                    && src.contains("unsigned short* tf_ob = t4 + tf_ou + ((tb4 + tf_wr"),
                "stores stop at the rows' end\n{src}"
            );
            // A thread's two neighbouring bf16 columns in one store where they can be.
            assert!(
                src.contains(
                    "*(unsigned int*)(tf_ob + tf_col) = tf_pack_bf16x2(tf_ov[0], tf_ov[1]);"
                ),
                "{src}"
            );
            assert_eq!(src.contains("tf_min_i(tb4 + B4, tf_end4)"), causal == 1);
            if cfg.wgmma {
                assert!(src.contains("&tf_map_q, 0, (int)tb1, (int)(tb4), tf_bq);"));
                assert!(src.contains("&tf_map_k, 0, (int)tb1, (int)(tf_row),"));
                assert!(l.params.iter().any(|p| matches!(
                    p,
                    Param::TensorMap {
                        tensor: 1,
                        box_outer: 128,
                        rows_axis: Some(0),
                        ..
                    }
                )));
            } else {
                assert!(src.contains("tf_q = t1 + tb1 * t1_s1;"), "{src}");
                assert!(src.contains("tf_q_rs = t1_s0"), "{src}");
            }
        }
    }
    let err = lower(
        ir,
        &spec,
        &Config::new(&[1, 1, 128, 128, 64, 64]).num_warps(4),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("row loop `tm`") && err.contains("same block"),
        "{err}"
    );
    // Rows over the whole sequence (not one block of it): the general lowering.
    let text = ir.to_string();
    let whole = text.replace("tile((begin + tq.begin())..", "tile(begin..");
    assert_ne!(whole, text);
    let other = Planned::new(tilefuse::codegen::ir::Kernel::parse(&whole).unwrap());
    assert_eq!(other.lowering(), "general");
}

/// The backward's dQ kernel (`S = Q·Kᵀ` and `dP = dO·Vᵀ` a key step, then
/// `dQ += dS·K`) takes the attention lowering: `dO` a second row operand
/// beside `q` in shared memory, `k` and `v` streamed (their loads waited for
/// where first read), 16 rows a warp by default so both scores fit beside the
/// accumulator (the default off Hopper; there the Hopper program's: see
/// `the_hopper_program_runs_the_backwards_kernels`).
#[test]
fn the_backwards_dq_takes_the_attention_lowering() {
    use common::examples::attention_backward::attention_dq;
    use tilefuse::codegen::config::default_config_at;
    let def = attention_dq::kernel();
    let ir = def.ir().unwrap();
    let (a, names) = planned_attention(ir);
    assert_eq!(names(vec![a.q, a.k, a.v]), ["q", "k", "k"]);
    assert_eq!(a.more_scores.len(), 1);
    let more = &a.more_scores[0];
    assert_eq!(names(vec![more.rows, more.keys]), ["dout", "v"]);
    assert_eq!(names(a.row_operands()), ["q", "dout"]);
    assert_eq!(names(a.key_operands()), ["k", "v"]);
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![1];
    let ext = [Some(4), Some(16), Some(2048), Some(128), Some(2048)];
    let c = fit_whole_dims(ir, default_config_at(ir, &spec, NO_WGMMA, &ext), &ext);
    assert_eq!(
        (c.block_sizes.clone(), c.num_warps, c.wgmma),
        (vec![1, 1, 64, 128, 64], 4, false)
    );
    let l = lower(ir, &spec, &c).unwrap();
    assert_eq!(l.path, "attention (mma.sync, flash)");
    // q and dO (64 rows), two buffers of k and of v (64 keys), 256 bytes a row.
    assert_eq!(l.shared_bytes, (2 * 64 + 4 * 64) * 256);
    let src = &l.source;
    assert!(
        src.contains("tf_att_load<64>(tf_sr1, tf_r1, tf_r1_rs, tb2,"),
        "{src}"
    );
    assert!(
        src.contains("tf_cp_async_wait<2>();  // this tile's `v`"),
        "{src}"
    );
    assert!(src.contains("(tf_ra1 + tf_mi * "), "dO·Vᵀ reads dO");
    assert!(
        src.contains("tf_ldmatrix_x4_trans(tf_bf, (tf_kb + tf_vl"),
        "dS·K reads k"
    );
}

/// The Hopper program runs the backward's kernels (more products a step, a
/// loop over a group's query heads around dK/dV's key loop): both row
/// operands' tiles by TMA on one barrier, each key operand in its own ring;
/// each product a `wgmma` group, the two score-like ones issued first (the
/// second from `dO` and `v`), a wait where each result is first read and
/// none between the two updates; `lse` and `delta` of the step's queries
/// staged in shared memory once a warpgroup; the scores' first `wgmma`
/// overwriting instead of zeroed accumulators. Its default, the untuned one
/// on Hopper at head dimensions 64 and 128 (those checked on an H200; others
/// keep `mma.sync`): 128 rows, 64 keys a step, three stages; NVRTC compiles
/// it without spills.
#[test]
fn the_hopper_program_runs_the_backwards_kernels() {
    use common::examples::attention_backward::{attention_dkdv, attention_dq};
    use tilefuse::codegen::config::default_config_at;
    for (def, queries) in [(attention_dq::kernel(), 64), (attention_dkdv::kernel(), 64)] {
        let ir = def.ir().unwrap();
        let mut spec = def.declared_spec().unwrap();
        spec.constexprs = vec![1];
        let ext = extents(ir, 128, 2048);
        let plain = fit_whole_dims(ir, default_config_at(ir, &spec, H200, &ext), &ext);
        let c = fit_whole_dims(ir, default_wgmma_attention(ir).unwrap(), &ext);
        assert_eq!(plain, c, "{}: the Hopper program by default", def.name());
        let unchecked = extents(ir, 96, 2048);
        let other = default_config_at(ir, &spec, H200, &unchecked);
        assert!(
            !other.wgmma,
            "{} at head dimension 96 keeps mma.sync: {other}",
            def.name()
        );
        let (a, _) = planned_attention(ir);
        assert_eq!(
            (
                c.block_sizes[a.m],
                c.block_sizes[a.n],
                c.num_warps,
                c.num_stages
            ),
            (128, queries, 8, 3),
            "{}",
            def.name()
        );
        let err = lower(ir, &spec, &c.clone().overlap(true))
            .unwrap_err()
            .to_string();
        assert!(err.contains("drop `overlap`"), "{err}");
        let l = lower(ir, &spec, &c).unwrap();
        assert_eq!(l.path, "attention (wgmma)");
        let src = &l.source;
        let at = |x: &str| src.find(x).unwrap_or_else(|| panic!("{x} in {src}"));
        // Both row operands on q's barrier, two rings.
        assert!(src.contains("tf_mbar_expect_tx(tf_bq, 65536u);"), "{src}");
        assert!(src.contains("&tf_map_r1, 64,"), "{src}");
        assert!(
            src.contains("tf_mbar_spin(tf_bv + tf_st * 8, tf_ph);"),
            "{src}"
        );
        // S and dP issued first, dP from the second row operand's tile.
        let (s, dp) = (at("tf_wgmma_sd(&tf_s[0]"), at("tf_wgmma_sd(&tf_s1[0]"));
        assert!(s < dp, "S before dP");
        // The row tiles' address opaque in each step (else their descriptors
        // stay in registers across the loop).
        assert!(src.contains("tf_wgmma_desc(tf_qwo + 32768u + "), "{src}");
        assert!(src.contains(": \"=r\"(tf_qwo) : \"r\"(tf_qw));"), "{src}");
        assert!(src.contains("1024u), tf_ks);"), "the first step overwrites");
        assert!(
            !src.contains("tf_s1[tf_mi][tf_j][tf_h * 2 + tf_e] = 0.0f"),
            "no zeroing"
        );
        let first_wait = at("wgmma.wait_group.sync.aligned 1;");
        assert!(dp < first_wait, "dP is in flight while S's result is read");
        // Column vectors: dK/dV's lse and delta, staged.
        if def.name() == "attention_dkdv" {
            assert!(
                src.contains("float (*const tf_cv)[2][2][64] = reinterpret_cast<float (*)[2][2][64]>(tf_smem + (tf_scv - tf_smem_u32(tf_smem)));"),
                "{src}"
            );
            assert!(src.contains("tf_cv[tf_cw >> 2][tf_it & 1][0][tf_j * 8 + 2 * tf_t + tf_e]"));
            // Loaded a step ahead into registers, staged at the step: the
            // first step's before the loop, the next step's after the
            // staging's barrier, each only where that step is one.
            let (first, staged, next) = (
                at("if (0 < tf_steps) {"),
                at("tf_cvw[0][tf_c] = tf_cvn[tf_r][0];"),
                at("if (tf_itn < tf_steps) {"),
            );
            let consumers_loop = src.rfind("for (int tf_it = 0;").unwrap();
            assert!(first < consumers_loop && consumers_loop < staged, "{src}");
            assert!(staged < next, "{src}");
            assert!(src[next..].contains("tf_cvn[tf_r][1] = "), "{src}");
            // In the dynamic shared memory, counted: the row tiles, the
            // rings, then the column vectors (2 warpgroups × 2 steps × 2
            // vectors × 64 keys of f32), then the barriers.
            assert!(!src.contains("__shared__ float"), "no static buffers");
            let (rows, rings, cv) = (2 * 128 * 128 * 2, 2 * 3 * 64 * 128 * 2, 2 * 2 * 2 * 64 * 4);
            assert!(
                src.contains(&format!(
                    "tf_scv = tf_sv + {}u, tf_bq = tf_scv + {cv}u",
                    3 * 64 * 128 * 2
                )),
                "{src}"
            );
            assert!(
                l.shared_bytes as usize >= rows + rings + cv,
                "{}",
                l.shared_bytes
            );
            // The group's query heads: one sequence of steps, the key operands'
            // head computed at each.
            assert!(src.contains("tf_it < tf_steps;"), "{src}");
            assert!(src.contains("const long long tf_kv1 = "), "{src}");
        }
        if common::nvrtc_or_skip() {
            let log = tilefuse::runtime::jit::resource_report(def.name(), src, "sm_90a").unwrap();
            assert!(
                log.contains(" 0 bytes spill stores"),
                "{}: {log}",
                def.name()
            );
            assert!(
                !log.contains("C7517"),
                "{}: a wait ptxas added: {log}",
                def.name()
            );
        }
    }
}

/// The one-pass backward (`attention_dkdvdq`: dK/dV's kernel adding each
/// step's `dS·K` into dQ's f32 accumulator) takes the attention lowering, the
/// atomic its atomic product (`k` a row operand); the `mma.sync` program
/// refuses it and says what to set, the untuned default off Hopper (and at
/// head dimensions not checked there) is the general lowering's (asked
/// for), and the Hopper program runs it, by default on Hopper: `dS` stored into
/// shared memory from dK's packed operand, after a barrier of both
/// warpgroups each multiplies 64 of the head dimension's columns over the
/// block's 128 keys (`wgmma` with both operands MN-major), then adds them,
/// two columns a vector reduction. NVRTC compiles it without spills at head
/// dimension 64 (16 bytes at 128, causal); the tuner's seeds reach it.
#[test]
fn the_one_pass_backward_adds_dq_atomically_on_the_hopper_program() {
    use common::examples::attention_backward::attention_dkdvdq;
    use tilefuse::codegen::config::default_config_at;
    let def = attention_dkdvdq::kernel();
    let ir = def.ir().unwrap();
    let (a, names) = planned_attention(ir);
    assert_eq!(a.atomics.len(), 1);
    assert_eq!(
        names(vec![a.atomics[0].tensor, a.atomics[0].rows]),
        ["dq_acc", "k"]
    );
    assert_eq!(names(a.row_operands()), ["k", "v"]);
    assert!(!a.is_forward());
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![1];
    for d in [64usize, 128] {
        let ext = extents(ir, d, 2048);
        // By default dQ is added by the TMA unit, in the stages that fit
        // beside its staging (two at 128); the threads' adds below.
        let hopper = default_config_at(ir, &spec, H200, &ext);
        let stages = if d == 128 { 2 } else { 3 };
        let by_tma = default_wgmma_attention(ir)
            .unwrap()
            .tma_store(true)
            .num_stages(stages);
        assert_eq!(hopper, by_tma, "{d}");
        let plain = default_config_at(ir, &spec, NO_WGMMA, &ext);
        assert!(plain.general && !plain.wgmma, "{plain}");
        let err = lower(ir, &spec, &plain.clone().general(false))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("atomically") && err.contains("set `wgmma`"),
            "{err}"
        );
        let c = fit_whole_dims(ir, default_wgmma_attention(ir).unwrap(), &ext);
        assert_eq!(
            c.block_sizes[a.n], 64,
            "the atomic product's rows: 64 keys a step"
        );
        let l = lower(ir, &spec, &c).unwrap();
        assert_eq!(l.path, "attention (wgmma)");
        let src = &l.source;
        assert!(
            src.contains("\"r\"(tf_pa0[tf_j >> 1][((tf_j & 1) << 1) + tf_h])"),
            "{src}"
        );
        assert!(src.contains("fence.proxy.async.shared::cta;"), "{src}");
        // Neighbouring columns in one vector reduction where they can be.
        assert!(src.contains("red.global.add.v2.f32"), "{src}");
        assert!(src.contains("if (tf_in1) atomicAdd(t"), "{src}");
        // The product's wgmma: A and B both MN-major.
        assert!(src.contains(", p, 1, 1, 1, 1; }"), "{src}");
        if d == 128 {
            assert!(src.contains("bar.sync 4, 256;"), "both warpgroups' dS");
            assert!(src.contains("float tf_dq[32];"), "64 columns a warpgroup");
            assert!(
                src.contains("const long long tf_qc = (tf_cw >> 2) * 64 + "),
                "{src}"
            );
        } else {
            assert!(
                src.contains("\"r\"(4 + (tf_cw >> 2))"),
                "a warpgroup's own dS"
            );
            assert!(src.contains("float tf_dq[32];"), "64 columns, its own keys");
        }
        if common::nvrtc_or_skip() {
            // 32 bytes at head dimension 128 with the causal mask (12
            // before the column vectors were loaded a step ahead; the
            // default, dQ by the TMA unit, spills none).
            let log = tilefuse::runtime::jit::resource_report(def.name(), src, "sm_90a").unwrap();
            let most = if d == 128 { 32 } else { 0 };
            let spilled = tilefuse_testkit::kernel_spill_stores(&log)
                .unwrap_or_else(|| panic!("no report in {log}"));
            assert!(spilled <= most, "{d}: {log}");
        }
    }
    let at_96 = extents(ir, 96, 2048);
    let other = default_config_at(ir, &spec, H200, &at_96);
    assert!(other.general && !other.wgmma, "head dimension 96: {other}");
    // The tuner's seeds reach the Hopper program (not the general default's
    // flag), with dQ added by the TMA unit and by the threads, at a launch's
    // extents as the tuner makes its space.
    let space =
        tilefuse::codegen::ConfigSpace::new(ir, &spec, H200).with_extents(&extents(ir, 128, 2048));
    let hopper: Vec<Config> = space
        .seeds(&spec, false)
        .into_iter()
        .filter(|c| c.wgmma && !c.general)
        .collect();
    for tma in [true, false] {
        assert!(
            hopper.iter().any(|c| c.tma_store == tma
                && lower(ir, &spec, c).is_ok_and(|l| l.path == "attention (wgmma)")),
            "tma_store {tma}: {hopper:?}"
        );
    }
    // `tma_store` only where it applies: not on the `mma.sync` program's seeds.
    assert!(space
        .seeds(&spec, false)
        .iter()
        .all(|c| c.wgmma || !c.tma_store));
}

/// `tma_store` on the one pass's Hopper program: each step's dQ staged in
/// shared memory (a warpgroup's 64 rows by its columns, f32 boxes of 32
/// columns swizzled as the TMA unit reads them) and added by the TMA unit
/// (`cp.reduce.async.bulk.tensor … .add`, a descriptor of `dq_acc` with the
/// step's rows along its sequence axis), after the last step's adds read the
/// staging, and all of them done before the block leaves; the staging is
/// counted in the shared memory (three stages at head dimension 128 then
/// pass the H200's 227 KB: two fit). NVRTC compiles it without spills.
/// Without an atomic product, or without `wgmma`, `tma_store` is an error
/// that says so.
#[test]
fn the_one_pass_can_add_dq_by_tma() {
    use common::examples::attention_backward::{attention_dkdvdq, attention_dq};
    use tilefuse::codegen::Param;
    let def = attention_dkdvdq::kernel();
    let ir = def.ir().unwrap();
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![1];
    for (d, stages) in [(128usize, 2), (64, 3)] {
        let ext = extents(ir, d, 2048);
        let plain =
            fit_whole_dims(ir, default_wgmma_attention(ir).unwrap(), &ext).num_stages(stages);
        let c = plain.clone().tma_store(true);
        let (l0, l) = (
            lower(ir, &spec, &plain).unwrap(),
            lower(ir, &spec, &c).unwrap(),
        );
        assert_eq!(l.path, "attention (wgmma)");
        let staging = 2 * 64 * 64 * 4; // 2 warpgroups × 64 rows × 64 columns of f32
        assert_eq!(l.shared_bytes, l0.shared_bytes + staging, "{d}");
        assert!(
            l.shared_bytes as usize <= H200.shared_limit,
            "{d}: {}",
            l.shared_bytes
        );
        let src = &l.source;
        for piece in [
            "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group",
            "const __grid_constant__ tf_tmap tf_map_add",
            "if (tf_lead) asm volatile(\"cp.async.bulk.wait_group.read 0;\"",
            "st.shared.v2.f32",
            "tf_tma_add_4d(&tf_map_add, tf_dqb + tf_box * 8192u, ",
            "asm volatile(\"cp.async.bulk.wait_group 0;\"",
        ] {
            assert!(src.contains(piece), "{d}: {piece} in {src}");
        }
        assert!(
            !src.contains("red.global.add.v2") && !src.contains("atomicAdd(t"),
            "{d}: no thread's adds"
        );
        let param = l.params.iter().find_map(|p| match p {
            Param::TensorMap {
                tensor,
                box_inner: 32,
                box_outer,
                rows_axis,
            } => Some((*tensor, *box_outer, *rows_axis)),
            _ => None,
        });
        let dq_acc = ir.kernel().tensors.iter().position(|t| t.name == "dq_acc");
        assert_eq!(param, Some((dq_acc.unwrap(), 64, Some(2))), "{d}");
        if common::nvrtc_or_skip() {
            let log = tilefuse::runtime::jit::resource_report(def.name(), src, "sm_90a").unwrap();
            assert!(log.contains(" 0 bytes spill stores"), "{d}: {log}");
        }
    }
    // Three stages at head dimension 128 do not fit beside the staging.
    let ext = extents(ir, 128, 2048);
    let three = fit_whole_dims(ir, default_wgmma_attention(ir).unwrap(), &ext).tma_store(true);
    assert!(lower(ir, &spec, &three).unwrap().shared_bytes as usize > H200.shared_limit);
    // Not without an atomic product, nor off the Hopper program.
    let err = hopper_default_error(attention_dq::kernel(), 1, |c| c.tma_store(true));
    assert!(
        err.contains("`tma_store`") && err.contains("atomic product"),
        "{err}"
    );
    let general = fit_whole_dims(ir, default_wgmma_attention(ir).unwrap(), &ext)
        .wgmma(false)
        .tma_store(true);
    let err = lower(ir, &spec, &general).unwrap_err().to_string();
    assert!(err.contains("set `wgmma`"), "{err}");
}

/// The one pass's step issues dQ's product before dK's update (dK's packed
/// `dS` kept from the update's place) and waits for dQ's alone, so dK runs
/// under dQ's staging and adds; dV's update, earlier in the step, keeps its
/// place (it runs under `dS`). The step's tile indices come from one 32-bit
/// division: with a group loop around the key loop (grouped-query), its index
/// is the quotient, no 64-bit `%` or `/` (on an H200 the two changes took the
/// 4×16×2048×128 one pass from 0.96 to 0.83 ms; dQ's staging without bank
/// conflicts then to 0.81).
#[test]
fn the_one_pass_issues_dk_after_dq_and_decodes_steps_in_32_bits() {
    use common::examples::attention_backward::attention_dkdvdq;
    use tilefuse::codegen::config::default_config_at;
    let def = attention_dkdvdq::kernel();
    let ir = def.ir().unwrap();
    for causal in [0, 1] {
        let mut spec = def.declared_spec().unwrap();
        spec.constexprs = vec![causal];
        let ext = extents(ir, 128, 2048);
        let c = fit_whole_dims(ir, default_config_at(ir, &spec, H200, &ext), &ext);
        let src = lower(ir, &spec, &c).unwrap().source;
        // One copy of the step (the unmasked one) from dS's store to the adds.
        let start = src.find("// dS as the scores lie").expect("dS's store");
        let step = &src[start..];
        let end = step.find("tf_tma_add_").expect("the TMA unit's adds");
        let step = &step[..end];
        let dq = step.find("tf_wgmma_dq(").expect("dQ's product");
        let dk = step
            .find("tf_wgmma_pv(")
            .expect("dK's update in the atomic's block");
        assert!(dq < dk, "dK after dQ:\n{step}");
        let wait = step[dk..]
            .find("wgmma.wait_group.sync.aligned 1;")
            .expect("a wait for dQ alone");
        let staged = step.find("st.shared.v2.f32").expect("dQ staged");
        assert!(dk + wait < staged, "{step}");
        // Before dQ's product, every earlier group (dV's) is complete.
        let before = &step[..dq];
        assert!(
            before.contains("wgmma.wait_group.sync.aligned 0;"),
            "{before}"
        );
        assert_eq!(
            src.matches("tf_wgmma_pv(&v").count(),
            4,
            "dV and dK, two copies of the step"
        );
        // dQ's staging: rows of odd `g` store the column group `j ^ 2` (a
        // half-warp's 8-byte stores on distinct banks of the swizzled rows).
        assert!(
            src.contains("const int tf_jo = tf_odd ? tf_j ^ 2 : tf_j;")
                && src.contains("(tf_jo >> 2) * 8192u + tf_r * 128 + ((tf_ch ^ (tf_r & 7)) << 4)"),
            "{src}"
        );
        assert!(src.contains("const int tf_rest0 = tf_it / tf_nt;"), "{src}");
        assert!(
            !src.contains("tf_rest %") && !src.contains("tf_it % tf_nt"),
            "{src}"
        );
    }
}

/// The backward's dK/dV kernel takes the attention lowering too: its grid's
/// keys are the program's rows and its loop walks the queries (`q·kᵀ`
/// computed as `k·qᵀ`, `k` and `v` the row operands, `q` and `dO` streamed),
/// dV and dK two accumulators, a loop over a group's query heads around the
/// key loop (their batch index `th * group + g`); 64 rows, 32 queries a step
/// and 4 warps by default off Hopper.
#[test]
fn the_backwards_dkdv_takes_the_attention_lowering() {
    use common::examples::attention_backward::attention_dkdv;
    use tilefuse::codegen::config::default_config_at;
    let def = attention_dkdv::kernel();
    let ir = def.ir().unwrap();
    let (a, names) = planned_attention(ir);
    // dims: tb, th, tn, td, g, tm.
    assert_eq!((a.m, a.n, a.d, a.outer_each.clone()), (2, 5, 3, vec![4]));
    assert_eq!(names(a.row_operands()), ["k", "v"]);
    assert_eq!(names(a.key_operands()), ["q", "dout"]);
    assert_eq!((a.more_scores.len(), a.more_updates.len()), (1, 1));
    assert!(
        matches!(a.kv_exprs.as_slice(), [None, Some(_)]),
        "{:?}",
        a.kv_exprs
    );
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![1];
    let ext = DKDV_4X16X2048X128;
    let c = fit_whole_dims(ir, default_config_at(ir, &spec, NO_WGMMA, &ext), &ext);
    assert_eq!(
        (c.block_sizes.clone(), c.num_warps, c.wgmma),
        (vec![1, 1, 64, 128, 1, 32], 4, false)
    );
    let l = lower(ir, &spec, &c).unwrap();
    assert_eq!(l.path, "attention (mma.sync, flash)");
    let src = &l.source;
    assert!(
        src.contains("for (long long tb4 = 0; tb4 < s"),
        "the group's loop: {src}"
    );
    assert!(src.contains("const long long tf_kv1 = "), "{src}");
    // Each update's `p` its own.
    assert!(
        src.contains("float tf_p[") && src.contains("float tf_p0["),
        "{src}"
    );
}

/// The H200's target (for defaults and tuning spaces without a GPU).
/// dK/dV's extents (tb, th, tn, td, g, tm) at 4 batches, 16 heads, 2048
/// tokens, head dimension 128, one query head a group.
const DKDV_4X16X2048X128: [Option<usize>; 6] = [
    Some(4),
    Some(16),
    Some(2048),
    Some(128),
    Some(1),
    Some(2048),
];

const H200: Target = Target {
    shared_limit: 227 * 1024,
    wgmma: true,
    sms: 132,
};

/// The error that lowering `def`'s Hopper default, changed by `change`,
/// gives (`causal` its constexpr).
fn hopper_default_error(
    def: &tilefuse::KernelDef,
    causal: i64,
    change: impl FnOnce(Config) -> Config,
) -> String {
    let ir = def.ir().unwrap();
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![causal];
    let c = change(default_wgmma_attention(ir).unwrap());
    lower(ir, &spec, &c).unwrap_err().to_string()
}

/// A kernel's extents: `whole` for its `whole(…)` dimensions (the head
/// dimension), `other` for the rest.
fn extents(ir: &Planned, whole: usize, other: usize) -> Vec<Option<usize>> {
    ir.dims
        .iter()
        .map(|d| Some(if d.whole { whole } else { other }))
        .collect()
}

/// A target without the Hopper instructions (the `mma.sync` programs' defaults).
const NO_WGMMA: Target = Target {
    wgmma: false,
    ..H200
};

/// An attention kernel's plan and the names of tensors it picks.
fn planned_attention(ir: &Planned) -> (&AttentionShape, impl Fn(Vec<usize>) -> Vec<String> + '_) {
    let Some(a) = ir.plan::<AttentionShape>() else {
        panic!("not attention: {}", ir.kernel());
    };
    let names = move |ts: Vec<usize>| -> Vec<String> {
        ts.into_iter().map(|t| ir.tensors[t].name.clone()).collect()
    };
    (a, names)
}

mod bshd {
    use tilefuse::prelude::*;

    /// The example's forward storing its output in `[b, s, h, d]` order
    /// (FlashAttention's own layout), `q`, `k`, `v` as the example's.
    #[fused_kernel]
    pub fn attention_bshd_out(
        q: &Tensor<bf16>,
        k: &Tensor<bf16>,
        v: &Tensor<bf16>,
        out: &Tensor<bf16>,
        scale: f32,
    ) {
        let [b, h, s, d] = q.shape();
        let [_, _, sk, _] = k.shape();
        for (tb, th, tm, td) in tile([b, h, s, whole(d)]) {
            let mut row_max = full::<f32>([tb, th, tm], f32::NEG_INFINITY);
            let mut denom = zeros::<f32>([tb, th, tm]);
            let mut acc = zeros::<f32>([tb, th, tm, td]);
            for tn in tile(sk) {
                let x = addmm(
                    zeros::<f32>([tb, th, tm, tn]),
                    q[(tb, th, tm, td)],
                    k[(tb, th, tn, td)],
                ) * scale;
                let new_max = max(row_max, x.max(tn));
                let p = exp(x - new_max);
                let alpha = exp(row_max - new_max);
                denom = denom * alpha + p.sum(tn);
                acc = addmm(acc * alpha, p.cast::<bf16>(), v[(tb, th, tn, td)]);
                row_max = new_max;
            }
            out[(tb, tm, th, td)] = (acc / denom).cast();
        }
    }
}

mod not_online {
    use tilefuse::prelude::*;

    /// The example's forward but for its sum, which forgets to rescale
    /// (`denom + p.sum(tn)`): attention-shaped, yet not the online softmax
    /// whose states the split tail knows how to combine.
    #[fused_kernel]
    pub fn attention_unscaled_sum(
        q: &Tensor<bf16>,
        k: &Tensor<bf16>,
        v: &Tensor<bf16>,
        out: &Tensor<bf16>,
        scale: f32,
    ) {
        let [b, h, s, d] = q.shape();
        let [_, _, sk, _] = k.shape();
        for (tb, th, tm, td) in tile([b, h, s, whole(d)]) {
            let mut row_max = full::<f32>([tb, th, tm], f32::NEG_INFINITY);
            let mut denom = zeros::<f32>([tb, th, tm]);
            let mut acc = zeros::<f32>([tb, th, tm, td]);
            for tn in tile(sk) {
                let x = addmm(
                    zeros::<f32>([tb, th, tm, tn]),
                    q[(tb, th, tm, td)],
                    k[(tb, th, tn, td)],
                ) * scale;
                let new_max = max(row_max, x.max(tn));
                let p = exp(x - new_max);
                let alpha = exp(row_max - new_max);
                denom = denom + p.sum(tn);
                acc = addmm(acc * alpha, p.cast::<bf16>(), v[(tb, th, tn, td)]);
                row_max = new_max;
            }
            out[(tb, th, tm, td)] = (acc / denom).cast();
        }
    }
}

/// The split tail combines two parts' states only where the key loop is the
/// online softmax: a recurrence it does not know (a sum never rescaled) is
/// refused with the reason, while the same kernel lowers persistent
/// without the split.
#[test]
fn the_split_tail_refuses_a_loop_that_is_not_the_online_softmax() {
    let def = not_online::attention_unscaled_sum::kernel();
    let ir = def.ir().unwrap();
    assert!(ir.plan::<AttentionShape>().is_some(), "attention-shaped");
    let spec = def.declared_spec().unwrap();
    let cfg = Config::new(&[1, 1, 128, 128, 128])
        .num_warps(8)
        .num_stages(3)
        .wgmma(true)
        .overlap(true)
        .persistent(true);
    lower(ir, &spec, &cfg).expect("persistent, without the split");
    let err = lower(ir, &spec, &cfg.stream_k(true))
        .unwrap_err()
        .to_string();
    assert!(err.contains("exactly the online softmax"), "{err}");
    // Nor does its default take the split at 4096 keys.
    use tilefuse::codegen::config::default_config_at;
    let ext = extents(ir, 128, 4096);
    let c = fit_whole_dims(ir, default_config_at(ir, &spec, H200, &ext), &ext);
    assert!(c.persistent && !c.stream_k, "{c}");
}

/// The Hopper program stores an output whose rows are not its second-last
/// axis (`[b, s, h, d]`) by rows too: a row's address from its own stride,
/// pairs where the head dimension is contiguous and that stride and the
/// batch offset are even.
#[test]
fn the_hopper_program_stores_a_bshd_output_by_rows() {
    let def = bshd::attention_bshd_out::kernel();
    let ir = def.ir().unwrap();
    let spec = def.declared_spec().unwrap();
    let c = tilefuse::codegen::default_config_at(ir, &spec, H200, &extents(ir, 128, 4096));
    assert!(c.wgmma, "{c}");
    let src = lower(ir, &spec, &c).unwrap().source;
    for needle in [
        "const long long tf_ou = (tb0) * t3_s0 + (tb1) * t3_s2;",
        "const bool tf_oc = t3_s3 == 1 && ((t3_s1 | tf_ou) & 1) == 0",
        "unsigned short* tf_ob = t3 + tf_ou + ((tb2 + tf_wr + tf_mi * 16 + tf_h * 8 + tf_g)) * t3_s1;",
        "if (tf_rok && tf_col < t3_n3) tf_ob[tf_col * t3_s3] = tf_f32_to_bf16(tf_ov[0]);",
        // Where the whole head dimension is contiguous and rows start 16-byte
        // aligned, a quad's column pairs are traded so each thread stores 8
        // adjacent columns in one 16-byte store.
        "const bool tf_o16 = t3_s3 == 1 && t3_n3 >= 128 && ((t3_s1 | tf_ou) & 7) == 0",
        "__shfl_xor_sync(0xffffffffu, tf_b ? tf_w[tf_lo] : tf_w[tf_hi], 1 << tf_k);",
        "if (tf_rok) ((uint4*)tf_ob)[tf_q * 4 + tf_t] = make_uint4(tf_w[0], tf_w[1], tf_w[2], tf_w[3]);",
    ] {
        assert!(src.contains(needle), "{needle}\n{src}");
    }
}
