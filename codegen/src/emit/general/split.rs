//! A reduction loop shared by several programs (a "split reduction").
//!
//! A column sum over a tall matrix has few column tiles, each walking every
//! row: too few programs to keep the GPU's memory busy. When a program's first
//! tile loop only accumulates (`acc = acc + x[(tm, tn)].sum(tm)`, max, min,
//! product or `addmm`, and the position of a running minimum or maximum:
//! `at = select(lo < best, v.argmin(tm), at)` before `best = min(best, lo)`)
//! and nothing before it writes memory, the runtime may
//! launch `ways` programs per grid tile, each walking a contiguous share of
//! the loop's tiles. Each writes its accumulators to scratch; the last to
//! arrive (an atomic counter per grid tile) combines the shares in order,
//! part 0 first, so the result does not depend on timing, then runs the rest
//! of the program alone. The runtime picks `ways` at launch
//! (`runtime::split_loop`), from the grid, the loop's extent and the GPU, up to
//! [`crate::Config::split`]; with one way the kernel runs as written.

use super::{Gen, Val};
use crate::dtype::{CTy, DType};
use crate::error::CodegenError;
use crate::ir::{CmpOp, DimId, Expr, Kernel, ReduceOp, Stmt, VarId};

/// A program's first tile loop, when its programs can share it.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitLoop {
    /// Its index among the grid body's statements.
    pub at: usize,
    pub dim: DimId,
    /// The variables the loop accumulates, each with how two shares combine.
    pub accs: Vec<(VarId, Combine)>,
}

/// How the shares of one accumulator combine, in order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Combine {
    /// `acc = acc ⊕ e`: the shares' `⊕`.
    Op(ReduceOp),
    /// `at = select(x < best, t, at)` ahead of `best = min(best, x)` (or `>`
    /// and `max`): a later share's `at` where its `best` is strictly better
    /// than every share's before it, as the loop takes a later tile's only
    /// where it is strictly better (the first position of the best value).
    ArgOf { best: VarId, op: ReduceOp },
}

/// The split loop of `k`, if it has one: the first statement of the grid's
/// body that is a tile loop over the dimension's whole extent, with only
/// `let`s and assignments before it, a body of `let`s and accumulations
/// (`acc = acc ⊕ e` with `e` not reading an accumulator), and no tile loop
/// after it (the program after the loop runs in one program of the `ways`:
/// a long loop there would run serially). No `wait` or `signal` anywhere.
pub fn find(k: &Kernel) -> Option<SplitLoop> {
    let mut flags = false;
    k.walk_stmts(&mut |s| flags |= matches!(s, Stmt::Wait { .. } | Stmt::Signal { .. }));
    if flags {
        return None;
    }
    let at = k
        .body
        .iter()
        .position(|s| !matches!(s, Stmt::Let { .. } | Stmt::Assign { .. }))?;
    let Stmt::Loop {
        dim,
        body,
        until: None,
        range: None,
    } = &k.body[at]
    else {
        return None;
    };
    if k.is_each(*dim) {
        return None;
    }
    let mut loops_after = false;
    crate::ir::walk_stmts(&k.body[at + 1..], &mut |s| {
        loops_after |= matches!(s, Stmt::Loop { dim, .. } if !k.is_each(*dim));
    });
    if loops_after {
        return None;
    }
    // Variables defined inside the loop are its own; an assignment to any
    // other is an accumulation.
    let local: Vec<VarId> = body
        .iter()
        .filter_map(|s| match s {
            Stmt::Let { var, .. } => Some(*var),
            _ => None,
        })
        .collect();
    let mut accs: Vec<(VarId, Combine)> = Vec::new();
    let mut terms: Vec<&Expr> = Vec::new();
    // Each select's place in `accs` and its readings as `x < best` or `x > best`.
    let mut args: Vec<(usize, Vec<ArgRead>)> = Vec::new();
    for s in body {
        match s {
            Stmt::Let { value, .. } => terms.push(value),
            Stmt::Assign { var, value, .. } if !local.contains(var) => {
                if accs.iter().any(|(v, _)| v == var) {
                    return None;
                }
                match accumulation(*var, value) {
                    Some((op, term)) => {
                        accs.push((*var, Combine::Op(op)));
                        terms.extend(term);
                    }
                    None => {
                        args.push((accs.len(), arg_readings(*var, value)));
                        // Set below, once its `best` is known.
                        accs.push((*var, Combine::Op(ReduceOp::Sum)));
                    }
                }
            }
            _ => return None,
        }
    }
    if accs.is_empty() {
        return None;
    }
    // A select reads its `best` before the loop's `best = min(best, x)` of
    // the same `x` updates it.
    for (slot, readings) in args {
        let at = accs[slot].0;
        let pos = body
            .iter()
            .position(|s| matches!(s, Stmt::Assign { var, .. } if *var == at))?;
        let r = readings.into_iter().find(|r| {
            accs.contains(&(r.best, Combine::Op(r.op)))
                && body[pos + 1..].iter().any(|s| {
                    matches!(s, Stmt::Assign { var, value, .. } if *var == r.best
                    && accumulation(r.best, value).is_some_and(|(o, t)| o == r.op && t == [r.x]))
                })
        })?;
        accs[slot].1 = Combine::ArgOf {
            best: r.best,
            op: r.op,
        };
        terms.extend([r.x, r.t]);
    }
    // A share's terms may not read what the loop accumulates.
    let mut reads_acc = false;
    for t in terms {
        t.walk(&mut |x| {
            if let Expr::Var(v) = x {
                reads_acc |= accs.iter().any(|(a, _)| a == v);
            }
        });
    }
    (!reads_acc).then_some(SplitLoop {
        at,
        dim: *dim,
        accs,
    })
}

/// `acc ⊕ e` (either side) or `addmm(acc, a, b)`: how shares combine, and
/// the terms added in.
fn accumulation(acc: VarId, value: &Expr) -> Option<(ReduceOp, Vec<&Expr>)> {
    let is_acc = |e: &Expr| matches!(e, Expr::Var(v) if *v == acc);
    match value {
        Expr::Binary { op, lhs, rhs, .. } => {
            let op = ReduceOp::of_binary(*op)?;
            match (is_acc(lhs), is_acc(rhs)) {
                (true, false) => Some((op, vec![&**rhs])),
                (false, true) => Some((op, vec![&**lhs])),
                _ => None,
            }
        }
        Expr::Addmm { acc: a0, a, b, .. } if is_acc(a0) => Some((ReduceOp::Sum, vec![&**a, &**b])),
        _ => None,
    }
}

/// One reading of `select(mask, t, at)` as the position of a running best.
struct ArgRead<'a> {
    best: VarId,
    op: ReduceOp,
    x: &'a Expr,
    t: &'a Expr,
}

/// The readings of `at = select(x < best, t, at)` (or `best > x`; `>` for a
/// maximum): both sides of `lo < best` are variables, so it reads as a
/// minimum of `best` or a maximum of `lo`.
fn arg_readings(at: VarId, value: &Expr) -> Vec<ArgRead<'_>> {
    let Expr::Select {
        mask,
        then,
        otherwise,
        ..
    } = value
    else {
        return vec![];
    };
    let Expr::Compare { op, lhs, rhs, .. } = &**mask else {
        return vec![];
    };
    if !matches!(&**otherwise, Expr::Var(v) if *v == at) {
        return vec![];
    }
    // `l < r`: a minimum of `r` taking `l`, or a maximum of `l` taking `r`.
    let (small, large) = match op {
        CmpOp::Lt => (&**lhs, &**rhs),
        CmpOp::Gt => (&**rhs, &**lhs),
        _ => return vec![],
    };
    let mut out = Vec::new();
    if let Expr::Var(b) = large {
        out.push(ArgRead {
            best: *b,
            op: ReduceOp::Min,
            x: small,
            t: then,
        });
    }
    if let Expr::Var(b) = small {
        out.push(ArgRead {
            best: *b,
            op: ReduceOp::Max,
            x: large,
            t: then,
        });
    }
    out.retain(|r| r.best != at);
    out
}

/// The C of `op` combining two values of type `t`: the binary operation the
/// loop accumulates with (`fmaxf` for a float `max`, as the loop did).
fn combine_c(op: ReduceOp, t: CTy, a: &str, b: &str) -> String {
    let e = op.binary().entry();
    let template = if t == CTy::F32 { e.cuda } else { e.cuda_int };
    template.replace("{a}", a).replace("{b}", b)
}

/// Whether an accumulator of `t` can go through scratch: the types whose
/// registers hold exactly the stored value (`__ldcg` reads them back).
pub(super) fn shareable(t: DType) -> bool {
    matches!(t, DType::F32 | DType::I32 | DType::U32 | DType::I64)
}

/// Bytes of one element of `t` in scratch.
fn bytes(t: CTy) -> usize {
    match t {
        CTy::I64 => 8,
        _ => 4,
    }
}

impl Gen<'_, '_> {
    /// After a split loop: each share's accumulators (`accs`) go to scratch;
    /// the last program of the grid tile to arrive combines the shares in
    /// order and goes on, the others return. Returns the bytes a program's
    /// share takes in scratch.
    pub(super) fn split_meet(
        &mut self,
        accs: &[(VarId, Val, Combine)],
        depth: usize,
    ) -> Result<usize, CodegenError> {
        // Each accumulator's place in a share, 8-byte aligned.
        let mut offsets = Vec::new();
        let mut share = 0usize;
        for (_, v, _) in accs {
            offsets.push(share);
            let tile: usize = v.dims.iter().map(|&d| self.block(d)).product();
            share += (tile * bytes(v.cty)).next_multiple_of(8);
        }
        let d1 = depth + 1;
        self.w(depth, "if (tf_ways > 1) {  // the loop's shares meet");
        self.w(
            d1,
            format!(
                "unsigned char* tf_share = (unsigned char*)tf_partials + ((size_t)tf_prog * tf_ways + tf_part) * {share}ull;"
            ),
        );
        for ((_, v, _), off) in accs.iter().zip(&offsets) {
            let (n, at) = self.split_element(v, d1);
            let owner = self.owner_c(v.layout, &v.dims);
            let access = self.access(v);
            self.w(
                d1 + n,
                format!(
                    "if ({owner}) (({}*)(tf_share + {off}))[{at}] = {access};",
                    v.cty.c()
                ),
            );
            self.close(n, d1);
        }
        self.w(d1, "__threadfence();");
        self.w(d1, "__syncthreads();");
        self.w(d1, "__shared__ bool tf_last;");
        self.w(
            d1,
            "if (tid == 0) tf_last = tf_arrive_last(&tf_counters[tf_prog], (unsigned int)tf_ways);",
        );
        self.w(d1, "__syncthreads();");
        self.w(d1, "if (!tf_last) return;");
        self.w(d1, "__threadfence();");
        self.w(
            d1,
            format!(
                "const unsigned char* tf_shares = (const unsigned char*)tf_partials + (size_t)tf_prog * tf_ways * {share}ull;"
            ),
        );
        // Past L1, which may hold what another SM wrote before.
        let read = |c: &str, q: &str, off: usize, at: &str| {
            format!("__ldcg((const {c}*)(tf_shares + (size_t)({q}) * {share}ull + {off}) + {at})")
        };
        // The shares in order, each share's elements at once: a thread's
        // loads of one share are in flight together (the last program's
        // meet is the kernel's tail: 63 shares one element at a time took
        // 63 round trips to L2 an element).
        for ((_, v, _), off) in accs.iter().zip(&offsets) {
            let (n, at) = self.split_element(v, d1);
            let access = self.access(v);
            self.w(
                d1 + n,
                format!("{access} = {};", read(v.cty.c(), "0", *off, &at)),
            );
            self.close(n, d1);
        }
        // A position takes a later share's where that share's best is
        // strictly better than the best of the shares before it: a running
        // best of its own in the position's layout (`best`'s registers may
        // sit in another), set from share 0 and updated ahead of `best`.
        let mut args = Vec::new();
        for (i, ((var, v, combine), off)) in accs.iter().zip(&offsets).enumerate() {
            let Combine::ArgOf { best, op } = combine else {
                continue;
            };
            let b = accs.iter().position(|(w, _, _)| w == best);
            let Some((bv, boff)) = b
                .map(|b| (&accs[b].1, offsets[b]))
                .filter(|(bv, _)| bv.dims == v.dims)
            else {
                let name = self.e.k.vars[*var].name.clone();
                return Err(self.unsupported(
                    &name,
                    format!(
                        "`{name}` follows a best value over other tiles (split loops check this)"
                    ),
                ));
            };
            let lay = &self.layouts[v.layout];
            let count: usize = v
                .dims
                .iter()
                .map(|&d| lay.pos(d).map_or(1, |p| lay.per_thread(p)))
                .product();
            let flat = self.flat(v.layout, &v.dims);
            let running = format!("tf_rb{i}{flat}");
            let bc = bv.cty.c();
            let decl = if flat.is_empty() {
                String::new()
            } else {
                format!("[{count}]")
            };
            self.w(d1, format!("{bc} tf_rb{i}{decl};"));
            let (n, at) = self.split_element(v, d1);
            self.w(d1 + n, format!("{running} = {};", read(bc, "0", boff, &at)));
            self.close(n, d1);
            let better = if *op == ReduceOp::Max { ">" } else { "<" };
            args.push((v, *off, bc, boff, running, better));
        }
        self.w(d1, "#pragma unroll 4");
        self.w(d1, "for (int tf_q = 1; tf_q < tf_ways; ++tf_q) {");
        for (v, off, bc, boff, running, better) in args {
            let (n, at) = self.split_element(v, d1 + 1);
            let access = self.access(v);
            let d = d1 + 1 + n;
            self.w(
                d,
                format!("{{ const {bc} tf_sb = {};", read(bc, "tf_q", boff, &at)),
            );
            self.w(
                d + 1,
                format!(
                    "const {} tf_sa = {};",
                    v.cty.c(),
                    read(v.cty.c(), "tf_q", off, &at)
                ),
            );
            self.w(
                d + 1,
                format!(
                    "if (tf_sb {better} {running}) {{ {running} = tf_sb; {access} = tf_sa; }} }}"
                ),
            );
            self.close(n, d1 + 1);
        }
        for ((_, v, combine), off) in accs.iter().zip(&offsets) {
            let Combine::Op(op) = combine else { continue };
            let (n, at) = self.split_element(v, d1 + 1);
            let access = self.access(v);
            let next = read(v.cty.c(), "tf_q", *off, &at);
            self.w(
                d1 + 1 + n,
                format!("{access} = {};", combine_c(*op, v.cty, &access, &next)),
            );
            self.close(n, d1 + 1);
        }
        self.w(d1, "}");
        self.w(depth, "}");
        Ok(share)
    }

    /// Opens loops over a thread's elements of `v`; returns how many to
    /// close and the element's place in its tile (row-major over `v.dims`,
    /// each dimension its block long).
    fn split_element(&mut self, v: &Val, depth: usize) -> (usize, String) {
        let l = v.layout;
        let n = self.open(l, &v.dims, depth);
        let mut at = String::from("0");
        for &d in &v.dims {
            at = format!("({at}) * {} + {}", self.block(d), self.offset_c(l, d));
        }
        (n, at)
    }
}
