//! The host function and the kernel definition a `#[fused_kernel]` expands to.

use crate::attr::Pinned;
use crate::device::{dtype_of, Builder};
use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use std::collections::HashMap;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, ItemFn, Pat, ReturnType, Stmt, Type};
use tilefuse_codegen::dtype::DType;
use tilefuse_codegen::spec::{ScalarKind, Spec, TensorSpec};
use tilefuse_codegen::{default_config, lower, CodegenError, Config, Kernel, Planned};

/// `Tensor<T>` (behind any references) → `T`'s dtype.
fn tensor_dtype_of_type(ty: &Type) -> Option<DType> {
    match ty {
        Type::Reference(r) => tensor_dtype_of_type(&r.elem),
        Type::Path(p) => {
            let seg = p.path.segments.last()?;
            if seg.ident != "Tensor" {
                return None;
            }
            let syn::PathArguments::AngleBracketed(a) = &seg.arguments else {
                return None;
            };
            match a.args.first()? {
                syn::GenericArgument::Type(t) => dtype_of(t).ok(),
                _ => None,
            }
        }
        _ => None,
    }
}

/// `Tensor::<T>::…(…)` anywhere in a call chain → `T`'s dtype.
fn tensor_dtype_of_expr(e: &Expr) -> Option<DType> {
    match e {
        Expr::Call(c) => tensor_dtype_of_expr(&c.func),
        Expr::MethodCall(m) => tensor_dtype_of_expr(&m.receiver),
        Expr::Try(t) => tensor_dtype_of_expr(&t.expr),
        Expr::Path(p) => p.path.segments.iter().find_map(|seg| {
            if seg.ident != "Tensor" {
                return None;
            }
            let syn::PathArguments::AngleBracketed(a) = &seg.arguments else {
                return None;
            };
            match a.args.first()? {
                syn::GenericArgument::Type(t) => dtype_of(t).ok(),
                _ => None,
            }
        }),
        _ => None,
    }
}

fn is_grid_loop(s: &Stmt) -> Option<&syn::ExprForLoop> {
    let is_tile = |e: &Expr| matches!(e, Expr::Call(c) if matches!(c.func.as_ref(), Expr::Path(p) if p.path.is_ident("tile")));
    match s {
        Stmt::Expr(Expr::ForLoop(fl), _) => match fl.expr.as_ref() {
            e if is_tile(e) => Some(fl),
            // `tile([...]).starting_at([...])`
            Expr::MethodCall(m) if is_tile(&m.receiver) => Some(fl),
            _ => None,
        },
        _ => None,
    }
}

fn returns_result(ret: &ReturnType) -> bool {
    match ret {
        ReturnType::Type(_, ty) => {
            matches!(ty.as_ref(), Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Result"))
        }
        ReturnType::Default => false,
    }
}

/// What the function's signature and body say: the kernel and the host
/// values around it.
pub(crate) struct Parsed {
    pub builder: Builder,
    /// `#[constexpr]` parameters, in `ConstId` order.
    pub consts: Vec<syn::Ident>,
    /// Tensor parameters whose rank the launch checks first.
    pub tensor_params: Vec<syn::Ident>,
    /// Position of the grid loop in the body.
    pub at: usize,
}

/// Reads the signature (dropping the `#[constexpr]` attributes it consumes)
/// and turns the grid loop into the kernel's IR.
pub(crate) fn parse(func: &mut ItemFn) -> syn::Result<Parsed> {
    let name_str = func.sig.ident.to_string();
    // Signature: constexpr parameters, declared tensor dtypes, scalar kinds.
    let mut consts = Vec::new();
    let mut declared: HashMap<String, DType> = HashMap::new();
    let mut scalar_kinds = HashMap::new();
    let mut tensor_params = Vec::new();
    for arg in func.sig.inputs.iter_mut() {
        let FnArg::Typed(pt) = arg else {
            return Err(syn::Error::new_spanned(
                arg,
                "a #[fused_kernel] is a free function; `self` is not supported",
            ));
        };
        let Pat::Ident(pi) = pt.pat.as_ref() else {
            return Err(syn::Error::new_spanned(
                &pt.pat,
                "kernel parameters are plain names",
            ));
        };
        let pname = pi.ident.to_string();
        let before = pt.attrs.len();
        pt.attrs.retain(|a| !a.path().is_ident("constexpr"));
        if pt.attrs.len() != before {
            consts.push(pi.ident.clone());
        } else if let Some(d) = tensor_dtype_of_type(&pt.ty) {
            declared.insert(pname.clone(), d);
            tensor_params.push(pi.ident.clone());
        } else if let Type::Path(p) = pt.ty.as_ref() {
            let name = p.path.get_ident().map(|i| i.to_string());
            if let Some(k) = name.as_deref().and_then(ScalarKind::of_type_name) {
                scalar_kinds.insert(pname, k);
            }
        }
    }

    // Body: host code around exactly one grid loop.
    let stmts = &func.block.stmts;
    let loops: Vec<usize> = stmts
        .iter()
        .enumerate()
        .filter(|(_, s)| is_grid_loop(s).is_some())
        .map(|(i, _)| i)
        .collect();
    let Some(&at) = loops.first() else {
        return Err(syn::Error::new(
            func.sig.ident.span(),
            "a #[fused_kernel] needs one `for … in tile([…])` loop at the top level of its body: \
             that loop is the launch grid, and its body the device code",
        ));
    };
    if let Some(&second) = loops.get(1) {
        return Err(syn::Error::new_spanned(
            &stmts[second],
            "a #[fused_kernel] has one grid loop; nest further `tile()` loops inside it, or write a second kernel",
        ));
    }
    for s in &stmts[..at] {
        if let Stmt::Local(l) = s {
            let (ident, ty) = match &l.pat {
                Pat::Ident(p) => (Some(&p.ident), None),
                Pat::Type(t) => match t.pat.as_ref() {
                    Pat::Ident(p) => (Some(&p.ident), Some(t.ty.as_ref())),
                    _ => (None, None),
                },
                _ => (None, None),
            };
            if let Some(ident) = ident {
                let d = ty
                    .and_then(tensor_dtype_of_type)
                    .or_else(|| l.init.as_ref().and_then(|i| tensor_dtype_of_expr(&i.expr)));
                if let Some(d) = d {
                    declared.insert(ident.to_string(), d);
                }
            }
        }
    }
    let grid = is_grid_loop(&stmts[at])
        .ok_or_else(|| syn::Error::new_spanned(&stmts[at], "internal: grid loop"))?;
    let const_names: Vec<String> = consts.iter().map(|c| c.to_string()).collect();
    let mut builder =
        Builder::new(&name_str, const_names, declared).with_scalar_kinds(scalar_kinds);
    builder.grid_loop(grid)?;
    Ok(Parsed {
        builder,
        consts,
        tensor_params,
        at,
    })
}

/// The argument facts of `kernel` when every tensor's dtype is declared in
/// the source (constexprs taken as 0), for checking it at compile time.
pub(crate) fn declared_spec(kernel: &Kernel) -> Option<Spec> {
    Some(Spec {
        tensors: kernel
            .tensors
            .iter()
            .map(|t| Some(TensorSpec::contiguous(t.declared?, t.rank)))
            .collect::<Option<_>>()?,
        scalars: kernel.declared_scalar_kinds(),
        constexprs: vec![0; kernel.constexprs.len()],
    })
}

pub fn expand(
    pinned: Pinned,
    attr_tokens: TokenStream,
    mut func: ItemFn,
) -> syn::Result<TokenStream> {
    let name = func.sig.ident.clone();
    let name_str = name.to_string();
    let Parsed {
        builder: b,
        consts,
        tensor_params,
        at,
    } = parse(&mut func)?;
    let stmts = &func.block.stmts;
    // Planned once: the lowering it takes chosen for the checks below.
    let kernel = Planned::new(b.kernel.clone());

    // Checks that need no GPU: when every dtype is known, the kernel's types
    // and its lowering with the default or pinned config.
    let loop_span = stmts[at].span();
    let pinned_given = pinned.block_sizes.is_some()
        || pinned.num_warps.is_some()
        || pinned.num_stages.is_some()
        || pinned.group_m.is_some();
    // A config error points at the attribute that pinned it; an error about a
    // place of the device code at that code (just the message: the span says
    // where); other errors at the loop.
    let to_syn = |e: CodegenError| match &e {
        CodegenError::Config { .. } if pinned_given => {
            syn::Error::new_spanned(&attr_tokens, e.to_string())
        }
        CodegenError::Type { at, message, .. } | CodegenError::Unsupported { at, message, .. } => {
            match b.spans.iter().find(|(text, _)| text == at) {
                Some((_, tokens)) => syn::Error::new_spanned(tokens, message),
                None => syn::Error::new(loop_span, e.to_string()),
            }
        }
        _ => syn::Error::new(loop_span, e.to_string()),
    };
    // The default of the kernel as checked below, with its compile-time `if`s
    // decided (constexprs 0): a kernel whose branches all leave a GEMM gets
    // the GEMM's default, as a launch does (`default_config_at` specializes).
    let consts0 = vec![0; kernel.constexprs.len()];
    let mut cfg = default_config(&*kernel.specialize(&consts0).map_err(to_syn)?);
    if let Some(bs) = pinned.block_sizes {
        cfg.block_sizes = bs;
    }
    if let Some(w) = pinned.num_warps {
        cfg.num_warps = w;
    }
    if let Some(s) = pinned.num_stages {
        cfg.num_stages = s;
    }
    if let Some(g) = pinned.group_m {
        cfg.group_m = g;
    }
    if let Some(spec) = declared_spec(&kernel) {
        // Every dtype is known: check types and lower with the default or pinned
        // config now, so mistakes are compile errors with the checker's message.
        lower(&kernel, &spec, &cfg).map_err(to_syn)?;
    }
    // Otherwise some dtypes are only known at launch, where the kernel is
    // checked and lowered (every kernel the checker accepts has a lowering).
    let json = kernel.to_json();
    let pinned_tokens = if pinned_given {
        let cj = serde_json_config(&cfg);
        quote!(::core::option::Option::Some(#cj))
    } else {
        quote!(::core::option::Option::None)
    };

    // The launch that replaces the grid loop.
    let tensor_args = b
        .tensor_idents
        .iter()
        .map(|t| quote_spanned!(t.span()=> ::tilefuse::__private::AsTensorArg::tensor_arg(&#t)));
    let scalar_args = b
        .scalar_exprs
        .iter()
        .map(|e| quote_spanned!(e.span()=> ::tilefuse::__private::IntoScalar::into_scalar(#e)));
    let const_args = consts.iter().map(|c| {
        let s = c.to_string();
        quote_spanned!(c.span()=> ::tilefuse::__private::IntoConst::into_const(#c, #s)?)
    });
    let (nt, ns, nc) = (b.tensor_idents.len(), b.scalar_exprs.len(), consts.len());
    let launch: Stmt = syn::parse_quote! {
        {
            let __tf_tensors: [::tilefuse::__private::TensorArg; #nt] = [#(#tensor_args),*];
            let __tf_scalars: [::tilefuse::__private::ScalarArg; #ns] = [#(#scalar_args),*];
            let __tf_consts: [i64; #nc] = [#(#const_args),*];
            #name::kernel().launch(&__tf_tensors, &__tf_scalars, &__tf_consts)?;
        }
    };
    let mut new_stmts: Vec<Stmt> = Vec::new();
    // Rank checks first, so host code can destructure `a.shape()` safely.
    for t in &tensor_params {
        if let Some(p) = kernel.tensors.iter().find(|p| *t == p.name) {
            let (s, r) = (t.to_string(), p.rank);
            new_stmts.push(
                syn::parse_quote!(::tilefuse::__private::expect_rank(&#t, #s, #r, #name_str)?;),
            );
        }
    }
    let host_before = &stmts[..at];
    let host_after = &stmts[at + 1..];

    let vis = &func.vis;
    let attrs = &func.attrs;
    let sig = &func.sig;
    let body_tokens;
    let out_sig;
    if returns_result(&sig.output) {
        out_sig = quote!(#sig);
        body_tokens = quote!({ #(#new_stmts)* #(#host_before)* #launch #(#host_after)* });
    } else {
        let inner = match &sig.output {
            ReturnType::Default => quote!(()),
            ReturnType::Type(_, ty) => quote!(#ty),
        };
        let mut s2 = sig.clone();
        s2.output = syn::parse_quote!(-> ::tilefuse::Result<#inner>);
        out_sig = quote!(#s2);
        body_tokens = quote!({
            #(#new_stmts)*
            let __tf_result: #inner = { #(#host_before)* #launch #(#host_after)* };
            ::core::result::Result::Ok(__tf_result)
        });
    }
    let mod_doc =
        format!("The compiled form of the `{name_str}` kernel: its IR, configs and JIT caches.");
    let def_ident = format_ident!("__TF_KERNEL_{}", name_str.to_uppercase());
    Ok(quote! {
        #(#attrs)*
        // `let mut out` is natural for a tensor the device code stores to, but the
        // store becomes a launch that only borrows it.
        #[allow(unused_mut)]
        #vis #out_sig #body_tokens

        #[doc = #mod_doc]
        #vis mod #name {
            /// The kernel's definition: its IR, pinned config and compiled variants.
            pub fn kernel() -> &'static ::tilefuse::KernelDef {
                static #def_ident: ::tilefuse::KernelDef = ::tilefuse::KernelDef::new(#name_str, #json, #pinned_tokens);
                &#def_ident
            }
        }
    })
}

fn serde_json_config(c: &Config) -> String {
    // The runtime reads it back with the same codegen crate.
    format!(
        "{{\"block_sizes\":{:?},\"num_warps\":{},\"num_stages\":{},\"group_m\":{}}}",
        c.block_sizes, c.num_warps, c.num_stages, c.group_m
    )
}
