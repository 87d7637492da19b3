//! What a corpus case is, and the helpers its cases share: random inputs made
//! on a device from a seed, outputs read back, float64 references compared.

use std::sync::Arc;
use tilefuse::{Device, Element, KernelDef, Result, Tensor};
use tilefuse_testkit::Rng;

/// One kernel (or a few launched together) of the corpus.
pub struct Case {
    /// A short name (`add`, `softmax_bwd`), also the PyTorch script's.
    pub name: &'static str,
    /// Which bullets of the corpus it covers, for the table.
    pub covers: &'static str,
    /// The kernels it launches (compiled by NVRTC in the tests).
    pub kernels: fn() -> Vec<&'static KernelDef>,
    /// Makes the inputs from `seed` on a device at a small ragged shape,
    /// runs, and returns the outputs with their references.
    pub check: fn(&Arc<Device>, u64) -> Result<Vec<Output>>,
    /// Sets the case up at its benchmark shape on a GPU.
    pub bench: fn(&Arc<Device>) -> Result<Bench>,
}

/// One output of a case: what the kernel wrote, the float64 reference, and
/// the largest ‖got − want‖ / ‖want‖ it passes with.
pub struct Output {
    pub name: String,
    pub got: Vec<f64>,
    pub want: Vec<f64>,
    pub tol: f64,
}

impl Output {
    pub fn new(name: &str, got: Vec<f64>, want: Vec<f64>, tol: f64) -> Output {
        Output {
            name: name.to_string(),
            got,
            want,
            tol,
        }
    }

    /// ‖got − want‖ / ‖want‖ (NaN where an element is NaN that should not be:
    /// an element the kernel never wrote).
    pub fn err(&self) -> f64 {
        rel(&self.got, &self.want)
    }
}

/// ‖a − b‖ / ‖b‖ in f64 (absolute when `b` is zero; NaN if lengths or NaNs differ).
pub fn rel(a: &[f64], b: &[f64]) -> f64 {
    if a.len() != b.len() {
        return f64::NAN;
    }
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        if x.is_nan() != y.is_nan() {
            return f64::NAN;
        }
        if y.is_nan() {
            continue;
        }
        num += (x - y) * (x - y);
        den += y * y;
    }
    if den == 0.0 {
        num.sqrt()
    } else {
        (num / den).sqrt()
    }
}

/// A case at its benchmark shape: the bytes it must move at least (every
/// input read once, every output written once), and one run.
pub struct Bench {
    /// The shape, as the PyTorch script names it (`16384x8192`).
    pub shape: String,
    pub bytes: usize,
    pub run: Box<dyn FnMut() -> Result<()>>,
}

/// A tensor of `shape` on `dev` with values uniform in [-scale, scale) from
/// `rng`, and those values (rounded to `T`) as f64.
pub fn input<T: Element>(
    dev: &Arc<Device>,
    rng: &mut Rng,
    shape: &[usize],
    scale: f64,
) -> Result<(Tensor<T>, Vec<f64>)> {
    let n: usize = shape.iter().product();
    let data: Vec<T> = (0..n).map(|_| T::from_f64(rng.uniform() * scale)).collect();
    let f = data.iter().map(|&x| x.to_f64()).collect();
    Ok((Tensor::from_slice_on(dev, &data, shape)?, f))
}

/// Integers uniform in `lo..hi` (as f64 too).
pub fn ints<T: Element>(
    dev: &Arc<Device>,
    rng: &mut Rng,
    shape: &[usize],
    lo: i64,
    hi: i64,
) -> Result<(Tensor<T>, Vec<f64>)> {
    let n: usize = shape.iter().product();
    let span = (hi - lo).max(1) as u64;
    let data: Vec<T> = (0..n)
        .map(|_| T::from_f64((lo + (rng.next_u64() % span) as i64) as f64))
        .collect();
    let f = data.iter().map(|&x| x.to_f64()).collect();
    Ok((Tensor::from_slice_on(dev, &data, shape)?, f))
}

/// An output tensor filled with a value a correct kernel overwrites (NaN
/// for floats, 1e9 for integers), so elements left unwritten show.
pub fn poisoned<T: Element>(dev: &Arc<Device>, shape: &[usize]) -> Result<Tensor<T>> {
    let poison = if T::DTYPE.is_float() { f64::NAN } else { 1e9 };
    let n: usize = shape.iter().product();
    Tensor::from_slice_on(dev, &vec![T::from_f64(poison); n], shape)
}

/// A tensor of zeros (an accumulator atomics add into).
pub fn zeros<T: Element>(dev: &Arc<Device>, shape: &[usize]) -> Result<Tensor<T>> {
    let n: usize = shape.iter().product();
    Tensor::from_slice_on(dev, &vec![T::from_f64(0.0); n], shape)
}

/// A tensor's values as f64.
pub fn host<T: Element>(t: &Tensor<T>) -> Result<Vec<f64>> {
    Ok(t.to_vec()?.into_iter().map(|x| x.to_f64()).collect())
}

/// `v` rounded to bf16, as a bf16 tensor stores it.
pub fn bf16r(v: f64) -> f64 {
    tilefuse::bf16::from_f64(v).to_f64()
}

/// The tolerance of a bf16 output (one rounding of each element, plus the
/// f32 and fast-exponential arithmetic before it).
pub const BF16_TOL: f64 = 1e-2;
/// The tolerance of an f32 output computed in f32 from bf16 inputs.
pub const F32_TOL: f64 = 1e-5;
