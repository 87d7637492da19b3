//! Flash attention's backward pass in `#[fused_kernel]`s, in FlashAttention-2's
//! structure: the forward also saves each query row's log-sum-exp; `delta =
//! rowsum(dO ∘ O)`; one kernel per key tile accumulates dK and dV over the
//! query tiles and one per query tile accumulates dQ over the key tiles, each
//! recomputing the probabilities from `q`, `k` and the saved log-sum-exp
//! instead of storing them. Causal or not; grouped-query (`--kv-heads HK`:
//! each key/value head shared by `H / HK` query heads, its dK and dV summed
//! over them). Every gradient is checked against float64.
//!
//! ```text
//! cargo run --release --example attention_backward -- [B H S D] [--causal] [--kv-heads HK] [--bench] [--hopper] [--fused [--tma-add] | --two-kernels]   (default 1 2 200 64)
//! ```
//!
//! The forward takes the attention program, and so do the backward's
//! kernels, in its `mma.sync` form (FlashAttention-2's): dQ with `dO·Vᵀ` a
//! second product of the scores' form and `dS·K` the update; dK/dV with the
//! grid's keys as the program's rows, the queries streamed (`q·kᵀ` computed
//! as `k·qᵀ`), dV and dK two accumulators and the loop over a group's query
//! heads around the query loop. Scores and accumulators stay in registers.
//! On Hopper the untuned default is the Hopper (`wgmma`) program at head
//! dimensions 64 and 128 (those checked there; `--hopper` pins it at any): K
//! and V (or Q and dO) in shared memory, the streamed operands in a ring
//! filled by TMA, each product a `wgmma` group.
//!
//! On Hopper the backward runs in one pass by default ([`attention_dkdvdq`]:
//! dQ added atomically from the dK/dV kernel, as FlashAttention-2 and -3 do,
//! the adds made by the TMA unit; 4×16×2048×128 on an H200: 0.83 ms, the two
//! kernels 1.03). `--two-kernels` runs dK/dV and dQ apart instead (the
//! default elsewhere, where the one pass takes the general lowering);
//! `--fused` the one pass on any GPU; `--fused --hopper` pins the Hopper
//! program with the threads' adds, `--hopper` alone the two kernels'.

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse_testkit::{exit_code, poisoned, random_tensor};

/// The forward of `examples/attention.rs` (grouped-query as
/// `attention_gqa`: `k` and `v` may have fewer heads, each shared by `H / HK`
/// query heads), also storing each row's log-sum-exp of its scaled scores
/// (`lse`, `[B, H, S]` f32) for the backward.
#[fused_kernel]
pub fn attention_lse(
    q: &Tensor<bf16>,
    k: &Tensor<bf16>,
    v: &Tensor<bf16>,
    out: &Tensor<bf16>,
    lse: &Tensor<f32>,
    scale: f32,
    #[constexpr] causal: bool,
) {
    let [b, h, s, d] = q.shape();
    let [_, hk, sk, _] = k.shape();
    if hk == 0 || h % hk != 0 {
        return Err(tilefuse::Error::Argument {
            context: "attention_lse".into(),
            arg: "k".into(),
            message: format!("{hk} key/value heads do not divide the {h} query heads"),
        });
    }
    let group = h / hk;
    for (tb, th, tm, td) in tile([b, h, s, whole(d)]) {
        let mut row_max = full::<f32>([tb, th, tm], f32::NEG_INFINITY);
        let mut denom = zeros::<f32>([tb, th, tm]);
        let mut acc = zeros::<f32>([tb, th, tm, td]);
        for tn in tile(sk).until(if causal { tm.end() } else { sk }) {
            let x = addmm(
                zeros::<f32>([tb, th, tm, tn]),
                q[(tb, th, tm, td)],
                k[(tb, th / group, tn, td)],
            ) * scale;
            let x = if causal {
                select(tm.index() >= tn.index(), x, f32::NEG_INFINITY)
            } else {
                x
            };
            let new_max = max(row_max, x.max(tn));
            let p = exp(x - new_max);
            let alpha = exp(row_max - new_max);
            denom = denom * alpha + p.sum(tn);
            acc = addmm(acc * alpha, p.cast::<bf16>(), v[(tb, th / group, tn, td)]);
            row_max = new_max;
        }
        out[(tb, th, tm, td)] = (acc / denom).cast();
        lse[(tb, th, tm)] = row_max + ln(denom);
    }
}

/// `delta = rowsum(dO ∘ O)`: each query row's `Σ_d dO·O`, the term every
/// probability's gradient subtracts.
#[fused_kernel]
pub fn attention_delta(out: &Tensor<bf16>, dout: &Tensor<bf16>, delta: &Tensor<f32>) {
    let [b, h, s, d] = out.shape();
    for (tb, th, tm) in tile([b, h, s]) {
        let mut acc = zeros::<f32>([tb, th, tm]);
        for td in tile(d) {
            let o = out[(tb, th, tm, td)].cast::<f32>();
            acc = acc + (o * dout[(tb, th, tm, td)].cast::<f32>()).sum(td);
        }
        delta[(tb, th, tm)] = acc;
    }
}

/// dK and dV for a tile of keys, over every query tile: `P` recomputed from
/// the saved log-sum-exp, `dV += Pᵀ·dO`, `dS = P ∘ (dO·Vᵀ − delta)`,
/// `dK += dSᵀ·Q` (times `scale`). With grouped-query attention (`k` and `v`
/// of `HK` heads, each shared by `H / HK` consecutive query heads) a key/value
/// head's gradients also sum over its group's query heads (`for g in
/// tile(each(group))`, one pass where `HK = H`).
#[fused_kernel]
#[allow(clippy::too_many_arguments)]
pub fn attention_dkdv(
    q: &Tensor<bf16>,
    k: &Tensor<bf16>,
    v: &Tensor<bf16>,
    dout: &Tensor<bf16>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dk: &Tensor<bf16>,
    dv: &Tensor<bf16>,
    scale: f32,
    #[constexpr] causal: bool,
) {
    let [b, h, s, d] = q.shape();
    let [_, hk, sk, _] = k.shape();
    if hk == 0 || h % hk != 0 {
        return Err(tilefuse::Error::Argument {
            context: "attention_dkdv".into(),
            arg: "k".into(),
            message: format!("{hk} key/value heads do not divide the {h} query heads"),
        });
    }
    let group = h / hk;
    for (tb, th, tn, td) in tile([b, hk, sk, whole(d)]) {
        let mut dk_acc = zeros::<f32>([tb, th, tn, td]);
        let mut dv_acc = zeros::<f32>([tb, th, tn, td]);
        for g in tile(each(group)) {
            // Causal: queries before the tile's first key see none of its keys.
            for tm in tile(if causal { tn.begin() } else { 0 }..s) {
                let x = addmm(
                    zeros::<f32>([tb, th, tm, tn]),
                    q[(tb, th * group + g, tm, td)],
                    k[(tb, th, tn, td)],
                ) * scale;
                let p = exp(x - lse[(tb, th * group + g, tm)]);
                let p = if causal {
                    select(tm.index() >= tn.index(), p, 0.0)
                } else {
                    p
                };
                dv_acc = addmm(dv_acc, p.cast::<bf16>(), dout[(tb, th * group + g, tm, td)]);
                let dp = addmm(
                    zeros::<f32>([tb, th, tm, tn]),
                    dout[(tb, th * group + g, tm, td)],
                    v[(tb, th, tn, td)],
                );
                let ds = p * (dp - delta[(tb, th * group + g, tm)]);
                dk_acc = addmm(dk_acc, ds.cast::<bf16>(), q[(tb, th * group + g, tm, td)]);
            }
        }
        dk[(tb, th, tn, td)] = (dk_acc * scale).cast();
        dv[(tb, th, tn, td)] = dv_acc.cast();
    }
}

/// dK and dV as [`attention_dkdv`], and dQ in the same pass, FlashAttention-2
/// and -3's single backward kernel: each step's `dS·K` (over the step's
/// queries and the head dimension; `dS` transposed against the scores) is
/// added into `dq_acc` (f32, zeroed before) atomically, since the key tiles
/// a query row meets run in different programs; [`attention_dq_out`] then
/// rounds it to `dq`. Five products a step, against seven in the two kernels
/// (dQ's recomputes `S` and `dP`).
#[fused_kernel]
#[allow(clippy::too_many_arguments)]
pub fn attention_dkdvdq(
    q: &Tensor<bf16>,
    k: &Tensor<bf16>,
    v: &Tensor<bf16>,
    dout: &Tensor<bf16>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dk: &Tensor<bf16>,
    dv: &Tensor<bf16>,
    dq_acc: &Tensor<f32>,
    scale: f32,
    #[constexpr] causal: bool,
) {
    let [b, h, s, d] = q.shape();
    let [_, hk, sk, _] = k.shape();
    if hk == 0 || h % hk != 0 {
        return Err(tilefuse::Error::Argument {
            context: "attention_dkdvdq".into(),
            arg: "k".into(),
            message: format!("{hk} key/value heads do not divide the {h} query heads"),
        });
    }
    let group = h / hk;
    for (tb, th, tn, td) in tile([b, hk, sk, whole(d)]) {
        let mut dk_acc = zeros::<f32>([tb, th, tn, td]);
        let mut dv_acc = zeros::<f32>([tb, th, tn, td]);
        for g in tile(each(group)) {
            for tm in tile(if causal { tn.begin() } else { 0 }..s) {
                let x = addmm(
                    zeros::<f32>([tb, th, tm, tn]),
                    q[(tb, th * group + g, tm, td)],
                    k[(tb, th, tn, td)],
                ) * scale;
                let p = exp(x - lse[(tb, th * group + g, tm)]);
                let p = if causal {
                    select(tm.index() >= tn.index(), p, 0.0)
                } else {
                    p
                };
                dv_acc = addmm(dv_acc, p.cast::<bf16>(), dout[(tb, th * group + g, tm, td)]);
                let dp = addmm(
                    zeros::<f32>([tb, th, tm, tn]),
                    dout[(tb, th * group + g, tm, td)],
                    v[(tb, th, tn, td)],
                );
                let ds = p * (dp - delta[(tb, th * group + g, tm)]);
                dk_acc = addmm(dk_acc, ds.cast::<bf16>(), q[(tb, th * group + g, tm, td)]);
                atomic_add(
                    dq_acc[(tb, th * group + g, tm, td)],
                    addmm(
                        zeros::<f32>([tb, th, tm, td]),
                        ds.cast::<bf16>(),
                        k[(tb, th, tn, td)],
                    ) * scale,
                );
            }
        }
        dk[(tb, th, tn, td)] = (dk_acc * scale).cast();
        dv[(tb, th, tn, td)] = dv_acc.cast();
    }
}

/// `dq = dq_acc` rounded to bf16 ([`attention_dkdvdq`]'s accumulated dQ).
#[fused_kernel]
pub fn attention_dq_out(dq_acc: &Tensor<f32>, dq: &Tensor<bf16>) {
    let [b, h, s, d] = dq.shape();
    for (tb, th, tm, td) in tile([b, h, s, d]) {
        dq[(tb, th, tm, td)] = dq_acc[(tb, th, tm, td)].cast();
    }
}

/// dQ for a tile of queries, over the key tiles (up to the diagonal when
/// causal): `dQ += dS·K` (times `scale`), `dS` recomputed as for dK; a
/// query head reads its group's key/value head.
#[fused_kernel]
#[allow(clippy::too_many_arguments)]
pub fn attention_dq(
    q: &Tensor<bf16>,
    k: &Tensor<bf16>,
    v: &Tensor<bf16>,
    dout: &Tensor<bf16>,
    lse: &Tensor<f32>,
    delta: &Tensor<f32>,
    dq: &Tensor<bf16>,
    scale: f32,
    #[constexpr] causal: bool,
) {
    let [b, h, s, d] = q.shape();
    let [_, hk, sk, _] = k.shape();
    if hk == 0 || h % hk != 0 {
        return Err(tilefuse::Error::Argument {
            context: "attention_dq".into(),
            arg: "k".into(),
            message: format!("{hk} key/value heads do not divide the {h} query heads"),
        });
    }
    let group = h / hk;
    for (tb, th, tm, td) in tile([b, h, s, whole(d)]) {
        let mut dq_acc = zeros::<f32>([tb, th, tm, td]);
        for tn in tile(sk).until(if causal { tm.end() } else { sk }) {
            let x = addmm(
                zeros::<f32>([tb, th, tm, tn]),
                q[(tb, th, tm, td)],
                k[(tb, th / group, tn, td)],
            ) * scale;
            let p = exp(x - lse[(tb, th, tm)]);
            let p = if causal {
                select(tm.index() >= tn.index(), p, 0.0)
            } else {
                p
            };
            let dp = addmm(
                zeros::<f32>([tb, th, tm, tn]),
                dout[(tb, th, tm, td)],
                v[(tb, th / group, tn, td)],
            );
            let ds = p * (dp - delta[(tb, th, tm)]);
            dq_acc = addmm(dq_acc, ds.cast::<bf16>(), k[(tb, th / group, tn, td)]);
        }
        dq[(tb, th, tm, td)] = (dq_acc * scale).cast();
    }
}

/// The gradients of one `(batch, head)` slice in float64: `q` `s × d`, `k`
/// and `v` `sk × d`, `dout` `s × d`; returns `(dq, dk, dv)`, row-major.
#[allow(clippy::type_complexity)]
pub fn reference_grads(
    (q, k, v, dout): (&[f64], &[f64], &[f64], &[f64]),
    (s, sk, d): (usize, usize, usize),
    scale: f64,
    causal: bool,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    // P: softmax of the scaled scores, row by row (a causal row sees keys up to itself).
    let mut p = vec![0.0; s * sk];
    for i in 0..s {
        let row = &mut p[i * sk..(i + 1) * sk];
        for (j, x) in row.iter_mut().enumerate() {
            *x = if causal && j > i {
                f64::NEG_INFINITY
            } else {
                scale * (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>()
            };
        }
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|x| (x - m).exp()).sum();
        for x in row.iter_mut() {
            *x = (*x - m).exp() / z;
        }
    }
    let (mut dq, mut dk, mut dv) = (vec![0.0; s * d], vec![0.0; sk * d], vec![0.0; sk * d]);
    for i in 0..s {
        // dP = dO·Vᵀ; dS = P ∘ (dP − Σ_j P·dP).
        let dp: Vec<f64> = (0..sk)
            .map(|j| (0..d).map(|c| dout[i * d + c] * v[j * d + c]).sum())
            .collect();
        let pi = &p[i * sk..(i + 1) * sk];
        let dot: f64 = pi.iter().zip(&dp).map(|(a, b)| a * b).sum();
        for j in 0..sk {
            let ds = pi[j] * (dp[j] - dot);
            for c in 0..d {
                dv[j * d + c] += pi[j] * dout[i * d + c];
                dq[i * d + c] += scale * ds * k[j * d + c];
                dk[j * d + c] += scale * ds * q[i * d + c];
            }
        }
    }
    (dq, dk, dv)
}

/// One problem's tensors: fresh random `q` and `dout` of `[b, h, s, d]`, `k`
/// and `v` of `[b, hk, s, d]`, the rest poisoned until the kernels write them.
pub struct Problem {
    pub shape: [usize; 4],
    /// Key/value heads (`h` without grouped-query attention).
    pub kv_heads: usize,
    pub causal: bool,
    scale: f32,
    q: Tensor<bf16>,
    k: Tensor<bf16>,
    v: Tensor<bf16>,
    dout: Tensor<bf16>,
    out: Tensor<bf16>,
    lse: Tensor<f32>,
    delta: Tensor<f32>,
    dq: Tensor<bf16>,
    dk: Tensor<bf16>,
    dv: Tensor<bf16>,
    /// dQ's f32 accumulator for [`Problem::backward_fused`].
    dq_acc: Tensor<f32>,
}

impl Problem {
    pub fn new(shape: [usize; 4], causal: bool) -> tilefuse::Result<Problem> {
        Problem::grouped(shape, shape[1], causal)
    }

    /// `kv_heads` key/value heads, each shared by `h / kv_heads` query heads.
    pub fn grouped(shape: [usize; 4], kv_heads: usize, causal: bool) -> tilefuse::Result<Problem> {
        let [b, h, s, d] = shape;
        let hk = kv_heads;
        Ok(Problem {
            shape,
            kv_heads,
            causal,
            scale: 1.0 / (d as f32).sqrt(),
            q: random_tensor::<bf16>([b, h, s, d], 1.0)?,
            k: random_tensor::<bf16>([b, hk, s, d], 1.0)?,
            v: random_tensor::<bf16>([b, hk, s, d], 1.0)?,
            dout: random_tensor::<bf16>([b, h, s, d], 1.0)?,
            out: poisoned::<bf16>([b, h, s, d])?,
            lse: poisoned::<f32>([b, h, s])?,
            delta: poisoned::<f32>([b, h, s])?,
            dq: poisoned::<bf16>([b, h, s, d])?,
            dk: poisoned::<bf16>([b, hk, s, d])?,
            dv: poisoned::<bf16>([b, hk, s, d])?,
            dq_acc: poisoned::<f32>([b, h, s, d])?,
        })
    }

    /// The forward, saving `out` and the log-sum-exp.
    pub fn forward(&self) -> tilefuse::Result<()> {
        let p = self;
        attention_lse(&p.q, &p.k, &p.v, &p.out, &p.lse, p.scale, p.causal)
    }

    /// The backward: `delta`, then dK and dV (summed over each group's query
    /// heads where `k` and `v` have fewer heads), then dQ.
    pub fn backward(&self) -> tilefuse::Result<()> {
        let p = self;
        attention_delta(&p.out, &p.dout, &p.delta)?;
        attention_dkdv(
            &p.q, &p.k, &p.v, &p.dout, &p.lse, &p.delta, &p.dk, &p.dv, p.scale, p.causal,
        )?;
        attention_dq(
            &p.q, &p.k, &p.v, &p.dout, &p.lse, &p.delta, &p.dq, p.scale, p.causal,
        )
    }

    /// The backward in one pass over the keys ([`attention_dkdvdq`]: dQ
    /// accumulated atomically in f32, then rounded), after `delta`.
    pub fn backward_fused(&self) -> tilefuse::Result<()> {
        let p = self;
        attention_delta(&p.out, &p.dout, &p.delta)?;
        p.dq_acc.zero()?;
        attention_dkdvdq(
            &p.q, &p.k, &p.v, &p.dout, &p.lse, &p.delta, &p.dk, &p.dv, &p.dq_acc, p.scale, p.causal,
        )?;
        attention_dq_out(&p.dq_acc, &p.dq)
    }

    /// The relative errors `‖g − ref‖/‖ref‖` of dQ, dK and dV against
    /// float64, over the batches `batches` and key/value heads `kv_heads`
    /// (with their groups' query heads; a key/value head's reference
    /// gradients summed over its group).
    pub fn errors(&self, batches: &[usize], kv_heads: &[usize]) -> tilefuse::Result<[f64; 3]> {
        let [_, h, s, d] = self.shape;
        let hk = self.kv_heads;
        let group = h / hk;
        let host = |t: &Tensor<bf16>| -> tilefuse::Result<Vec<f64>> {
            Ok(t.to_vec()?.iter().map(|x| x.to_f64()).collect())
        };
        let (qh, kh, vh, oh) = (
            host(&self.q)?,
            host(&self.k)?,
            host(&self.v)?,
            host(&self.dout)?,
        );
        let got = [host(&self.dq)?, host(&self.dk)?, host(&self.dv)?];
        let (mut num, mut den) = ([0.0f64; 3], [0.0f64; 3]);
        let n = s * d;
        let at = |x: &[f64], slice: usize| x[slice * n..(slice + 1) * n].to_vec();
        for &bi in batches {
            let (mut dk, mut dv) = (vec![vec![0.0; n]; hk], vec![vec![0.0; n]; hk]);
            for hq in (0..h).filter(|hq| kv_heads.contains(&(hq / group))) {
                let (qs, kv) = (bi * h + hq, bi * hk + hq / group);
                let (rq, rk, rv) = reference_grads(
                    (&at(&qh, qs), &at(&kh, kv), &at(&vh, kv), &at(&oh, qs)),
                    (s, s, d),
                    f64::from(self.scale),
                    self.causal,
                );
                for (i, w) in rq.iter().enumerate() {
                    num[0] += (got[0][qs * n + i] - w).powi(2);
                    den[0] += w * w;
                }
                for i in 0..n {
                    dk[hq / group][i] += rk[i];
                    dv[hq / group][i] += rv[i];
                }
            }
            for (g, want) in [(1, dk), (2, dv)] {
                for (hh, w) in want
                    .iter()
                    .enumerate()
                    .filter(|(hh, _)| kv_heads.contains(hh))
                {
                    let base = (bi * hk + hh) * n;
                    for (i, w) in w.iter().enumerate() {
                        num[g] += (got[g][base + i] - w).powi(2);
                        den[g] += w * w;
                    }
                }
            }
        }
        Ok([0, 1, 2].map(|g| (num[g] / den[g].max(f64::MIN_POSITIVE)).sqrt()))
    }
}

/// Forward and backward on `[b, h, s, d]` inputs with a random `dout`; the
/// relative errors `‖g − ref‖/‖ref‖` of dQ, dK and dV over every slice.
pub fn run_and_check(shape: [usize; 4], causal: bool) -> tilefuse::Result<[f64; 3]> {
    run_and_check_grouped(shape, shape[1], causal)
}

/// [`run_and_check`] with `kv_heads` key/value heads (grouped-query attention).
pub fn run_and_check_grouped(
    shape: [usize; 4],
    kv_heads: usize,
    causal: bool,
) -> tilefuse::Result<[f64; 3]> {
    let p = Problem::grouped(shape, kv_heads, causal)?;
    p.forward()?;
    p.backward()?;
    p.errors(
        &(0..shape[0]).collect::<Vec<_>>(),
        &(0..kv_heads).collect::<Vec<_>>(),
    )
}

/// [`run_and_check_grouped`] with the one-pass backward ([`Problem::backward_fused`]).
pub fn run_and_check_fused(
    shape: [usize; 4],
    kv_heads: usize,
    causal: bool,
) -> tilefuse::Result<[f64; 3]> {
    let p = Problem::grouped(shape, kv_heads, causal)?;
    p.forward()?;
    p.backward_fused()?;
    p.errors(
        &(0..shape[0]).collect::<Vec<_>>(),
        &(0..kv_heads).collect::<Vec<_>>(),
    )
}

/// attention_backward's command line.
#[derive(clap::Parser)]
#[command(
    about = "Flash attention's backward pass (dQ, dK, dV) over q, k, v of [B, H, S, D] bf16, checked against float64"
)]
struct Cli {
    /// Batch, heads, sequence length and head dimension (all four, or none
    /// for the defaults).
    #[arg(num_args = 4, value_names = ["B", "H", "S", "D"])]
    shape: Vec<usize>,
    /// A causal mask.
    #[arg(long)]
    causal: bool,
    /// Key and value heads, each shared by H / HK query heads (grouped-query
    /// attention; H by default).
    #[arg(long, value_name = "HK")]
    kv_heads: Option<usize>,
    /// Time the backward (delta, dK/dV, dQ) after the check; at large sizes
    /// only the first batch's first key/value head is checked.
    #[arg(long)]
    bench: bool,
    /// Pin the Hopper (`wgmma`) program's default for dQ and dK/dV (or the
    /// one pass) at any head dimension (the untuned default on Hopper at 64
    /// and 128).
    #[arg(long)]
    hopper: bool,
    /// The one-pass backward (`attention_dkdvdq`: dQ accumulated atomically
    /// in the dK/dV pass) instead of dK/dV and dQ apart, on any GPU (the
    /// default on Hopper, unless `--hopper` pins the two kernels' programs).
    #[arg(long)]
    fused: bool,
    /// dK/dV and dQ in two kernels (FlashAttention-2's structure; the
    /// default off Hopper, where the one pass takes the general lowering).
    #[arg(long, conflicts_with = "fused")]
    two_kernels: bool,
    /// With `--fused`, pin the Hopper program with dQ's adds staged in
    /// shared memory and made by the TMA unit (`Config::tma_store`) at any
    /// head dimension (the untuned default on Hopper at 64 and 128), two
    /// stages past 64 (three do not fit beside the staging).
    #[arg(long, requires = "fused")]
    tma_add: bool,
}

/// The command line, for the errors clap does not make.
const USAGE: &str = "usage: attention_backward [B H S D] [--causal] [--kv-heads HK] [--bench] [--hopper] [--fused [--tma-add] | --two-kernels]";

fn main() -> ExitCode {
    tilefuse::runtime::log::init();
    let cli = match tilefuse_testkit::args::<Cli>("attention_backward") {
        Ok(c) => c,
        Err(code) => return code,
    };
    let shape = match cli.shape.as_slice() {
        [] => [1, 2, 200, 64],
        [b, h, s, d] if [*b, *h, *s, *d].contains(&0) => {
            eprintln!("{USAGE}: every size must be at least 1");
            return ExitCode::from(2);
        }
        [b, h, s, d] => [*b, *h, *s, *d],
        other => {
            eprintln!("{USAGE}: expected four sizes, got {}", other.len());
            return ExitCode::from(2);
        }
    };
    let hk = cli.kv_heads.unwrap_or(shape[1]);
    if hk == 0 || shape[1] % hk != 0 {
        eprintln!(
            "{USAGE}: --kv-heads {hk}: expected a divisor of the {} query heads",
            shape[1]
        );
        return ExitCode::from(2);
    }
    let run = || -> tilefuse::Result<bool> {
        let dev = Device::current()?;
        let [b, h, s, d] = shape;
        // One pass where the Hopper program takes it (faster than the two
        // kernels there: 0.83 against 1.03 ms at 4×16×2048×128 on an H200),
        // unless `--hopper` pins the two kernels' programs.
        let fused =
            cli.fused || (!cli.two_kernels && !cli.hopper && !dev.is_host() && dev.target().wgmma);
        println!(
            "device: {} ({}), attention backward over q [{b}x{h}x{s}x{d}], k, v [{b}x{hk}x{s}x{d}] bf16{}{}",
            dev.name(),
            dev.arch(),
            if cli.causal { ", causal" } else { "" },
            match (fused, cli.hopper || cli.tma_add, cli.tma_add) {
                (true, _, true) => ", one pass, Hopper program, dQ added by TMA",
                (true, true, _) => ", one pass, Hopper program",
                (true, false, _) => ", one pass",
                (false, true, _) => ", Hopper program",
                (false, false, _) => "",
            }
        );
        if (cli.hopper || cli.tma_add) && !dev.is_host() && !dev.target().wgmma {
            return Err(tilefuse::Error::Argument {
                context: "attention_backward".into(),
                arg: if cli.tma_add { "--tma-add" } else { "--hopper" }.into(),
                message: format!(
                    "the Hopper program needs sm_90 (wgmma, TMA); this GPU is {}: drop the flag",
                    dev.arch()
                ),
            });
        }
        let p = Problem::grouped(shape, hk, cli.causal)?;
        let backward = || {
            if fused {
                p.backward_fused()
            } else {
                p.backward()
            }
        };
        p.forward()?;
        backward()?;
        // Every head of every batch when the float64 reference is cheap, else
        // the first batch's first key/value head (and its group's query heads).
        let work = (b * h * s) as f64 * s as f64 * d as f64;
        let (batches, heads): (Vec<usize>, Vec<usize>) = if work <= 2e9 {
            ((0..b).collect(), (0..hk).collect())
        } else {
            (vec![0], vec![0])
        };
        let errs = p.errors(&batches, &heads)?;
        let ok = errs.iter().all(|e| *e <= 2e-2);
        println!(
            "check ({} of {b} batches, {} of {hk} key/value heads): ‖g − ref‖/‖ref‖ dQ {:.2e}, dK {:.2e}, dV {:.2e} ({})",
            batches.len(),
            heads.len(),
            errs[0],
            errs[1],
            errs[2],
            if ok { "ok" } else { "FAILED" }
        );
        if cli.bench && !dev.is_host() {
            // FlashAttention's count for the backward: 2.5 times the forward's
            // 4·B·H·S²·D (five products of the forward's size against two),
            // half of it under a causal mask.
            let flops = 10.0 * work / if cli.causal { 2.0 } else { 1.0 };
            let t = tilefuse::time_gpu(&dev, 3, 20, true, backward)?;
            println!(
                "attention backward{}: {:.3} ms, {:.0} TFLOP/s",
                if cli.causal { " (causal)" } else { "" },
                t.median_ms,
                flops / t.median_ms / 1e9
            );
            // Where the time goes: each kernel timed alone.
            let ms = |f: &dyn Fn() -> tilefuse::Result<()>| -> tilefuse::Result<f64> {
                Ok(tilefuse::time_gpu(&dev, 3, 20, true, f)?.median_ms)
            };
            let delta = ms(&|| attention_delta(&p.out, &p.dout, &p.delta))?;
            let parts = if fused {
                let one = ms(&|| {
                    p.dq_acc.zero()?;
                    attention_dkdvdq(
                        &p.q, &p.k, &p.v, &p.dout, &p.lse, &p.delta, &p.dk, &p.dv, &p.dq_acc,
                        p.scale, p.causal,
                    )
                })?;
                let out = ms(&|| attention_dq_out(&p.dq_acc, &p.dq))?;
                format!("dK/dV/dQ (with zeroing) {one:.3} ms, rounding dQ {out:.3} ms")
            } else {
                let kv = ms(&|| {
                    attention_dkdv(
                        &p.q, &p.k, &p.v, &p.dout, &p.lse, &p.delta, &p.dk, &p.dv, p.scale,
                        p.causal,
                    )
                })?;
                let q = ms(&|| {
                    attention_dq(
                        &p.q, &p.k, &p.v, &p.dout, &p.lse, &p.delta, &p.dq, p.scale, p.causal,
                    )
                })?;
                format!("dK/dV {kv:.3} ms, dQ {q:.3} ms")
            };
            println!("  of which: delta {delta:.3} ms, {parts}");
        }
        Ok(ok)
    };
    if !cli.hopper && !cli.tma_add {
        return exit_code(run());
    }
    let hopper = |k: &tilefuse::KernelDef| -> tilefuse::Result<Config> {
        tilefuse::codegen::default_wgmma_attention(k.ir()?).ok_or_else(|| {
            tilefuse::Error::Argument {
                context: "attention_backward".into(),
                arg: "--hopper".into(),
                message: format!("`{}` is not an attention kernel", k.name()),
            }
        })
    };
    if cli.fused {
        let one = attention_dkdvdq::kernel();
        let config = hopper(one).map(|c| match (cli.tma_add, shape[3] > 64) {
            (true, true) => c.tma_store(true).num_stages(2),
            (true, false) => c.tma_store(true),
            (false, _) => c,
        });
        return exit_code(config.and_then(|c| one.with_config(c, run)));
    }
    let (dq, dkdv) = (attention_dq::kernel(), attention_dkdv::kernel());
    exit_code(hopper(dq).and_then(|c| {
        let kv = hopper(dkdv)?;
        dkdv.with_config(kv, || dq.with_config(c, run))
    }))
}
