//! Kernels without a matmul: each program owns one tile of the grid; statements run
//! in order, nested `tile()` loops run sequentially, and each group of stores is an
//! elementwise loop whose elements are spread over the block's threads (the
//! fastest-moving index last, so neighbouring threads touch neighbouring addresses).

use super::expr::{narrow, tensor_mask, tensor_offset, CTy};
use super::{one_line, Emitter, Lowered};
use crate::error::CodegenError;
use crate::ir::*;
use std::collections::HashMap;
use std::fmt::Write;

pub(super) fn emit(e: &mut Emitter) -> Result<Lowered, CodegenError> {
    let nt = e.cfg.threads();
    let params = e.begin(nt, 1, "", &[]);
    let _ = writeln!(
        e.out,
        "  const int tid = threadIdx.x;\n  long long tf_pid = blockIdx.x;"
    );
    // Decode the program id, the last grid dimension moving fastest.
    for &d in &e.k.grid {
        let _ = writeln!(e.out, "  long long tb{d};");
    }
    // `starting_at`: the order starts at the tile holding that index and wraps.
    for (pos, &d) in e.k.grid.iter().enumerate().rev() {
        let ext = e.k.dims[d].extent;
        let shift = match e.k.grid_start.get(pos) {
            Some(&s) => {
                if e.spec.scalars.get(s) != Some(&crate::spec::ScalarKind::Int) {
                    return Err(CodegenError::Argument {
                        kernel: e.k.name.clone(),
                        arg: e.k.scalars[s].name.clone(),
                        message: "a `starting_at` index must be an integer".into(),
                    });
                }
                format!(" + (s{s} / B{d}) % tf_t + tf_t")
            }
            None => String::new(),
        };
        let _ = writeln!(
            e.out,
            "  {{ const long long tf_t = (s{ext} + B{d} - 1) / B{d};\n    tb{d} = ((tf_pid % tf_t{shift}) % tf_t) * B{d};\n    tf_pid /= tf_t; }}"
        );
    }
    let body = e.k.body.clone();
    let mut depth_of = HashMap::new();
    stmts(e, &body, 1, &mut depth_of)?;
    e.out.push_str("}\n");
    Ok(e.finish(params, nt, 0, "pointwise"))
}

fn indent(depth: usize) -> String {
    "  ".repeat(depth)
}

fn stmts(
    e: &mut Emitter,
    body: &[Stmt],
    depth: usize,
    depth_of: &mut HashMap<VarId, usize>,
) -> Result<(), CodegenError> {
    let ind = indent(depth);
    let mut i = 0;
    while i < body.len() {
        let s = &body[i];
        if let Stmt::Store { index, .. } = s {
            // A run of stores over the same dimensions shares one elementwise loop.
            let mut key = index.clone();
            key.sort_unstable();
            let mut j = i + 1;
            while let Some(Stmt::Store { index: ix, .. }) = body.get(j) {
                let mut k2 = ix.clone();
                k2.sort_unstable();
                if k2 != key {
                    break;
                }
                j += 1;
            }
            store_group(e, &body[i..j], depth)?;
            i = j;
            continue;
        }
        if let Stmt::Let { var, .. } = s {
            depth_of.insert(*var, depth);
        }
        if e.block_stmt(s, &ind)? {
            i += 1;
            continue;
        }
        match s {
            Stmt::Let { var, value, .. } => e.bind_inline(*var, value),
            Stmt::Assign { var, value, at } => {
                if depth_of.get(var) != Some(&depth) {
                    return Err(CodegenError::Unsupported {
                        kernel: e.k.name.clone(),
                        at: at.clone(),
                        message: format!(
                            "`{}` is carried across iterations of a `tile()` loop; outside `addmm` accumulators \
                             this is not supported yet: compute the value in the loop that uses it",
                            e.k.vars[*var].name
                        ),
                    });
                }
                if e.checked.vars[*var].dims.is_empty() {
                    return Err(CodegenError::Unsupported {
                        kernel: e.k.name.clone(),
                        at: at.clone(),
                        message:
                            "reassigning a scalar is not supported; bind a new name with `let`"
                                .into(),
                    });
                }
                // `v = f(v)`: f with v's current value substituted.
                e.bind_inline(*var, value);
            }
            Stmt::Loop {
                dim, body: inner, ..
            } => {
                let ext = e.k.dims[*dim].extent;
                let _ = writeln!(
                    e.out,
                    "{ind}for (long long tb{dim} = 0; tb{dim} < s{ext}; tb{dim} += B{dim}) {{  // tile `{}`",
                    e.k.dims[*dim].name
                );
                let saved = e.inline_vars.clone();
                stmts(e, inner, depth + 1, depth_of)?;
                e.inline_vars = saved;
                let _ = writeln!(e.out, "{ind}}}");
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

fn store_group(e: &mut Emitter, stores: &[Stmt], depth: usize) -> Result<(), CodegenError> {
    let ind = indent(depth);
    let Some(Stmt::Store { index: first, .. }) = stores.first() else {
        return Ok(());
    };
    let dims = first.clone();
    let elems: usize = dims.iter().map(|&d| e.cfg.block_sizes[d]).product();
    let nt = e.cfg.threads();
    let _ = writeln!(
        e.out,
        "{ind}for (int tf_e = tid; tf_e < {elems}; tf_e += {nt}) {{"
    );
    let _ = writeln!(e.out, "{ind}  int tf_r = tf_e;");
    let mut coords = Vec::new();
    for &d in dims.iter().rev() {
        let _ = writeln!(
            e.out,
            "{ind}  const long long c{d} = tb{d} + tf_r % B{d}; tf_r /= B{d};"
        );
        coords.push((d, format!("c{d}")));
    }
    // Elements past an extent that is not a multiple of the block do nothing.
    let inside: Vec<String> = dims
        .iter()
        .map(|&d| format!("c{d} < s{}", e.k.dims[d].extent))
        .collect();
    let _ = writeln!(e.out, "{ind}  if ({}) {{", inside.join(" && "));
    for s in stores {
        let Stmt::Store {
            tensor,
            index,
            value,
            at,
        } = s
        else {
            continue;
        };
        let (v, ty) = e.ctx(&coords).emit(value, at)?;
        let idx: Vec<String> = index.iter().map(|d| format!("c{d}")).collect();
        let dtype = e.spec.tensors[*tensor].dtype;
        let cty = if ty == CTy::F32 { "float" } else { "long long" };
        let _ = writeln!(
            e.out,
            "{ind}    {{ const {cty} v = {v};  // {}\n{ind}      if ({}) t{tensor}[{}] = {}; }}",
            one_line(at),
            tensor_mask(*tensor, &idx),
            tensor_offset(*tensor, &idx),
            narrow(dtype, "v", ty)
        );
    }
    let _ = writeln!(e.out, "{ind}  }}\n{ind}}}");
    Ok(())
}
