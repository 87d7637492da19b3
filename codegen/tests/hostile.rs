//! What a careless or hostile config, spec or extent does to the compiler: an
//! error or a lowering, never a panic (a panic in a proc macro or at a launch
//! takes the user's program with it).

mod common;
use common::*;
use tilefuse_codegen::config::Target;
use tilefuse_codegen::default_config_at;

fn kernels() -> Vec<Kernel> {
    vec![
        matmul(),
        matmul_bias_gelu(),
        pointwise_2d(),
        pointwise_1d(),
        rows_inner_loop(),
    ]
}

/// Every block size, warp count and stage count from nothing to absurd.
fn configs(k: &Kernel) -> Vec<Config> {
    let n = k.dims.len();
    let mut out = Vec::new();
    for b in [0usize, 1, 3, 1 << 20, 1 << 40, usize::MAX] {
        for warps in [0usize, 1, 4, 33, 1 << 20] {
            for stages in [0usize, 1, 4, 1 << 20] {
                out.push(Config::new(&vec![b; n]).num_warps(warps).num_stages(stages));
            }
        }
    }
    // Too few and too many block sizes.
    out.push(Config::new(&[]));
    out.push(Config::new(&vec![16; n + 3]));
    out
}

#[test]
fn absurd_configs_are_errors_not_panics() {
    for k in kernels() {
        let spec = declared_spec(&k);
        for cfg in configs(&k) {
            let r = std::panic::catch_unwind(|| lower(&plan(&k), &spec, &cfg).map(drop));
            assert!(r.is_ok(), "`{}` with {cfg} panicked", k.name);
        }
    }
}

#[test]
fn absurd_extents_give_a_default_not_a_panic() {
    for k in kernels() {
        let spec = declared_spec(&k);
        for target in [
            Target {
                shared_limit: 0,
                wgmma: false,
                sms: 0,
            },
            Target {
                shared_limit: 232448,
                wgmma: true,
                sms: 132,
            },
            Target {
                shared_limit: usize::MAX,
                wgmma: true,
                sms: usize::MAX,
            },
        ] {
            for e in [0usize, 1, 1 << 40, usize::MAX] {
                let extents = vec![Some(e); k.dims.len()];
                let r = std::panic::catch_unwind(|| {
                    default_config_at(&plan(&k), &spec, target, &extents)
                });
                assert!(
                    r.is_ok(),
                    "`{}` at extents {e} on {target:?} panicked",
                    k.name
                );
            }
        }
    }
}
