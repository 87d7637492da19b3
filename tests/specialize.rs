//! Compile-time `if`s on `#[constexpr]` parameters: each specialization lowers
//! only the branch it takes (no GPU needed).

use tilefuse::codegen::Spec;
use tilefuse::prelude::*;

/// `out = act(x + bias)`, the pre-activation stored to `aux` when asked.
#[fused_kernel]
fn bias_act(
    x: &Tensor<f32>,
    bias: &Tensor<f32>,
    out: &Tensor<f32>,
    aux: &Tensor<f32>,
    #[constexpr] act: usize,
    #[constexpr] keep_aux: bool,
) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        let y = x[(tm, tn)] + bias[tn];
        if keep_aux {
            aux[(tm, tn)] = y;
        }
        let y = if act == 1 {
            relu(y)
        } else if act == 2 && !keep_aux {
            gelu(y)
        } else {
            y
        };
        out[(tm, tn)] = y;
    }
}

fn source(consts: [i64; 2]) -> String {
    let def = bias_act::kernel();
    let mut spec: Spec = def.declared_spec().expect("declared dtypes");
    spec.constexprs = consts.to_vec();
    let config = def.config().expect("default config");
    let source = def.lower(&spec, &config).expect("lowers").source;
    // The kernel itself, after the shared prelude.
    let body = source.find("extern \"C\"").expect("an entry point");
    source[body..].to_string()
}

#[test]
fn only_the_taken_branches_are_lowered() {
    // Tensors are numbered as the device code first uses them: `aux` is t2.
    let plain = source([0, 0]);
    assert!(
        !plain.contains("t2 + ("),
        "aux touched without keep_aux:\n{plain}"
    );
    assert!(!plain.contains("fmaxf(") && !plain.contains("tf_gelu("));
    let relu_aux = source([1, 1]);
    assert!(relu_aux.contains("t2 + ("), "aux not stored:\n{relu_aux}");
    assert!(relu_aux.contains("fmaxf("));
    // `act == 2 && !keep_aux`: gelu only without the aux.
    assert!(source([2, 0]).contains("tf_gelu("));
    assert!(!source([2, 1]).contains("tf_gelu("));
}

#[test]
fn the_ir_records_the_branches() {
    let k = bias_act::kernel().ir().expect("ir");
    assert!(k.has_branches());
    let taken = k.specialize(&[1, 0]).expect("specializes");
    assert!(!taken.has_branches());
    assert!(taken.body.len() < k.body.len() + 2);
}

/// Scales `x` after the flags of its row chunk, or of every chunk.
#[fused_kernel]
fn scale_after(
    x: &Tensor<f32>,
    flags: &Tensor<u32>,
    rows_per_chunk: usize,
    #[constexpr] per_chunk: bool,
) {
    let [m, n] = x.shape();
    for (tm, tn) in tile([m, n]) {
        wait(
            flags,
            if per_chunk {
                tm.begin() / rows_per_chunk
            } else {
                0
            },
            1,
        );
        x[(tm, tn)] = x[(tm, tn)] * 2.0;
    }
}

#[test]
fn value_ifs_inside_a_wait_are_decided() {
    let def = scale_after::kernel();
    let lowered = |per_chunk: i64| {
        let mut spec: Spec = def.declared_spec().expect("declared dtypes");
        spec.constexprs = vec![per_chunk];
        def.lower(&spec, &def.config().expect("default config"))
            .expect("lowers")
            .source
    };
    let wait_line = |src: &str| {
        src.lines()
            .find(|l| l.contains("!tf_wait_flag("))
            .expect("a wait")
            .to_string()
    };
    assert!(
        wait_line(&lowered(1)).contains(" / "),
        "{}",
        wait_line(&lowered(1))
    );
    assert!(
        !wait_line(&lowered(0)).contains(" / "),
        "{}",
        wait_line(&lowered(0))
    );
}

/// A tuning result is keyed by the code it timed
/// (`tilefuse::autotune::code_digest`): each specialization's own, the same
/// for the same code, another for other candidates.
#[test]
fn each_specialization_is_tuned_under_its_own_code() {
    use tilefuse::autotune::code_digest;
    use tilefuse::codegen::{Config, Target};
    let def = bias_act::kernel();
    let ir = def.ir().unwrap();
    let h200 = Target {
        shared_limit: 227 * 1024,
        wgmma: true,
        sms: 132,
    };
    let ext = [Some(1000), Some(3000)];
    let digest = |act: i64, explicit: Option<&[Config]>| {
        let mut spec: Spec = def.declared_spec().unwrap();
        spec.constexprs = vec![act, 0];
        code_digest(ir, &spec, h200, &ext, explicit)
    };
    assert_eq!(digest(1, None), digest(1, None));
    assert_ne!(digest(1, None), digest(2, None));
    let one = [Config::new(&[4, 1024]).num_warps(4)];
    assert_ne!(digest(1, Some(&one)), digest(1, None));
}

/// `out = x * alpha + k`: a float and a u32 parameter.
#[fused_kernel]
fn scale_shift(x: &Tensor<f32>, out: &Tensor<f32>, alpha: f32, k: u32) {
    let [n] = x.shape();
    for tn in tile(n) {
        out[tn] = x[tn] * alpha + k.cast::<f32>();
    }
}

/// A kernel specialized before any launch (NVRTC's checks, `corpus --source`)
/// takes its typed parameters as a launch passes them: `alpha: f32` a float,
/// `k: u32` an unsigned 32-bit integer, the extent a 64-bit one. Before, every
/// scalar was taken for a `long long`, and those sources converted the float
/// from an integer at each use.
#[test]
fn typed_scalar_parameters_are_specialized_as_a_launch_passes_them() {
    use tilefuse::codegen::ScalarKind;
    let def = scale_shift::kernel();
    let spec = def.declared_spec().expect("declared dtypes");
    let names: Vec<String> = def
        .ir()
        .expect("ir")
        .scalars
        .iter()
        .map(|s| s.name.clone())
        .collect();
    let kind = |name: &str| spec.scalars[names.iter().position(|n| n == name).expect(name)];
    assert_eq!(kind("alpha"), ScalarKind::Float);
    assert_eq!(kind("k"), ScalarKind::U32);
    assert_eq!(kind("n"), ScalarKind::Int);
    let source = def
        .lower(&spec, &def.config().expect("default config"))
        .expect("lowers")
        .source;
    let alpha = names.iter().position(|n| n == "alpha").expect("alpha");
    assert!(source.contains(&format!("float s{alpha}")), "{source}");
    assert!(!source.contains(&format!("(float)(s{alpha})")), "{source}");
}
