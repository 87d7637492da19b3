#!/usr/bin/env python3
"""Edited copies of the generated col_sum at `[256, 64]`, 8 warps (docs/perf-history.md,
"The column walk's tail; ..."), to run under the runtime's own launch with
`TILEFUSE_OVERRIDE_DIR`. From the sources `TILEFUSE_DUMP_DIR` wrote, writes OUT/<v>/ with
the same file names:

  v0  the generated source as it is
  v1  the generated signature with the hand-written body of colsum_variants.py (one warp
      across 256 columns, eight warps down the rows, 8 rows a thread, meeting as the
      lowering does)
  vA  the loop's loads unmasked; vB  the loop's adds without the partial tile's copy;
  vC  both; vD  vC with 32-bit row offsets from a base pointer (this shape only)
  vF  vD with v1's end (the warps' sums through shared memory, warp 0 alone meeting)
  vG  v1 with the generated 64-bit shares of the walk

On the GPU machine, with the bundle of scripts/gpu-bundle:

  CFG='{"block_sizes":[256,64],"num_warps":8,"num_stages":1,"group_m":8,"split":16}'
  TILEFUSE_DUMP_DIR=/tmp/dump bin/corpus --bench col_sum --config "$CFG"
  python3 colsum_override.py /tmp/dump /tmp/ovr
  TILEFUSE_OVERRIDE_DIR=/tmp/ovr/v1 bin/corpus --bench col_sum --config "$CFG"
"""
import glob, os, re, sys

HAND = r'''
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned int tiles = (unsigned int)((s0 + 255) / 256);
  const unsigned int prog = blockIdx.x % tiles, part = blockIdx.x / tiles;
  const int m = (int)s1, n = (int)s0;
  const int nt = (m + 63) / 64;
  const int beg = nt * (int)part / tf_ways * 64;
  const int end = min(m, nt * ((int)part + 1) / tf_ways * 64);
  const int col = prog * 256 + lane * 8;
  float acc[8];
  #pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  int r = beg + warp;
  for (; r + 56 < end; r += 64) {
    uint4 w[8];
    #pragma unroll
    for (int k = 0; k < 8; ++k) w[k] = *(const uint4*)(t0 + (size_t)(r + k * 8) * n + col);
    #pragma unroll
    for (int k = 0; k < 8; ++k) {
      unsigned int u[4] = {w[k].x, w[k].y, w[k].z, w[k].w};
      #pragma unroll
      for (int j = 0; j < 4; ++j) { acc[2*j] += __uint_as_float(u[j] << 16); acc[2*j+1] += __uint_as_float(u[j] & 0xffff0000u); }
    }
  }
  for (; r < end; r += 8) {
    uint4 w = *(const uint4*)(t0 + (size_t)r * n + col);
    unsigned int u[4] = {w.x, w.y, w.z, w.w};
    #pragma unroll
    for (int j = 0; j < 4; ++j) { acc[2*j] += __uint_as_float(u[j] << 16); acc[2*j+1] += __uint_as_float(u[j] & 0xffff0000u); }
  }
  float* sm = (float*)tf_smem;
  #pragma unroll
  for (int j = 0; j < 8; ++j) sm[warp * 256 + lane * 8 + j] = acc[j];
  __syncthreads();
  if (warp == 0) {
    for (int q = 1; q < 8; ++q) {
      #pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += sm[q * 256 + lane * 8 + j];
    }
  }
  float* share = tf_partials + ((size_t)prog * tf_ways + part) * 256;
  if (warp == 0) {
    #pragma unroll
    for (int j = 0; j < 8; ++j) share[lane * 8 + j] = acc[j];
  }
  __threadfence();
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = tf_arrive_last(&tf_counters[prog], (unsigned)tf_ways);
  __syncthreads();
  if (!last || warp != 0) return;
  __threadfence();
  const float* sh = tf_partials + (size_t)prog * tf_ways * 256;
  #pragma unroll
  for (int j = 0; j < 8; ++j) acc[j] = 0.f;
  #pragma unroll 8
  for (int q = 0; q < tf_ways; ++q) {
    #pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] += __ldcg(sh + (size_t)q * 256 + lane * 8 + j);
  }
  #pragma unroll
  for (int j = 0; j < 8; ++j) t1[col + j] = acc[j];
}
'''

EPI = r'''
    {
      float* sm = (float*)tf_smem;
      float acc[8];
      #pragma unroll
      for (int j = 0; j < 8; ++j) { acc[j] = tf_d2[j * 8]; sm[tf_warp * 256 + tf_lane * 8 + j] = acc[j]; }
      __syncthreads();
      if (tf_warp == 0) {
        for (int q = 1; q < 8; ++q) {
          #pragma unroll
          for (int j = 0; j < 8; ++j) acc[j] += sm[q * 256 + tf_lane * 8 + j];
        }
      }
      float* share = tf_partials + ((size_t)tf_prog * tf_ways + tf_part) * 256;
      if (tf_warp == 0) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) share[tf_lane * 8 + j] = acc[j];
      }
      __threadfence();
      __syncthreads();
      __shared__ bool last;
      if (tid == 0) last = tf_arrive_last(&tf_counters[tf_prog], (unsigned)tf_ways);
      __syncthreads();
      if (!last || tf_warp != 0) return;
      __threadfence();
      const float* sh = tf_partials + (size_t)tf_prog * tf_ways * 256;
      #pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] = 0.f;
      #pragma unroll 8
      for (int q = 0; q < tf_ways; ++q) {
        #pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += __ldcg(sh + (size_t)q * 256 + tf_lane * 8 + j);
      }
      #pragma unroll
      for (int j = 0; j < 8; ++j) t1[tb0 + tf_lane * 8 + j] = acc[j];
    }
  }
}
'''

def unmask_loads(s):
    # inside the tile loop only: the first load block after 'for (long long tb1 = tf_beg1'
    i = s.index('for (long long tb1 = tf_beg1')
    j = s.index('// acc = acc +', i)
    body = s[i:j]
    body = re.sub(r'if \(tf_ok && \(tb0 \+ tf_o0_0 \+ \(tf_q \* 8\)\) \+ 8 <= s0 && true\) \{', 'if (true) {', body)
    body = re.sub(r'\} else \{\n\s*#pragma unroll\n\s*for \(int tf_k = 0; tf_k < 4; \+\+tf_k\).*?\n\s*#pragma unroll\n\s*for \(int tf_e.*?\n', '} if (false) {\n', body)
    return s[:i] + body + s[j:]
def full_adds(s):
    i = s.index('// acc = acc +')
    a = s.index('if (tb1 + 64 <= s1) {', i)
    e = s.index('} else {', a)
    k = s.index('float tf_r4[8]', e)
    # the else part runs to the loop's closing: keep 'if (true) {' ... '} else if (false) {'
    return s[:a] + 'if (true) {' + s[a + len('if (tb1 + 64 <= s1) {'):e] + '} else if (false) {' + s[e + len('} else {'):]
def rowptr(s):
    return s.replace('const unsigned short* tf_p = t0 + ((tb1 + tf_o0_1 + r1 * 8) * t0_s0 + (tb0 + tf_o0_0 + (tf_q * 8)) * t0_s1);',
                     'const unsigned short* tf_p = tf_base + (int)((tb1 + r1 * 8) * 8192);')


def variants(src):
    i = src.index('extern "C" __global__')
    j = src.index(') {', i) + 3
    v = {'v0': src, 'v1': src[:j] + '\n  extern __shared__ __align__(16) unsigned char tf_smem[];' + HAND}
    v['vA'] = unmask_loads(src)
    v['vB'] = full_adds(src)
    v['vC'] = full_adds(unmask_loads(src))
    d = v['vC']
    k = d.index('for (long long tb1 = tf_beg1')
    d = d[:k] + 'const unsigned short* tf_base = t0 + (tf_o0_1 * t0_s0 + (tb0 + tf_o0_0) * t0_s1);\n    ' + d[k:]
    v['vD'] = rowptr(d)
    v['vF'] = v['vD'][:v['vD'].index('    float tf_r4[8];')] + EPI
    v['vG'] = v['v1'].replace('''  const int nt = (m + 63) / 64;
  const int beg = nt * (int)part / tf_ways * 64;
  const int end = min(m, nt * ((int)part + 1) / tf_ways * 64);''', '''  const long long tf_beg1 = (((s1) + 64 - 1) / 64) * part / tf_ways * 64;
  const long long tf_end1 = tf_min_i(s1, (((s1) + 64 - 1) / 64) * (part + 1) / tf_ways * 64);
  const int beg = (int)tf_beg1, end = (int)tf_end1;''')
    return v


def main():
    dump, out = sys.argv[1], sys.argv[2]
    for p in glob.glob(os.path.join(dump, 'col_sum-*.cu')):
        name = os.path.basename(p)
        for v, text in variants(open(p).read()).items():
            os.makedirs(os.path.join(out, v), exist_ok=True)
            open(os.path.join(out, v, name), 'w').write(text)
        print('variants of', name)


main()
