//! The user crate's kernels compile with NVRTC (when it is there) and compute the
//! right thing: on a GPU when there is one, else in interpret mode on the CPU.
//! The compile test skips with a message without NVRTC; TILEFUSE_REQUIRE_NVRTC=1 /
//! TILEFUSE_REQUIRE_GPU=1 make a skip (or interpret mode) a failure.

use tilefuse::prelude::*;
use tilefuse_testkit::{random_tensor, rel_error};
use tilefuse_user_example::{linear_residual, swiglu};

fn require(var: &str) -> bool {
    std::env::var(var).as_deref() == Ok("1")
}

#[test]
fn kernels_compile_for_hopper_and_ampere() {
    if !tilefuse::runtime::libs::nvrtc_present() {
        assert!(
            !require("TILEFUSE_REQUIRE_NVRTC") && !require("TILEFUSE_REQUIRE_GPU"),
            "NVRTC is required"
        );
        eprintln!("SKIPPED: NVRTC is not on the library path");
        return;
    }
    for def in [swiglu::kernel(), linear_residual::kernel()] {
        let spec = def.declared_spec().unwrap();
        let cfg = def.config().unwrap();
        for arch in ["sm_90a", "sm_80"] {
            let cubin = def
                .compile(&spec, &cfg, arch)
                .unwrap_or_else(|e| panic!("{}: {e}", def.name()));
            assert!(
                cubin.image.starts_with(b"\x7fELF"),
                "a cubin is an ELF image"
            );
        }
    }
    // The pinned config reached the kernel definition.
    assert_eq!(
        linear_residual::kernel().config().unwrap().block_sizes,
        vec![64, 64, 32]
    );
}

#[test]
fn kernels_match_host_references() {
    match Device::current() {
        // Without a GPU, interpret mode (TILEFUSE_INTERPRET=0 makes that an error).
        Ok(d) if d.is_host() => eprintln!("no GPU: the kernels run in interpret mode"),
        Ok(_) => {}
        Err(e) => {
            assert!(
                !require("TILEFUSE_REQUIRE_GPU"),
                "TILEFUSE_REQUIRE_GPU=1 but: {e}"
            );
            eprintln!("SKIPPED (no GPU, and TILEFUSE_INTERPRET=0): {e}");
            return;
        }
    }
    let (m, n, k) = (130, 200, 72);
    let gate = random_tensor::<bf16>([m, n], 4.0).unwrap();
    let up = random_tensor::<bf16>([m, n], 1.0).unwrap();
    let out = swiglu(&gate, &up, 0.5).unwrap();
    let (g, u) = (gate.to_vec().unwrap(), up.to_vec().unwrap());
    let reference: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(g, u)| {
            let g = g.to_f64();
            g / (1.0 + (-g).exp()) * u.to_f64() * 0.5
        })
        .collect();
    let err = rel_error(
        &out.to_vec().unwrap(),
        &reference,
        |x: bf16| x.to_f64(),
        |x| x,
    );
    assert!(err <= 1e-2, "swiglu rel err {err}");

    let x = random_tensor::<f16>([m, k], 1.0).unwrap();
    let w = random_tensor::<f16>([k, n], 1.0).unwrap();
    let r = random_tensor::<f16>([m, n], 1.0).unwrap();
    let out = linear_residual(&x, &w, &r).unwrap();
    let to64 = |t: &Tensor<f16>| {
        t.to_vec()
            .unwrap()
            .into_iter()
            .map(|v| v.to_f64())
            .collect::<Vec<_>>()
    };
    let (xh, wh, rh) = (to64(&x), to64(&w), to64(&r));
    let mut reference = tilefuse_testkit::matmul_f64(&xh, &wh, m, k, n);
    for (o, r) in reference.iter_mut().zip(&rh) {
        *o += r;
    }
    let err = rel_error(
        &out.to_vec().unwrap(),
        &reference,
        |x: f16| x.to_f64(),
        |x| x,
    );
    assert!(err <= 1e-2, "linear_residual rel err {err}");
}
