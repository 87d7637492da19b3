#!/usr/bin/env python3
"""Edited copies of the generated Hopper attention forward whose output store (a
tile's end: normalize, convert, store) is written differently, to run under the
runtime's own launch with `TILEFUSE_OVERRIDE_DIR`. From the sources `TILEFUSE_DUMP_DIR`
wrote, writes OUT/<v>/ with the same file names:

  e0  the generated source as it is
  eA  the store by rows: each of a thread's two rows' address and mask computed once,
      a column's offset a 32-bit add where the head dimension is contiguous and the
      rows' starts 4-byte aligned (tested once a tile), the pair converted by one
      cvt.rn.bf16x2 and stored in 4 bytes
  eB  no store: the tile's outputs summed into one value, stored only where it is
      an unlikely number (a bound on the end's cost; the output is wrong)

On the GPU machine:

  TILEFUSE_DUMP_DIR=/tmp/dump attention 32 16 1024 128 --bench
  python3 attn_end_override.py /tmp/dump /tmp/ovr
  TILEFUSE_OVERRIDE_DIR=/tmp/ovr/eA attention 32 16 1024 128 --bench
"""
import glob, os, re, sys

# The generated end: `for mi, for j, for h { … tf_sv … }` up to the ring's count.
END = re.compile(
    r"(    #pragma unroll\n    for \(int tf_mi = 0; tf_mi < (\d+); \+\+tf_mi\)\n"
    r"    #pragma unroll\n    for \(int tf_j = 0; tf_j < (\d+); \+\+tf_j\)\n"
    r"    #pragma unroll\n    for \(int tf_h = 0; tf_h < 2; \+\+tf_h\)\n    \{\n"
    r"      unsigned short tf_sv\[2\];.*?\n    \}\n)(    tf_r0 \+= tf_nt;)", re.S)
VAL = re.compile(r"if \(tf_sm\[tf_e\]\) tf_sv\[tf_e\] = tf_f32_to_bf16\((.*?)\);  // its loads")
T = re.compile(r"\*\(unsigned int\*\)\(t(\d+) \+ tf_so\[0\]\)")

def by_rows(m, block):
    mi, j = m.group(2), m.group(3)
    val = VAL.search(block).group(1)
    t = 't' + T.search(block).group(1)
    v = lambda e: val.replace('tf_h * 2 + tf_e', f'tf_h * 2 + {e}')
    return f'''    {{
      // The output's columns contiguous and its rows' starts 4-byte aligned: once a tile.
      const bool tf_c = {t}_s3 == 1 && (({t}_s2 | (tb0) * {t}_s0 + (tb1) * {t}_s1) & 1) == 0 && (((unsigned long long){t}) & 3ull) == 0;
      #pragma unroll
      for (int tf_mi = 0; tf_mi < {mi}; ++tf_mi)
      #pragma unroll
      for (int tf_h = 0; tf_h < 2; ++tf_h) {{
        const long long tf_row = tb2 + tf_wr + tf_mi * 16 + tf_h * 8 + tf_g;
        const bool tf_rok = (tb0) < {t}_n0 && (tb1) < {t}_n1 && tf_row < {t}_n2;
        unsigned short* tf_base = {t} + (tb0) * {t}_s0 + (tb1) * {t}_s1 + tf_row * {t}_s2;
        #pragma unroll
        for (int tf_j = 0; tf_j < {j}; ++tf_j) {{
          const int tf_col = tf_j * 8 + 2 * tf_t;
          const float tf_a = {v(0)}, tf_b = {v(1)};
          if (tf_rok && tf_c && tf_col + 1 < {t}_n3) *(unsigned int*)(tf_base + tf_col) = tf_pack_bf16x2(tf_a, tf_b);
          else {{
            if (tf_rok && tf_col < {t}_n3) tf_base[tf_col * {t}_s3] = tf_f32_to_bf16(tf_a);
            if (tf_rok && tf_col + 1 < {t}_n3) tf_base[(tf_col + 1) * {t}_s3] = tf_f32_to_bf16(tf_b);
          }}
        }}
      }}
    }}
'''

def bound(m):
    mi, j = m.group(2), m.group(3)
    t = 't' + T.search(m.group(1)).group(1)
    return f'''    {{
      float tf_x = 0.0f;
      #pragma unroll
      for (int tf_mi = 0; tf_mi < {mi}; ++tf_mi)
      #pragma unroll
      for (int tf_j = 0; tf_j < {j}; ++tf_j)
      #pragma unroll
      for (int tf_e = 0; tf_e < 4; ++tf_e) tf_x += v2[tf_mi][tf_j][tf_e];
      if (tf_x == 1.2345e-7f) {t}[0] = 0;
    }}
'''

def variants(text):
    m = END.search(text)
    if not m:
        return {}
    block = m.group(1)
    return {
        'e0': text,
        'eA': text[:m.start(1)] + by_rows(m, block) + text[m.end(1):],
        'eB': text[:m.start(1)] + bound(m) + text[m.end(1):],
    }

def main():
    src, dst = sys.argv[1], sys.argv[2]
    for path in glob.glob(os.path.join(src, '*.cu')):
        name = os.path.basename(path)
        for v, text in variants(open(path).read()).items():
            os.makedirs(os.path.join(dst, v), exist_ok=True)
            open(os.path.join(dst, v, name), 'w').write(text)
            print(v, name)

if __name__ == '__main__':
    main()
