//! Flash attention, forward, in one `#[fused_kernel]`: for each block of query
//! rows, an online softmax over tiles of keys, two `addmm`s a tile (scores
//! `q·kᵀ`, then the output update `p·v`), and an optional causal mask whose
//! loop stops at the diagonal. Checked against a float64 reference; `--bench`
//! times it next to cuBLAS's GEMM rate.
//!
//! ```text
//! cargo run --release --example attention -- [B H S D] [--causal] [--kv-heads HK | --varlen] [--bench] [--config JSON]   (default 2 3 1000 80)
//! ```
//!
//! `--kv-heads HK` runs grouped-query attention ([`attention_gqa`]): `k` and `v`
//! of `HK` heads, each shared by `H / HK` query heads.
//!
//! `q`, `k`, `v` and the output are `[B, H, S, D]` bf16, as PyTorch's
//! `scaled_dot_product_attention` takes them.

use std::process::ExitCode;
use tilefuse::prelude::*;
use tilefuse_testkit::{config_json, exit_code, poisoned, random_tensor};

/// `out = softmax(q·kᵀ · scale [+ causal mask]) · v`, per batch and head.
#[fused_kernel]
pub fn attention(
    q: &Tensor<bf16>,
    k: &Tensor<bf16>,
    v: &Tensor<bf16>,
    out: &Tensor<bf16>,
    scale: f32,
    #[constexpr] causal: bool,
) {
    let [b, h, s, d] = q.shape();
    let [_, _, sk, _] = k.shape();
    for (tb, th, tm, td) in tile([b, h, s, whole(d)]) {
        let mut row_max = full::<f32>([tb, th, tm], f32::NEG_INFINITY);
        let mut denom = zeros::<f32>([tb, th, tm]);
        let mut acc = zeros::<f32>([tb, th, tm, td]);
        // Causal: key tiles past the last row of this tile are all masked.
        for tn in tile(sk).until(if causal { tm.end() } else { sk }) {
            let x = addmm(
                zeros::<f32>([tb, th, tm, tn]),
                q[(tb, th, tm, td)],
                k[(tb, th, tn, td)],
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
            acc = addmm(acc * alpha, p.cast::<bf16>(), v[(tb, th, tn, td)]);
            row_max = new_max;
        }
        out[(tb, th, tm, td)] = (acc / denom).cast();
    }
}

/// Grouped-query attention: `k` and `v` have `hk` heads, each shared by `h / hk`
/// consecutive query heads (`hk = h` is [`attention`]; `hk = 1`, multi-query
/// attention), as SDPA's `enable_gqa=True`. Otherwise the same program.
#[fused_kernel]
pub fn attention_gqa(
    q: &Tensor<bf16>,
    k: &Tensor<bf16>,
    v: &Tensor<bf16>,
    out: &Tensor<bf16>,
    scale: f32,
    #[constexpr] causal: bool,
) {
    let [b, h, s, d] = q.shape();
    let [_, hk, sk, _] = k.shape();
    // A query head past the last group would read no keys: refuse it.
    if hk == 0 || h % hk != 0 {
        return Err(tilefuse::Error::Argument {
            context: "attention_gqa".into(),
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
    }
}

/// Variable-length (packed) attention, FlashAttention's varlen layout: `q`,
/// `k`, `v` and `out` are `[total, H, D]`, every sequence's tokens one after
/// another, and sequence `b` holds tokens `cu_seqlens[b]..cu_seqlens[b + 1]`
/// (queries and keys alike: self-attention). One launch for the batch: a
/// program per (sequence, head block, block of `max_seqlen` query rows); a
/// block past its sequence's end has no rows and stops at once.
/// `max_seqlen` must be at least every sequence's length (FlashAttention's
/// contract): it sizes the grid, and rows past it would not be computed.
/// Offsets outside `q` are masked (no access outside a tensor), not reported.
/// It takes the attention lowering as the batched kernel does (a program's
/// rows one block of its sequence, TMA boxes of one head's rows on Hopper).
#[allow(clippy::too_many_arguments)]
#[fused_kernel]
pub fn attention_varlen(
    q: &Tensor<bf16>,
    k: &Tensor<bf16>,
    v: &Tensor<bf16>,
    cu_seqlens: &Tensor<i64>,
    out: &Tensor<bf16>,
    max_seqlen: usize,
    scale: f32,
    #[constexpr] causal: bool,
) {
    let [_, h, d] = q.shape();
    let [bounds] = cu_seqlens.shape();
    let nb = bounds - 1;
    for (b, th, tq, td) in tile([each(nb), h, max_seqlen, whole(d)]) {
        let begin = cu_seqlens[b];
        let end = cu_seqlens[b + 1];
        // This program's query rows: its block of the sequence, none past its end.
        for tm in tile(begin + tq.begin()..min(begin + tq.end(), end)) {
            let mut row_max = full::<f32>([th, tm], f32::NEG_INFINITY);
            let mut denom = zeros::<f32>([th, tm]);
            let mut acc = zeros::<f32>([th, tm, td]);
            // Causal: the keys up to the block's last row.
            for tn in tile(begin..if causal { min(tm.end(), end) } else { end }) {
                let x = addmm(zeros::<f32>([th, tm, tn]), q[(tm, th, td)], k[(tn, th, td)]) * scale;
                let x = if causal {
                    select(tm.index() >= tn.index(), x, f32::NEG_INFINITY)
                } else {
                    x
                };
                let new_max = max(row_max, x.max(tn));
                let p = exp(x - new_max);
                let alpha = exp(row_max - new_max);
                denom = denom * alpha + p.sum(tn);
                acc = addmm(acc * alpha, p.cast::<bf16>(), v[(tn, th, td)]);
                row_max = new_max;
            }
            out[(tm, th, td)] = (acc / denom).cast();
        }
    }
}

/// [`attention_varlen`] on packed sequences of `lens` tokens, `h` heads of
/// dimension `d`, fresh random inputs and a poisoned output; the relative
/// error `‖out − ref‖/‖ref‖` against each sequence's float64 attention over
/// its own tokens only.
pub fn run_varlen_and_check(
    lens: &[usize],
    h: usize,
    d: usize,
    causal: bool,
) -> tilefuse::Result<f64> {
    Ok(run_varlen(lens, h, d, causal, false)?.0)
}

/// [`run_varlen_and_check`], or with `bench` a check of the first and last
/// sequences' first head (every 97th row and the last three) and then the
/// launch timed: the error and the median time in ms.
pub fn run_varlen(
    lens: &[usize],
    h: usize,
    d: usize,
    causal: bool,
    bench: bool,
) -> tilefuse::Result<(f64, Option<f64>)> {
    let mut cu = vec![0i64];
    for &l in lens {
        cu.push(cu[cu.len() - 1] + l as i64);
    }
    let total = cu[lens.len()] as usize;
    let max_seqlen = lens.iter().copied().max().unwrap_or(0);
    let q = random_tensor::<bf16>([total, h, d], 1.0)?;
    let k = random_tensor::<bf16>([total, h, d], 1.0)?;
    let v = random_tensor::<bf16>([total, h, d], 1.0)?;
    let cu_seqlens = Tensor::from_slice(&cu, [cu.len()])?;
    let out = poisoned::<bf16>([total, h, d])?;
    let scale = if bench { 1.0 / (d as f32).sqrt() } else { 0.3 };
    let launch = || attention_varlen(&q, &k, &v, &cu_seqlens, &out, max_seqlen, scale, causal);
    launch()?;
    let host = |t: &Tensor<bf16>| -> tilefuse::Result<Vec<f64>> {
        Ok(t.to_vec()?.into_iter().map(f64::from).collect())
    };
    let (qh, kh, vh, oh) = (host(&q)?, host(&k)?, host(&v)?, host(&out)?);
    // One head of one sequence as the reference's contiguous rows.
    let slice = |x: &[f64], b: usize, hh: usize| -> Vec<f64> {
        (cu[b] as usize..cu[b + 1] as usize)
            .flat_map(|t| x[(t * h + hh) * d..(t * h + hh + 1) * d].to_vec())
            .collect()
    };
    let (sequences, heads): (Vec<usize>, Vec<usize>) = if bench {
        (vec![0, lens.len().saturating_sub(1)], vec![0])
    } else {
        ((0..lens.len()).collect(), (0..h).collect())
    };
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for &b in sequences.iter().filter(|&&b| b < lens.len()) {
        let len = lens[b];
        let rows: Vec<usize> = if bench {
            (0..len)
                .step_by(97)
                .chain(len.saturating_sub(3)..len)
                .collect()
        } else {
            (0..len).collect()
        };
        for &hh in &heads {
            let (qs, ks, vs) = (slice(&qh, b, hh), slice(&kh, b, hh), slice(&vh, b, hh));
            for &r in &rows {
                let want = reference_row(&qs, &ks, &vs, r, (len, d), f64::from(scale), causal);
                let t = cu[b] as usize + r;
                for (c, w) in want.iter().enumerate() {
                    num += (oh[(t * h + hh) * d + c] - w).powi(2);
                    den += w * w;
                }
            }
        }
    }
    let err = (num / den.max(f64::MIN_POSITIVE)).sqrt();
    let dev = Device::current()?;
    let ms = if bench && !dev.is_host() {
        Some(tilefuse::time_gpu(&dev, 3, 20, true, launch)?.median_ms)
    } else {
        None
    };
    Ok((err, ms))
}

/// The float64 attention of one `(batch, head)` slice's query `row`: `q`, `k`, `v`
/// are that slice (`s × d`, `sk × d`, `sk × d`, with `(sk, d)` given), the
/// result `d` values.
pub fn reference_row(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    row: usize,
    (sk, d): (usize, usize),
    scale: f64,
    causal: bool,
) -> Vec<f64> {
    let keys = if causal { (row + 1).min(sk) } else { sk };
    let qr = &q[row * d..(row + 1) * d];
    let scores: Vec<f64> = (0..keys)
        .map(|j| {
            scale
                * qr.iter()
                    .zip(&k[j * d..(j + 1) * d])
                    .map(|(a, b)| a * b)
                    .sum::<f64>()
        })
        .collect();
    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|x| (x - mx).exp()).collect();
    let sum: f64 = w.iter().sum();
    let mut o = vec![0.0; d];
    for (j, wj) in w.iter().enumerate() {
        for (c, oc) in o.iter_mut().enumerate() {
            *oc += wj * v[j * d + c];
        }
    }
    o.iter().map(|x| x / sum).collect()
}

/// attention's command line.
#[derive(clap::Parser)]
#[command(
    about = "Flash attention over q, k, v of [B, H, S, D] bf16: checked against float64, optionally timed"
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
    /// Time it next to cuBLAS's GEMMs of the same FLOPs.
    #[arg(long)]
    bench: bool,
    /// Variable-length sequences packed in one launch (`attention_varlen`): B
    /// sequences of 0.4·S to S tokens, evenly spread (30% of a padded
    /// batch's S·B rows are padding), against the padded run's S.
    #[arg(long, conflicts_with = "kv_heads")]
    varlen: bool,
    /// Run the kernel at this config (JSON, as `Config` serializes, e.g.
    /// `{"block_sizes":[1,1,128,128,128],"num_warps":8,"num_stages":3,"group_m":8,"wgmma":true,"overlap":true}`)
    /// instead of the tuned or default one.
    #[arg(long, value_name = "JSON", value_parser = config_json)]
    config: Option<Config>,
}

struct Args {
    shape: [usize; 4],
    causal: bool,
    /// Key and value heads; `None`: one per query head.
    kv_heads: Option<usize>,
    bench: bool,
    varlen: bool,
    config: Option<Config>,
}

fn parse(cli: Cli) -> Result<Args, String> {
    let shape = match cli.shape.as_slice() {
        [] if tilefuse::runtime::mode::interpreting() => {
            println!("interpret mode: default sizes [1, 2, 100, 40] for the CPU (the GPU's are [2, 3, 1000, 80])");
            [1, 2, 100, 40]
        }
        [] => [2, 3, 1000, 80],
        [b, h, s, d] => [*b, *h, *s, *d],
        other => return Err(format!("expected four sizes B H S D, got {}", other.len())),
    };
    if shape.contains(&0) {
        return Err("every size must be at least 1".into());
    }
    if let Some(hk) = cli.kv_heads {
        if hk == 0 || shape[1] % hk != 0 {
            return Err(format!(
                "--kv-heads {hk}: expected a divisor of the {} query heads",
                shape[1]
            ));
        }
    }
    Ok(Args {
        shape,
        causal: cli.causal,
        kv_heads: cli.kv_heads,
        bench: cli.bench,
        varlen: cli.varlen,
        config: cli.config,
    })
}

/// Sequence lengths for `--varlen`: `b` of them from 0.4·`s` to `s`, evenly
/// spread (a mean of 0.7·`s`: 30% of a padded batch is padding).
fn varlen_lengths(b: usize, s: usize) -> Vec<usize> {
    (0..b)
        .map(|i| {
            let f = if b > 1 {
                i as f64 / (b - 1) as f64
            } else {
                1.0
            };
            ((s as f64 * (0.4 + 0.6 * f)).round() as usize).clamp(1, s)
        })
        .collect()
}

fn run_packed(a: &Args) -> tilefuse::Result<bool> {
    let dev = Device::current()?;
    let [b, h, s, d] = a.shape;
    let lens = varlen_lengths(b, s);
    let total: usize = lens.iter().sum();
    println!(
        "device: {} ({}), variable-length attention over {b} packed sequences of {}..{} tokens ({total} of {} padded rows, {:.0}% padding), {h} heads of {d} bf16{}",
        dev.name(),
        dev.arch(),
        lens.iter().min().unwrap_or(&0),
        lens.iter().max().unwrap_or(&0),
        b * s,
        100.0 * (1.0 - total as f64 / (b * s) as f64),
        if a.causal { ", causal" } else { "" }
    );
    let (err, ms) = run_varlen(&lens, h, d, a.causal, a.bench)?;
    let ok = err <= 1e-2;
    println!(
        "check: ‖out − ref‖/‖ref‖ = {err:.2e} ({})",
        if ok { "ok" } else { "FAILED" }
    );
    if let Some(ms) = ms {
        // The FLOPs done: 4·H·len²·D a sequence, half of it under a causal mask.
        let work: f64 = lens.iter().map(|&l| 4.0 * (h * l * l * d) as f64).sum();
        let flops = work / if a.causal { 2.0 } else { 1.0 };
        println!(
            "varlen attention{}: {ms:.3} ms, {:.0} TFLOP/s (compare with the padded {b}x{h}x{s}x{d} run's time)",
            if a.causal { " (causal)" } else { "" },
            flops / ms / 1e9
        );
    }
    Ok(ok)
}

fn run(a: &Args) -> tilefuse::Result<bool> {
    if a.varlen {
        return run_packed(a);
    }
    let dev = Device::current()?;
    let [b, h, s, d] = a.shape;
    let hk = a.kv_heads.unwrap_or(h);
    println!(
        "device: {} ({}), attention over q [{b}x{h}x{s}x{d}], k, v [{b}x{hk}x{s}x{d}] bf16{}",
        dev.name(),
        dev.arch(),
        if a.causal { ", causal" } else { "" }
    );
    let q = random_tensor::<bf16>([b, h, s, d], 1.0)?;
    let k = random_tensor::<bf16>([b, hk, s, d], 1.0)?;
    let v = random_tensor::<bf16>([b, hk, s, d], 1.0)?;
    let out = poisoned::<bf16>([b, h, s, d])?;
    let scale = 1.0 / (d as f32).sqrt();
    let grouped = a.kv_heads.is_some();
    let launch = || match grouped {
        true => attention_gqa(&q, &k, &v, &out, scale, a.causal),
        false => attention(&q, &k, &v, &out, scale, a.causal),
    };
    launch()?;

    // Every row of every slice when that is cheap, else rows spread over the
    // first and last slices (the last rows included: ragged edges).
    let work = (b * h * s) as f64 * s as f64 * d as f64;
    let slices: Vec<usize> = if work <= 2e9 {
        (0..b * h).collect()
    } else {
        vec![0, b * h - 1]
    };
    let rows: Vec<usize> = if work <= 2e9 {
        (0..s).collect()
    } else {
        (0..s).step_by(97).chain(s.saturating_sub(3)..s).collect()
    };
    let to64 = |t: &Tensor<bf16>| -> tilefuse::Result<Vec<f64>> {
        Ok(t.to_vec()?.iter().map(|x| x.to_f64()).collect())
    };
    let (qh, kh, vh, oh) = (to64(&q)?, to64(&k)?, to64(&v)?, to64(&out)?);
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for &sl in &slices {
        let at = |x: &[f64], sl: usize| x[sl * s * d..(sl + 1) * s * d].to_vec();
        // A query head's key/value head: its group's.
        let kv = sl / h * hk + sl % h / (h / hk);
        let (qs, ks, vs) = (at(&qh, sl), at(&kh, kv), at(&vh, kv));
        for &r in &rows {
            let want = reference_row(&qs, &ks, &vs, r, (s, d), f64::from(scale), a.causal);
            for (c, w) in want.iter().enumerate() {
                let got = oh[(sl * s + r) * d + c];
                num += (got - w).powi(2);
                den += w * w;
            }
        }
    }
    let err = (num / den.max(f64::MIN_POSITIVE)).sqrt();
    let ok = err <= 1e-2;
    println!(
        "check ({} slices × {} rows): ‖out − ref‖/‖ref‖ = {err:.2e} ({})",
        slices.len(),
        rows.len(),
        if ok { "ok" } else { "FAILED" }
    );
    if a.bench && !dev.is_host() {
        // FlashAttention's count: 4·B·H·S²·D, half of it under a causal mask.
        let flops = 4.0 * work / if a.causal { 2.0 } else { 1.0 };
        let t = tilefuse::time_gpu(&dev, 3, 20, true, launch)?;
        let n = 8192;
        let ga = random_tensor::<bf16>([n, n], 1.0)?;
        let gb = random_tensor::<bf16>([n, n], 1.0)?;
        let mut gc = poisoned::<bf16>([n, n])?;
        let g = tilefuse::time_gpu(&dev, 3, 20, true, || {
            tilefuse::cublas::matmul_into(&mut gc, &ga, &gb)
        })?;
        let ours = flops / t.median_ms / 1e9;
        let gemm = 2.0 * (n as f64).powi(3) / g.median_ms / 1e9;
        println!(
            "attention{}: {:.3} ms, {ours:.0} TFLOP/s; cuBLAS GEMM {n}³ {gemm:.0} TFLOP/s; {:.1}% of the GEMM rate",
            if a.causal { " (causal)" } else { "" },
            t.median_ms,
            100.0 * ours / gemm
        );
    }
    Ok(ok)
}

fn main() -> ExitCode {
    // Library messages on stderr, filtered by TILEFUSE_LOG (default: warnings).
    tilefuse::runtime::log::init();
    let cli = match tilefuse_testkit::args::<Cli>("attention") {
        Ok(c) => c,
        Err(code) => return code,
    };
    match parse(cli) {
        Ok(a) => exit_code(match a.config.clone() {
            // The config goes to the kernel this run launches.
            Some(c) if a.varlen => attention_varlen::kernel().with_config(c, || run(&a)),
            Some(c) if a.kv_heads.is_some() => attention_gqa::kernel().with_config(c, || run(&a)),
            Some(c) => attention::kernel().with_config(c, || run(&a)),
            None => run(&a),
        }),
        Err(e) => {
            eprintln!(
                "usage: attention [B H S D] [--causal] [--kv-heads HK | --varlen] [--bench] [--config JSON]: {e}"
            );
            ExitCode::from(2)
        }
    }
}
