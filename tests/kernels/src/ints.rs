//! Integer kernels: a histogram with atomics, bit mixing, int8
//! quantization, float-to-integer conversions, and integer division, each
//! checked exactly.

use crate::harness::*;
use std::sync::Arc;
use tilefuse::prelude::*;
use tilefuse::Device;
use tilefuse_testkit::Rng;

/// A histogram of `x` over `[0, 1)` in `nbins` equal bins (values outside
/// counted in the first or last bin), counts added atomically.
#[fused_kernel]
pub fn histogram(x: &Tensor<f32>, counts: &Tensor<u32>) {
    let [n] = x.shape();
    let [nbins] = counts.shape();
    for tn in tile(n) {
        let bin = (x[tn] * nbins as f32).floor().cast::<i32>();
        let bin = bin.max(0).min(nbins as i32 - 1);
        atomic_add(counts[bin], 1);
    }
}

/// MurmurHash3's 32-bit finalizer (`fmix32`) of `x ^ seed`: shifts, xors and
/// wrapping multiplies on u32.
#[fused_kernel]
pub fn hash_u32(x: &Tensor<u32>, out: &Tensor<u32>, seed: u32) {
    let [n] = x.shape();
    for tn in tile(n) {
        // `as u32`: every integer scalar is an i64 in device code whatever
        // its Rust type, so a bare `x[tn] ^ seed` would make `h` an i64 and
        // the multiplies below wrap at 64 bits (reported to the lead).
        let mut h = x[tn] ^ (seed as u32);
        h ^= h >> 16;
        h *= 0x85eb_ca6b;
        h ^= h >> 13;
        h *= 0xc2b2_ae35;
        h ^= h >> 16;
        out[tn] = h;
    }
}

/// Per-row symmetric int8 quantization: `scale = max|x| / 127` over the row
/// (a first pass), then `q = clamp(round(x / scale), -127, 127)`.
#[fused_kernel]
pub fn quantize_i8(x: &Tensor<bf16>, q: &Tensor<i8>, scale: &Tensor<f32>) {
    let [m, n] = x.shape();
    for tm in tile(m) {
        let mut amax = zeros::<f32>([tm]);
        for tn in tile(n) {
            amax = max(amax, x[(tm, tn)].abs().max(tn));
        }
        let s = max(amax, 1e-12) / 127.0;
        scale[tm] = s;
        for tn in tile(n) {
            let v = (x[(tm, tn)] / s).round();
            q[(tm, tn)] = v.max(-127.0).min(127.0).cast::<i8>();
        }
    }
}

/// int8 back to bf16: `out = q · scale[row]`.
#[fused_kernel]
pub fn dequantize_i8(q: &Tensor<i8>, scale: &Tensor<f32>, out: &Tensor<bf16>) {
    let [m, n] = q.shape();
    for (tm, tn) in tile([m, n]) {
        out[(tm, tn)] = (q[(tm, tn)].cast::<f32>() * scale[tm]).cast();
    }
}

/// Float to integer conversions as Rust's `as`: truncation toward zero,
/// saturation at each type's range, NaN to 0.
#[fused_kernel]
pub fn float_to_int(
    x: &Tensor<f32>,
    o8: &Tensor<i8>,
    u8s: &Tensor<u8>,
    o16: &Tensor<i16>,
    o32: &Tensor<i32>,
    u32s: &Tensor<u32>,
    o64: &Tensor<i64>,
) {
    let [n] = x.shape();
    for tn in tile(n) {
        let v = x[tn];
        o8[tn] = v.cast::<i8>();
        u8s[tn] = v as u8;
        o16[tn] = v.cast::<i16>();
        o32[tn] = v as i32;
        u32s[tn] = v.cast::<u32>();
        o64[tn] = v as i64;
    }
}

/// C's integer division and remainder on i32 (truncated toward zero, the
/// remainder taking the dividend's sign).
#[fused_kernel]
pub fn int_divmod(a: &Tensor<i32>, b: &Tensor<i32>, q: &Tensor<i32>, r: &Tensor<i32>) {
    let [n] = a.shape();
    for tn in tile(n) {
        q[tn] = a[tn] / b[tn];
        r[tn] = a[tn] % b[tn];
    }
}

/// Python's floor division and modulo on i64 (`a // b`, `a % b`), built
/// from C's: one step down where the remainder's sign differs from `b`'s.
#[fused_kernel]
pub fn floor_divmod(a: &Tensor<i64>, b: &Tensor<i64>, q: &Tensor<i64>, r: &Tensor<i64>) {
    let [n] = a.shape();
    for tn in tile(n) {
        let x = a[tn];
        let y = b[tn];
        let qt = x / y;
        let rt = x % y;
        let fix = rt != 0 && (rt < 0) != (y < 0);
        q[tn] = select(fix, qt - 1, qt);
        r[tn] = select(fix, rt + y, rt);
    }
}

/// `x`'s bin as the kernel computes it (an f32 product, floored, clamped).
fn bin_of(x: f32, nbins: usize) -> usize {
    ((x * nbins as f32).floor() as i64).clamp(0, nbins as i64 - 1) as usize
}

fn histogram_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (n, nbins) = (1_000_003, 100);
    // Mostly [-0.1, 1.1) (the ends clamp into the first and last bin), and
    // the bin edges k / nbins themselves.
    let data: Vec<f32> = (0..n)
        .map(|i| {
            if i % 1000 < nbins + 1 {
                (i % 1000) as f32 / nbins as f32
            } else {
                (0.5 + 0.6 * rng.uniform()) as f32
            }
        })
        .collect();
    let x = Tensor::from_slice_on(dev, &data, [n])?;
    let counts = zeros::<u32>(dev, &[nbins])?;
    histogram(&x, &counts)?;
    let mut want = vec![0.0; nbins];
    for &v in &data {
        want[bin_of(v, nbins)] += 1.0;
    }
    Ok(vec![Output::new("counts", host(&counts)?, want, 0.0)])
}

fn histogram_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (n, nbins) = (1 << 27, 256);
    // Uniform in [0, 1), as `torch.rand` in the PyTorch script: every bin
    // about as full. (Values in [-1, 1) put half of them in bin 0, one
    // shared-memory word every warp's atomics queue on.)
    let mut rng = Rng::new(1);
    let data: Vec<f32> = (0..n).map(|_| (0.5 + 0.5 * rng.uniform()) as f32).collect();
    let x = Tensor::from_slice_on(dev, &data, [n])?;
    let counts = zeros::<u32>(dev, &[nbins])?;
    Ok(Bench {
        shape: format!("{n}/{nbins}"),
        bytes: n * 4 + nbins * 4,
        // From zero at every call, as `torch.bincount`'s counts.
        run: Box::new(move || {
            counts.zero()?;
            histogram(&x, &counts)
        }),
    })
}

/// MurmurHash3's `fmix32` of `x ^ seed`, on the host.
fn fmix32(x: u32, seed: u32) -> u32 {
    let mut h = x ^ seed;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

fn hash_u32_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let n = 100_003;
    let data: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
    let key = rng.next_u64() as u32;
    let x = Tensor::from_slice_on(dev, &data, [n])?;
    let out = poisoned::<u32>(dev, &[n])?;
    hash_u32(&x, &out, key)?;
    let want = data.iter().map(|&v| f64::from(fmix32(v, key))).collect();
    Ok(vec![Output::new("out", host(&out)?, want, 0.0)])
}

fn hash_u32_bench(dev: &Arc<Device>) -> Result<Bench> {
    let n = 1 << 27;
    let (x, _) = ints::<u32>(dev, &mut Rng::new(1), &[n], 0, 1 << 32)?;
    let out = Tensor::<u32>::empty_on(dev, [n])?;
    Ok(Bench {
        shape: format!("{n}"),
        bytes: 2 * n * 4,
        run: Box::new(move || hash_u32(&x, &out, 0x9e37_79b9)),
    })
}

fn quantize_i8_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 1000);
    // Rows of different magnitudes; row 5 all zeros (the scale's floor).
    let data: Vec<bf16> = (0..m * n)
        .map(|i| {
            let row = i / n;
            let mag = [0.01, 1.0, 3.0, 100.0][row % 4];
            bf16::from_f64(if row == 5 { 0.0 } else { rng.uniform() * mag })
        })
        .collect();
    let xf: Vec<f64> = data.iter().map(|v| v.to_f64()).collect();
    let x = Tensor::from_slice_on(dev, &data, [m, n])?;
    // -128 never comes out of a symmetric quantizer: it marks unwritten
    // elements (harness::poisoned's 1e9 saturates to 127, a valid q).
    let q = Tensor::from_slice_on(dev, &vec![-128i8; m * n], [m, n])?;
    let scale = poisoned::<f32>(dev, &[m])?;
    quantize_i8(&x, &q, &scale)?;
    let (qg, sg) = (host(&q)?, host(&scale)?);
    let want_s = (0..m)
        .map(|i| {
            let amax = xf[i * n..(i + 1) * n]
                .iter()
                .fold(0f64, |a, v| a.max(v.abs()));
            amax.max(1e-12) / 127.0
        })
        .collect();
    // q from the kernel's own scale. Where `x / scale` lies within f32's
    // error of a half (the GPU's f32 `/` is within 2 ulp), either neighbour
    // is right; everywhere else the integer is exact.
    let want_q = (0..m * n)
        .map(|i| {
            let t = xf[i] / sg[i / n];
            let frac = t.abs() - t.abs().floor();
            let k = t.round().clamp(-127.0, 127.0);
            let near_half = (frac - 0.5).abs() < 1e-4 * t.abs().max(1.0);
            if near_half && (qg[i] == t.floor() || qg[i] == t.ceil()) {
                qg[i]
            } else {
                k
            }
        })
        .collect();
    Ok(vec![
        Output::new("q", qg, want_q, 0.0),
        Output::new("scale", sg, want_s, F32_TOL),
    ])
}

fn quantize_i8_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let (x, _) = input::<bf16>(dev, &mut Rng::new(1), &[m, n], 1.0)?;
    let q = Tensor::<i8>::empty_on(dev, [m, n])?;
    let scale = Tensor::<f32>::empty_on(dev, [m])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * (2 + 1) + m * 4,
        run: Box::new(move || quantize_i8(&x, &q, &scale)),
    })
}

fn dequantize_i8_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let (m, n) = (77, 1000);
    let (q, qf) = ints::<i8>(dev, &mut rng, &[m, n], -127, 128)?;
    let sc: Vec<f32> = (0..m)
        .map(|_| (0.05 + 0.05 * rng.uniform()) as f32)
        .collect();
    let scale = Tensor::from_slice_on(dev, &sc, [m])?;
    let out = poisoned::<bf16>(dev, &[m, n])?;
    dequantize_i8(&q, &scale, &out)?;
    let want = (0..m * n).map(|i| qf[i] * f64::from(sc[i / n])).collect();
    Ok(vec![Output::new("out", host(&out)?, want, BF16_TOL)])
}

fn dequantize_i8_bench(dev: &Arc<Device>) -> Result<Bench> {
    let (m, n) = (16384, 8192);
    let mut rng = Rng::new(1);
    let (q, _) = ints::<i8>(dev, &mut rng, &[m, n], -127, 128)?;
    let (scale, _) = input::<f32>(dev, &mut rng, &[m], 0.1)?;
    let out = Tensor::<bf16>::empty_on(dev, [m, n])?;
    Ok(Bench {
        shape: format!("{m}x{n}"),
        bytes: m * n * (1 + 2) + m * 4,
        run: Box::new(move || dequantize_i8(&q, &scale, &out)),
    })
}

/// Values that test every conversion's edges: NaN, infinities, signed
/// zero, halves, each type's range ± a bit.
const EDGES: &[f32] = &[
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    -0.0,
    0.5,
    -0.5,
    -0.99,
    127.5,
    128.0,
    -128.9,
    -129.0,
    255.9,
    256.0,
    32767.9,
    32768.0,
    -32769.0,
    2_147_483_520.0,
    2_147_483_648.0,
    -2_147_483_648.0,
    -2_147_483_904.0,
    4_294_967_040.0,
    4_294_967_296.0,
    9.223_371_5e18,
    9.3e18,
    -9.3e18,
];

fn float_to_int_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let n = 10_007;
    let data: Vec<f32> = (0..n)
        .map(|i| match EDGES.get(i) {
            Some(&e) => e,
            // Magnitudes from 1e-3 to 1e20.
            None => (rng.uniform() * 10f64.powf(-3.0 + 23.0 * (rng.uniform() + 1.0) / 2.0)) as f32,
        })
        .collect();
    let x = Tensor::from_slice_on(dev, &data, [n])?;
    let want: [Vec<f64>; 6] = [
        data.iter().map(|&v| f64::from(v as i8)).collect(),
        data.iter().map(|&v| f64::from(v as u8)).collect(),
        data.iter().map(|&v| f64::from(v as i16)).collect(),
        data.iter().map(|&v| f64::from(v as i32)).collect(),
        data.iter().map(|&v| f64::from(v as u32)).collect(),
        data.iter().map(|&v| v as i64 as f64).collect(),
    ];
    // Twice, into poisoned and into zeroed outputs: the small types'
    // poison (1e9, saturated) is a value the conversion also gives.
    let mut got: [Vec<f64>; 6] = Default::default();
    for zeroed in [false, true] {
        macro_rules! out {
            ($t:ty) => {
                if zeroed {
                    zeros::<$t>(dev, &[n])?
                } else {
                    poisoned::<$t>(dev, &[n])?
                }
            };
        }
        let (o8, ou8, o16, o32, ou32, o64) = (
            out!(i8),
            out!(u8),
            out!(i16),
            out!(i32),
            out!(u32),
            out!(i64),
        );
        float_to_int(&x, &o8, &ou8, &o16, &o32, &ou32, &o64)?;
        got[0].extend(host(&o8)?);
        got[1].extend(host(&ou8)?);
        got[2].extend(host(&o16)?);
        got[3].extend(host(&o32)?);
        got[4].extend(host(&ou32)?);
        got[5].extend(host(&o64)?);
    }
    let names = ["i8", "u8", "i16", "i32", "u32", "i64"];
    Ok(names
        .iter()
        .zip(got)
        .zip(want)
        .map(|((name, g), w)| Output::new(name, g, [w.clone(), w].concat(), 0.0))
        .collect())
}

fn float_to_int_bench(dev: &Arc<Device>) -> Result<Bench> {
    let n = 1 << 25;
    let (x, _) = input::<f32>(dev, &mut Rng::new(1), &[n], 1e4)?;
    let (o8, ou8) = (
        Tensor::<i8>::empty_on(dev, [n])?,
        Tensor::<u8>::empty_on(dev, [n])?,
    );
    let (o16, o32) = (
        Tensor::<i16>::empty_on(dev, [n])?,
        Tensor::<i32>::empty_on(dev, [n])?,
    );
    let (ou32, o64) = (
        Tensor::<u32>::empty_on(dev, [n])?,
        Tensor::<i64>::empty_on(dev, [n])?,
    );
    Ok(Bench {
        shape: format!("{n}"),
        bytes: n * (4 + 1 + 1 + 2 + 4 + 4 + 8),
        run: Box::new(move || float_to_int(&x, &o8, &ou8, &o16, &o32, &ou32, &o64)),
    })
}

/// Divisors: nonzero, of both signs, mostly small, some large.
fn divisor(rng: &mut Rng, big: i64) -> i64 {
    let v = if rng.next_u64().is_multiple_of(4) {
        (rng.next_u64() % big as u64) as i64 + 1
    } else {
        (rng.next_u64() % 100) as i64 + 1
    };
    if rng.next_u64().is_multiple_of(2) {
        v
    } else {
        -v
    }
}

fn int_divmod_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let n = 100_003;
    // Any i32 but i32::MIN (whose quotient by -1 overflows).
    let a: Vec<i32> = (0..n)
        .map(|_| (rng.next_u64() as i32).max(-i32::MAX))
        .collect();
    let b: Vec<i32> = (0..n).map(|_| divisor(&mut rng, 1 << 31) as i32).collect();
    let (at, bt) = (
        Tensor::from_slice_on(dev, &a, [n])?,
        Tensor::from_slice_on(dev, &b, [n])?,
    );
    let (q, r) = (poisoned::<i32>(dev, &[n])?, poisoned::<i32>(dev, &[n])?);
    int_divmod(&at, &bt, &q, &r)?;
    let wq = a.iter().zip(&b).map(|(x, y)| f64::from(x / y)).collect();
    let wr = a.iter().zip(&b).map(|(x, y)| f64::from(x % y)).collect();
    Ok(vec![
        Output::new("q", host(&q)?, wq, 0.0),
        Output::new("r", host(&r)?, wr, 0.0),
    ])
}

fn int_divmod_bench(dev: &Arc<Device>) -> Result<Bench> {
    let n = 1 << 27;
    let mut rng = Rng::new(1);
    let (a, _) = ints::<i32>(dev, &mut rng, &[n], -(1 << 30), 1 << 30)?;
    let (b, _) = ints::<i32>(dev, &mut rng, &[n], 1, 1000)?;
    let (q, r) = (
        Tensor::<i32>::empty_on(dev, [n])?,
        Tensor::<i32>::empty_on(dev, [n])?,
    );
    Ok(Bench {
        shape: format!("{n}"),
        bytes: 4 * n * 4,
        run: Box::new(move || int_divmod(&a, &b, &q, &r)),
    })
}

fn floor_divmod_check(dev: &Arc<Device>, seed: u64) -> Result<Vec<Output>> {
    let mut rng = Rng::new(seed);
    let n = 100_003;
    let b: Vec<i64> = (0..n).map(|_| divisor(&mut rng, 1 << 20)).collect();
    // Beyond i32's range; every fifth an exact multiple (remainder 0).
    let a: Vec<i64> = (0..n)
        .map(|i| {
            let v = (rng.next_u64() % (1 << 41)) as i64 - (1 << 40);
            if i % 5 == 0 {
                (v >> 20) * b[i]
            } else {
                v
            }
        })
        .collect();
    let (at, bt) = (
        Tensor::from_slice_on(dev, &a, [n])?,
        Tensor::from_slice_on(dev, &b, [n])?,
    );
    let (q, r) = (poisoned::<i64>(dev, &[n])?, poisoned::<i64>(dev, &[n])?);
    floor_divmod(&at, &bt, &q, &r)?;
    // Python's `//` rounds the quotient down; `%` is `a - b·(a // b)`.
    let floor_div = |x: i64, y: i64| {
        let t = x / y;
        if x % y != 0 && (x < 0) != (y < 0) {
            t - 1
        } else {
            t
        }
    };
    let wq = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| floor_div(x, y) as f64)
        .collect();
    let wr = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| (x - y * floor_div(x, y)) as f64)
        .collect();
    Ok(vec![
        Output::new("q", host(&q)?, wq, 0.0),
        Output::new("r", host(&r)?, wr, 0.0),
    ])
}

fn floor_divmod_bench(dev: &Arc<Device>) -> Result<Bench> {
    let n = 1 << 26;
    let mut rng = Rng::new(1);
    let (a, _) = ints::<i64>(dev, &mut rng, &[n], -(1 << 40), 1 << 40)?;
    let (b, _) = ints::<i64>(dev, &mut rng, &[n], 1, 1 << 20)?;
    let (q, r) = (
        Tensor::<i64>::empty_on(dev, [n])?,
        Tensor::<i64>::empty_on(dev, [n])?,
    );
    Ok(Bench {
        shape: format!("{n}"),
        bytes: 4 * n * 8,
        run: Box::new(move || floor_divmod(&a, &b, &q, &r)),
    })
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "histogram",
            covers: "float to bin (floor, cast, integer clamp), atomic_add into u32 at a computed index",
            kernels: || vec![histogram::kernel()],
            check: histogram_check,
            bench: histogram_bench,
        },
        Case {
            name: "hash_u32",
            covers: "u32 bit mixing: ^ << >>, wrapping multiply, compound assignment, a u32 scalar",
            kernels: || vec![hash_u32::kernel()],
            check: hash_u32_check,
            bench: hash_u32_bench,
        },
        Case {
            name: "quantize_i8",
            covers: "two passes over a row (a carried max, then a store), round, clamp, cast to i8",
            kernels: || vec![quantize_i8::kernel()],
            check: quantize_i8_check,
            bench: quantize_i8_bench,
        },
        Case {
            name: "dequantize_i8",
            covers: "i8 load, cast to f32, a per-row scale broadcast",
            kernels: || vec![dequantize_i8::kernel()],
            check: dequantize_i8_check,
            bench: dequantize_i8_bench,
        },
        Case {
            name: "float_to_int",
            covers: "saturating float-to-integer casts (`as`, `.cast()`) into six integer types, NaN and infinities",
            kernels: || vec![float_to_int::kernel()],
            check: float_to_int_check,
            bench: float_to_int_bench,
        },
        Case {
            name: "int_divmod",
            covers: "C's i32 `/` and `%` on negative numbers",
            kernels: || vec![int_divmod::kernel()],
            check: int_divmod_check,
            bench: int_divmod_bench,
        },
        Case {
            name: "floor_divmod",
            covers: "i64 arithmetic, masks combined with && and !=, select on integers",
            kernels: || vec![floor_divmod::kernel()],
            check: floor_divmod_check,
            bench: floor_divmod_bench,
        },
    ]
}
