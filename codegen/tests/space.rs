//! The autotuner's search space: derived from the IR, pruned before compiling.

mod common;

use common::*;
use tilefuse_codegen::{Axis, ConfigSpace, Target};

const H200_SHARED: usize = 227 * 1024;

/// A GPU with `shared` bytes per block and no Hopper instructions.
fn portable(shared: usize) -> Target {
    Target {
        shared_limit: shared,
        wgmma: false,
        sms: 132,
    }
}

#[test]
fn gemm_space_has_block_warp_stage_and_group_axes() {
    let k = Planned::new(matmul());
    let space = ConfigSpace::new(&k, &declared_spec(&k), portable(H200_SHARED));
    let names: Vec<String> = space.axes().iter().map(Axis::name).collect();
    assert_eq!(
        names,
        [
            "block_sizes[0]",
            "block_sizes[1]",
            "block_sizes[2]",
            "num_warps",
            "num_stages",
            "group_m"
        ]
    );
    assert!(space.size() > 1000, "{}", space.size());
    assert_eq!(space.default_config(), &default_config(&k));
}

#[test]
fn seeds_start_with_the_default_and_all_fit() {
    let k = Planned::new(matmul());
    let spec = declared_spec(&k);
    let space = ConfigSpace::new(&k, &spec, portable(H200_SHARED));
    let seeds = space.seeds(&spec, false);
    assert_eq!(seeds[0], default_config(&k));
    assert!(seeds.len() >= 8, "{seeds:?}");
    for c in &seeds {
        space.fits(c, &spec).unwrap_or_else(|e| panic!("{c}: {e}"));
    }
    let quick = space.seeds(&spec, true);
    assert!(quick.len() < seeds.len() && quick.len() >= 4);
    let mut dedup = seeds.clone();
    dedup.dedup();
    assert_eq!(dedup.len(), seeds.len());
}

#[test]
fn pruning_names_what_does_not_fit() {
    let k = Planned::new(matmul());
    let spec = declared_spec(&k);
    // An A100-class limit: 128x256x64 with 4 stages (192 KB) does not fit, and the
    // default drops to 3 stages.
    let space = ConfigSpace::new(&k, &spec, portable(164 * 1024));
    assert_eq!(space.default_config().num_stages, 3);
    let big = Config::new(&[128, 256, 64]).num_warps(8).num_stages(4);
    let e = space.fits(&big, &spec).unwrap_err();
    assert!(e.contains("shared memory"), "{e}");
    // 256x256 on 4 warps: 512 accumulators a thread.
    let e = space
        .fits(
            &Config::new(&[256, 256, 32]).num_warps(4).num_stages(2),
            &spec,
        )
        .unwrap_err();
    assert!(e.contains("accumulators"), "{e}");
    // Every seed fits the smaller GPU.
    for c in space.seeds(&spec, false) {
        assert!(space.fits(&c, &spec).is_ok(), "{c}");
        assert!(
            c.num_stages * (c.block_sizes[0] + c.block_sizes[1]) * c.block_sizes[2] * 2
                <= 164 * 1024
        );
    }
}

#[test]
fn neighbors_are_one_step_along_one_axis_and_fit() {
    let k = Planned::new(matmul());
    let spec = declared_spec(&k);
    let space = ConfigSpace::new(&k, &spec, portable(H200_SHARED));
    let c = Config::new(&[128, 128, 64]).num_warps(4).num_stages(3);
    let ns = space.neighbors(&c, &spec);
    assert!(!ns.is_empty());
    for n in &ns {
        let changed = [
            n.block_sizes[0] != c.block_sizes[0],
            n.block_sizes[1] != c.block_sizes[1],
            n.block_sizes[2] != c.block_sizes[2],
            n.num_warps != c.num_warps,
            n.num_stages != c.num_stages,
            n.group_m != c.group_m,
        ];
        assert_eq!(changed.iter().filter(|&&x| x).count(), 1, "{n}");
        assert!(space.fits(n, &spec).is_ok(), "{n}");
    }
    // Both directions along the stage axis.
    assert!(ns.iter().any(|n| n.num_stages == 2));
    assert!(ns.iter().any(|n| n.num_stages == 4));
    // An off-grid value still gets its nearest neighbours.
    let odd = Config::new(&[128, 128, 64])
        .num_warps(4)
        .num_stages(3)
        .group_m(6);
    let ns = space.neighbors(&odd, &spec);
    assert!(ns.iter().any(|n| n.group_m == 4) && ns.iter().any(|n| n.group_m == 8));
}

#[test]
fn pointwise_space_tunes_the_contiguous_block_and_warps() {
    let k = Planned::new(pointwise_2d());
    let spec = pointwise_2d_spec();
    let space = ConfigSpace::new(&k, &spec, portable(H200_SHARED));
    assert!(space
        .axes()
        .iter()
        .all(|a| !matches!(a, Axis::Stages(_) | Axis::GroupM(_))));
    let seeds = space.seeds(&spec, false);
    assert_eq!(seeds[0], default_config(&k));
    assert!(seeds.len() >= 4);
    for c in &seeds {
        assert!(space.fits(c, &spec).is_ok(), "{c}");
    }
}

#[test]
fn on_hopper_the_default_and_seeds_take_the_wgmma_path_when_the_spec_allows() {
    let k = Planned::new(matmul());
    let spec = declared_spec(&k);
    let h200 = Target {
        shared_limit: H200_SHARED,
        wgmma: true,
        sms: 132,
    };
    let space = ConfigSpace::new(&k, &spec, h200);
    assert!(space.default_config().wgmma, "{}", space.default_config());
    let seeds = space.seeds(&spec, true);
    assert!(seeds.iter().filter(|c| c.wgmma).count() >= 3, "{seeds:?}");
    // The TMA-store epilogue: an axis, and the fastest seed's twin in the quick set.
    assert!(space.axes().contains(&Axis::TmaStore));
    assert!(seeds.contains(&space.default_config().clone().tma_store(true)));
    // Every Hopper seed stores through TMA, but the fastest one also as fragments.
    assert_eq!(
        seeds.iter().filter(|c| c.wgmma && !c.tma_store).count(),
        1,
        "{seeds:?}"
    );
    assert!(
        seeds.iter().any(|c| !c.wgmma),
        "the portable path stays in the space"
    );
    for c in &seeds {
        assert!(space.fits(c, &spec).is_ok(), "{c}");
    }
    // Rows TMA cannot load (2-byte alignment): the Hopper default with staged
    // operands, every wgmma seed staged, and the portable path both ways.
    let ragged = unaligned_spec(&k);
    let space = ConfigSpace::new(&k, &ragged, h200);
    let d = space.default_config();
    assert!(d.wgmma && d.stage, "{d}");
    assert!(space.axes().contains(&Axis::Stage));
    let seeds = space.seeds(&ragged, false);
    assert!(seeds.iter().filter(|c| c.wgmma).all(|c| c.stage));
    // The output's rows are not 16-byte aligned either: no TMA store.
    assert!(seeds.iter().all(|c| !c.tma_store), "{seeds:?}");
    assert!(seeds.iter().any(|c| !c.wgmma && c.stage));
    assert!(seeds.iter().any(|c| !c.wgmma && !c.stage));
    for c in &seeds {
        assert!(space.fits(c, &ragged).is_ok(), "{c}");
    }
    // Unstaged, the Hopper path refuses those rows.
    let e = space.fits(&d.clone().stage(false), &ragged).unwrap_err();
    assert!(e.contains("16-byte aligned rows"), "{e}");
    // Aligned operands have no stage axis.
    let space = ConfigSpace::new(&k, &spec, h200);
    assert!(!space.axes().contains(&Axis::Stage));
    assert!(!space.default_config().stage);
}
