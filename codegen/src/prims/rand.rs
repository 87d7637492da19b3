//! Counter-based random numbers: Philox 4x32 with 10 rounds (as Triton's
//! `tl.rand` and cuRAND), keyed by a 64-bit `seed`, so the same (seed,
//! offset) gives the same number in every program, launch and run (a dropout
//! mask is recomputed in the backward pass instead of stored). The numbers
//! are bit-identical in interpret mode.
//!
//! One Philox call gives four words, and a call costs about 100 instructions:
//! more than a memory-bound kernel can spend per element. So, as cuRAND's
//! `curand_uniform4`, four consecutive offsets share one call: offset `o`
//! takes word `o % 4` of the counter `o / 4` (`randn`, two words per value:
//! words `2 (o % 2)` and `2 (o % 2) + 1` of the counter `o / 2`). Where a
//! thread's run of elements has consecutive offsets from a multiple of the
//! group ([`RandKind::group`]), the lowering draws once per group.

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

    /// Consecutive offsets that share one Philox call.
    pub fn group(self) -> u32 {
        match self {
            RandKind::Normal => 2,
            RandKind::Uniform | RandKind::Bits => 4,
        }
    }

    /// C for one element: `seed` a `long long`, `offset` an `unsigned int`.
    pub fn cuda(self, seed: &str, offset: &str) -> String {
        match self {
            RandKind::Uniform => format!("tf_rand({seed}, {offset})"),
            RandKind::Normal => format!("tf_randn({seed}, {offset})"),
            RandKind::Bits => format!("tf_randint({seed}, {offset})"),
        }
    }

    /// C for element `j` of a group (offset `group · c + j`), from the words
    /// `tf_c[0..4]` of the counter `c`'s call.
    pub fn cuda_of_words(self, j: u32) -> String {
        match self {
            RandKind::Uniform => format!("tf_uniform(tf_c[{j}])"),
            RandKind::Normal => format!("tf_normal(tf_c[{}], tf_c[{}])", 2 * j, 2 * j + 1),
            RandKind::Bits => format!("tf_c[{j}]"),
        }
    }

    /// What interpret mode computes: an f32 value (as f64), or a u32.
    pub fn cpu(self, seed: i64, offset: u32) -> super::cast::Num {
        use super::cast::Num;
        let g = self.group();
        let c = philox(seed as u64, offset / g);
        let j = (offset % g) as usize;
        match self {
            RandKind::Uniform => Num::F(f64::from(uniform(c[j]))),
            RandKind::Normal => Num::F(f64::from(normal(c[2 * j], c[2 * j + 1]))),
            RandKind::Bits => Num::I(i64::from(c[j])),
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

/// A word to a float in [0, 1): its top 23 bits as the mantissa of a float
/// in [1, 2), less 1. Every value is a multiple of 2^-23 below 1 (Triton's
/// `i32 · 2^-31` rounds its largest words up to 1.0), and it costs two
/// full-rate instructions where an int-to-float conversion runs at an eighth.
pub fn uniform(x: u32) -> f32 {
    f32::from_bits(0x3f80_0000 | (x >> 9)) - 1.0
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
pub const HELPERS: &str = r#"// The 20 round keys of a seed, computed once per kernel value (not per call):
// a draw then costs the rounds' multiplies and xors only.
__device__ __forceinline__ void tf_philox_keys(long long seed, unsigned int* k) {
  const unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)((unsigned long long)seed >> 32);
  #pragma unroll
  for (int i = 0; i < 10; ++i) { k[2 * i] = k0 + (unsigned int)i * 0x9E3779B9u; k[2 * i + 1] = k1 + (unsigned int)i * 0xBB67AE85u; }
}
// The same keys, each passed through a shuffle from the first active lane (all
// lanes hold the same value), which the compiler cannot recompute: the keys
// then stay in registers across the calls of a run instead of being rebuilt
// (an add each) inside every call, a fifth of its instructions.
__device__ __forceinline__ void tf_philox_keys_held(long long seed, unsigned int* k) {
  tf_philox_keys(seed, k);
  const unsigned int active = __activemask();
  const int first = __ffs(active) - 1;
  #pragma unroll
  for (int i = 0; i < 20; ++i) k[i] = __shfl_sync(active, k[i], first);
}
// A round's two products as 64-bit multiplies: one IMAD.WIDE gives both halves
// where `__umulhi` and `*` are two instructions.
__device__ __forceinline__ void tf_philox_k(const unsigned int* k, unsigned int offset, unsigned int* out) {
  unsigned int c0 = offset, c1 = 0u, c2 = 0u, c3 = 0u;
  #pragma unroll
  for (int i = 0; i < 10; ++i) {
    const unsigned long long m0 = (unsigned long long)0xD2511F53u * c0, m2 = (unsigned long long)0xCD9E8D57u * c2;
    c0 = (unsigned int)(m2 >> 32) ^ c1 ^ k[2 * i];
    c2 = (unsigned int)(m0 >> 32) ^ c3 ^ k[2 * i + 1];
    c1 = (unsigned int)m2;
    c3 = (unsigned int)m0;
  }
  out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}
__device__ __forceinline__ void tf_philox(long long seed, unsigned int offset, unsigned int* out) {
  unsigned int k[20]; tf_philox_keys(seed, k); tf_philox_k(k, offset, out);
}
__device__ __forceinline__ float tf_uniform(unsigned int x) { return __uint_as_float(0x3f800000u | (x >> 9)) - 1.0f; }
// The bound on words for comparing a group's uniforms with one value p (see
// `UniformCmp` in the general lowering): `tf_uniform(w) > p` iff w >= the bound
// of (p, strict, !below); `u >= p` (not strict); `u < p` iff w < the bound of
// (p, not strict, below), `u <= p` (strict). 2^32 admits no word; a NaN p
// compares false.
__device__ __forceinline__ unsigned long long tf_uniform_bound(float p, bool strict, bool below) {
  if (p != p) return below ? 0ull : (1ull << 32);
  const float s = p * 8388608.0f;  // exact: a power of two
  const float l = fminf(fmaxf(strict ? floorf(s) + 1.0f : ceilf(s), 0.0f), 8388608.0f);
  return (unsigned long long)l << 9;
}
__device__ __forceinline__ float tf_normal(unsigned int a, unsigned int b) {
  const float u1 = fmaxf(1.0e-7f, tf_uniform(a)), u2 = tf_uniform(b);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
__device__ __forceinline__ unsigned int tf_word(const unsigned int* c, unsigned int j) { return (j & 2u) ? ((j & 1u) ? c[3] : c[2]) : ((j & 1u) ? c[1] : c[0]); }
// One element by itself (a run whose offsets are not consecutive from a
// multiple of the group): not inlined, each costs a whole Philox call.
__device__ __noinline__ float tf_rand(long long seed, unsigned int offset) { unsigned int c[4]; tf_philox(seed, offset >> 2, c); return tf_uniform(tf_word(c, offset & 3u)); }
__device__ __noinline__ unsigned int tf_randint(long long seed, unsigned int offset) { unsigned int c[4]; tf_philox(seed, offset >> 2, c); return tf_word(c, offset & 3u); }
__device__ __noinline__ float tf_randn(long long seed, unsigned int offset) {
  unsigned int c[4]; tf_philox(seed, offset >> 1, c);
  return (offset & 1u) ? tf_normal(c[2], c[3]) : tf_normal(c[0], c[1]);
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

    #[test]
    fn uniform_stays_below_one_at_the_largest_words() {
        // i32 · 2^-31 rounds 0x7fff_ffff up to exactly 1.0.
        for w in [u32::MAX, 0x7fff_ffff, 0x8000_0000, 0xffff_fe00] {
            assert!(uniform(w) < 1.0, "{w:#x} -> {}", uniform(w));
        }
        assert_eq!(uniform(0), 0.0);
        assert_eq!(uniform(u32::MAX), 1.0 - f32::EPSILON);
    }

    #[test]
    fn four_offsets_share_a_call_and_every_offset_differs() {
        use crate::prims::cast::Num;
        let words = philox(7, 3);
        for j in 0..4 {
            assert_eq!(
                RandKind::Bits.cpu(7, 12 + j),
                Num::I(i64::from(words[j as usize]))
            );
        }
        let normal = |o| match RandKind::Normal.cpu(7, o) {
            Num::F(f) => f,
            Num::I(_) => f64::NAN,
        };
        let w = philox(7, 5);
        assert_eq!(normal(11), f64::from(super::normal(w[2], w[3])));
        let all: std::collections::HashSet<i64> = (0..4096)
            .map(|o| match RandKind::Bits.cpu(1, o) {
                Num::I(i) => i,
                Num::F(_) => -1,
            })
            .collect();
        assert_eq!(all.len(), 4096);
    }
}
