//! The `#[fused_kernel]` macro's error messages: each case in `tests/ui` has one
//! mistake, and its `.stderr` holds the message and the code it points at.
//! Regenerate with `TRYBUILD=overwrite cargo test --test compile_fail`.

#[test]
fn macro_errors() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
