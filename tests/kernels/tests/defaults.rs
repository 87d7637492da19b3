//! The untuned configs and code the corpus benchmarks measured (no GPU or
//! NVRTC needed): each test pins a choice of the defaults or the row emitter
//! that an H200 run found faster, so a change that undoes it fails here
//! first (docs/perf-history.md, "Loads issued together in row steps;
//! defaults from the sweeps").

use tilefuse::codegen::{default_config_at, fit_default, Config, Target};
use tilefuse::KernelDef;

const H200: Target = Target {
    shared_limit: 227 * 1024,
    wgmma: true,
    sms: 132,
};

fn kernel(name: &str) -> &'static KernelDef {
    tilefuse_kernels::cases()
        .into_iter()
        .flat_map(|c| (c.kernels)())
        .find(|k| k.name() == name)
        .unwrap_or_else(|| panic!("`{name}` is not in the corpus"))
}

/// The config an untuned launch at these extents takes, as the runtime fits it.
fn launch_default(def: &KernelDef, extents: &[usize]) -> Config {
    let ir = def.ir().unwrap();
    let spec = def.declared_spec().unwrap();
    let ext: Vec<Option<usize>> = extents.iter().map(|&e| Some(e)).collect();
    fit_default(ir, default_config_at(ir, &spec, H200, &ext), &ext)
}

fn source(def: &KernelDef, cfg: &Config) -> String {
    let spec = def.declared_spec().unwrap();
    def.lower(&spec, cfg).unwrap().source
}

/// layer_norm_bwd's first walk reads `weight` and `dy`, reduces `wdy`, then
/// reads `x` for the second sum: all three loads are issued before the
/// first reduction's shuffles, not `x` after them.
#[test]
fn a_row_step_issues_its_loads_before_its_reductions() {
    let def = kernel("layer_norm_bwd");
    let src = source(def, &Config::new(&[1, 8192, 8192]).num_warps(8));
    let first = src.find("for (long long tb1").expect("a first walk");
    let second = src.find("for (long long tb2").expect("a second walk");
    let walk = &src[first..second];
    let shuffle = walk.find("__shfl_xor_sync").expect("a reduction");
    let loads: Vec<usize> = walk
        .match_indices("const unsigned short* tf_p = t")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(loads.len(), 3, "weight, dy and x:\n{walk}");
    assert!(
        loads.iter().all(|&l| l < shuffle),
        "a load after the first reduction:\n{walk}"
    );
}

/// Rows of 8192 held by 8 warps: layer_norm_bwd and rms_norm_bwd keep three
/// tensors' rows across their walks, where ptxas would take two blocks an
/// SM; the launch bounds ask for three. softmax, whose registers allow four,
/// keeps four.
#[test]
fn wide_rows_keep_three_blocks_an_sm() {
    for (name, blocks) in [("layer_norm_bwd", 3), ("rms_norm_bwd", 3), ("softmax", 4)] {
        let def = kernel(name);
        let cfg = launch_default(def, &[16384, 8192, 8192]);
        assert_eq!(cfg.block_sizes, [1, 8192, 8192], "{name}");
        assert_eq!((cfg.num_warps, cfg.occupancy), (8, 0), "{name}");
        let bounds = format!("__launch_bounds__(256, {blocks})");
        assert!(source(def, &cfg).contains(&bounds), "{name}: {bounds}");
    }
}

/// long_row_sum's chunks of a row, shared among programs: 8192 columns a
/// step and 8 warps (four steps a 32768-column chunk), not 4096 and 4.
#[test]
fn a_loop_shared_along_its_row_takes_wide_steps() {
    let def = kernel("long_row_sum");
    let cfg = launch_default(def, &[4, 128, 32768]);
    assert_eq!(cfg.block_sizes, [1, 1, 8192]);
    assert_eq!(cfg.num_warps, 8);
    assert!(cfg.split > 1, "{cfg}");
    // A column reduction's walk down the rows keeps its one-warp tile.
    let def = kernel("col_sum");
    let cfg = launch_default(def, &[8192, 16384]);
    assert_eq!(cfg.num_warps, 1, "{cfg}");
}

/// index_select gathers along its rows (staged through shared memory): 8
/// warps share a program's copies and values.
#[test]
fn a_staged_gather_takes_eight_warps() {
    let def = kernel("index_select");
    let cfg = launch_default(def, &[16384, 4096]);
    assert_eq!(cfg.block_sizes, [1, 4096]);
    assert_eq!(cfg.num_warps, 8);
    // A plain copy of the same shape keeps 4.
    let def = kernel("add");
    assert_eq!(launch_default(def, &[16384, 8192]).num_warps, 4);
}
