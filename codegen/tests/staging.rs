//! Staged operands (`Config::stage`): which matmul operands are copied into
//! aligned rows before a launch, and what the kernel is compiled for then.

mod common;

use common::*;
use tilefuse_codegen::staging::unaligned_operands;
use tilefuse_codegen::{default_config_for, Target};

const A: usize = 0;
const B: usize = 1;

fn hopper_config() -> Config {
    Config::new(&[128, 256, 64])
        .num_warps(8)
        .num_stages(4)
        .wgmma(true)
}

/// `matmul`'s spec with A's rows 2-byte aligned (K odd) and B's 4-byte aligned.
fn ragged_spec(k: &Kernel) -> Spec {
    let mut spec = declared_spec(k);
    spec.tensors[A].align = 2;
    spec.tensors[B].align = 4;
    spec
}

#[test]
fn the_unaligned_operands_are_staged_and_compiled_as_aligned() {
    let k = Planned::new(matmul());
    let spec = ragged_spec(&k);
    assert_eq!(unaligned_operands(&k, &spec), vec![A, B]);
    let e = expect_config_err(lower(&k, &spec, &hopper_config()), "16-byte aligned rows");
    assert!(e.contains("`a`"), "{e}");
    let l = lowered(&k, &spec, &hopper_config().stage(true));
    assert_eq!(l.staged, vec![A, B]);
    assert_eq!(
        l.path,
        lowered(&k, &declared_spec(&k), &hopper_config()).path
    );
    // The portable path stages too (16-byte copies instead of 2-byte ones), and the
    // code (after the header naming the config) is what aligned operands get.
    let portable = gemm_config();
    let staged = lowered(&k, &spec, &portable.clone().stage(true));
    assert_eq!(staged.staged, vec![A, B]);
    let body = |l: &Lowered| kernel_part(l).split_once('\n').unwrap().1.to_string();
    assert_eq!(
        body(&staged),
        body(&lowered(&k, &declared_spec(&k), &portable))
    );
    assert!(lowered(&k, &spec, &portable).staged.is_empty());
}

#[test]
fn aligned_operands_and_outputs_are_not_staged() {
    let k = Planned::new(matmul());
    let spec = declared_spec(&k);
    assert!(unaligned_operands(&k, &spec).is_empty());
    assert!(lowered(&k, &spec, &hopper_config().stage(true))
        .staged
        .is_empty());
    // An unaligned output is written in place, never staged.
    let mut out_ragged = spec.clone();
    out_ragged.tensors[2].align = 2;
    assert!(unaligned_operands(&k, &out_ragged).is_empty());
    // Neither is an operand that is not contiguous along its rows.
    let mut strided = ragged_spec(&k);
    strided.tensors[A].last_contiguous = false;
    assert_eq!(unaligned_operands(&k, &strided), vec![B]);
}

#[test]
fn a_kernel_that_waits_for_its_operands_is_never_staged() {
    // A copy queued before the launch would read A before its chunks arrive.
    let mut k = matmul();
    k.tensors.push(tensor("flags", 1, Some(DType::U32)));
    k.body.insert(
        1,
        Stmt::Wait {
            tensor: 3,
            end: None,
            index: Expr::Int(0),
            value: Expr::Int(1),
            at: "wait(flags, 0, 1)".into(),
        },
    );
    let k = Planned::new(k);
    let spec = ragged_spec(&k);
    assert!(unaligned_operands(&k, &spec).is_empty());
    assert!(lowered(&k, &spec, &gemm_config().stage(true))
        .staged
        .is_empty());
    let h200 = Target {
        shared_limit: 227 * 1024,
        wgmma: true,
        sms: 132,
    };
    let d = default_config_for(&k, &spec, h200);
    assert!(!d.wgmma && !d.stage, "{d}");
}

#[test]
fn stage_is_an_option_of_matmuls() {
    let k = Planned::new(pointwise_2d());
    expect_config_err(
        lower(
            &k,
            &pointwise_2d_spec(),
            &Config::new(&[4, 256]).stage(true),
        ),
        "`stage`",
    );
    // Shown with the config, so logs say which launches copy their operands.
    assert!(hopper_config().stage(true).to_string().ends_with(", stage"));
}
