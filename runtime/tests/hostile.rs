//! What a hostile or careless caller can pass, and the errors it gets instead of
//! memory outside a buffer. Runs without a GPU (interpret mode's host device).

use tilefuse_runtime::{Device, Error, Tensor};

/// An argument error that names `arg` and says `says`.
#[track_caller]
fn refused<T: std::fmt::Debug>(r: Result<T, Error>, arg: &str, says: &str) {
    match r {
        Err(e @ Error::Argument { .. }) => {
            let m = e.to_string();
            assert!(m.contains(arg) && m.contains(says), "{m}");
        }
        other => panic!("expected an argument error naming `{arg}`, got {other:?}"),
    }
}

#[test]
fn shapes_whose_size_overflows_are_refused() {
    let dev = Device::interpreter();
    // 2^32 · 2^32 · 4 elements wraps to 0 in a usize product.
    refused(
        Tensor::<f32>::empty_on(&dev, [1 << 32, 1 << 32, 4]),
        "shape",
        "overflows the address space",
    );
    // A zero dimension makes no elements, but the strides still overflow.
    refused(
        Tensor::<f32>::empty_on(&dev, [0, 1 << 62, 8]),
        "shape",
        "overflows the address space",
    );
    refused(
        Tensor::<f32>::from_slice_on(&dev, &[], [0, usize::MAX]),
        "shape",
        "overflows",
    );
    // Just inside: an empty tensor of a large but representable shape.
    let t = Tensor::<f32>::empty_on(&dev, [0, 1 << 20]).expect("an empty tensor");
    assert_eq!(t.numel(), 0);
}

#[test]
fn views_outside_their_tensor_are_refused() {
    let dev = Device::interpreter();
    let empty = Tensor::<f32>::empty_on(&dev, [0, 4]).expect("an empty tensor");
    // 2^63 · 2 elements wraps to 0, the element count of the empty tensor.
    refused(empty.reshape([1 << 63, 2]), "shape", "overflows");
    let t = Tensor::<f32>::zeros_on(&dev, [6, 4]).expect("a tensor");
    // usize::MAX + 2 wraps to 1, inside the 6 rows.
    refused(t.narrow(0, usize::MAX, 2), "dim/start/len", "outside shape");
    refused(t.narrow(2, 0, 1), "dim/start/len", "outside shape");
    refused(t.reshape([5, 5]), "shape", "same number of elements");
    let v = t.narrow(1, 1, 3).expect("an inside view");
    assert_eq!(v.dims(), &[6, 3]);
}

/// Huge finite values where a duration is read clamp to a week instead of
/// overflowing `Duration` (a panic); values that are not numbers are errors
/// naming their variable or flag.
#[test]
fn huge_timeouts_clamp_and_bad_ones_are_refused() {
    use std::time::Duration;
    use tilefuse_runtime::autotune::Effort;
    use tilefuse_runtime::settings::LONGEST;
    std::env::set_var("TILEFUSE_DIST_TIMEOUT_S", "1e300");
    assert_eq!(tilefuse_runtime::dist::default_timeout().unwrap(), LONGEST);
    std::env::set_var("TILEFUSE_DIST_TIMEOUT_S", "soon");
    refused(
        tilefuse_runtime::dist::default_timeout(),
        "TILEFUSE_DIST_TIMEOUT_S",
        "expected a positive number of seconds",
    );
    std::env::set_var("TILEFUSE_DIST_TIMEOUT_S", "30");
    assert_eq!(
        tilefuse_runtime::dist::default_timeout().unwrap(),
        Duration::from_secs(30)
    );
    std::env::remove_var("TILEFUSE_DIST_TIMEOUT_S");
    std::env::set_var("TILEFUSE_AUTOTUNE_BUDGET_S", "1e308");
    assert_eq!(Effort::Quick.budget().unwrap(), LONGEST);
    std::env::remove_var("TILEFUSE_AUTOTUNE_BUDGET_S");
    let args = |g: &str| {
        tilefuse_runtime::launcher::parse(
            ["--grace-period-s", g, "prog"].map(std::ffi::OsString::from),
        )
    };
    let a = args("1e300").expect("parses").expect("a program to run");
    assert_eq!(a.grace_period_s, LONGEST.as_secs_f64());
    let e = args("never").expect_err("not a number");
    assert!(
        e.contains("--grace-period-s") && e.contains("`never`"),
        "{e}"
    );
}
