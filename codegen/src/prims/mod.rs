//! The DSL's primitives, one table per family: each entry holds the name a
//! user writes, its doc line, its type rule, its CUDA C and its CPU semantics
//! (what interpret mode computes), side by side, so the checker, every
//! lowering, the interpreter and the macro's messages read one definition.
//! Adding an elementwise function or a reduction is one entry here.
//!
//! Integer semantics are C's with wrap-around: results are computed in the
//! promoted type ([`DType::promote`]) and wrap to its width; integer division
//! truncates toward zero and `%` takes the dividend's sign; a shift by the
//! type's width or more gives 0 (or the sign, for `>>` of a negative signed
//! value), as PTX's `shl`/`shr` do.

pub mod atomic;
pub mod binary;
pub mod cast;
pub mod compare;
pub mod rand;
pub mod reduce;
pub mod unary;

pub use atomic::AtomicOp;
pub use binary::BinOp;
pub use compare::CmpOp;
pub use rand::RandKind;
pub use reduce::ReduceOp;
pub use unary::UnOp;

use crate::dtype::DType;

/// `v` (an integer computed exactly) wrapped to the width and signedness of
/// `t`, as the GPU's registers hold it: the CPU semantics of every integer
/// result. `bool` is 0 or 1.
pub fn wrap_int(t: DType, v: i128) -> i64 {
    match t {
        DType::I8 => v as i8 as i64,
        DType::U8 => v as u8 as i64,
        DType::I16 => v as i16 as i64,
        DType::I32 => v as i32 as i64,
        DType::U32 => v as u32 as i64,
        DType::Bool => i64::from(v != 0),
        _ => v as i64,
    }
}

/// `v` rounded to f32, the precision every float result has.
pub fn f32r(v: f64) -> f64 {
    f64::from(v as f32)
}

/// Every function name of device code: the tables' names and the DSL's
/// other calls.
fn functions() -> Vec<&'static str> {
    let mut names: Vec<&str> = vec![
        "addmm", "zeros", "full", "select", "clamp", "wait", "signal", "rand", "randn", "randint",
    ];
    names.extend(atomic::AtomicOp::ALL.iter().map(|o| o.name()));
    names.extend(binary::BinOp::ALL.iter().filter_map(|o| o.function()));
    names.extend(unary::UnOp::ALL.iter().map(|o| o.name()));
    names
}

/// Every function and method name of device code, for messages.
pub fn function_names() -> String {
    functions().join(", ")
}

/// The device function a misspelled `name` most likely meant (`sigmiod`:
/// `sigmoid`), if one is within a typo or two of it.
pub fn nearest_function(name: &str) -> Option<&'static str> {
    nearest(name, functions())
}

/// The method a misspelled `.name()` most likely meant: a function (methods
/// too), a reduction or scan, `.cast()` or a tile's `.begin()`, `.end()`, `.size()`,
/// `.index()`.
pub fn nearest_method(name: &str) -> Option<&'static str> {
    let mut names = functions();
    names.extend(reduce::ReduceOp::ALL.iter().map(|o| o.name()));
    names.extend(reduce::ReduceOp::ALL.iter().map(|o| o.scan_name()));
    names.extend(reduce::ReduceOp::ALL.iter().filter_map(|o| o.arg_name()));
    names.extend(["cast", "begin", "end", "size", "index"]);
    nearest(name, names)
}

fn nearest(name: &str, names: Vec<&'static str>) -> Option<&'static str> {
    names
        .into_iter()
        .map(|f| (strsim::damerau_levenshtein(name, f), f))
        .filter(|&(d, f)| d <= if f.len() <= 4 { 1 } else { 2 })
        .min_by_key(|&(d, _)| d)
        .map(|(_, f)| f)
}
