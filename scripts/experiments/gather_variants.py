#!/usr/bin/env python3
"""Hand-written segment sums and embeddings on the GPU machine, against PyTorch
eager and torch.compile in the same process: what bounds the two corpus kernels
near torch.compile's time (segment_sum: 2M rows of 128 bf16 added into 2000
f32 rows by unsorted ids; embedding: 16384 tokens of a 32000x4096 bf16 table).

segment_sum: `red.global.add.v4.f32` an element group (as the general lowering
and Triton do) against Hopper's bulk reduction (`cp.reduce.async.bulk ... add.f32`:
a row converted to f32 in shared memory, added into its segment's row by the
TMA unit in one operation of 512 bytes).
embedding: a warp a token row, with L2 eviction hints on the table's loads and
the output's stores (`createpolicy` + `.L2::cache_hint`).

CUDA events, L2 flushed, median of 40 (colsum_variants.bench):

    python3 scripts/experiments/gather_variants.py

Needs cupy and torch (both on the GPU machine's image).
"""
import cupy as cp, torch

from colsum_variants import bench  # the same timing: CUDA events, L2 flushed, median

SEG_SRC = r'''

// A: 16 threads a row, 8 bf16 (16 B) a thread, two red.v4.f32 each.
extern "C" __global__ void __launch_bounds__(256) seg_red(const uint4* __restrict__ v,
    const long long* __restrict__ ids, float* out, int n) {
  const int t = threadIdx.x & 15;
  for (long long r = (long long)blockIdx.x * 16 + (threadIdx.x >> 4); r < n; r += (long long)gridDim.x * 16) {
    uint4 w = v[r * 16 + t];
    long long id = ids[r];
    float* dst = out + id * 128 + t * 8;
    unsigned u[4] = {w.x, w.y, w.z, w.w};
    float f[8];
    #pragma unroll
    for (int j = 0; j < 4; ++j) { f[2*j] = __uint_as_float(u[j] << 16); f[2*j+1] = __uint_as_float(u[j] & 0xffff0000u); }
    asm volatile("red.global.add.v4.f32 [%0], {%1,%2,%3,%4};" :: "l"(dst), "f"(f[0]), "f"(f[1]), "f"(f[2]), "f"(f[3]) : "memory");
    asm volatile("red.global.add.v4.f32 [%0], {%1,%2,%3,%4};" :: "l"(dst + 4), "f"(f[4]), "f"(f[5]), "f"(f[6]), "f"(f[7]) : "memory");
  }
}

// B: ROWS rows a stage converted to f32 in shared memory (double buffered),
// each added into its segment's row by one bulk reduction of 512 bytes.
extern "C" __global__ void __launch_bounds__(256) seg_bulk(const uint4* __restrict__ v,
    const long long* __restrict__ ids, float* out, int n) {
  __shared__ __align__(128) float buf[2][ROWS][128];
  const int t = threadIdx.x & 15, rr = threadIdx.x >> 4;  // 16 rows a pass of the block
  int stage = 0;
  const bool issuer = threadIdx.x < ROWS;
  for (long long r0 = (long long)blockIdx.x * ROWS; r0 < n; r0 += (long long)gridDim.x * ROWS, stage ^= 1) {
    // the bulk reductions that read this buffer two stages ago are done reading
    if (issuer) asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
    __syncthreads();
    #pragma unroll
    for (int p = 0; p < ROWS / 16; ++p) {
      const long long r = r0 + p * 16 + rr;
      if (r < n) {
        uint4 w = v[r * 16 + t];
        unsigned u[4] = {w.x, w.y, w.z, w.w};
        float4 a, b;
        a.x = __uint_as_float(u[0] << 16); a.y = __uint_as_float(u[0] & 0xffff0000u);
        a.z = __uint_as_float(u[1] << 16); a.w = __uint_as_float(u[1] & 0xffff0000u);
        b.x = __uint_as_float(u[2] << 16); b.y = __uint_as_float(u[2] & 0xffff0000u);
        b.z = __uint_as_float(u[3] << 16); b.w = __uint_as_float(u[3] & 0xffff0000u);
        float4* s = (float4*)&buf[stage][p * 16 + rr][t * 8];
        s[0] = a; s[1] = b;
      }
    }
    // generic-proxy writes made visible to the async proxy, then to the issuers
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (issuer) {
      const long long r = r0 + threadIdx.x;
      if (r < n) {
        float* dst = out + ids[r] * 128;
        unsigned src = (unsigned)__cvta_generic_to_shared(&buf[stage][threadIdx.x][0]);
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], 512;"
                     :: "l"(dst), "r"(src) : "memory");
      }
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }
  }
  if (issuer) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}
'''

EMB_SRC = r'''
// A warp a piece of K*32 uint4 of a token's 8 KB row (16/K warps a row), all
// its loads before its stores.
extern "C" __global__ void __launch_bounds__(256) emb(const uint4* __restrict__ w,
    const long long* __restrict__ ids, uint4* __restrict__ out, int t) {
  const int lane = threadIdx.x & 31;
  const int piece = blockIdx.x * 8 + (threadIdx.x >> 5);
  const int tok = piece / (16 / K), part = piece % (16 / K);
  if (tok >= t) return;
  const uint4* src = w + ids[tok] * 512 + part * K * 32;
  uint4* dst = out + (long long)tok * 512 + part * K * 32;
  unsigned long long lp = 0, sp = 0;
#if LOADHINT
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(lp));
#endif
#if STOREHINT == 1
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(sp));
#endif
  (void)lp; (void)sp;
  uint4 x[K];
  #pragma unroll
  for (int k = 0; k < K; ++k) {
#if LOADHINT
    asm volatile("ld.global.nc.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
        : "=r"(x[k].x), "=r"(x[k].y), "=r"(x[k].z), "=r"(x[k].w) : "l"(src + k * 32 + lane), "l"(lp));
#else
    x[k] = src[k * 32 + lane];
#endif
  }
  #pragma unroll
  for (int k = 0; k < K; ++k) {
#if STOREHINT == 1
    asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1,%2,%3,%4}, %5;"
        :: "l"(dst + k * 32 + lane), "r"(x[k].x), "r"(x[k].y), "r"(x[k].z), "r"(x[k].w), "l"(sp) : "memory");
#elif STOREHINT == 2
    __stcs(dst + k * 32 + lane, x[k]);
#else
    dst[k * 32 + lane] = x[k];
#endif
  }
}
'''


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def segment(copy_bw, cps):
    n, d, nseg = 1 << 21, 128, 2000
    v = torch.randn(n, d, device='cuda').bfloat16()
    ids = torch.randint(0, nseg, (n,), device='cuda')
    out = torch.empty(nseg, d, device='cuda')
    ref = torch.zeros(nseg, d, device='cuda', dtype=torch.float64).index_add_(0, ids, v.double())
    byt = n * d * 2 + n * 8 + nseg * d * 4
    def pct(t): return byt / t / 1e6 / copy_bw * 100
    eager = lambda: torch.zeros(nseg, d, device='cuda').index_add_(0, ids, v.float())
    comp = torch.compile(lambda a, i: torch.zeros(nseg, d, device='cuda', dtype=torch.float32).index_add_(0, i, a.float()))
    comp(v, ids); comp(v, ids)
    te, tc = bench(eager), bench(lambda: comp(v, ids))
    print(f'segment_sum eager {te:.4f} ms ({pct(te):.0f}%)  torch.compile {tc:.4f} ms ({pct(tc):.0f}%) err {rel(comp(v, ids), ref):.1e}', flush=True)
    red = cp.RawModule(code=SEG_SRC, options=('-std=c++17', '-arch=sm_90', '-DROWS=32')).get_function('seg_red')
    for blocks in (132 * 8, 132 * 16, 132 * 64, n // 16):
        def run():
            out.zero_()
            red((blocks,), (256,), (v.data_ptr(), ids.data_ptr(), out.data_ptr(), cp.int32(n)), stream=cps)
        with cps:
            run(); torch.cuda.synchronize()
            t = bench(run)
        print(f'  red.v4 blocks={blocks}: {t:.4f} ms ({pct(t):.0f}%) {tc / t:.2f}x compile, err {rel(out, ref):.1e}', flush=True)
    for rows in (16, 32):
        try:
            bulk = cp.RawModule(code=SEG_SRC, options=('-std=c++17', '-arch=sm_90', f'-DROWS={rows}')).get_function('seg_bulk')
        except Exception as ex:
            print('  bulk build failed', rows, ex, flush=True)
            continue
        for blocks in (132 * 2, 132 * 4, 132 * 8, 132 * 16):
            def run():
                out.zero_()
                bulk((blocks,), (256,), (v.data_ptr(), ids.data_ptr(), out.data_ptr(), cp.int32(n)), stream=cps)
            with cps:
                run(); torch.cuda.synchronize()
                t = bench(run)
            print(f'  bulk rows={rows} blocks={blocks}: {t:.4f} ms ({pct(t):.0f}%) {tc / t:.2f}x compile, err {rel(out, ref):.1e}', flush=True)


def embedding(copy_bw, cps):
    v, d, t = 32000, 4096, 16384
    w = torch.randn(v, d, device='cuda').bfloat16()
    g = torch.Generator(device='cuda').manual_seed(1)
    ids = torch.randint(0, v, (t,), device='cuda', generator=g)
    out = torch.empty(t, d, device='cuda', dtype=torch.bfloat16)
    distinct = ids.unique().numel()
    byt = distinct * d * 2 + t * (d * 2 + 8)
    def pct(x): return byt / x / 1e6 / copy_bw * 100
    te = bench(lambda: torch.nn.functional.embedding(ids, w))
    comp = torch.compile(lambda i, a: torch.nn.functional.embedding(i, a))
    comp(ids, w); comp(ids, w)
    tc = bench(lambda: comp(ids, w))
    print(f'embedding ({distinct} distinct rows) eager {te:.4f} ms ({pct(te):.0f}%)  torch.compile {tc:.4f} ms ({pct(tc):.0f}%)', flush=True)
    ref = w[ids]
    variants = [(k, 0, 0) for k in (2, 4, 8, 16)] + [(k, lh, sh) for k in (4, 16) for lh in (0, 1) for sh in (0, 1, 2) if lh or sh]
    for k, lh, sh in variants:
            fn = cp.RawModule(code=EMB_SRC, options=('-std=c++17', '-arch=sm_90', f'-DK={k}', f'-DLOADHINT={lh}', f'-DSTOREHINT={sh}')).get_function('emb')
            def run():
                fn((t * (16 // k) // 8,), (256,), (w.data_ptr(), ids.data_ptr(), out.data_ptr(), cp.int32(t)), stream=cps)
            with cps:
                out.fill_(float('nan')); run(); torch.cuda.synchronize()
                x = bench(run)
            ok = torch.equal(out, ref)
            print(f'  emb K={k} loadhint={lh} storehint={sh}: {x:.4f} ms ({pct(x):.1f}%) {tc / x:.3f}x compile, exact {ok}', flush=True)


def main():
    torch.manual_seed(0)
    x = torch.randn(16384, 8192, device='cuda').bfloat16()
    y = torch.empty_like(x)
    copy = bench(lambda: y.copy_(x))
    copy_bw = 2 * x.numel() * 2 / copy / 1e6
    print(f'copy {copy:.4f} ms {copy_bw:.0f} GB/s', flush=True)
    del x, y
    cps = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    segment(copy_bw, cps)
    embedding(copy_bw, cps)


main()
