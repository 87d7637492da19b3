#!/usr/bin/env python3
"""Edited copies of a generated pointwise kernel (clamp_pow at [4, 512], 8 warps:
eight elements a thread) that measure what its per-thread set-up costs, to run
under the runtime's own launch with `TILEFUSE_OVERRIDE_DIR`. From the sources
`TILEFUSE_DUMP_DIR` wrote, writes OUT/<v>/ with the same file names:

  c0   as generated
  cM   the outermost grid dimension's tile without a modulo (the program id
       is below the grid's count: the quotient is the index)
  cS   cM with the last stride a literal 1 (the spec's `last_contiguous`)
  cI   cS with the element offsets in 32 bits (every offset below 2^31)
  cIO  cI with the arithmetic gone: out = x, pow2 = x (the memory and set-up
       bound of the same loads and stores)
  cN   cI without pow (out = the clamped value)
  cE   cI without the powers of two (pow2 = x)
  cL   cI with log2f by lg2.approx (the accurate logarithm's share)

On the GPU machine:

  TILEFUSE_DUMP_DIR=/tmp/dump corpus --bench clamp_pow --config '{"block_sizes":[4,512],...}'
  python3 setup_override.py /tmp/dump /tmp/ovr
  TILEFUSE_OVERRIDE_DIR=/tmp/ovr/cI corpus --bench clamp_pow --config ...
"""
import glob, os, re, sys


def rep(text, old, new, count=None):
    n = text.count(old)
    assert n >= 1 and (count is None or n == count), (old, n)
    return text.replace(old, new)


def variants(text):
    v = {"c0": text}
    # The outermost grid dimension (tm, the last decomposed): no modulo.
    m = rep(text, "tb0 = (long long)(tf_pid % tf_t) * B0;", "tb0 = (long long)tf_pid * B0;", 1)
    v["cM"] = m
    s = m
    for t in ("t0", "t1", "t2"):
        s = rep(s, f" * {t}_s1)", ")")
    v["cS"] = s
    # 32-bit offsets: the row and column indices and the row stride as int.
    i = s
    for t in ("t0", "t1", "t2"):
        i = rep(i, f"{t} + ((tb0 + tf_o0_0) * {t}_s0 + (tb1 + tf_o0_1 + (tf_q * 8)))",
                f"{t} + ((int)(tb0 + tf_o0_0) * (int){t}_s0 + (int)(tb1 + tf_o0_1 + (tf_q * 8)))")
    v["cI"] = i
    io = re.sub(r"tf_pow_narrow\(fabsf\(v0_1\[r1\]\), (\(float\)\(s4\)|s4)\)", "v0_1[r1]", i)
    assert io != i
    io = rep(io, "log2f(fabsf(", "((")
    io = rep(io, "(tf_exp2(ceilf(v2_3[(tf_q * 8 + tf_j)])) + tf_exp2(floorf(v2_3[(tf_q * 8 + tf_j)])))",
             "v2_3[(tf_q * 8 + tf_j)]")
    v["cIO"] = io
    # One part of the arithmetic gone at a time: pow (out = the clamp), then
    # the logarithm's powers of two (pow2 = |x|).
    n = re.sub(r"tf_pow_narrow\(fabsf\(v0_1\[r1\]\), (\(float\)\(s4\)|s4)\)", "v0_1[r1]", i)
    v["cN"] = n
    e = rep(i, "log2f(fabsf(", "((")
    v["cE"] = rep(e, "(tf_exp2(ceilf(v2_3[(tf_q * 8 + tf_j)])) + tf_exp2(floorf(v2_3[(tf_q * 8 + tf_j)])))",
                  "v2_3[(tf_q * 8 + tf_j)]")
    v["cL"] = rep(i, "log2f(fabsf(", "tf_lg2_approx((")
    v["cL"] = v["cL"].replace('extern "C"', '__device__ __forceinline__ float tf_lg2_approx(float x) { float r; asm("lg2.approx.f32 %0, %1;" : "=f"(r) : "f"(x)); return r; }\nextern "C"', 1)
    return v


def main():
    src, out = sys.argv[1], sys.argv[2]
    files = [f for f in glob.glob(os.path.join(src, "clamp_pow-*.cu"))]
    assert files, "no clamp_pow source in " + src
    for f in files:
        text = open(f).read()
        if "#define B1 512" not in text:
            continue
        for name, body in variants(text).items():
            os.makedirs(os.path.join(out, name), exist_ok=True)
            open(os.path.join(out, name, os.path.basename(f)), "w").write(body)
            print(name, os.path.basename(f))


if __name__ == "__main__":
    main()
