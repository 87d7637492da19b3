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

impl SplitLoop {
    /// Whether every accumulator starts as a scalar (`zeros([])`,
    /// `full([], …)` or a literal) before the loop: their shares meet across
    /// the threads at once (`scalar_meet`), so many shares cost little.
    pub fn scalars(&self, k: &Kernel) -> bool {
        self.accs.iter().all(|(v, _)| {
            k.body[..self.at].iter().any(|s| match s {
                Stmt::Let { var, value, .. } if var == v => {
                    matches!(
                        value,
                        Expr::Full { dims, .. } if dims.is_empty()
                    ) || matches!(value, Expr::Float(_) | Expr::Int(_))
                }
                _ => false,
            })
        })
    }
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

/// Element `at` of an accumulator at byte `off` of share `q` (`share` bytes
/// each), read past L1, which may hold what another SM wrote before.
fn share_read(c: &str, q: &str, off: usize, at: &str, share: usize) -> String {
    format!("__ldcg((const {c}*)(tf_shares + (size_t)({q}) * {share}ull + {off}) + {at})")
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
        self.store_accs(accs, &offsets, "tf_share", d1);
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
        let read = |c: &str, q: &str, off: usize, at: &str| share_read(c, q, off, at, share);
        if accs.iter().all(|(_, v, _)| v.dims.is_empty()) {
            self.scalar_meet(accs, &offsets, share, d1)?;
            self.w(depth, "}");
            return Ok(share);
        }
        // Where the accumulators share one layout with warps along a dimension
        // they do not have (the warps down a column sum's rows, each left with
        // the sums), only the owners read the shares, and the other warps take
        // the sums from them through shared memory after: each warp would
        // read every share again, in the kernel's tail (col_sum at `[256,
        // 64]`, 8 warps, on an H200: 0.0795 → 0.0755–0.0763 ms). Replicas
        // among a warp's lanes keep reading for themselves: gated, a one-warp
        // column argmin took 186 registers instead of 144 and ran 0.161 →
        // 0.212 ms.
        let (l0, dims0) = (accs[0].1.layout, &accs[0].1.dims);
        let owner = self.owner_c(l0, dims0);
        let lay = &self.layouts[l0];
        let warp_copies = lay
            .dims
            .iter()
            .zip(&lay.wpc)
            .any(|(d, &w)| w > 1 && !dims0.contains(d));
        let gated = warp_copies
            && accs
                .iter()
                .all(|(_, v, _)| v.layout == l0 && self.owner_c(v.layout, &v.dims) == owner);
        let d1 = match gated {
            true => {
                self.w(
                    d1,
                    format!("if ({owner}) {{  // the owners read the shares"),
                );
                d1 + 1
            }
            false => d1,
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
            let count = self.per_thread(v);
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
        // Shares a step: about 64 loads in flight a thread (at least 4
        // shares, at most 16), each step one round trip to L2 for the last
        // program, the kernel's tail (a column sum's 8 elements a thread and
        // 33 shares: 4 steps, where 4 shares a step took 8).
        let loads: usize = accs
            .iter()
            .map(|(_, v, c)| {
                self.per_thread(v)
                    * if matches!(c, Combine::ArgOf { .. }) {
                        2
                    } else {
                        1
                    }
            })
            .sum();
        let unroll = (64 / loads.max(1)).clamp(4, 16);
        let unroll = 1 << unroll.ilog2();
        self.w(d1, format!("#pragma unroll {unroll}"));
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
        if gated {
            self.broadcast_meet(accs, &offsets, share, d1 - 1);
        }
        self.w(depth, "}");
        Ok(share)
    }

    /// After the owners' meet: the sums through shared memory (laid out as a
    /// share) to every thread that holds a copy of them.
    fn broadcast_meet(
        &mut self,
        accs: &[(VarId, Val, Combine)],
        offsets: &[usize],
        share: usize,
        depth: usize,
    ) {
        self.w(depth, "}");
        self.need_smem(share);
        self.store_accs(accs, offsets, "tf_smem", depth);
        self.w(depth, "__syncthreads();");
        for ((_, v, _), off) in accs.iter().zip(offsets) {
            let (n, at) = self.split_element(v, depth);
            let access = self.access(v);
            self.w(
                depth + n,
                format!("{access} = (({}*)(tf_smem + {off}))[{at}];", v.cty.c()),
            );
            self.close(n, depth);
        }
    }

    /// Each accumulator's elements written by their owners at `base` (bytes),
    /// laid out as a share: the accumulator at its offset, its tile row-major.
    fn store_accs(
        &mut self,
        accs: &[(VarId, Val, Combine)],
        offsets: &[usize],
        base: &str,
        depth: usize,
    ) {
        for ((_, v, _), off) in accs.iter().zip(offsets) {
            let (n, at) = self.split_element(v, depth);
            let owner = self.owner_c(v.layout, &v.dims);
            let access = self.access(v);
            self.w(
                depth + n,
                format!(
                    "if ({owner}) (({}*)({base} + {off}))[{at}] = {access};",
                    v.cty.c()
                ),
            );
            self.close(n, depth);
        }
    }

    /// The meet of scalar accumulators (each thread holds the whole value):
    /// the threads take the shares between them (thread `t` shares `t`,
    /// `t + threads`, …), then combine across the lanes by butterfly
    /// shuffles and across the warps through shared memory in warp order.
    /// One round trip to L2 for up to a block's threads of shares, where the
    /// loop over shares in order took one for every few (a row split 128
    /// ways waited 32 of them). The order is fixed, so the result does not
    /// depend on timing; a position (`Combine::ArgOf`) carries its share's
    /// number and, between equal bests, the lower one wins, as in order.
    fn scalar_meet(
        &mut self,
        accs: &[(VarId, Val, Combine)],
        offsets: &[usize],
        share: usize,
        d: usize,
    ) -> Result<(), CodegenError> {
        let read = |c: &str, q: &str, off: usize| share_read(c, q, off, "0", share);
        // Per accumulator: its C type, its place in a share, how it combines.
        struct Run {
            c: &'static str,
            off: usize,
            how: How,
        }
        enum How {
            Op(ReduceOp),
            Arg(Best),
        }
        // A position's best value: its C type, its place in a share, `<` or
        // `>`, and its start (the reduction's identity).
        #[derive(Clone, Copy)]
        struct Best {
            c: &'static str,
            off: usize,
            better: &'static str,
            identity: &'static str,
        }
        let mut runs = Vec::new();
        for ((var, v, combine), &off) in accs.iter().zip(offsets) {
            let c = v.cty.c();
            let run = match combine {
                Combine::Op(op) => Run {
                    c,
                    off,
                    how: How::Op(*op),
                },
                Combine::ArgOf { best, op } => {
                    let Some(b) = accs.iter().position(|(w, _, _)| w == best) else {
                        let name = self.e.k.vars[*var].name.clone();
                        return Err(self.unsupported(
                            &name,
                            format!("`{name}` follows a best value the loop does not accumulate"),
                        ));
                    };
                    let bt = accs[b].1.cty;
                    let better = if *op == ReduceOp::Max { ">" } else { "<" };
                    Run {
                        c,
                        off,
                        how: How::Arg(Best {
                            c: bt.c(),
                            off: offsets[b],
                            better,
                            identity: op.identity_c(bt),
                        }),
                    }
                }
            };
            runs.push(run);
        }
        // Each thread's shares, in order.
        for (i, r) in runs.iter().enumerate() {
            match &r.how {
                How::Op(op) => self.w(
                    d,
                    format!("{} tf_m{i} = {};", r.c, op.identity_c(accs[i].1.cty)),
                ),
                How::Arg(b) => self.w(
                    d,
                    format!(
                        "{} tf_m{i} = 0; {} tf_mb{i} = {}; int tf_mq{i} = 2147483647;",
                        r.c, b.c, b.identity
                    ),
                ),
            }
        }
        let threads = self.threads;
        self.w(
            d,
            format!("for (int tf_q = tid; tf_q < tf_ways; tf_q += {threads}) {{"),
        );
        for (i, r) in runs.iter().enumerate() {
            match &r.how {
                How::Op(op) => {
                    let x = read(r.c, "tf_q", r.off);
                    let cty = accs[i].1.cty;
                    self.w(d + 1, format!("tf_m{i} = {};", combine_c(*op, cty, &format!("tf_m{i}"), &x)));
                }
                How::Arg(b) => self.w(
                    d + 1,
                    format!(
                        "{{ const {} tf_sb = {}; const {} tf_sa = {}; if (tf_sb {} tf_mb{i} || (tf_sb == tf_mb{i} && tf_q < tf_mq{i})) {{ tf_mb{i} = tf_sb; tf_mq{i} = tf_q; tf_m{i} = tf_sa; }} }}",
                        b.c,
                        read(b.c, "tf_q", b.off),
                        r.c,
                        read(r.c, "tf_q", r.off),
                        b.better
                    ),
                ),
            }
        }
        self.w(d, "}");
        // Two partial results, `x` from the other lane or warp: the same
        // combine as above, so every thread ends with the same value.
        let combine_in = |i: usize, r: &Run, x: &str, xb: &str, xq: &str| -> String {
            match &r.how {
                How::Op(op) => format!("tf_m{i} = {};", combine_c(*op, accs[i].1.cty, &format!("tf_m{i}"), x)),
                How::Arg(b) => format!(
                    "if ({xb} {} tf_mb{i} || ({xb} == tf_mb{i} && {xq} < tf_mq{i})) {{ tf_mb{i} = {xb}; tf_mq{i} = {xq}; tf_m{i} = {x}; }}",
                    b.better
                ),
            }
        };
        self.w(d, "#pragma unroll");
        self.w(d, "for (int tf_s = 16; tf_s > 0; tf_s >>= 1) {");
        for (i, r) in runs.iter().enumerate() {
            let sh = |v: &str| format!("__shfl_xor_sync(0xffffffffu, {v}, tf_s)");
            let mut line = format!("{{ const {} tf_x = {};", r.c, sh(&format!("tf_m{i}")));
            if let How::Arg(Best { c: bc, .. }) = r.how {
                line += &format!(
                    " const {bc} tf_xb = {}; const int tf_xq = {};",
                    sh(&format!("tf_mb{i}")),
                    sh(&format!("tf_mq{i}"))
                );
            }
            line += &format!(" {} }}", combine_in(i, r, "tf_x", "tf_xb", "tf_xq"));
            self.w(d + 1, line);
        }
        self.w(d, "}");
        let warps = threads / 32;
        if warps > 1 {
            // Each warp's result in shared memory (after whatever the loop
            // left there), then every thread combines them in warp order.
            let mut cells = Vec::new();
            let mut at = 0usize;
            for (i, r) in runs.iter().enumerate() {
                let size = |c: &str| if c == "long long" { 8 } else { 4 };
                let m = at;
                at = (at + warps * size(r.c)).next_multiple_of(8);
                let mut extra = None;
                if let How::Arg(Best { c: bc, .. }) = r.how {
                    let mb = at;
                    at = (at + warps * size(bc)).next_multiple_of(8);
                    let mq = at;
                    at = (at + warps * 4).next_multiple_of(8);
                    extra = Some((bc, mb, mq));
                }
                cells.push((i, m, extra));
            }
            self.need_smem(at);
            self.w(d, "__syncthreads();");
            let mut write = String::from("if (tf_lane == 0) {");
            for (i, m, extra) in &cells {
                let c = runs[*i].c;
                write += &format!(" (({c}*)(tf_smem + {m}))[tf_warp] = tf_m{i};");
                if let Some((bc, mb, mq)) = extra {
                    write += &format!(
                        " (({bc}*)(tf_smem + {mb}))[tf_warp] = tf_mb{i}; ((int*)(tf_smem + {mq}))[tf_warp] = tf_mq{i};"
                    );
                }
            }
            self.w(d, write + " }");
            self.w(d, "__syncthreads();");
            for (i, m, extra) in &cells {
                let c = runs[*i].c;
                let mut first = format!("tf_m{i} = (({c}*)(tf_smem + {m}))[0];");
                if let Some((bc, mb, mq)) = extra {
                    first += &format!(
                        " tf_mb{i} = (({bc}*)(tf_smem + {mb}))[0]; tf_mq{i} = ((int*)(tf_smem + {mq}))[0];"
                    );
                }
                self.w(d, first);
            }
            self.w(d, "#pragma unroll");
            self.w(d, format!("for (int tf_w = 1; tf_w < {warps}; ++tf_w) {{"));
            for (i, m, extra) in &cells {
                let r = &runs[*i];
                let c = r.c;
                let mut line = format!("{{ const {c} tf_x = (({c}*)(tf_smem + {m}))[tf_w];");
                if let Some((bc, mb, mq)) = extra {
                    line += &format!(
                        " const {bc} tf_xb = (({bc}*)(tf_smem + {mb}))[tf_w]; const int tf_xq = ((int*)(tf_smem + {mq}))[tf_w];"
                    );
                }
                line += &format!(" {} }}", combine_in(*i, r, "tf_x", "tf_xb", "tf_xq"));
                self.w(d + 1, line);
            }
            self.w(d, "}");
        }
        for (i, (_, v, _)) in accs.iter().enumerate() {
            let access = self.access(v);
            self.w(d, format!("{access} = tf_m{i};"));
        }
        Ok(())
    }

    /// How many elements of `v` a thread holds.
    fn per_thread(&self, v: &Val) -> usize {
        let lay = &self.layouts[v.layout];
        v.dims
            .iter()
            .map(|&d| lay.pos(d).map_or(1, |p| lay.per_thread(p)))
            .product()
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
