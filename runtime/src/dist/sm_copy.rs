//! An all-gather's copies done by a few SMs instead of the copy engine.
//!
//! The copy engine pulls about 135 GB/s into an H200 from all its peers together
//! (one stream or one per peer, measured), which bounds a fused all-gather
//! matmul of small M on 4 ranks. SM loads over NVLink go faster, as NCCL's
//! all-gather shows: here a small grid (`ctas` blocks, in pairs so that each pair
//! takes one cluster slot of a clustered GEMM) walks the pieces in the order the
//! consumer wants them, every block taking a share of each piece, and the last
//! block to finish a piece sets its flag to the call's epoch. The consumer must
//! leave these SMs free ([`crate::kernel::leaving_sms`]): a persistent GEMM that
//! fills every SM while it waits for this kernel would wait until its bounded
//! waits give up.

use crate::device::Device;
use crate::error::{argument, driver, Result};
use crate::jit;
use crate::tensor::Tensor;
use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaModule};
use std::ffi::c_void;
use std::sync::Arc;

const KERNEL: &str = "tilefuse_pull_pieces";

/// Threads per block: 1024 threads with 8 vectors of 16 bytes in flight each
/// keep 128 KiB of loads outstanding per SM, enough to cover NVLink's latency.
const THREADS: u32 = 1024;

/// One piece: `rows` rows of `width` bytes, `pitch` bytes apart, from `src` (a
/// peer's mapping) to `dst` (this GPU), then `*flag = epoch`. The kernel reads
/// the same seven 64-bit words (`vec`: the widest access, in bytes, that every
/// address, width and pitch allow).
const SOURCE: &str = r#"
typedef unsigned long long u64;
struct Piece { u64 src, dst, flag, rows, width, pitch, vec; };
struct __align__(16) V16 { unsigned a, b, c, d; };
struct __align__(8) V8 { unsigned a, b; };
struct V4 { unsigned a; };
struct V2 { unsigned short a; };
struct V1 { unsigned short a; };
// Loads bypass L1 (the peer's rows change between calls); stores are plain.
__device__ __forceinline__ void ld(V16& v, u64 p) { asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.a), "=r"(v.b), "=r"(v.c), "=r"(v.d) : "l"(p)); }
__device__ __forceinline__ void st(u64 p, const V16& v) { asm volatile("st.global.v4.u32 [%0], {%1,%2,%3,%4};" :: "l"(p), "r"(v.a), "r"(v.b), "r"(v.c), "r"(v.d) : "memory"); }
__device__ __forceinline__ void ld(V8& v, u64 p) { asm volatile("ld.global.cg.v2.u32 {%0,%1}, [%2];" : "=r"(v.a), "=r"(v.b) : "l"(p)); }
__device__ __forceinline__ void st(u64 p, const V8& v) { asm volatile("st.global.v2.u32 [%0], {%1,%2};" :: "l"(p), "r"(v.a), "r"(v.b) : "memory"); }
__device__ __forceinline__ void ld(V4& v, u64 p) { asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v.a) : "l"(p)); }
__device__ __forceinline__ void st(u64 p, const V4& v) { asm volatile("st.global.u32 [%0], %1;" :: "l"(p), "r"(v.a) : "memory"); }
__device__ __forceinline__ void ld(V2& v, u64 p) { asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v.a) : "l"(p)); }
__device__ __forceinline__ void st(u64 p, const V2& v) { asm volatile("st.global.u16 [%0], %1;" :: "l"(p), "h"(v.a) : "memory"); }
__device__ __forceinline__ void ld(V1& v, u64 p) { asm volatile("ld.global.cg.u8 %0, [%1];" : "=h"(v.a) : "l"(p)); }
__device__ __forceinline__ void st(u64 p, const V1& v) { asm volatile("st.global.u8 [%0], %1;" :: "l"(p), "h"(v.a) : "memory"); }

template <typename T, int SIZE>
__device__ __forceinline__ void copy_piece(const Piece& p, u64 first, u64 step) {
  const u64 per_row = p.width / SIZE, total = p.rows * per_row;
  const bool flat = p.width == p.pitch;
  auto at = [&](u64 q) -> u64 { return flat ? q * SIZE : (q / per_row) * p.pitch + (q % per_row) * SIZE; };
  u64 j = first;
  for (; j + 7 * step < total; j += 8 * step) {
    T v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) ld(v[u], p.src + at(j + u * step));
#pragma unroll
    for (int u = 0; u < 8; ++u) st(p.dst + at(j + u * step), v[u]);
  }
  for (; j < total; j += step) { T v; ld(v, p.src + at(j)); st(p.dst + at(j), v); }
}

extern "C" __global__ void
#if __CUDA_ARCH__ >= 900
__cluster_dims__(2, 1, 1)
#endif
__launch_bounds__(1024) tilefuse_pull_pieces(const Piece* __restrict__ pieces, unsigned n, unsigned* counters, unsigned epoch) {
  const u64 first = (u64)blockIdx.x * blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;
  for (unsigned i = 0; i < n; ++i) {
    const Piece p = pieces[i];
    switch (p.vec) {
      case 16: copy_piece<V16, 16>(p, first, step); break;
      case 8: copy_piece<V8, 8>(p, first, step); break;
      case 4: copy_piece<V4, 4>(p, first, step); break;
      case 2: copy_piece<V2, 2>(p, first, step); break;
      default: copy_piece<V1, 1>(p, first, step); break;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      // Every block adds one per call: the counter reaches epoch * blocks
      // (wrapping) when the last block's share of this call is written.
      __threadfence();
      const unsigned before = atomicAdd(&counters[i], 1u);
      if (before + 1u == epoch * gridDim.x) {
        __threadfence();
        asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p.flag), "r"(epoch) : "memory");
      }
    }
  }
}
"#;

/// The copy kernel compiled for `arch` with ptxas's resource report in the
/// log (for the NVRTC tests: it needs no GPU).
pub fn copy_kernel_report(arch: &str) -> Result<String> {
    jit::resource_report(KERNEL, SOURCE, arch)
}

/// A piece of an all-gather for [`SmCopier`]: `rows` rows of `width` bytes,
/// `pitch` bytes apart at both ends, then its flag.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub src: u64,
    pub dst: u64,
    pub flag: u64,
    pub rows: usize,
    pub width: usize,
    pub pitch: usize,
}

impl Piece {
    /// The widest access (16, 8, 4, 2 or 1 bytes) that both ends' addresses,
    /// the width and the pitch are multiples of.
    fn vector_bytes(&self) -> u64 {
        let all = self.src | self.dst | self.width as u64 | self.pitch as u64;
        [16u64, 8, 4, 2]
            .into_iter()
            .find(|v| all % v == 0)
            .unwrap_or(1)
    }
}

/// The compiled copy kernel and its fixed pieces, for one all-gather.
pub(crate) struct SmCopier {
    _module: Arc<CudaModule>,
    function: CudaFunction,
    /// The pieces as the kernel reads them, seven words each.
    pieces: Tensor<i64>,
    /// One counter per piece, grown by the block count each call.
    counters: Tensor<u32>,
    count: u32,
    blocks: u32,
}

impl SmCopier {
    /// Compiles the copy kernel for `dev` (or takes it from the cubin cache) and
    /// uploads `pieces`, copied in this order by `blocks` blocks (even: they run
    /// in pairs) on every call.
    pub fn new(dev: &Arc<Device>, pieces: &[Piece], blocks: usize) -> Result<SmCopier> {
        let ctx = "AllGather::copy_with_sms";
        if blocks == 0 || blocks % 2 != 0 || blocks > dev.sm_count() {
            return Err(argument(
                ctx,
                "sms",
                format!(
                    "an even count of SMs from 2 to the GPU's {} (got {blocks})",
                    dev.sm_count()
                ),
            ));
        }
        let count = u32::try_from(pieces.len())
            .map_err(|_| argument(ctx, "pieces", "more than 4 billion pieces"))?;
        let gpu = dev.gpu("copying an all-gather with SMs")?;
        let cubin = jit::compile_cubin(KERNEL, SOURCE, &dev.arch())?;
        let module = gpu
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin.image))
            .map_err(driver("loading the all-gather's copy kernel"))?;
        let function = module
            .load_function(KERNEL)
            .map_err(driver("finding the all-gather's copy kernel"))?;
        let words: Vec<i64> = pieces
            .iter()
            .flat_map(|p| {
                [
                    p.src,
                    p.dst,
                    p.flag,
                    p.rows as u64,
                    p.width as u64,
                    p.pitch as u64,
                    p.vector_bytes(),
                ]
            })
            .map(|w| w as i64)
            .collect();
        let len = words.len().max(1);
        let table = if words.is_empty() { vec![0] } else { words };
        Ok(SmCopier {
            _module: module,
            function,
            pieces: Tensor::from_slice_on(dev, &table, [len])?,
            counters: Tensor::<u32>::flags(pieces.len().max(1))?,
            count,
            blocks: blocks as u32,
        })
    }

    /// SMs the copies occupy while they run.
    pub fn sms(&self) -> usize {
        self.blocks as usize
    }

    /// Queues this call's copies on `stream`: every piece, then its flag set to
    /// `epoch`.
    ///
    /// # Safety
    /// Every piece's source must be readable and its destination writable, and
    /// its flag a 4-byte aligned word, until `stream` has run the kernel; no
    /// earlier call's copies may still run on another stream (the counters are
    /// shared).
    pub unsafe fn launch(&self, stream: sys::CUstream, epoch: u32) -> Result<()> {
        let (mut table, mut n, mut counters, mut e) = (
            self.pieces.device_ptr(),
            self.count,
            self.counters.device_ptr(),
            epoch,
        );
        let mut params: [*mut c_void; 4] = [
            &mut table as *mut u64 as *mut c_void,
            &mut n as *mut u32 as *mut c_void,
            &mut counters as *mut u64 as *mut c_void,
            &mut e as *mut u32 as *mut c_void,
        ];
        // SAFETY: four parameters of the kernel's C types (pointer, unsigned,
        // pointer, unsigned), alive across the call; the piece table and the
        // counters are this copier's own device buffers; the pieces' addresses
        // are the caller's contract.
        unsafe {
            cudarc::driver::result::launch_kernel(
                self.function.cu_function(),
                (self.blocks, 1, 1),
                (THREADS, 1, 1),
                0,
                stream,
                &mut params,
            )
        }
        .map_err(driver("launching the all-gather's copy kernel"))
    }
}
