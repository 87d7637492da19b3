#!/usr/bin/env python3
"""Vector stores by inline PTX: in generated sources, `*(uint4*)(P) = V;` and
`*(uint2*)(P) = V;` become `st.global.v4.b32` / `.v2.b32` in `asm volatile`
(NVVM split a `uint4` store of cross_entropy_bwd into four 32-bit stores once
its last stride was no longer multiplied: docs/perf-history.md, "Vector
stores NVVM splits"). For A/B under the runtime's launch with
`TILEFUSE_OVERRIDE_DIR`:

  python3 store_asm.py IN_DIR OUT_DIR     # every .cu of IN_DIR, same names
"""
import glob, os, sys

HELPERS = r'''
__device__ __forceinline__ void tf_st_v4(void* p, uint4 v) { asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory"); }
__device__ __forceinline__ void tf_st_v2(void* p, uint2 v) { asm volatile("st.global.v2.b32 [%0], {%1, %2};" :: "l"(p), "r"(v.x), "r"(v.y) : "memory"); }
'''


def closing(s, i):
    """Index just past the parenthesis that closes the one at s[i]."""
    depth = 0
    for j in range(i, len(s)):
        depth += {'(': 1, ')': -1}.get(s[j], 0)
        if depth == 0:
            return j + 1
    raise ValueError('unbalanced')


def convert(s):
    out, i, n = [], 0, 0
    while True:
        hits = [(s.find(f'*({t}*)(', i), t) for t in ('uint4', 'uint2')]
        hits = [(k, t) for k, t in hits if k >= 0]
        if not hits:
            out.append(s[i:])
            break
        k, t = min(hits)
        p0 = k + len(f'*({t}*)')
        p1 = closing(s, p0)
        rest = s[p1:]
        if not rest.startswith(' = '):
            out.append(s[i:p1])  # a load
            i = p1
            continue
        e = s.index(';\n', p1)
        out.append(s[i:k])
        out.append(f'tf_st_v{t[-1]}((void*){s[p0:p1]}, {s[p1 + 3:e]})')
        i = e
        n += 1
    text = ''.join(out)
    at = text.index('extern "C"')
    return text[:at] + HELPERS + text[at:], n


def main():
    src, dst = sys.argv[1], sys.argv[2]
    os.makedirs(dst, exist_ok=True)
    for f in glob.glob(os.path.join(src, '*.cu')):
        text, n = convert(open(f).read())
        open(os.path.join(dst, os.path.basename(f)), 'w').write(text)
        print(os.path.basename(f), n, 'stores')


if __name__ == '__main__':
    main()
