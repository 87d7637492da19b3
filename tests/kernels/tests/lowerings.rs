//! Every kernel of the corpus takes the lowering expected of it (no GPU or
//! NVRTC needed): the row lowering takes the kernels that reduce rows walked
//! in `tile()` loops, the general lowering the rest, and each lowers at its
//! default through the path its plan names.

use std::collections::HashSet;

/// The kernels the row lowering takes, with the path their default lowers
/// through: the row emitter hands a kernel with a construct its check let
/// through but it cannot emit to the general lowering.
const ROWS: &[(&str, &str)] = &[
    ("argmax", "general"),
    ("jsd", "rows"),
    ("kl_div", "rows"),
    ("layer_norm", "rows"),
    ("layer_norm_bwd", "rows"),
    ("logsumexp", "rows"),
    ("quantize_i8", "rows"),
    ("rms_norm", "rows"),
    ("rms_norm_bwd", "rows"),
    ("row_max_min", "general"),
    ("row_mean", "rows"),
    ("row_sum", "rows"),
    ("softmax", "rows"),
    ("softmax_bwd", "rows"),
    ("welford", "general"),
];

#[test]
fn every_kernel_takes_its_lowering() {
    let mut seen = HashSet::new();
    let mut wrong = Vec::new();
    for case in tilefuse_kernels::cases() {
        for def in (case.kernels)() {
            if !seen.insert(def.name()) {
                continue;
            }
            let ir = def.ir().expect("IR");
            let spec = def.declared_spec().expect("the corpus declares its dtypes");
            let lowered = def
                .lower(&spec, &tilefuse::codegen::default_config(ir))
                .unwrap_or_else(|e| panic!("{}: {e}", def.name()));
            let want = match ROWS.iter().find(|(name, _)| *name == def.name()) {
                Some(&(_, path)) => ("rows", path),
                None => ("general", "general"),
            };
            let got = (ir.lowering(), lowered.path);
            if got != want {
                wrong.push(format!("{}: {got:?}, expected {want:?}", def.name()));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    for (name, _) in ROWS {
        assert!(seen.contains(name), "`{name}` is not in the corpus");
    }
}
