#!/usr/bin/env python3
"""Hand-written column sums (bf16 16384x8192 -> f32 8192) on the GPU machine:
which layout and how many programs a column tile reach the read ceiling,
against PyTorch eager and torch.compile in the same process. CuPy compiles
each variant (CW warps across 256-column strips, RW warps and LR lanes down
the rows, R 16-byte loads a thread, S programs a column tile, meeting by
atomicAdd into a zeroed output or as tilefuse's general lowering meets them:
partials, a counter, the last program adds). CUDA events, L2 flushed, median
of 40. docs/perf-history.md, "Column walks of eight warps; ...", call 1:

    python3 scripts/experiments/colsum_variants.py

Needs cupy and torch (both on the GPU machine's image).
"""
import sys, statistics, itertools
import cupy as cp, torch

M, N = 16384, 8192
SRC = r'''
extern "C" __global__ void __launch_bounds__(CW*RW*32) colsum(const unsigned int* __restrict__ x, float* __restrict__ out,
    int m, int n, int rows_per_part, float* partials, unsigned* counters, int ways) {
  // a warp: LR lanes along rows x (32/LR) lanes along columns, 8 bf16 (16 B) a lane
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cw = warp % CW, rw = warp / CW;
  const int lc = lane % (32 / LR), lr = lane / (32 / LR);
  const int cols_per_block = CW * (32 / LR) * 8;
  const int col = blockIdx.x * cols_per_block + cw * (32 / LR) * 8 + lc * 8;
  const int part = blockIdx.y;
  const int r0 = part * rows_per_part;
  const int r1 = min(m, r0 + rows_per_part);
  float acc[8];
  #pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  const int step = RW * LR;   // rows a load of the block covers
  int r = r0 + rw * LR + lr;
  #pragma unroll UNROLL
  for (; r + (R - 1) * step < r1; r += R * step) {
    uint4 w[R];
    #pragma unroll
    for (int k = 0; k < R; ++k) {
      const uint4* p = (const uint4*)(x + ((size_t)(r + k * step) * n + col) / 2);
#if STREAM
      w[k] = __ldcs(p);
#else
      w[k] = *p;
#endif
    }
    #pragma unroll
    for (int k = 0; k < R; ++k) {
      unsigned int u[4] = {w[k].x, w[k].y, w[k].z, w[k].w};
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        acc[2*j] += __uint_as_float(u[j] << 16);
        acc[2*j+1] += __uint_as_float(u[j] & 0xffff0000u);
      }
    }
  }
  for (; r < r1; r += step) {
    uint4 w = *(const uint4*)(x + ((size_t)r * n + col) / 2);
    unsigned int u[4] = {w.x, w.y, w.z, w.w};
    #pragma unroll
    for (int j = 0; j < 4; ++j) {
      acc[2*j] += __uint_as_float(u[j] << 16);
      acc[2*j+1] += __uint_as_float(u[j] & 0xffff0000u);
    }
  }
  // lanes along rows
  #pragma unroll
  for (int o = 32 / LR; o < 32; o *= 2) {
    #pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
  }
  // warps along rows, through shared memory
  __shared__ float sm[RW][CW * (32 / LR) * 8];
  if (RW > 1) {
    if (lr == 0) {
      #pragma unroll
      for (int j = 0; j < 8; ++j) sm[rw][cw * (32 / LR) * 8 + lc * 8 + j] = acc[j];
    }
    __syncthreads();
    if (rw == 0 && lr == 0) {
      for (int q = 1; q < RW; ++q) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += sm[q][cw * (32 / LR) * 8 + lc * 8 + j];
      }
    }
  }
  const bool writer = rw == 0 && lr == 0;
#if MEET == 0
  if (!writer) return;
  #pragma unroll
  for (int j = 0; j < 8; ++j) atomicAdd(out + col + j, acc[j]);
#else
  // partials, then the last program of the column block adds them
  float* share = partials + ((size_t)blockIdx.x * ways + part) * cols_per_block;
  const int c = cw * (32 / LR) * 8 + lc * 8;
  #pragma unroll
  if (writer) for (int j = 0; j < 8; ++j) share[c + j] = acc[j];
  __threadfence();
  // every thread that wrote takes part: count arrivals per thread-group via block sync
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(counters + blockIdx.x, 1u) == (unsigned)ways - 1;
  __syncthreads();
  if (!last || !writer) return;
  __threadfence();
  const float* sh = partials + (size_t)blockIdx.x * ways * cols_per_block;
  #pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  #pragma unroll 8
  for (int q = 0; q < ways; ++q) {
    #pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += __ldcg(sh + (size_t)q * cols_per_block + c + j);
  }
  #pragma unroll
  for (int j = 0; j < 8; ++j) out[col + j] = acc[j];
  if (threadIdx.x == 0) counters[blockIdx.x] = 0;
#endif
}
'''

def build(CW, RW, LR, R, UNROLL, STREAM, MEET):
    opts = ('-std=c++17', '-arch=sm_90', f'-DCW={CW}', f'-DRW={RW}', f'-DLR={LR}', f'-DR={R}',
            f'-DUNROLL={UNROLL}', f'-DSTREAM={STREAM}', f'-DMEET={MEET}')
    return cp.RawModule(code=SRC, options=opts).get_function('colsum')

def bench(fn, reps=40):
    flush = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')
    ts = []
    for i in range(reps + 5):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize()
        if i >= 5: ts.append(s.elapsed_time(e))
    return statistics.median(ts)

def main():
    torch.manual_seed(0)
    x = torch.randn(M, N, device='cuda').bfloat16()
    ref = x.float().sum(0)
    out = torch.empty(N, device='cuda')
    partials = torch.empty(64 << 20, device='cuda')
    counters = torch.zeros(1 << 16, dtype=torch.int32, device='cuda')
    y = torch.empty_like(x)
    copy = bench(lambda: y.copy_(x))
    copy_bw = 2 * x.numel() * 2 / copy / 1e6
    byt = M * N * 2 + N * 4
    print(f'copy {copy:.4f} ms {copy_bw:.0f} GB/s; 85% of copy for col_sum = {byt / (0.85 * copy_bw) / 1e6:.4f} ms', flush=True)
    t_eager = bench(lambda: torch.sum(x, 0, dtype=torch.float32))
    comp = torch.compile(lambda a: a.float().sum(0))
    comp(x); comp(x)
    t_comp = bench(lambda: comp(x))
    print(f'eager {t_eager:.4f} ms  torch.compile {t_comp:.4f} ms', flush=True)
    cps = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    configs = []
    for CW, RW, LR in [(1,1,2),(1,1,1),(1,4,1),(2,2,1),(1,8,1),(2,4,1),(4,2,1),(4,1,1),(1,2,1),(2,1,1)]:
        for R in (4, 8):
            for S in (16, 32, 64, 128):
                configs.append((CW, RW, LR, R, 1, 1, 0, S))
    # meet variants and stream off, a few
    for CW, RW, LR, R, S in [(1,1,2,8,64),(1,1,1,8,64),(2,1,1,8,32),(1,1,1,4,32),(2,1,1,4,64)]:
        configs.append((CW, RW, LR, R, 1, 1, 1, S))
        configs.append((CW, RW, LR, R, 1, 0, 1, S))
        configs.append((CW, RW, LR, R, 2, 1, 1, S))
    results = []
    with cps:
        for (CW, RW, LR, R, UNROLL, STREAM, MEET, S) in configs:
            try:
                fn = build(CW, RW, LR, R, UNROLL, STREAM, MEET)
            except Exception as ex:
                print('build failed', CW, RW, LR, R, ex); continue
            cols_per_block = CW * (32 // LR) * 8
            gx = N // cols_per_block
            rows_per_part = (M + S - 1) // S
            args = (x.data_ptr(), out.data_ptr(), cp.int32(M), cp.int32(N), cp.int32(rows_per_part),
                    partials.data_ptr(), counters.data_ptr(), cp.int32(S))
            grid, block = (gx, S), (CW * RW * 32,)
            def run():
                if not MEET:
                    out.zero_()
                fn(grid, block, args, stream=cps)
            run(); torch.cuda.synchronize()
            err = ((out - ref).norm() / ref.norm()).item()
            t = bench(run)
            # without the memset (accumulates; timing only)
            t2 = bench(lambda: fn(grid, block, args, stream=cps)) if not MEET else t
            pct = byt / t / 1e6 / copy_bw * 100
            line = f'CW={CW} RW={RW} LR={LR} R={R} U={UNROLL} ST={STREAM} MEET={MEET} S={S} blocks={gx*S}x{CW*RW*32}: {t:.4f} ms ({pct:.1f}%) no-memset {t2:.4f} ({byt/t2/1e6/copy_bw*100:.1f}%) err {err:.1e}'
            print(line, flush=True)
            results.append((t2, line))
    results.sort()
    print('best (no memset):')
    for t, l in results[:10]:
        print(' ', l)

if __name__ == '__main__':
    main()
