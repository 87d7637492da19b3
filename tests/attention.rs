//! The attention form without a GPU: the example's kernel is recognised as
//! attention and lowered; configs the lowering cannot run and loops it does
//! not bound are errors that say why; a `whole` tile's block follows the
//! extent.

mod common;

use common::examples::{attention, softmax};
use tilefuse::codegen::plan::{classify, Shape};
use tilefuse::codegen::{default_config, fit_whole_dims, ir::Expr, ir::Stmt, lower, Config};

/// dims: tb, th, tm, td, tn
const TM: usize = 2;
const TD: usize = 3;
const TN: usize = 4;

#[test]
fn the_example_is_attention_shaped_and_lowers() {
    let def = attention::attention::kernel();
    let ir = def.ir().unwrap();
    let Ok(Shape::Attention(a)) = classify(ir) else {
        panic!("not attention: {:?}", classify(ir));
    };
    assert_eq!((a.m, a.d, a.n, a.batch.clone()), (TM, TD, TN, vec![0, 1]));
    assert!(ir.dims[TD].whole && !ir.dims[TM].whole);
    let mut spec = def.declared_spec().unwrap();
    for causal in [0, 1] {
        spec.constexprs = vec![causal];
        let l = lower(ir, &spec, &default_config(ir)).expect("default lowers");
        assert!(l.path.starts_with("attention"), "{}", l.path);
        assert_eq!(l.threads, 128);
        // q (128 rows), two k and two v tiles of 64 rows, 256 bytes each.
        assert_eq!(l.shared_bytes, (128 + 4 * 64) * 256);
        // Causal: the loop ends at the row tile's end, and a tile under the
        // diagonal runs the copy without the mask.
        assert_eq!(l.source.contains("tf_min_i(tb2 + B2, s2)"), causal == 1);
        assert_eq!(l.source.contains(">= (tb4 + 63"), causal == 1);
    }
}

#[test]
fn configs_the_lowering_cannot_run_say_why() {
    let def = attention::attention::kernel();
    let ir = def.ir().unwrap();
    let mut spec = def.declared_spec().unwrap();
    spec.constexprs = vec![0];
    let err = |c: Config| lower(ir, &spec, &c).unwrap_err().to_string();
    assert!(err(Config::new(&[2, 1, 128, 128, 64]).num_warps(4)).contains("block size 1"));
    assert!(err(Config::new(&[1, 1, 128, 96, 64]).num_warps(4)).contains("power of two"));
    assert!(err(Config::new(&[1, 1, 96, 128, 64]).num_warps(4)).contains("16 or 32 rows a warp"));
    assert!(err(Config::new(&[1, 1, 128, 128, 48]).num_warps(4)).contains("key block"));
    assert!(err(Config::new(&[1, 1, 128, 256, 128]).num_warps(4)).contains("registers"));
    assert!(err(Config::new(&[1, 1, 128, 128, 64]).num_warps(2)).contains("4 or 8 warps"));
}

#[test]
fn only_the_key_loop_takes_a_bound() {
    let def = softmax::softmax::kernel();
    let mut ir = def.ir().unwrap().clone();
    let Some(Stmt::Loop { until, .. }) =
        ir.body.iter_mut().find(|s| matches!(s, Stmt::Loop { .. }))
    else {
        panic!("softmax has a column loop");
    };
    *until = Some(Expr::Int(100));
    let spec = def.declared_spec().unwrap();
    let e = lower(&ir, &spec, &default_config(&ir))
        .unwrap_err()
        .to_string();
    assert!(e.contains("`.until(…)` bounds the key loop"), "{e}");
}

#[test]
fn a_whole_tile_takes_its_extent() {
    let ir = attention::attention::kernel().ir().unwrap();
    let ext = |d: usize| [Some(8), Some(16), Some(4096), Some(d), Some(4096)];
    let fitted = |d: usize| fit_whole_dims(ir, default_config(ir), &ext(d));
    assert_eq!(fitted(80).block_sizes, vec![1, 1, 128, 128, 64]);
    assert_eq!(fitted(64).block_sizes[TD], 64);
    assert_eq!(fitted(7).block_sizes[TD], 16);
    assert_eq!(fitted(128).num_warps, 4);
    // Past 128 the default's rows go to 8 warps, so its accumulators fit.
    assert_eq!(
        (fitted(256).block_sizes[TD], fitted(256).num_warps),
        (256, 8)
    );
    // A pinned config's whole block is refitted too; its warps stay.
    let pinned = Config::new(&[1, 1, 64, 8, 32]).num_warps(4);
    let f = fit_whole_dims(ir, pinned, &ext(200));
    assert_eq!((f.block_sizes[TD], f.num_warps), (256, 4));
}
