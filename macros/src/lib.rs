//! The `#[fused_kernel]` attribute: turns a Rust function written with tile loops
//! into tile IR (checked at expansion time, errors spanned on the offending code)
//! and a typed host function that launches the JIT-compiled kernel.
//!
//! This crate only turns syntax into IR and glue; lowering and launching live in
//! `tilefuse-codegen` and `tilefuse-runtime`. Generated code names everything as
//! `::tilefuse::…`, so kernels work from any crate that depends on `tilefuse`.

mod attr;
mod device;
mod glue;
#[cfg(test)]
mod hostile;
#[cfg(test)]
mod tests;

use proc_macro::TokenStream;

/// Compiles a Rust function with an outermost `for … in tile(…)` loop into a GPU
/// kernel. See the `tilefuse` crate's documentation for the DSL.
#[proc_macro_attribute]
pub fn fused_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let attr_tokens = proc_macro2::TokenStream::from(attr.clone());
    let pinned = syn::parse_macro_input!(attr as attr::Pinned);
    let func = syn::parse_macro_input!(item as syn::ItemFn);
    match glue::expand(pinned, attr_tokens, func) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}
