//! The attribute's arguments: a pinned config, e.g.
//! `#[fused_kernel(block_sizes = [128, 256, 64], num_warps = 8, num_stages = 3)]`.

use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprArray, Lit, MetaNameValue, Token};

/// What the attribute pins. Everything left out comes from the default config.
#[derive(Default)]
pub struct Pinned {
    pub block_sizes: Option<Vec<usize>>,
    pub num_warps: Option<usize>,
    pub num_stages: Option<usize>,
    pub group_m: Option<usize>,
}

fn int(e: &Expr, what: &str) -> syn::Result<usize> {
    if let Expr::Lit(l) = e {
        if let Lit::Int(i) = &l.lit {
            return i.base10_parse();
        }
    }
    Err(syn::Error::new_spanned(
        e,
        format!("`{what}` takes an integer literal"),
    ))
}

impl Parse for Pinned {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut p = Pinned::default();
        let items = Punctuated::<MetaNameValue, Token![,]>::parse_terminated(input)?;
        for nv in items {
            let key = nv
                .path
                .get_ident()
                .map(|i| i.to_string())
                .unwrap_or_default();
            match key.as_str() {
                "block_sizes" => {
                    let Expr::Array(ExprArray { elems, .. }) = &nv.value else {
                        return Err(syn::Error::new_spanned(
                            &nv.value,
                            "`block_sizes` takes an array of integers, one per tile dimension, e.g. `[128, 256, 64]`",
                        ));
                    };
                    p.block_sizes = Some(elems.iter().map(|e| int(e, "block_sizes")).collect::<syn::Result<_>>()?);
                }
                "num_warps" => p.num_warps = Some(int(&nv.value, "num_warps")?),
                "num_stages" => p.num_stages = Some(int(&nv.value, "num_stages")?),
                "group_m" => p.group_m = Some(int(&nv.value, "group_m")?),
                _ => {
                    return Err(syn::Error::new_spanned(
                        &nv.path,
                        "unknown setting; #[fused_kernel] accepts `block_sizes = [..]`, `num_warps = N`, \
                         `num_stages = N` and `group_m = N`",
                    ))
                }
            }
        }
        Ok(p)
    }
}
