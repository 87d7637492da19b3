//! Kernels that reduce tiles (softmax, RMSNorm, LayerNorm): what they lower to for
//! their configs, the configs they refuse, and their tuning space. No GPU needed.

mod common;

use common::examples::{layer_norm::layer_norm, rms_norm::rms_norm, softmax::softmax};
use tilefuse::codegen::{Axis, Config, ConfigSpace, Target};

const H200: Target = Target {
    shared_limit: 227 * 1024,
    wgmma: true,
    sms: 132,
};

#[test]
fn row_kernels_lower_to_the_row_path_with_vector_loads() {
    for def in [softmax::kernel(), rms_norm::kernel(), layer_norm::kernel()] {
        let spec = def.declared_spec().unwrap();
        let ir = def.ir().unwrap();
        let d = tilefuse::codegen::default_config(ir);
        let l = def.lower(&spec, &d).unwrap();
        assert_eq!(l.path, "rows", "{}", def.name());
        // Rows 16-byte aligned: 8 bf16 a load; the ragged edge element by element.
        assert!(l.source.contains("const uint4* tf_q"), "{}", def.name());
        assert!(l.source.contains("__shfl_xor_sync"), "{}", def.name());
        // Unaligned rows: no vector loads.
        let mut ragged = spec.clone();
        ragged.tensors[0].align = 2;
        let l = def.lower(&ragged, &d).unwrap();
        assert!(!l.source.contains("(const uint4*)(t0"), "{}", def.name());
    }
}

#[test]
fn a_row_spread_over_warps_meets_in_shared_memory() {
    let def = softmax::kernel();
    let spec = def.declared_spec().unwrap();
    // One row per program, 8 warps: 256 lanes per row.
    let cfg = Config::new(&[1, 8192, 8192]).num_warps(8);
    let l = def.lower(&spec, &cfg).unwrap();
    assert!(l.source.contains("__shared__ float tf_red["));
    assert!(l.source.contains("__syncthreads()"));
    // A warp per row: shuffles only.
    let l = def
        .lower(&spec, &Config::new(&[4, 1024, 1024]).num_warps(4))
        .unwrap();
    assert!(!l.source.contains("tf_red["));
}

#[test]
fn configs_a_row_kernel_cannot_run_are_refused_with_the_reason() {
    let def = softmax::kernel();
    let spec = def.declared_spec().unwrap();
    let e = def
        .lower(&spec, &Config::new(&[4, 100, 1024]).num_warps(4))
        .unwrap_err()
        .to_string();
    assert!(e.contains("multiple of 256"), "{e}");
    let e = def
        .lower(&spec, &Config::new(&[4, 8192, 1024]).num_warps(4))
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 64"), "{e}");
    let e = def
        .lower(&spec, &Config::new(&[3, 1024, 1024]).num_warps(4))
        .unwrap_err()
        .to_string();
    assert!(e.contains("power of two"), "{e}");
    let e = def
        .lower(
            &spec,
            &Config::new(&[4, 1024, 1024]).num_warps(4).wgmma(true),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("elementwise") || e.contains("matmul"), "{e}");
}

#[test]
fn the_tuning_space_of_a_row_kernel_spans_rows_columns_and_warps() {
    let def = rms_norm::kernel();
    let spec = def.declared_spec().unwrap();
    let space = ConfigSpace::new(def.ir().unwrap(), &spec, H200);
    let names: Vec<String> = space.axes().iter().map(Axis::name).collect();
    // Each `tile()` loop's columns (two walks over the row), the rows, the warps.
    assert_eq!(
        names,
        [
            "block_sizes[1]",
            "block_sizes[2]",
            "block_sizes[0]",
            "num_warps",
            "occupancy"
        ]
    );
    let seeds = space.seeds(&spec, true);
    let one_pass = Config::new(&[1, 8192, 8192]).num_warps(8);
    space.fits(&one_pass, &spec).unwrap();
    assert!(seeds.len() >= 5, "{seeds:?}");
    for c in &seeds {
        space.fits(c, &spec).unwrap_or_else(|e| panic!("{c}: {e}"));
    }
    // One pass over 8192 columns is among them.
    assert!(seeds
        .iter()
        .any(|c| c.block_sizes[1] == 8192 && c.block_sizes[2] == 8192));
}

/// A second walk over the row with the same column block reads the registers the
/// first walk filled, and loads again only when the row took several steps; 16-bit
/// values stay packed two to a register.
#[test]
fn a_second_walk_reuses_the_first_walks_registers() {
    let def = softmax::kernel();
    let spec = def.declared_spec().unwrap();
    let same = def
        .lower(&spec, &Config::new(&[1, 8192, 8192]).num_warps(8))
        .unwrap();
    let src = &same.source;
    let decl = src
        .find("tf_u32 tf_keep0[1][16];")
        .expect("a packed kept array");
    let first = src.find("for (long long tb1").unwrap();
    let second = src.find("for (long long tb2").unwrap();
    assert!(decl < first, "declared before the first walk");
    let again = src
        .find("if (s1 > B2) {")
        .expect("a reload when not one step");
    assert!(second < again);
    // x is read in the first walk and in the reload: no other loads of it.
    assert_eq!(
        src.matches("const unsigned short* tf_p = t0 +").count(),
        2,
        "{src}"
    );
    // Different blocks per walk: each walk loads its own chunk, nothing is kept.
    let apart = def
        .lower(&spec, &Config::new(&[2, 4096, 2048]).num_warps(16))
        .unwrap();
    assert!(!apart.source.contains("tf_keep"));
    assert_eq!(
        apart
            .source
            .matches("const unsigned short* tf_p = t0 +")
            .count(),
        2
    );
}

/// `occupancy` sets the launch bounds of a row kernel (resident threads per SM);
/// out-of-range values and other kernels' use of it are refused with the reason.
#[test]
fn occupancy_sets_the_launch_bounds_of_row_kernels() {
    let def = rms_norm::kernel();
    let spec = def.declared_spec().unwrap();
    let base = Config::new(&[1, 8192, 8192]).num_warps(8);
    let l = def.lower(&spec, &base.clone().occupancy(768)).unwrap();
    assert!(l.source.contains("__launch_bounds__(256, 3)"));
    let l = def.lower(&spec, &base.clone().occupancy(512)).unwrap();
    assert!(l.source.contains("__launch_bounds__(256, 2)"));
    for bad in [128, 4096] {
        let e = def
            .lower(&spec, &base.clone().occupancy(bad))
            .unwrap_err()
            .to_string();
        assert!(e.contains("occupancy") && e.contains("2048"), "{e}");
    }
    let mm = common::examples::matmul::matmul::kernel();
    let mm_spec = mm.declared_spec().unwrap();
    let e = mm
        .lower(&mm_spec, &mm.config().unwrap().occupancy(1024))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`occupancy` is an option of the row and general lowerings"),
        "{e}"
    );
}

/// Masks: `tn.index()` is each column's index, a comparison gives a mask, and
/// `select` picks elementwise; cross-entropy picks its label's logit so.
#[test]
fn masks_pick_by_index() {
    let def = common::examples::cross_entropy::cross_entropy::kernel();
    let spec = def.declared_spec().unwrap();
    let ir = def.ir().unwrap();
    let l = def
        .lower(&spec, &tilefuse::codegen::default_config(ir))
        .unwrap();
    assert_eq!(l.path, "rows");
    let src = &l.source;
    // The comparison is a mask `select` picks by, per element (both sides
    // computed, as interpret mode does).
    assert!(src.contains("tf_select<float>(((long long)"), "{src}");
    assert!(src.contains(" == v0[i])"), "{src}");
    // The label is a 64-bit integer per row, loaded before the walk.
    let label = src
        .find("long long v0[1];  // label")
        .expect("the label per row");
    assert!(label < src.find("for (long long tb1").unwrap(), "{src}");
}

/// Untuned, a row kernel that walks its rows twice takes one pass over rows that
/// fit 8192 columns (the shape-blind default walks 1024 at a time and reads a
/// long row twice); short rows, single-walk kernels, matmuls and configs already
/// chosen keep theirs; the tuner's space starts from the same fitted default.
#[test]
fn the_untuned_row_default_fits_the_row_length() {
    use tilefuse::codegen::{default_config, fit_default};
    let ir = rms_norm::kernel().ir().unwrap();
    let d = default_config(ir);
    let grid = ir.grid[0];
    let at = |cols: usize| {
        let extents: Vec<Option<usize>> = (0..ir.dims.len())
            .map(|i| Some(if i == grid { 16384 } else { cols }))
            .collect();
        fit_default(ir, d.clone(), &extents)
    };
    let one_pass = |c: &Config, block: usize, warps: usize| {
        let rows = if block == 2048 { 2 } else { 1 };
        (0..ir.dims.len()).all(|i| c.block_sizes[i] == if i == grid { rows } else { block })
            && c.num_warps == warps
    };
    assert_eq!(at(1000), d, "a warp per row covers 1024 columns already");
    assert!(one_pass(&at(1500), 2048, 4), "{}", at(1500));
    assert!(one_pass(&at(3000), 4096, 4), "{}", at(3000));
    assert!(one_pass(&at(8192), 8192, 8), "{}", at(8192));
    assert!(one_pass(&at(50000), 8192, 8), "{}", at(50000));
    // Nothing known about the extents, or a config already chosen: unchanged.
    assert_eq!(fit_default(ir, d.clone(), &[]), d);
    let chosen = Config::new(&[2, 2048, 2048]).num_warps(16);
    assert_eq!(
        fit_default(ir, chosen.clone(), &[Some(16384), Some(8192), Some(8192)]),
        chosen
    );
    let spec = rms_norm::kernel().declared_spec().unwrap();
    let space =
        ConfigSpace::new(ir, &spec, H200).with_extents(&[Some(16384), Some(8192), Some(8192)]);
    assert!(one_pass(space.default_config(), 8192, 8));
    assert_eq!(space.seeds(&spec, true)[0], *space.default_config());
    // Three walks (LayerNorm with a two-pass variance): past 4096 columns the
    // first covers the row with 4 warps, the later ones take 2048 a step.
    let ln = tilefuse::codegen::Planned::new(
        tilefuse::codegen::ir::Kernel::parse(
            "kernel ln(x: Tensor<f32, 2>, out: Tensor<f32, 2>; m, n) {
           for tm in tile(m) {
             let mut s = zeros::<f32>([tm]);
             for tn in tile(n) { s = s + x[(tm, tn)].sum(tn); }
             let mu = s / 8192.0;
             let mut q = zeros::<f32>([tm]);
             for tn in tile(n) { q = q + ((x[(tm, tn)] - mu) * (x[(tm, tn)] - mu)).sum(tn); }
             for tn in tile(n) { out[(tm, tn)] = (x[(tm, tn)] - mu) * rsqrt(q / 8192.0 + 0.00001); }
           }
         }",
        )
        .unwrap(),
    );
    assert_eq!(ln.lowering(), "rows");
    let lnd = default_config(&ln);
    let ln_at = |cols: usize| {
        fit_default(
            &ln,
            lnd.clone(),
            &[Some(16384), Some(cols), Some(cols), Some(cols)],
        )
    };
    assert_eq!(ln_at(8192).block_sizes, [1, 8192, 4096, 2048]);
    assert_eq!(ln_at(8192).num_warps, 4);
    assert_eq!(ln_at(3000).block_sizes, [1, 4096, 4096, 4096]);
    assert_eq!(ln_at(50000).block_sizes, [1, 8192, 8192, 8192]);
    assert_eq!(ln_at(50000).num_warps, 8);
    // One online walk (cross-entropy) reads each element once: it keeps the default.
    let ce = common::examples::cross_entropy::cross_entropy::kernel()
        .ir()
        .unwrap();
    let cd = default_config(ce);
    assert_eq!(fit_default(ce, cd.clone(), &[Some(16384), Some(8192)]), cd);
    // Matmuls keep theirs.
    let mm = common::examples::matmul::matmul::kernel().ir().unwrap();
    let md = default_config(mm);
    assert_eq!(fit_default(mm, md.clone(), &[Some(4096); 3]), md);
}

/// The tuner weighs the general lowering against the row lowering: a row
/// kernel's seeds hold the general lowering's default (`Config::general`),
/// which lowers through the general lowering; a matmul's do not.
#[test]
fn the_tuner_weighs_the_general_lowering_on_row_kernels() {
    let def = softmax::kernel();
    let (ir, spec) = (def.ir().unwrap(), def.declared_spec().unwrap());
    let space =
        ConfigSpace::new(ir, &spec, H200).with_extents(&[Some(16384), Some(8192), Some(8192)]);
    for quick in [true, false] {
        let seeds = space.seeds(&spec, quick);
        assert!(!seeds[0].general, "the row default comes first");
        let general: Vec<&Config> = seeds.iter().filter(|c| c.general).collect();
        assert_eq!(general.len(), 1, "{seeds:?}");
        assert_eq!(*general[0], space.general_default());
        let l = def.lower(&spec, general[0]).unwrap();
        assert_eq!(l.path, "general");
        assert_eq!(def.lower(&spec, &seeds[0]).unwrap().path, "rows");
        // Neighbours of the general candidate stay general.
        for n in space.neighbors(general[0], &spec) {
            assert!(n.general, "{n}");
        }
    }
    // The GPU suite's general configs of the row kernels lower.
    for def in [softmax::kernel(), rms_norm::kernel(), layer_norm::kernel()] {
        let spec = def.declared_spec().unwrap();
        for bs in [[1, 8192, 8192], [4, 1024, 1024]] {
            let w = if bs[0] == 1 { 8 } else { 4 };
            let c = Config::new(&bs).num_warps(w).general(true);
            let l = def.lower(&spec, &c).unwrap_or_else(|e| panic!("{c}: {e}"));
            assert_eq!(l.path, "general", "{} {c}", def.name());
        }
    }
    let g = space.general_default();
    assert!(g.to_string().ends_with(", general"), "{g}");
    let json = serde_json::to_string(&g).unwrap();
    assert_eq!(serde_json::from_str::<Config>(&json).unwrap(), g);
    // Configs written before the field read as the registry's choice.
    let old: Config = serde_json::from_str(
        r#"{"block_sizes":[1,8192,8192],"num_warps":8,"num_stages":1,"group_m":8}"#,
    )
    .unwrap();
    assert!(!old.general);
    let mm = common::examples::matmul::matmul::kernel();
    let mm_spec = mm.declared_spec().unwrap();
    let mm_space = ConfigSpace::new(mm.ir().unwrap(), &mm_spec, H200);
    assert!(mm_space.seeds(&mm_spec, true).iter().all(|c| !c.general));
}
