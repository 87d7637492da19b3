//! References in float64 and the relative error ‖out − ref‖ / ‖ref‖.

use tilefuse_runtime::{Element, Result, Tensor};

/// ‖out − ref‖₂ / ‖ref‖₂ in f64. NaN anywhere in `out` gives NaN (never passes a `<=` check).
pub fn rel_error<A: Copy, B: Copy>(
    out: &[A],
    reference: &[B],
    a: impl Fn(A) -> f64,
    b: impl Fn(B) -> f64,
) -> f64 {
    if out.len() != reference.len() {
        return f64::NAN;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        let (o, r) = (a(o), b(r));
        num += (o - r) * (o - r);
        den += r * r;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// The relative error of a device tensor against a device reference.
pub fn rel_error_tensors<T: Element, U: Element>(
    out: &Tensor<T>,
    reference: &Tensor<U>,
) -> Result<f64> {
    let (o, r) = (out.to_vec()?, reference.to_vec()?);
    Ok(rel_error(&o, &r, T::to_f64, U::to_f64))
}

/// `A·B` in f64 on the host, row-major: the reference for small problems.
pub fn matmul_f64(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p];
            for j in 0..n {
                c[i * n + j] += x * b[p * n + j];
            }
        }
    }
    c
}

/// erf-based GELU in f64 (PyTorch's default GELU), for host references.
pub fn gelu_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + erf_f64(x / std::f64::consts::SQRT_2))
}

/// erf with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26): ample for bf16 checks.
pub fn erf_f64(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
        + 0.254829592)
        * t;
    (1.0 - poly * (-x * x).exp()).copysign(x)
}
