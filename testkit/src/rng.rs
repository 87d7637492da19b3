//! Fresh random inputs and poisoned outputs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};
use tilefuse_runtime::{Element, Result, Tensor};

/// A SplitMix64 generator: small, fast, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A generator seeded from the clock and a counter: fresh data on every call.
    pub fn fresh() -> Rng {
        static N: AtomicU64 = AtomicU64::new(0);
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Rng::new(t ^ N.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// Host data with values uniform in [-scale, scale), rounded to `T`.
pub fn random_vec<T: Element>(rng: &mut Rng, n: usize, scale: f64) -> Vec<T> {
    (0..n).map(|_| T::from_f64(rng.uniform() * scale)).collect()
}

/// A tensor on the current device with fresh random values in [-scale, scale).
pub fn random_tensor<T: Element>(shape: impl AsRef<[usize]>, scale: f64) -> Result<Tensor<T>> {
    let shape = shape.as_ref();
    let data = random_vec::<T>(&mut Rng::fresh(), shape.iter().product(), scale);
    Tensor::from_slice(&data, shape)
}

/// A tensor filled with a value a correct kernel does not write (NaN for floats,
/// 1e9 for integers; NaN would convert to 0), so that elements a kernel forgot to
/// write show up in the error.
pub fn poisoned<T: Element>(shape: impl AsRef<[usize]>) -> Result<Tensor<T>> {
    let poison = if T::DTYPE.is_float() { f64::NAN } else { 1e9 };
    Tensor::full(shape, T::from_f64(poison))
}
