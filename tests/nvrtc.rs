//! Every example kernel, lowered under several configs and specializations,
//! compiles with NVRTC for sm_90a and sm_80. Needs libnvrtc only (no GPU): without
//! it these tests skip and say so, unless TILEFUSE_REQUIRE_NVRTC=1.

mod common;

use common::examples::*;
use tilefuse::codegen::spec::TensorSpec;
use tilefuse::codegen::{Config, Spec};
use tilefuse::KernelDef;
use tilefuse_testkit::kernel_spill_stores as spill_stores;

const ARCHS: [&str; 2] = ["sm_90a", "sm_80"];

/// Held by every test that compiles, so the compile counter sees only its own.
static COMPILES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `def`'s declared spec with its one `#[constexpr]` flag off, then on.
fn flag_specs(def: &KernelDef) -> Vec<Spec> {
    [0, 1]
        .into_iter()
        .map(|c| {
            let mut spec = def.declared_spec().expect("declared dtypes");
            spec.constexprs = vec![c];
            spec
        })
        .collect()
}

fn compile_all(def: &KernelDef, specs: &[Spec], configs: &[Config]) {
    if !common::nvrtc_or_skip() {
        return;
    }
    let _alone = COMPILES.lock().unwrap_or_else(|p| p.into_inner());
    // Compile for real: cubins cached on disk by an earlier run would not test NVRTC.
    std::env::set_var("TILEFUSE_SKIP_CACHE", "1");
    let before = tilefuse::jit::compile_count();
    for spec in specs {
        for cfg in configs {
            for arch in ARCHS {
                let started = std::time::Instant::now();
                match def.compile(spec, cfg, arch) {
                    Ok(c) => no_warnings(&format!("{} {cfg} {arch}", def.name()), &c.log),
                    Err(e) => panic!("{} with {cfg} for {arch} failed:\n{e}", def.name()),
                }
                eprintln!(
                    "{} {cfg} {arch}: {:.0} ms",
                    def.name(),
                    started.elapsed().as_secs_f64() * 1e3
                );
            }
        }
    }
    // Each compile is counted once (compiling tests hold `COMPILES`).
    let expected = (specs.len() * configs.len() * ARCHS.len()) as u64;
    assert_eq!(
        tilefuse::jit::compile_count() - before,
        expected,
        "NVRTC compile counter"
    );
}

fn gemm_configs() -> Vec<Config> {
    vec![
        Config::new(&[256, 128, 32]).num_warps(8).num_stages(4),
        Config::new(&[128, 256, 32]).num_warps(8).num_stages(4),
        Config::new(&[128, 256, 64]).num_warps(8).num_stages(3),
        Config::new(&[128, 256, 64]).num_warps(8).num_stages(4),
        Config::new(&[128, 128, 32]).num_warps(4).num_stages(4),
        Config::new(&[64, 64, 32]).num_warps(4).num_stages(2),
        Config::new(&[256, 128, 64]).num_warps(8).num_stages(3),
        Config::new(&[32, 32, 16]).num_warps(1).num_stages(3),
    ]
}

/// The declared spec, and the same with rows that are not 16-byte aligned.
fn aligned_and_not(def: &KernelDef) -> Vec<Spec> {
    let spec = def.declared_spec().expect("declared dtypes");
    let mut ragged = spec.clone();
    for t in &mut ragged.tensors {
        *t = TensorSpec {
            align: 2,
            ..t.clone()
        };
    }
    vec![spec, ragged]
}

#[test]
fn matmul_compiles() {
    let def = matmul::matmul::kernel();
    compile_all(def, &aligned_and_not(def), &gemm_configs());
}

/// The default GEMM config keeps its loop in registers: a spill in the K loop cost
/// 12% of the GEMM's speed once (docs/perf-history.md, “Notes: predictions and outcomes”, note 9), so ptxas's report
/// must say 0 bytes of spill stores, for every arch.
#[test]
fn default_gemm_config_does_not_spill() {
    if !common::nvrtc_or_skip() {
        return;
    }
    let def = matmul::matmul::kernel();
    let spec = def.declared_spec().expect("declared dtypes");
    let cfg = def.config().expect("default config");
    let lowered = def.lower(&spec, &cfg).expect("lowering");
    let _alone = COMPILES.lock().unwrap_or_else(|p| p.into_inner());
    for arch in ARCHS {
        let log = tilefuse::jit::resource_report(def.name(), &lowered.source, arch)
            .unwrap_or_else(|e| panic!("{cfg} for {arch}: {e}"));
        no_warnings(&format!("{cfg} for {arch}"), &log);
        assert!(
            kernel_does_not_spill(&log),
            "{cfg} for {arch} spills:\n{log}"
        );
    }
}

/// The seed example's GEMM: a range `wait` before the mainloop (chunks of rows)
/// or per k-tile inside it (chunks along K), and a rotated tile order.
#[test]
fn all_gather_matmul_compiles() {
    let def = all_gather_matmul::ag_matmul::kernel();
    let specs = flag_specs(def); // along_k off and on
    let configs = [
        def.config().expect("default config"),
        Config::new(&[64, 64, 32]).num_warps(4).num_stages(2),
        Config::new(&[64, 64, 16]).num_warps(4).num_stages(3),
    ];
    compile_all(def, &specs, &configs);
}

/// The Hopper path (TMA + wgmma) compiles for sm_90a without spills, for the
/// plain matmul, the fused bias + GELU epilogue and the seed's GEMM (its `wait`s
/// run in the producer), at the configs it is tuned over, persistent or not;
/// two configs may keep a few words of a persistent loop's state in local
/// memory (named below), which the tuner weighs by their time.
#[test]
fn wgmma_matmul_compiles_for_sm_90a() {
    if !common::nvrtc_or_skip() {
        return;
    }
    let _alone = COMPILES.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("TILEFUSE_SKIP_CACHE", "1");
    let mut configs = common::wgmma_configs();
    configs.extend(common::tma_store_configs());
    configs.extend(common::pingpong_configs());
    let ag = all_gather_matmul::ag_matmul::kernel();
    for (def, constexprs) in [
        (matmul::matmul::kernel(), vec![]),
        (bias_gelu::matmul_bias_gelu::kernel(), vec![]),
        // Chunks of rows (waits before the K loop) and along K (inside it).
        (ag, vec![0]),
        (ag, vec![1]),
    ] {
        let mut spec = def.declared_spec().expect("declared dtypes");
        spec.constexprs = constexprs;
        let mut seen = std::collections::HashSet::new();
        for cfg in &configs {
            let lowered = def
                .lower(&spec, cfg)
                .unwrap_or_else(|e| panic!("{} {cfg}: {e}", def.name()));
            assert_eq!(lowered.path, "gemm/wgmma");
            // Persistent or not is the same code launched on another grid; NVRTC
            // may then skip ptxas (an empty report), so each code is checked once.
            let code: String = lowered
                .source
                .lines()
                .filter(|l| !l.starts_with("// kernel `"))
                .collect();
            if !seen.insert(code) {
                eprintln!("{} {cfg}: the same code as an earlier config", def.name());
                continue;
            }
            let t = std::time::Instant::now();
            let log = tilefuse::jit::resource_report(def.name(), &lowered.source, "sm_90a")
                .unwrap_or_else(|e| panic!("{} {cfg}: {e}", def.name()));
            no_warnings(&format!("{} {cfg}", def.name()), &log);
            eprintln!(
                "{} {cfg}: {:.0} ms\n{log}",
                def.name(),
                t.elapsed().as_secs_f64() * 1e3
            );
            // Waits inside the K loop cost the producer registers, and it has
            // 56 (setmaxnreg): at 128×128 persistent pairs it spills 24 bytes,
            // one thread's (the tuner weighs that config by its time).
            let k_waits_in_pairs = spec.constexprs == [1] && cfg.persistent && cfg.cluster_m == 2;
            // The GELU epilogue (a 12-step polynomial an element) at 128×128
            // stream-K ping-pong: ptxas keeps two words of the persistent
            // loop's tile state in local memory (20 bytes, stored and reloaded
            // once a tile, outside the K loop and the epilogue's arithmetic).
            let gelu_stream_k = def.name() == "matmul_bias_gelu"
                && cfg.stream_k
                && cfg.pingpong
                && spill_stores(&log).is_some_and(|b| b <= 32);
            assert!(
                kernel_does_not_spill(&log) || k_waits_in_pairs || gelu_stream_k,
                "{cfg} spills:\n{log}"
            );
        }
    }
}

/// Fails on any warning in a compile log: NVRTC's (`warning #550-D: variable
/// ... set but never used` points at generated code that does work for nothing)
/// and ptxas's (C7510: `wgmma`s serialized, a large slowdown).
fn no_warnings(what: &str, log: &str) {
    let found: Vec<&str> = log.lines().filter(|l| l.contains("warning")).collect();
    assert!(found.is_empty(), "{what}: compile warnings:\n{log}");
}

/// Whether ptxas's report says the kernel (`tf_…`, not a helper function) has
/// no spill stores (beyond [`spill_allowed`]).
fn kernel_does_not_spill(log: &str) -> bool {
    spill_stores(log).is_some_and(|b| b <= spill_allowed())
}

/// Spill-store bytes a kernel may have: none with NVRTC 13 (the GPU machine's);
/// with CUDA 12's (12.8) a few, as its ptxas spills 16 bytes on one of the ops'
/// Hopper configs where 13.0's spills none. The CUDA 12 run checks that
/// everything compiles, not the register allocation.
fn spill_allowed() -> usize {
    if cfg!(feature = "cuda-12") {
        64
    } else {
        0
    }
}

/// The fused ops' kernels compile for both archs at their default config, for
/// each specialization the schedules launch (switches: copy, addend, C, aux
/// out, activation), and on sm_90a the ops' ones without spills at the Hopper
/// configs, with the TMA-store epilogue or not. (The plans' heavier epilogues,
/// `C` + aux + gelu, do spill at 128×256 tiles: 168 registers hold the
/// accumulator; see docs/PERFORMANCE.md.)
#[test]
fn op_kernels_compile() {
    use tilefuse::ops::kernels::*;
    let gemm = gemm_fused::kernel();
    let gemm_specs: Vec<Spec> = [
        // [along_k, with_signal, copies, with_addend, with_c, aux_out, act]
        [0, 0, 0, 0, 0, 0, 0], // all-gather matmul, chunks of rows
        [1, 0, 0, 0, 0, 0, 0], // all-gather matmul, chunks along K
        [0, 1, 0, 0, 0, 0, 0], // first ring step
        [0, 1, 0, 1, 0, 0, 0], // ring steps, the all-reduce's last step
        [0, 0, 0, 1, 0, 0, 0], // the reduce-scatter's last step
        [0, 1, 1, 0, 0, 0, 0], // matmul + all-gather, copy-engine pulls
        [0, 1, 3, 0, 0, 0, 0], // matmul + all-gather, stores into 3 peers
        [0, 0, 0, 0, 1, 1, 2], // plans: beta·C, gelu with its aux
        [0, 1, 0, 1, 1, 0, 4], // plans: dgelu from an aux, all-reduced
        [0, 0, 0, 1, 0, 0, 3], // plans: drelu
    ]
    .into_iter()
    .map(|consts| {
        let mut spec = gemm.declared_spec().expect("declared dtypes");
        spec.constexprs = consts.to_vec();
        spec
    })
    .collect();
    let configs = [
        gemm.config().expect("default config"),
        Config::new(&[64, 64, 32]).num_warps(4).num_stages(2),
    ];
    compile_all(gemm, &gemm_specs, &configs);
    let epi = epilogue::kernel();
    // [with_addend, with_c, aux_out, act]
    let epi_specs: Vec<Spec> = [
        [0, 0, 0, 0],
        [0, 1, 1, 2],
        [0, 0, 0, 3],
        [0, 1, 0, 4],
        [1, 0, 0, 0],
        [1, 1, 1, 2],
    ]
    .into_iter()
    .map(|consts| {
        let mut spec = epi.declared_spec().expect("declared dtypes");
        spec.constexprs = consts.to_vec();
        spec
    })
    .collect();
    compile_all(epi, &epi_specs, &[epi.config().expect("default config")]);
    if !common::nvrtc_or_skip() {
        return;
    }
    let _alone = COMPILES.lock().unwrap_or_else(|p| p.into_inner());
    // With the TMA-store epilogue too: the signalling steps then wait for the
    // TMA unit's writes before they count. Ping-pong storing fragments (with
    // the TMA store, the ring steps, the reduce-scatter's last step and the
    // matmul + all-gather spill at 168 registers: 636 bytes for a ring step at
    // 128×128 in a pair; the tuner weighs such configs by their time).
    let hopper: Vec<Config> = common::wgmma_configs()
        .into_iter()
        .step_by(3)
        .chain(common::tma_store_configs().into_iter().take(2))
        .chain(common::pingpong_configs().into_iter().take(2))
        .collect();
    for spec in &gemm_specs[..6] {
        for cfg in &hopper {
            let lowered = gemm
                .lower(spec, cfg)
                .unwrap_or_else(|e| panic!("{:?} {cfg}: {e}", spec.constexprs));
            assert_eq!(lowered.path, "gemm/wgmma", "{:?} {cfg}", spec.constexprs);
            let log = tilefuse::jit::resource_report(gemm.name(), &lowered.source, "sm_90a")
                .unwrap_or_else(|e| panic!("{:?} {cfg}: {e}", spec.constexprs));
            no_warnings(&format!("{:?} {cfg}", spec.constexprs), &log);
            assert!(
                kernel_does_not_spill(&log),
                "{:?} {cfg} spills:\n{log}",
                spec.constexprs
            );
        }
    }
}

/// The row kernels (softmax, RMSNorm, LayerNorm): a warp per row, a row over
/// several warps (shared-memory combine), one pass over 8192 columns, with rows
/// aligned (16-byte loads) and not.
#[test]
fn row_kernels_compile() {
    let configs = [
        Config::new(&[4, 1024, 1024]).num_warps(4),
        Config::new(&[1, 8192, 8192]).num_warps(8),
        Config::new(&[2, 4096, 2048]).num_warps(16),
        // The untuned defaults fitted to rows of 1025-2048 and 2049-4096 columns.
        Config::new(&[2, 2048, 2048]).num_warps(4),
        Config::new(&[1, 4096, 4096]).num_warps(4),
    ];
    for def in [
        softmax::softmax::kernel(),
        rms_norm::rms_norm::kernel(),
        layer_norm::layer_norm::kernel(),
    ] {
        compile_all(def, &aligned_and_not(def), &configs);
    }
    // One walk (two tile dimensions): the same blocks, its first walk's.
    let def = cross_entropy::cross_entropy::kernel();
    let two: Vec<Config> = configs
        .iter()
        .map(|c| Config::new(&c.block_sizes[..2]).num_warps(c.num_warps))
        .collect();
    compile_all(def, &aligned_and_not(def), &two);
    // The one-shot all-reduce + bias + RMSNorm, for each world size it reads.
    let def = all_reduce_rms_norm::all_reduce_bias_rms_norm::kernel();
    let worlds: Vec<Spec> = (1..=all_reduce_rms_norm::MAX_WORLD)
        .flat_map(|w| {
            aligned_and_not(def).into_iter().map(move |mut s| {
                s.constexprs = vec![w as i64];
                s
            })
        })
        .collect();
    compile_all(def, &worlds, &configs);
}

/// The row kernels hold their rows in registers: with room (occupancy 512, so
/// 128 registers a thread) no seed of their tuning space spills, and at the
/// derived occupancy (launch bounds from the registers the loads hold) at most a
/// few words do. Before rows stayed packed, seeds spilled hundreds of bytes.
#[test]
fn row_kernels_do_not_spill_at_their_seeds() {
    if !common::nvrtc_or_skip() {
        return;
    }
    let _alone = COMPILES.lock().unwrap_or_else(|p| p.into_inner());
    let h200 = tilefuse::codegen::Target {
        shared_limit: 227 * 1024,
        wgmma: true,
        sms: 132,
    };
    for def in [
        softmax::softmax::kernel(),
        rms_norm::rms_norm::kernel(),
        layer_norm::layer_norm::kernel(),
        cross_entropy::cross_entropy::kernel(),
    ] {
        let spec = def.declared_spec().expect("declared dtypes");
        let space = tilefuse::codegen::ConfigSpace::new(def.ir().expect("ir"), &spec, h200);
        let seeds = space.seeds(&spec, false);
        assert!(seeds.len() >= 5, "{}: {seeds:?}", def.name());
        for seed in seeds {
            // The general lowering's candidate (`Config::general`) keeps its
            // own register choices: only the derived occupancy's bound holds.
            let bounded = (!seed.general).then(|| (seed.clone().occupancy(512), 0));
            for (cfg, most) in bounded.into_iter().chain([(seed, 32)]) {
                let lowered = def
                    .lower(&spec, &cfg)
                    .unwrap_or_else(|e| panic!("{} {cfg}: {e}", def.name()));
                let log = tilefuse::jit::resource_report(def.name(), &lowered.source, "sm_90a")
                    .unwrap_or_else(|e| panic!("{} {cfg}: {e}", def.name()));
                no_warnings(&format!("{} {cfg}", def.name()), &log);
                let spilled = spill_stores(&log)
                    .unwrap_or_else(|| panic!("{} {cfg}: no report in\n{log}", def.name()));
                assert!(
                    spilled <= most,
                    "{} {cfg} spills {spilled} bytes (at most {most}):\n{log}",
                    def.name()
                );
            }
        }
    }
}

/// Attention's backward compiles for both architectures on the attention
/// program's `mma.sync` form: dQ (`dO·Vᵀ` beside `Q·Kᵀ`, `dS·K` the update)
/// and dK/dV (the keys the rows, the queries streamed, two accumulators, a
/// loop over the group's query heads). At their defaults (64 rows; 64 keys,
/// or 32 queries, a step; 4 warps) for head dimensions 64 and 128 they keep
/// scores and accumulators in registers on sm_90a (the general lowering
/// spilled 264 and 1216 bytes at head dimension 128 with 8 warps), and a few
/// words at most on sm_80.
#[test]
fn attention_backward_compiles_with_tensor_core_addmm() {
    use attention_backward::{attention_dkdv, attention_dq};
    // dQ's dims: tb, th, tm, td, tn; dK/dV's: tb, th, tn, td, g (a group's
    // query heads), tm.
    for (def, cfg, path, mma) in [
        (
            attention_dq::kernel(),
            Config::new(&[1, 1, 64, 64, 64]).num_warps(4),
            "attention (mma.sync, flash)",
            "tf_att_mma(tf_s1[",
        ),
        (
            attention_dkdv::kernel(),
            Config::new(&[1, 1, 64, 64, 1, 32]).num_warps(4),
            "attention (mma.sync, flash)",
            "tf_att_mma(tf_s1[",
        ),
    ] {
        let specs: Vec<Spec> = [0, 1]
            .into_iter()
            .map(|c| {
                let mut spec = def.declared_spec().expect("declared dtypes");
                spec.constexprs = vec![c];
                let lowered = def.lower(&spec, &cfg).expect("lowers");
                assert_eq!(lowered.path, path, "{}", def.name());
                assert!(
                    lowered.source.contains(mma),
                    "{}: no tensor-core addmm",
                    def.name()
                );
                spec
            })
            .collect();
        compile_all(def, &specs, std::slice::from_ref(&cfg));
    }
    if !common::nvrtc_or_skip() {
        return;
    }
    let _alone = COMPILES.lock().unwrap_or_else(|p| p.into_inner());
    for def in [attention_dq::kernel(), attention_dkdv::kernel()] {
        let default = def.config().expect("the default config");
        for d in [64, 128] {
            let mut cfg = default.clone();
            cfg.block_sizes[3] = d;
            for causal in [0, 1] {
                let mut spec = def.declared_spec().expect("declared dtypes");
                spec.constexprs = vec![causal];
                let lowered = def.lower(&spec, &cfg).expect("lowers");
                for arch in ARCHS {
                    let log = tilefuse::jit::resource_report(def.name(), &lowered.source, arch)
                        .unwrap_or_else(|e| panic!("{} {cfg}: {e}", def.name()));
                    let spilled =
                        spill_stores(&log).unwrap_or_else(|| panic!("no report in\n{log}"));
                    // sm_80 keeps a few words of dK/dV's in local memory.
                    let most = if arch == "sm_80" { 32 } else { spill_allowed() };
                    assert!(
                        spilled <= most,
                        "{} {cfg} causal={causal} {arch} spills {spilled} bytes:\n{log}",
                        def.name()
                    );
                }
            }
        }
    }
}

/// The one-pass attention backward at its default off Hopper (the general
/// lowering: the `mma.sync` program does not add atomically) and dQ's rounding
/// compile for both architectures, causal and not. (Its Hopper program:
/// `tests/attention.rs`.)
#[test]
fn one_pass_attention_backward_compiles_off_hopper() {
    use attention_backward::{attention_dkdvdq, attention_dq_out};
    let def = attention_dkdvdq::kernel();
    let cfg = def.config().expect("the default config");
    assert!(cfg.general, "{cfg}");
    let specs = flag_specs(def); // causal off and on
    compile_all(def, &specs, std::slice::from_ref(&cfg));
    let out = attention_dq_out::kernel();
    let spec = out.declared_spec().expect("declared dtypes");
    compile_all(out, &[spec], &[out.config().expect("the default config")]);
}

/// The backward's Hopper programs at their untuned defaults on an H200 (the
/// two kernels, dQ and dK/dV, and the one pass with dQ added by the TMA unit),
/// head dimensions 64 and 128 at 2048 tokens, causal and not: no warnings, no
/// spills, no serialized `wgmma`. The GPU suite runs them; here CI compiles them.
#[test]
fn attention_backward_hopper_defaults_compile_without_spills() {
    use attention_backward::{attention_dkdv, attention_dkdvdq, attention_dq};
    for def in [
        attention_dq::kernel(),
        attention_dkdv::kernel(),
        attention_dkdvdq::kernel(),
    ] {
        hopper_defaults_compile_clean(def, &[64, 128], &[2048]);
    }
}

/// The forward's untuned defaults on an H200 (persistent blocks up to 4096
/// keys, three consumer warpgroups at head dimension 64, the output's 16-byte
/// stores) at the head dimensions and lengths its benchmarks run, and the
/// grouped-query kernel's: no warnings, no spills, no serialized `wgmma`.
#[test]
fn attention_hopper_defaults_compile_without_spills() {
    hopper_defaults_compile_clean(
        attention::attention::kernel(),
        &[64, 128, 256],
        &[1024, 4096, 16384],
    );
    hopper_defaults_compile_clean(attention::attention_gqa::kernel(), &[128], &[4096]);
}

/// Compiles `def`'s untuned default on an H200 for sm_90a at each whole
/// (head) dimension in `ds` and each other extent in `lens`, causal and not:
/// the Hopper program, with no warnings, no spills (see [`spill_allowed`]) and
/// no `wgmma` serialized by ptxas (C7510, C7520).
fn hopper_defaults_compile_clean(def: &KernelDef, ds: &[usize], lens: &[usize]) {
    use tilefuse::codegen::{config::default_config_at, fit_whole_dims, Target};
    if !common::nvrtc_or_skip() {
        return;
    }
    let _alone = COMPILES.lock().unwrap_or_else(|p| p.into_inner());
    let h200 = Target {
        shared_limit: 227 * 1024,
        wgmma: true,
        sms: 132,
    };
    let ir = def.ir().expect("the kernel's IR");
    for &d in ds {
        for &len in lens {
            let ext: Vec<Option<usize>> = ir
                .dims
                .iter()
                .map(|x| Some(if x.whole { d } else { len }))
                .collect();
            for causal in [0, 1] {
                let mut spec = def.declared_spec().expect("declared dtypes");
                spec.constexprs = vec![causal];
                let cfg = fit_whole_dims(ir, default_config_at(ir, &spec, h200, &ext), &ext);
                let what = format!("{} {cfg} causal={causal} d={d} len={len}", def.name());
                assert!(cfg.wgmma, "{what}: not the Hopper program");
                let lowered = def.lower(&spec, &cfg).expect("lowers");
                let log = tilefuse::jit::resource_report(def.name(), &lowered.source, "sm_90a")
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                no_warnings(&what, &log);
                assert!(
                    !log.contains("C7510") && !log.contains("C7520"),
                    "{what}: wgmma serialized:\n{log}"
                );
                let spilled = spill_stores(&log).unwrap_or_else(|| panic!("no report in\n{log}"));
                assert!(
                    spilled <= spill_allowed(),
                    "{what} spills {spilled} bytes:\n{log}"
                );
            }
        }
    }
}

/// Flash attention: FlashAttention-2's shapes and the tuner's others, head
/// dimensions 32 to 256, causal and not, compile for sm_90a. Configs whose
/// accumulators take at most 96 registers a thread do not spill; from 128 to
/// 192 a few words do (8 to 84 bytes measured; bounded here at 128): the
/// lowering keeps about 100 registers besides its accumulators. The Hopper
/// program's configs spill nothing, and ptxas does not serialize their `wgmma`s.
#[test]
fn attention_compiles_and_keeps_its_accumulators_in_registers() {
    if !common::nvrtc_or_skip() {
        return;
    }
    let _alone = COMPILES.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("TILEFUSE_SKIP_CACHE", "1");
    let def = attention::attention::kernel();
    // dims: tb, th, tm, td, tn; the accumulator registers a thread holds.
    let configs = [
        (Config::new(&[1, 1, 128, 128, 64]).num_warps(4), 192),
        (Config::new(&[1, 1, 128, 128, 32]).num_warps(4), 160),
        (Config::new(&[1, 1, 128, 128, 128]).num_warps(8), 128),
        (Config::new(&[1, 1, 128, 128, 64]).num_warps(8), 96),
        (Config::new(&[1, 1, 64, 64, 64]).num_warps(4), 64),
        (Config::new(&[1, 1, 128, 256, 64]).num_warps(8), 160),
        (Config::new(&[1, 1, 128, 32, 64]).num_warps(4), 96),
    ];
    // The Hopper program (one thread's share of a warpgroup's 64 rows: scores
    // `BN / 2` + output `D / 2`, at most 160 of 240 registers, 80 of 160 with
    // three consumer warpgroups): no spills.
    let hopper = |bm: usize, d: usize, bn: usize, stages: usize| {
        let c = Config::new(&[1, 1, bm, d, bn])
            .num_warps(bm / 16)
            .num_stages(stages)
            .wgmma(true);
        (c, 0)
    };
    let configs: Vec<(Config, usize)> = configs
        .into_iter()
        .chain([
            hopper(128, 128, 128, 3),
            hopper(128, 128, 176, 2),
            hopper(128, 64, 64, 4),
            hopper(64, 128, 128, 3),
            hopper(128, 256, 64, 2),
        ])
        // The softmax overlapped with the last tile's `p·v` (two `wgmma`
        // groups a step): one, two and three consumer warpgroups (192 rows at
        // head dimension 64, 160 registers a consumer thread).
        .chain(
            [
                (128, 128, 128, 3),
                (64, 128, 128, 3),
                (128, 64, 128, 2),
                (192, 64, 128, 2),
                (192, 64, 128, 3),
                (192, 64, 96, 3),
            ]
            .map(|(bm, d, bn, stages)| {
                let (c, held) = hopper(bm, d, bn, stages);
                (c.overlap(true), held)
            }),
        )
        .collect();
    // The grouped-query kernel (keys and values of a head group) at the two
    // paths' defaults for head dimension 128 (the Hopper one overlaps).
    let grouped = attention::attention_gqa::kernel();
    let grouped_hopper = tilefuse::codegen::default_wgmma_attention(grouped.ir().expect("the IR"))
        .expect("a Hopper config");
    assert!(grouped_hopper.overlap);
    let runs = configs
        .iter()
        .map(|(c, held)| (def, c.clone(), *held))
        .chain([
            (
                grouped,
                Config::new(&[1, 1, 128, 128, 64]).num_warps(4),
                192,
            ),
            (grouped, grouped_hopper, 0),
        ]);
    for (def, cfg, held) in runs {
        for causal in [0, 1] {
            let mut spec = def.declared_spec().expect("declared dtypes");
            spec.constexprs = vec![causal];
            let lowered = def
                .lower(&spec, &cfg)
                .unwrap_or_else(|e| panic!("attention {cfg}: {e}"));
            let name = def.name();
            let log = tilefuse::jit::resource_report(name, &lowered.source, "sm_90a")
                .unwrap_or_else(|e| panic!("{name} {cfg} causal={causal}: {e}"));
            no_warnings(&format!("{name} {cfg} causal={causal}"), &log);
            let spilled =
                spill_stores(&log).unwrap_or_else(|| panic!("{name} {cfg}: no report in\n{log}"));
            eprintln!("{name} {cfg} causal={causal}: {spilled} bytes spilled");
            let most = if held <= 96 { 0 } else { 128 };
            if cfg.wgmma {
                assert!(
                    !log.contains("C7510"),
                    "{name} {cfg}: wgmma serialized:\n{log}"
                );
            }
            assert!(
                spilled <= most,
                "{name} {cfg} causal={causal} spills {spilled} bytes (at most {most}):\n{log}"
            );
        }
    }
}

/// A `wait` inside the K loop keeps the GEMM on its fast paths: on Hopper a
/// second producer warp tests it (a lane per k-tile) and the issuing thread
/// reads how far the k-tiles are ready before each k-tile's loads; the
/// portable mainloop tests it before each k-tile's
/// `cp.async`s; a branch on a `#[constexpr]` around it does not change the
/// kernel's shape, so the unspecialized default config is the GEMM's.
#[test]
fn a_wait_inside_the_k_loop_stays_on_the_gemm_paths() {
    let def = all_gather_matmul::ag_matmul::kernel();
    let mut spec = def.declared_spec().expect("declared dtypes");
    spec.constexprs = vec![1];
    let default = def.config().expect("default config");
    assert_eq!(default.block_sizes, vec![128, 256, 64], "{default}");
    let portable = def.lower(&spec, &default).expect("portable lowering");
    assert_eq!(portable.path, "gemm/mma.sync");
    assert!(portable.source.contains("auto kwait = [&](int tf_kt)"));
    assert!(portable.source.contains("kwait(kt + 3);"));
    let hopper = common::wgmma_configs()[0].clone();
    let l = def.lower(&spec, &hopper).expect("wgmma lowering");
    assert_eq!(l.path, "gemm/wgmma");
    let producer = &l.source[l.source.find("for (int kt = kt_lo").expect("producer loop")..];
    let ready = producer
        .find("tf_ld_acquire_cta(&tf_kready)")
        .expect("the issuer reads the waiter's count");
    assert!(ready < producer.find("tf_tma_2d(").expect("the A load"));
    let waiter = &l.source[l.source.find("warp == 1").expect("the waiter warp")..];
    let test = waiter.find("tf_wait_flag_at").expect("the waiter's test");
    assert!(
        test < waiter
            .find("tf_st_release_cta(&tf_kready")
            .expect("its publication")
    );
    // Chunks of rows: no wait in the loop.
    spec.constexprs = vec![0];
    let rows = def.lower(&spec, &hopper).expect("wgmma lowering");
    let producer = &rows.source[rows
        .source
        .find("for (int kt = kt_lo")
        .expect("producer loop")..];
    let load = producer.find("tf_tma_2d(").expect("the A load");
    assert!(!producer[..load].contains("tf_wait_flag"));
}

/// The all-gather's SM copy kernel (hand-written CUDA in the runtime) compiles
/// for both architectures without spilling.
#[test]
fn the_all_gather_copy_kernel_compiles() {
    if !common::nvrtc_or_skip() {
        return;
    }
    // Its compiles count too: not while another test counts its own.
    let _alone = COMPILES.lock().unwrap_or_else(|p| p.into_inner());
    for arch in ARCHS {
        let log = tilefuse::runtime::dist::copy_kernel_report(arch)
            .unwrap_or_else(|e| panic!("the copy kernel for {arch}: {e}"));
        assert!(log.contains("0 bytes spill stores"), "{arch}:\n{log}");
        assert!(!log.contains("warning"), "{arch}:\n{log}");
    }
}

/// Variable-length attention (bounds loaded per sequence, a program's query
/// rows a range of one block) compiles on the attention lowering, causal and
/// not: the Hopper program at its defaults for head dimensions 64 and 128
/// for sm_90a without spills (as the batched kernel: `wgmma` never
/// serialized), the `mma.sync` program for both architectures.
#[test]
fn varlen_attention_compiles_on_the_attention_programs() {
    let def = attention::attention_varlen::kernel();
    let ir = def.ir().expect("the kernel's IR");
    // dims: b, th, tq, td, tm, tn.
    let portable = Config::new(&[1, 1, 128, 64, 128, 64]).num_warps(4);
    let specs: Vec<Spec> = [0, 1]
        .into_iter()
        .map(|c| {
            let mut spec = def.declared_spec().expect("declared dtypes");
            spec.constexprs = vec![c];
            let lowered = def.lower(&spec, &portable).expect("lowers");
            assert_eq!(lowered.path, "attention (mma.sync, flash)");
            spec
        })
        .collect();
    compile_all(def, &specs, std::slice::from_ref(&portable));
    if !common::nvrtc_or_skip() {
        return;
    }
    let _alone = COMPILES.lock().unwrap_or_else(|p| p.into_inner());
    let hopper = tilefuse::codegen::default_wgmma_attention(ir).expect("a Hopper config");
    for d in [64, 128] {
        let mut cfg = hopper.clone();
        cfg.block_sizes[3] = d;
        for spec in &specs {
            let lowered = def.lower(spec, &cfg).expect("lowers");
            assert_eq!(lowered.path, "attention (wgmma)");
            let log = tilefuse::jit::resource_report(def.name(), &lowered.source, "sm_90a")
                .unwrap_or_else(|e| panic!("{} {cfg}: {e}", def.name()));
            no_warnings(&format!("{} {cfg}", def.name()), &log);
            assert!(!log.contains("C7510"), "{cfg}: wgmma serialized:\n{log}");
            let spilled = spill_stores(&log).unwrap_or_else(|| panic!("no report in\n{log}"));
            assert!(
                spilled <= spill_allowed(),
                "{cfg} {:?} spills {spilled} bytes:\n{log}",
                spec.constexprs
            );
        }
    }
}
