//! Every kernel of the corpus and of the examples survives its textual form:
//! printed and parsed back it is the same kernel (but for the `at` texts,
//! which the parser takes from the text), and the parsed kernel prints as the
//! text it came from.

use std::collections::HashSet;
use tilefuse::codegen::Kernel;
use tilefuse::KernelDef;

/// The example programs, as modules.
#[path = "../../common/examples.rs"]
mod examples;

/// Why `def`'s kernel does not survive its text, if it does not.
fn round_trip(def: &KernelDef) -> Option<String> {
    let k: &Kernel = def.ir().expect("IR");
    let text = k.to_string();
    // JSON, so that a NaN compares equal to itself.
    let structure = |k: &Kernel| k.without_at().to_json();
    match Kernel::parse(&text) {
        Err(e) => Some(format!("{}: {e}\n{text}", def.name())),
        Ok(back) if structure(&back) != structure(k) => Some(format!(
            "{}: parsed to another kernel\n{text}\n{}\n{}",
            def.name(),
            structure(k),
            structure(&back)
        )),
        Ok(back) if back.to_string() != text => Some(format!(
            "{}: prints differently after parsing\n{text}\n{back}",
            def.name()
        )),
        Ok(_) => None,
    }
}

#[test]
fn every_corpus_kernel_round_trips_through_its_text() {
    let mut seen = HashSet::new();
    let mut wrong = Vec::new();
    for case in tilefuse_kernels::cases() {
        for def in (case.kernels)() {
            if seen.insert(def.name()) {
                wrong.extend(round_trip(def));
            }
        }
    }
    assert!(seen.len() >= 50, "only {} kernels", seen.len());
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn every_example_kernel_round_trips_through_its_text() {
    use examples::*;
    let defs = [
        matmul::matmul::kernel(),
        all_gather_matmul::ag_matmul::kernel(),
        bias_gelu::matmul_bias_gelu::kernel(),
        softmax::softmax::kernel(),
        rms_norm::rms_norm::kernel(),
        layer_norm::layer_norm::kernel(),
        cross_entropy::cross_entropy::kernel(),
        all_reduce_rms_norm::all_reduce_bias_rms_norm::kernel(),
        attention::attention::kernel(),
        attention::attention_gqa::kernel(),
        attention_backward::attention_lse::kernel(),
        attention_backward::attention_delta::kernel(),
        attention_backward::attention_dkdv::kernel(),
        attention_backward::attention_dq::kernel(),
    ];
    let wrong: Vec<String> = defs.into_iter().filter_map(round_trip).collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}
