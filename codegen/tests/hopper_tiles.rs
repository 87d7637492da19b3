//! The Hopper matmul default's tiles fitted to a launch's extents: pairs of
//! 128×256 blocks where the tiles need several waves, single blocks or
//! 128×128 ones where they need one at most.

mod common;

use common::*;
use tilefuse_codegen::{
    default_config_at, default_config_for, hopper_tiles, lower, Config, ConfigSpace, HopperTiles,
    Planned, Target,
};

const H200: Target = Target {
    shared_limit: 227 * 1024,
    wgmma: true,
    sms: 132,
};

/// `extents[d]` for a matmul launch of M×N×K.
fn extents(k: &Planned, m: usize, n: usize, kk: usize) -> Vec<Option<usize>> {
    let Some(g) = k.plan::<GemmShape>() else {
        panic!("not a matmul");
    };
    let mut e = vec![None; k.dims.len()];
    (e[g.m], e[g.n], e[g.k]) = (Some(m), Some(n), Some(kk));
    e
}

/// (M block, N block, blocks per cluster) of a config.
fn tile_of(k: &Planned, c: &Config) -> (usize, usize, usize) {
    let Some(g) = k.plan::<GemmShape>() else {
        panic!("not a matmul");
    };
    (c.block_sizes[g.m], c.block_sizes[g.n], c.cluster_m)
}

#[test]
fn tiles_follow_the_waves_they_need() {
    let k = Planned::new(matmul());
    let at = |m, n| hopper_tiles(&k, &extents(&k, m, n, 4096), 132);
    // 128×128 tiles fit one wave of 132 SMs.
    assert_eq!(at(1000, 1000), HopperTiles::Narrow); // 64 tiles
    assert_eq!(at(512, 4096), HopperTiles::Narrow); // 128
    assert_eq!(at(64, 4096), HopperTiles::Narrow); // 32
    assert_eq!(at(1536, 1408), HopperTiles::Narrow); // exactly 132
                                                     // One more column of tiles: 144 of 128×128, 72 of 128×256.
    assert_eq!(at(1536, 1409), HopperTiles::Wide);
    assert_eq!(at(2048, 2048), HopperTiles::Wide); // 128 of 128×256
    assert_eq!(at(1024, 4096), HopperTiles::Wide);
    // More than a wave of 128×256 tiles.
    assert_eq!(at(2048, 4096), HopperTiles::Pairs); // 256
    assert_eq!(at(8192, 8192), HopperTiles::Pairs);
    // Extents past any tensor: no overflow, several waves.
    assert_eq!(at(usize::MAX, usize::MAX), HopperTiles::Pairs);
    // On a GPU of half the SMs the same launch needs more waves.
    assert_eq!(
        hopper_tiles(&k, &extents(&k, 512, 4096, 4096), 66),
        HopperTiles::Wide
    );
}

#[test]
fn unknown_extents_or_sms_keep_the_pairs() {
    let k = Planned::new(matmul());
    assert_eq!(hopper_tiles(&k, &[], 132), HopperTiles::Pairs);
    let mut only_m = extents(&k, 512, 512, 512);
    let Some(g) = k.plan::<GemmShape>() else {
        unreachable!()
    };
    only_m[g.n] = None;
    assert_eq!(hopper_tiles(&k, &only_m, 132), HopperTiles::Pairs);
    assert_eq!(
        hopper_tiles(&k, &extents(&k, 512, 512, 512), 0),
        HopperTiles::Pairs
    );
    // Not a matmul: nothing to fit.
    let add = Planned::new(pointwise_2d());
    assert_eq!(
        hopper_tiles(&add, &[Some(64), Some(64)], 132),
        HopperTiles::Pairs
    );
}

#[test]
fn the_default_takes_the_tiles_of_its_extents_and_fits_the_gpu() {
    let k = Planned::new(matmul());
    let spec = declared_spec(&k);
    let pairs = default_config_for(&k, &spec, H200);
    assert_eq!(tile_of(&k, &pairs), (128, 256, 2));
    assert_eq!(default_config_at(&k, &spec, H200, &[]), pairs);
    assert_eq!(
        default_config_at(&k, &spec, H200, &extents(&k, 8192, 8192, 8192)),
        pairs
    );

    let wide = default_config_at(&k, &spec, H200, &extents(&k, 2048, 2048, 2048));
    assert_eq!(tile_of(&k, &wide), (128, 256, 1));
    assert_eq!(wide, pairs.clone().cluster_m(1));

    let narrow = default_config_at(&k, &spec, H200, &extents(&k, 1000, 1000, 1000));
    assert_eq!(tile_of(&k, &narrow), (128, 128, 1));
    assert!(
        narrow.wgmma && narrow.persistent && narrow.tma_store,
        "{narrow}"
    );
    assert_eq!(narrow.num_stages, 6, "{narrow}");
    for c in [&pairs, &wide, &narrow] {
        let l = lower(&k, &spec, c).unwrap_or_else(|e| panic!("{c}: {e}"));
        assert!(
            l.shared_bytes as usize <= H200.shared_limit,
            "{c}: {}",
            l.shared_bytes
        );
    }

    // Less shared memory: fewer stages, the same tiles.
    let small = Target {
        shared_limit: 160 * 1024,
        ..H200
    };
    let c = default_config_at(&k, &spec, small, &extents(&k, 1000, 1000, 1000));
    assert_eq!(tile_of(&k, &c), (128, 128, 1));
    assert!(c.num_stages < 6, "{c}");
    let l = lower(&k, &spec, &c).unwrap_or_else(|e| panic!("{c}: {e}"));
    assert!(l.shared_bytes as usize <= small.shared_limit, "{c}");
}

#[test]
fn staged_operands_and_portable_gpus_keep_their_paths() {
    let k = Planned::new(matmul());
    let ragged = unaligned_spec(&k);
    let c = default_config_at(&k, &ragged, H200, &extents(&k, 777, 2222, 3333));
    assert_eq!(tile_of(&k, &c), (128, 128, 1));
    assert!(c.wgmma && c.stage, "{c}");

    let portable = Target {
        wgmma: false,
        ..H200
    };
    let spec = declared_spec(&k);
    assert_eq!(
        default_config_at(&k, &spec, portable, &extents(&k, 1000, 1000, 1000)),
        default_config_for(&k, &spec, portable)
    );
}

#[test]
fn the_tuner_starts_from_the_default_of_its_extents() {
    let k = Planned::new(matmul());
    let spec = declared_spec(&k);
    let ext = extents(&k, 512, 4096, 4096);
    let space = ConfigSpace::new(&k, &spec, H200).with_extents(&ext);
    assert_eq!(
        space.default_config(),
        &default_config_at(&k, &spec, H200, &ext)
    );
    let seeds = space.seeds(&spec, true);
    assert_eq!(seeds[0], *space.default_config());
    assert!(space.fits(space.default_config(), &spec).is_ok());
    // Small tiles among the quick seeds: a 64-row block of one consumer
    // warpgroup, 128×128 blocks one per tile.
    let has = |bm, bn, warps| {
        seeds.iter().any(|c| {
            c.wgmma && tile_of(&k, c).0 == bm && tile_of(&k, c).1 == bn && c.num_warps == warps
        })
    };
    assert!(has(64, 256, 4) && has(128, 192, 8), "{seeds:?}");
    // A launch of several waves: its quick seeds are the proven large ones.
    let big = ConfigSpace::new(&k, &spec, H200).with_extents(&extents(&k, 8192, 8192, 8192));
    let big_seeds = big.seeds(&spec, true);
    assert!(
        !big_seeds.iter().any(|c| c.wgmma && tile_of(&k, c).0 == 64),
        "{big_seeds:?}"
    );
    assert_eq!(
        big_seeds,
        ConfigSpace::new(&k, &spec, H200).seeds(&spec, true)
    );
}
