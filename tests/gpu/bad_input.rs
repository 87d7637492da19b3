//! Bad input is an error naming the argument, before anything is launched.

use crate::common::gpu;
use crate::matmul::mm_bf16 as mm;
use tilefuse::prelude::*;
use tilefuse_testkit::{poisoned, random_tensor};

fn arg_error(e: tilefuse::Error) -> (String, String) {
    match e {
        tilefuse::Error::Argument { arg, message, .. } => (arg, message),
        other => panic!("expected an argument error, got: {other}"),
    }
}

fn untouched(out: &Tensor<bf16>) -> bool {
    out.to_vec().unwrap().iter().all(|v| v.is_nan())
}

#[test]
fn mismatched_inner_dimension() {
    let Some(_dev) = gpu() else { return };
    let a = random_tensor::<bf16>([64, 100], 1.0).unwrap();
    let b = random_tensor::<bf16>([101, 32], 1.0).unwrap();
    let out = poisoned::<bf16>([64, 32]).unwrap();
    let (arg, msg) = arg_error(mm(&a, &b, &out).unwrap_err());
    assert_eq!(arg, "b");
    assert!(
        msg.contains("dimension 0 has size 101") && msg.contains("tk"),
        "{msg}"
    );
    assert!(untouched(&out), "nothing may be launched");
}

#[test]
fn wrong_output_shape() {
    let Some(_dev) = gpu() else { return };
    let a = random_tensor::<bf16>([64, 100], 1.0).unwrap();
    let b = random_tensor::<bf16>([100, 32], 1.0).unwrap();
    let out = poisoned::<bf16>([64, 33]).unwrap();
    let (arg, msg) = arg_error(mm(&a, &b, &out).unwrap_err());
    assert_eq!(arg, "out");
    assert!(msg.contains("dimension 1 has size 33"), "{msg}");
    assert!(untouched(&out));
}

#[test]
fn non_contiguous_operand() {
    let Some(_dev) = gpu() else { return };
    let a = random_tensor::<bf16>([64, 100], 1.0).unwrap();
    let b_t = random_tensor::<bf16>([32, 100], 1.0).unwrap();
    let out = poisoned::<bf16>([64, 32]).unwrap();
    let (arg, msg) = arg_error(mm(&a, &b_t.t().unwrap(), &out).unwrap_err());
    assert_eq!(arg, "b");
    assert!(msg.contains("contiguous"), "{msg}");
    assert!(untouched(&out));
}

#[test]
fn wrong_rank() {
    let Some(_dev) = gpu() else { return };
    let a = random_tensor::<bf16>([4, 64, 100], 1.0).unwrap();
    let b = random_tensor::<bf16>([100, 32], 1.0).unwrap();
    let out = poisoned::<bf16>([64, 32]).unwrap();
    let (arg, msg) = arg_error(mm(&a, &b, &out).unwrap_err());
    assert_eq!(arg, "a");
    assert!(msg.contains("2-D"), "{msg}");
}

/// The typed host function rules out a wrong dtype at compile time; the launch
/// underneath still checks when called directly.
#[test]
fn wrong_dtype_at_launch() {
    let Some(_dev) = gpu() else { return };
    use tilefuse::__private::{AsTensorArg, IntoScalar};
    let a = random_tensor::<f16>([64, 100], 1.0).unwrap();
    let b = random_tensor::<bf16>([100, 32], 1.0).unwrap();
    let out = poisoned::<bf16>([64, 32]).unwrap();
    let tensors = [a.tensor_arg(), b.tensor_arg(), out.tensor_arg()];
    let scalars = [
        64usize.into_scalar(),
        32usize.into_scalar(),
        100usize.into_scalar(),
    ];
    let (arg, msg) = arg_error(mm::kernel().launch(&tensors, &scalars, &[]).unwrap_err());
    assert_eq!(arg, "a");
    assert!(
        msg.contains("Tensor<bf16>") && msg.contains("Tensor<f16>"),
        "{msg}"
    );
    assert!(untouched(&out));
}
