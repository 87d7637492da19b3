//! Interpret mode against the GPU: the same kernel, inputs and config run on
//! both (`tilefuse::interpret` on the CPU), compared within bf16 tolerance, at
//! ragged shapes of the GPU tests.

use crate::common::examples::{rms_norm, softmax};
use crate::common::interp::{out, scalars, tensors};
use crate::common::{gpu, host};
use crate::matmul::mm_bf16;
use tilefuse::codegen::DType;
use tilefuse::interpret::{run, HostTensor, Scalar};
use tilefuse::prelude::*;
use tilefuse::verify::{poisoned, random_tensor, rel_error};

fn on_host(t: &Tensor<bf16>, shape: &[usize]) -> HostTensor {
    HostTensor::from_f64(DType::BF16, shape, host(t)).unwrap()
}

fn agree(what: &str, gpu: &Tensor<bf16>, cpu: &[f64]) {
    let err = rel_error(&host(gpu), cpu, |v| v, |v| v);
    eprintln!("{what}: GPU vs interpret rel err {err:.2e}");
    assert!(err <= 1e-2, "{what}: GPU vs interpret rel err {err}");
}

#[test]
fn interpret_mode_agrees_with_the_gpu() {
    let Some(dev) = gpu() else { return };
    for (m, n, k) in [(127, 264, 72), (333, 392, 264)] {
        let a = random_tensor::<bf16>([m, k], 1.0).unwrap();
        let b = random_tensor::<bf16>([k, n], 1.0).unwrap();
        let c = poisoned::<bf16>([m, n]).unwrap();
        mm_bf16(&a, &b, &c).unwrap();
        // The interpreter takes the launch's block sizes (the Hopper path's on an H100/H200).
        let cfg = mm_bf16::kernel().config_on(&dev).unwrap();
        let ir = mm_bf16::kernel().ir().unwrap().clone();
        let t = tensors(
            &ir,
            vec![
                ("a", on_host(&a, &[m, k])),
                ("b", on_host(&b, &[k, n])),
                ("out", HostTensor::filled(DType::BF16, &[m, n], f64::NAN)),
            ],
        );
        let s = scalars(
            &ir,
            &[
                ("m", Scalar::Int(m as i64)),
                ("n", Scalar::Int(n as i64)),
                ("k", Scalar::Int(k as i64)),
            ],
        );
        run(&ir, &cfg, &[], &t, &s).unwrap();
        agree(
            &format!("matmul {m}x{n}x{k} {cfg}"),
            &c,
            &out(&ir, &t, "out"),
        );
    }

    let (m, n) = (130, 1000);
    let x = random_tensor::<bf16>([m, n], 1.0).unwrap();
    let w = random_tensor::<bf16>([n], 1.0).unwrap();
    let named = [
        ("m", Scalar::Int(m as i64)),
        ("n", Scalar::Int(n as i64)),
        ("n as f32", Scalar::Float(n as f32)),
        ("eps", Scalar::Float(1e-5)),
    ];
    let y = poisoned::<bf16>([m, n]).unwrap();
    softmax::softmax(&x, &y).unwrap();
    let def = softmax::softmax::kernel();
    let (cfg, ir) = (def.config_on(&dev).unwrap(), def.ir().unwrap().clone());
    let t = tensors(
        &ir,
        vec![
            ("x", on_host(&x, &[m, n])),
            ("out", HostTensor::filled(DType::BF16, &[m, n], f64::NAN)),
        ],
    );
    run(&ir, &cfg, &[], &t, &scalars(&ir, &named)).unwrap();
    agree(&format!("softmax {m}x{n} {cfg}"), &y, &out(&ir, &t, "out"));

    let y = poisoned::<bf16>([m, n]).unwrap();
    rms_norm::rms_norm(&x, &w, &y, 1e-5).unwrap();
    let def = rms_norm::rms_norm::kernel();
    let (cfg, ir) = (def.config_on(&dev).unwrap(), def.ir().unwrap().clone());
    let t = tensors(
        &ir,
        vec![
            ("x", on_host(&x, &[m, n])),
            ("weight", on_host(&w, &[n])),
            ("out", HostTensor::filled(DType::BF16, &[m, n], f64::NAN)),
        ],
    );
    run(&ir, &cfg, &[], &t, &scalars(&ir, &named)).unwrap();
    agree(&format!("rms_norm {m}x{n} {cfg}"), &y, &out(&ir, &t, "out"));
}
