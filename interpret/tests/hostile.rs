//! Interpret mode against hostile input: shapes whose sizes overflow, views
//! outside their memory, configs and extents no GPU launch takes, a wait that
//! nobody ends. Each gets an error that names what was wrong; none panics,
//! allocates without bound, reads outside a buffer or hangs.

use std::time::{Duration, Instant};
use tilefuse_codegen::ir::Kernel;
use tilefuse_codegen::{Config, DType, Planned};
use tilefuse_interpret::{run, run_with, HostTensor, Options, Scalar};

fn planned(text: &str) -> Planned {
    Planned::new(Kernel::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}")))
}

/// `out[t] = x[t] + 1` over the extent in scalar `n`.
fn add_one() -> Planned {
    planned(
        "kernel add_one(x: Tensor<f32, 1>, out: Tensor<f32, 1>; n) {
           for t in tile(n) {
             out[t] = x[t] + 1.0;
           }
         }",
    )
}

fn f32s(n: usize) -> HostTensor {
    HostTensor::from_f64(DType::F32, &[n], (0..n).map(|i| i as f64).collect())
        .expect("a small tensor")
}

/// A shape whose element or byte count wraps is an error naming the shape,
/// before anything is allocated (in a release build the count wrapped to 0:
/// an empty buffer behind a huge shape).
#[test]
fn shapes_whose_size_overflows_are_errors() {
    for shape in [
        vec![1usize << 32, 1 << 32, 4],
        vec![usize::MAX, 2],
        vec![1 << 62, 4],
    ] {
        let e = HostTensor::from_f64(DType::F32, &shape, vec![]).unwrap_err();
        assert!(e.to_string().contains("shape"), "{shape:?}: {e}");
        let e = HostTensor::from_i64(DType::I64, &shape, vec![]).unwrap_err();
        assert!(e.to_string().contains("shape"), "{shape:?}: {e}");
        let e = HostTensor::filled(DType::BF16, &shape, 0.0).unwrap_err();
        assert!(e.to_string().contains("shape"), "{shape:?}: {e}");
    }
}

/// A view whose strides reach outside its memory, or wrap, is refused.
#[test]
fn views_outside_their_memory_are_errors() {
    let t = f32s(16);
    let mem = t.memory().clone();
    for (shape, strides, offset) in [
        (vec![4usize, 5], vec![4isize, 1], 0usize),
        (vec![2, 2], vec![isize::MAX, 1], 0),
        (vec![2, 2], vec![isize::MIN, 1], 8),
        (vec![4], vec![1], usize::MAX),
        (vec![usize::MAX], vec![1], 0),
    ] {
        let e = HostTensor::view(mem.clone(), DType::F32, &shape, &strides, offset).unwrap_err();
        assert!(
            e.to_string().contains("outside"),
            "{shape:?} {strides:?} +{offset}: {e}"
        );
    }
}

/// Block sizes no GPU lowering takes are errors naming the config, not
/// allocations: a tile of 2^40 elements a program, a block of 0, one that is
/// not a power of two.
#[test]
fn absurd_configs_are_errors() {
    let k = add_one();
    let t = [f32s(8), f32s(8)];
    for blocks in [[1usize << 40], [0], [3], [usize::MAX]] {
        let e = run(&k, &Config::new(&blocks), &[], &t, &[Scalar::Int(8)]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("config") || msg.contains("block"),
            "{blocks:?}: {msg}"
        );
    }
}

/// An extent beyond the tensors it tiles is an error naming the tensor; one
/// that no tensor bounds (here only an atomic's fixed index reads it) but
/// that makes more programs than a GPU launch may have is refused as the
/// launch refuses it, rather than walked program by program for ever.
#[test]
fn extents_no_launch_could_cover_are_errors() {
    let t = [f32s(8), f32s(8)];
    let e = run(
        &add_one(),
        &Config::new(&[1]),
        &[],
        &t,
        &[Scalar::Int(1 << 50)],
    )
    .unwrap_err();
    assert!(e.to_string().contains("`out`"), "{e}");
    let count = planned(
        "kernel count(out: Tensor<f32, 1>; n) {
           for t in tile(n) {
             atomic_add(out[0], 1.0);
           }
         }",
    );
    let started = Instant::now();
    let e = run(
        &count,
        &Config::new(&[1]),
        &[],
        &[f32s(1)],
        &[Scalar::Int(1 << 50)],
    )
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(e.to_string().contains("(grid)"), "{e}");
    assert!(e.to_string().contains("programs"), "{e}");
}

/// A wait on a flag nobody sets ends after the configured timeout, naming
/// the flag and the value it waited for.
#[test]
fn a_wait_nobody_ends_times_out() {
    let k = planned(
        "kernel waits(flags: Tensor<u32, 1>, out: Tensor<f32, 1>; n) {
           for t in tile(n) {
             wait(flags, 0, 7);
             out[t] = 1.0;
           }
         }",
    );
    let flags = HostTensor::from_i64(DType::U32, &[1], vec![3]).expect("one flag");
    let out = f32s(4);
    let options = Options {
        wait_timeout: Duration::from_millis(200),
        ..Options::default()
    };
    let started = Instant::now();
    let e = run_with(
        &k,
        &Config::new(&[4]),
        &[],
        &[flags, out],
        &[Scalar::Int(4)],
        &options,
    )
    .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    let msg = e.to_string();
    assert!(msg.contains("flags") && msg.contains('7'), "{msg}");
}
