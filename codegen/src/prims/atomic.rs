//! Atomic read-modify-writes into global memory: `atomic_add(t[index], v);`
//! (and `atomic_max`, `atomic_min`). Each element of `v` is combined into
//! its place of `t`; places outside `t` or past a tile's extent are skipped.
//! Float additions from different programs land in any order, so sums are
//! not bit-reproducible (as with any atomics). `let old = atomic_add(…);`
//! keeps what each place held just before its update (every helper below
//! returns it; where the result goes unused the compiler emits a reduction,
//! as before).

use crate::dtype::DType;
use serde::{Deserialize, Serialize};

/// The atomic operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum AtomicOp {
    Add,
    Max,
    Min,
}

/// Device functions the atomics call: overloads per element type, each
/// returning the element's old value. bf16 and f16 go through a
/// compare-and-swap of the aligned 32-bit word (any arch); f32 max and min too.
pub const HELPERS: &str = r#"__device__ __forceinline__ float tf_atomic_add(float* p, float v) { return atomicAdd(p, v); }
// Four adds to 16 aligned bytes: one vector reduction on sm_90 and later.
__device__ __forceinline__ void tf_red_add_v4(float* p, float a, float b, float c, float d) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" :: "l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
#else
  atomicAdd(p, a); atomicAdd(p + 1, b); atomicAdd(p + 2, c); atomicAdd(p + 3, d);
#endif
}
__device__ __forceinline__ int tf_atomic_add(int* p, int v) { return atomicAdd(p, v); }
__device__ __forceinline__ unsigned int tf_atomic_add(unsigned int* p, unsigned int v) { return atomicAdd(p, v); }
__device__ __forceinline__ long long tf_atomic_add(long long* p, long long v) { return (long long)atomicAdd((unsigned long long*)p, (unsigned long long)v); }
__device__ __forceinline__ int tf_atomic_max(int* p, int v) { return atomicMax(p, v); }
__device__ __forceinline__ unsigned int tf_atomic_max(unsigned int* p, unsigned int v) { return atomicMax(p, v); }
__device__ __forceinline__ long long tf_atomic_max(long long* p, long long v) { return atomicMax(p, v); }
__device__ __forceinline__ int tf_atomic_min(int* p, int v) { return atomicMin(p, v); }
__device__ __forceinline__ unsigned int tf_atomic_min(unsigned int* p, unsigned int v) { return atomicMin(p, v); }
__device__ __forceinline__ long long tf_atomic_min(long long* p, long long v) { return atomicMin(p, v); }
// f32 max/min: compare-and-swap until the stored value is no smaller (larger).
__device__ __forceinline__ float tf_atomic_max(float* p, float v) {
  unsigned int* a = (unsigned int*)p; unsigned int old = *a;
  while (fmaxf(__uint_as_float(old), v) != __uint_as_float(old)) {
    const unsigned int seen = atomicCAS(a, old, __float_as_uint(fmaxf(__uint_as_float(old), v)));
    if (seen == old) break;
    old = seen;
  }
  return __uint_as_float(old);
}
__device__ __forceinline__ float tf_atomic_min(float* p, float v) {
  unsigned int* a = (unsigned int*)p; unsigned int old = *a;
  while (fminf(__uint_as_float(old), v) != __uint_as_float(old)) {
    const unsigned int seen = atomicCAS(a, old, __float_as_uint(fminf(__uint_as_float(old), v)));
    if (seen == old) break;
    old = seen;
  }
  return __uint_as_float(old);
}
// 16-bit floats: the half of the aligned word `p` is in, updated by CAS.
template <typename F>
__device__ __forceinline__ float tf_atomic16(unsigned short* p, float v, bool bf16, F f) {
  unsigned int* a = (unsigned int*)((unsigned long long)p & ~3ull);
  const unsigned int shift = ((unsigned long long)p & 2ull) ? 16u : 0u;
  unsigned int old = *a;
  while (true) {
    const unsigned short h = (unsigned short)(old >> shift);
    const float cur = bf16 ? tf_bf16_to_f32(h) : tf_f16_to_f32(h);
    const unsigned short n = bf16 ? tf_f32_to_bf16(f(cur, v)) : tf_f32_to_f16(f(cur, v));
    const unsigned int next = (old & ~(0xffffu << shift)) | ((unsigned int)n << shift);
    if (next == old) return cur;
    const unsigned int seen = atomicCAS(a, old, next);
    if (seen == old) return cur;
    old = seen;
  }
}
struct tf_add_f { __device__ float operator()(float a, float b) const { return a + b; } };
struct tf_max_f { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct tf_min_f { __device__ float operator()(float a, float b) const { return fminf(a, b); } };
"#;

impl AtomicOp {
    /// Every atomic operation.
    pub const ALL: &'static [AtomicOp] = &[AtomicOp::Add, AtomicOp::Max, AtomicOp::Min];

    /// The DSL function (`atomic_add`).
    pub fn name(self) -> &'static str {
        match self {
            AtomicOp::Add => "atomic_add",
            AtomicOp::Max => "atomic_max",
            AtomicOp::Min => "atomic_min",
        }
    }

    pub fn from_name(name: &str) -> Option<AtomicOp> {
        AtomicOp::ALL.iter().copied().find(|o| o.name() == name)
    }

    /// Whether tensors of `t` take this operation, or why not.
    pub fn check(self, t: DType) -> Result<(), String> {
        match t {
            DType::F32 | DType::BF16 | DType::F16 | DType::I32 | DType::U32 | DType::I64 => Ok(()),
            _ => Err(format!(
                "`{}` takes tensors of f32, bf16, f16, i32, u32 or i64; this one holds {t}",
                self.name()
            )),
        }
    }

    /// C performing the operation on the element at `ptr` (a pointer to the
    /// tensor's storage type) with `v` (computed in `t.cty()`): an expression
    /// whose value is the element's old value (in `t.cty()`).
    pub fn cuda(self, t: DType, ptr: &str, v: &str) -> String {
        let f = match self {
            AtomicOp::Add => "add",
            AtomicOp::Max => "max",
            AtomicOp::Min => "min",
        };
        match t {
            DType::BF16 | DType::F16 => {
                format!("tf_atomic16({ptr}, {v}, {}, tf_{f}_f())", t == DType::BF16)
            }
            _ => format!("tf_atomic_{f}({ptr}, {v})"),
        }
    }

    /// What interpret mode stores: the old value combined with `v` (floats,
    /// then rounded to the tensor's type by the store).
    pub fn cpu(self, old: f64, v: f64) -> f64 {
        match self {
            AtomicOp::Add => old + v,
            AtomicOp::Max => old.max(v),
            AtomicOp::Min => old.min(v),
        }
    }

    /// Integer version of [`AtomicOp::cpu`] (wrapped to the tensor's type by the caller).
    pub fn cpu_int(self, old: i64, v: i64) -> i128 {
        match self {
            AtomicOp::Add => old as i128 + v as i128,
            AtomicOp::Max => i128::from(old.max(v)),
            AtomicOp::Min => i128::from(old.min(v)),
        }
    }
}
