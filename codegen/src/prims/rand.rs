//! Counter-based random numbers, as Triton's `tl.rand`: Philox 4x32 with 10
//! rounds, keyed by a 64-bit `seed` and counting from a 32-bit `offset` per
//! element, so the same (seed, offset) gives the same number in every
//! program, launch and run (a dropout mask is recomputed in the backward pass
//! instead of stored). The numbers are bit-identical in interpret mode.

use serde::{Deserialize, Serialize};

/// What a random function returns per element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RandKind {
    /// `rand(seed, offset)`: f32 uniform in [0, 1).
    Uniform,
    /// `randn(seed, offset)`: f32 standard normal (Box–Muller on two words).
    Normal,
    /// `randint(seed, offset)`: u32 uniform over all values.
    Bits,
}

impl RandKind {
    pub const ALL: [RandKind; 3] = [RandKind::Uniform, RandKind::Normal, RandKind::Bits];

    /// The DSL function.
    pub fn name(self) -> &'static str {
        match self {
            RandKind::Uniform => "rand",
            RandKind::Normal => "randn",
            RandKind::Bits => "randint",
        }
    }

    pub fn from_name(name: &str) -> Option<RandKind> {
        RandKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// C for one element: `seed` a `long long`, `offset` an `unsigned int`.
    pub fn cuda(self, seed: &str, offset: &str) -> String {
        match self {
            RandKind::Uniform => format!("tf_rand({seed}, {offset})"),
            RandKind::Normal => format!("tf_randn({seed}, {offset})"),
            RandKind::Bits => format!("tf_randint({seed}, {offset})"),
        }
    }

    /// What interpret mode computes: an f32 value (as f64), or a u32.
    pub fn cpu(self, seed: i64, offset: u32) -> super::cast::Num {
        use super::cast::Num;
        let [c0, c1, ..] = philox(seed as u64, offset);
        match self {
            RandKind::Uniform => Num::F(f64::from(uniform(c0))),
            RandKind::Normal => Num::F(f64::from(normal(c0, c1))),
            RandKind::Bits => Num::I(i64::from(c0)),
        }
    }
}

const ROUND_A: u32 = 0xD251_1F53;
const ROUND_B: u32 = 0xCD9E_8D57;
const KEY_A: u32 = 0x9E37_79B9;
const KEY_B: u32 = 0xBB67_AE85;

/// Philox 4x32-10 of the counter `(offset, 0, 0, 0)` under the key
/// `(seed_lo, seed_hi)`.
pub fn philox(seed: u64, offset: u32) -> [u32; 4] {
    let (mut k0, mut k1) = (seed as u32, (seed >> 32) as u32);
    let (mut c0, mut c1, mut c2, mut c3) = (offset, 0u32, 0u32, 0u32);
    for _ in 0..10 {
        let (p0, p2) = (c0, c2);
        c0 = (((u64::from(ROUND_B) * u64::from(p2)) >> 32) as u32) ^ c1 ^ k0;
        c2 = (((u64::from(ROUND_A) * u64::from(p0)) >> 32) as u32) ^ c3 ^ k1;
        c1 = ROUND_B.wrapping_mul(p2);
        c3 = ROUND_A.wrapping_mul(p0);
        k0 = k0.wrapping_add(KEY_A);
        k1 = k1.wrapping_add(KEY_B);
    }
    [c0, c1, c2, c3]
}

/// A word to a float in [0, 1), as Triton does: the word as i32, negatives
/// folded onto non-negatives, times 2^-31.
pub fn uniform(x: u32) -> f32 {
    let i = x as i32;
    let i = if i < 0 { -i - 1 } else { i };
    i as f32 * 4.656_612_7e-10
}

/// Two words to a standard normal (the cosine half of Box–Muller).
pub fn normal(a: u32, b: u32) -> f32 {
    let u1 = uniform(a).max(1.0e-7);
    let u2 = uniform(b);
    let th = std::f32::consts::TAU * u2;
    let r = (-2.0f32 * u1.ln()).sqrt();
    r * th.cos()
}

/// Device functions of the random numbers (the same arithmetic as above).
pub const HELPERS: &str = r#"__device__ __forceinline__ void tf_philox(long long seed, unsigned int offset, unsigned int* out) {
  unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)((unsigned long long)seed >> 32);
  unsigned int c0 = offset, c1 = 0u, c2 = 0u, c3 = 0u;
  #pragma unroll
  for (int i = 0; i < 10; ++i) {
    const unsigned int p0 = c0, p2 = c2;
    c0 = __umulhi(0xCD9E8D57u, p2) ^ c1 ^ k0;
    c2 = __umulhi(0xD2511F53u, p0) ^ c3 ^ k1;
    c1 = 0xCD9E8D57u * p2;
    c3 = 0xD2511F53u * p0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}
__device__ __forceinline__ float tf_uniform(unsigned int x) { int i = (int)x; i = i < 0 ? -i - 1 : i; return (float)i * 4.6566127e-10f; }
__device__ __forceinline__ float tf_rand(long long seed, unsigned int offset) { unsigned int c[4]; tf_philox(seed, offset, c); return tf_uniform(c[0]); }
__device__ __forceinline__ unsigned int tf_randint(long long seed, unsigned int offset) { unsigned int c[4]; tf_philox(seed, offset, c); return c[0]; }
__device__ __forceinline__ float tf_randn(long long seed, unsigned int offset) {
  unsigned int c[4]; tf_philox(seed, offset, c);
  const float u1 = fmaxf(1.0e-7f, tf_uniform(c[0])), u2 = tf_uniform(c[1]);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_is_in_unit_interval_and_varies() {
        let xs: Vec<f32> = (0..1000).map(|o| uniform(philox(42, o)[0])).collect();
        assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
        assert_ne!(philox(1, 0), philox(2, 0));
    }
}
