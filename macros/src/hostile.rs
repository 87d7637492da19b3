//! The macro against hostile kernel source: literals past every integer
//! type, constants whose arithmetic overflows, deep nesting, Rust the device
//! syntax does not have. Each is a compile error naming what was wrong; the
//! macro never panics (a panic reaches the user as "proc macro panicked",
//! with no span).

use crate::attr::Pinned;
use crate::glue::expand;
use proc_macro2::TokenStream;

/// The expansion's outcome for `body` inside a one-tile kernel, caught if
/// the macro panics.
fn outcome(body: &str) -> std::thread::Result<Result<TokenStream, String>> {
    let src = format!(
        "fn k(x: &Tensor<f32>, out: &Tensor<f32>) {{
            let [n] = x.shape();
            for t in tile(n) {{
                {body}
            }}
        }}"
    );
    let item: syn::ItemFn = match syn::parse_str(&src) {
        Ok(item) => item,
        Err(e) => return Ok(Err(format!("does not parse as Rust: {e}"))),
    };
    std::panic::catch_unwind(|| {
        expand(Pinned::default(), TokenStream::new(), item).map_err(|e| e.to_string())
    })
}

/// `body` gives an error (not a panic, not an expansion) that says `what`.
fn refused(body: &str, what: &str) {
    match outcome(body) {
        Err(_) => panic!("the macro panicked on `{body}`"),
        Ok(Ok(_)) => panic!("`{body}` expanded"),
        Ok(Err(e)) => assert!(e.contains(what), "`{body}`: {e}"),
    }
}

/// `body` expands or gives an error, but never panics.
fn no_panic(body: &str) {
    if outcome(body).is_err() {
        panic!("the macro panicked on `{body}`");
    }
}

#[test]
fn literals_past_every_integer_type_are_errors() {
    // syn's error, at the literal's span.
    refused(
        "out[t] = x[t] * 340282366920938463463374607431768211456;",
        "too large",
    );
    no_panic("out[t] = x[t + 18446744073709551615];");
    no_panic("out[t] = x[t] * 1e999;");
}

#[test]
fn constant_arithmetic_that_overflows_does_not_panic() {
    for body in [
        "out[t] = x[t + 9223372036854775807 + 1];",
        "out[t] = x[t - 9223372036854775807 - 2];",
        "out[t] = x[t * 4611686018427387904 * 4];",
        "out[t] = x[t] * ((-9223372036854775807 - 1) / -1) as f32;",
        "out[t] = x[t] * (1 << 70) as f32;",
        "out[t] = x[t] * (7 % 0) as f32;",
        "out[t] = x[t] * (7 / 0) as f32;",
    ] {
        no_panic(body);
    }
}

#[test]
fn deep_nesting_does_not_overflow_the_stack() {
    // Run where rustc runs proc macros: a thread with a stack of its own size.
    let depth = 200;
    let body = format!(
        "out[t] = {}x[t]{};",
        "(".repeat(depth),
        " + 1.0)".repeat(depth)
    );
    let run = std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || no_panic(&body))
        .expect("a thread");
    assert!(run.join().is_ok(), "{depth} nested parentheses");
}

/// Each at the construct's span, with what device code has instead.
#[test]
fn rust_the_device_syntax_lacks_is_an_error() {
    for (body, what) in [
        (
            "let f = |v: f32| v; out[t] = x[t];",
            "not supported in device code",
        ),
        ("loop { }", "no `while` or `loop`"),
        ("while true { out[t] = x[t]; }", "no `while` or `loop`"),
        (
            "out[t] = match 1 { _ => x[t] };",
            "not supported in device code",
        ),
        ("unsafe { out[t] = x[t]; }", "device code supports"),
        (
            "println!(\"{}\", 1); out[t] = x[t];",
            "macros cannot be used",
        ),
        ("out[t] = x[t].frobnicate();", "`.frobnicate()`"),
    ] {
        refused(body, what);
    }
}
