#!/usr/bin/env python3
"""Edited copies of the generated quantize_i8 and clamp_pow that take rounding,
float-to-integer casts and powers of two off the SM's XU pipe (the special-function
and conversion unit: 16 results a clock per SM on Hopper, against 128 for an FADD),
to run under the runtime's own launch with `TILEFUSE_OVERRIDE_DIR`. From the sources
`TILEFUSE_DUMP_DIR` wrote, writes OUT/<v>/ with the same file names:

  q0, c0  the generated sources as they are
  qA      (in the lowering since: `tf_f2i_exact`, integral.rs) quantize_i8's i8 cast of its clamped, rounded value by a magic-number add
          (exact for an integral |v| < 2^22) in place of cvt.rzi (F2I)
  qB      qA with round() by two round-toward-zero adds (FRND gone)
  cA      clamp_pow's ceil and floor by directed-rounding adds (FRND gone)
  cB      cA with exp2 of those integral values built from their bits (MUFU.EX2 gone)
  cC      exp2 from the bits as cB, ceil and floor as generated
  cD      pow's narrow form without its powf fallback (a bound: wrong for a <= 0)
  cF      pow's narrow form by lg2/ex2 .ftz (no denormal fix-ups), the fallback also
          taking denormal a and results below 2^-126

On the GPU machine:

  TILEFUSE_DUMP_DIR=/tmp/dump corpus quantize_i8,clamp_pow            # check shapes
  TILEFUSE_DUMP_DIR=/tmp/dump corpus --bench quantize_i8,clamp_pow    # bench shapes
  python3 xu_override.py /tmp/dump /tmp/ovr
  TILEFUSE_OVERRIDE_DIR=/tmp/ovr/qB corpus --bench quantize_i8
"""
import glob, os, re, sys

HELPERS = r'''
// floor/ceil for |x| < 2^22 by an add at 1.5*2^23 rounding down/up; beyond, x is
// integral already (or inf, NaN). copysignf keeps the sign of a zero result.
__device__ __forceinline__ float tf_floor_fast(float x) { const float f = __fadd_rd(x, 12582912.0f) - 12582912.0f; return fabsf(x) < 4194304.0f ? copysignf(f, x) : x; }
__device__ __forceinline__ float tf_ceil_fast(float x) { const float f = __fadd_ru(x, 12582912.0f) - 12582912.0f; return fabsf(x) < 4194304.0f ? copysignf(f, x) : x; }
// round half away from zero: floor(|x| + 0.5) by two adds toward zero.
__device__ __forceinline__ float tf_round_fast(float x) { const float a = fabsf(x); const float f = __fadd_rz(__fadd_rz(a, 0.5f), 8388608.0f) - 8388608.0f; return a < 8388608.0f ? copysignf(f, x) : x; }
// 2^k for integral k: the exponent field (0 below -126, as ex2.approx.ftz; inf above 127).
__device__ __forceinline__ float tf_exp2_int(float k) { const float c = fminf(fmaxf(k, -127.0f), 128.0f); const float r = __int_as_float(__float_as_int(c + 12583039.0f) << 23); return k == k ? r : k; }
'''

POW = re.compile(r"__device__ __forceinline__ float tf_pow_narrow\(float a, float b\) \{.*?\n\}\n", re.S)
POW_D = r'''__device__ __forceinline__ float tf_pow_narrow(float a, float b) {
  float l, r;
  asm("lg2.approx.f32 %0, %1;" : "=f"(l) : "f"(a));
  asm("ex2.approx.f32 %0, %1;" : "=f"(r) : "f"(b * l));
  return r;
}
'''
POW_F = r'''__device__ __forceinline__ float tf_pow_narrow(float a, float b) {
  float l, r;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(l) : "f"(a));
  const float t = b * l;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(t));
  return (a >= 1.17549435082228751e-38f && a < __int_as_float(0x7f800000) && fabsf(b) < __int_as_float(0x7f800000) && t >= -126.0f) ? r : powf(a, b);
}
'''

Q = re.compile(r"tf_f2i\(fminf\(fmaxf\(roundf\((.*?)\), \(-127\.0f\)\), 127\.0f\), -128, 127\)")

def variants(name, text):
    head, sep, body = text.partition('extern "C"')
    assert sep, name
    head = head + HELPERS
    out = {}
    if name.startswith('quantize_i8') and Q.search(body):
        out['q0'] = text
        out['qA'] = head + sep + Q.sub(r"tf_f2i_exact(fminf(fmaxf(roundf(\1), (-127.0f)), 127.0f))", body)
        out['qB'] = head + sep + Q.sub(r"tf_f2i_exact(fminf(fmaxf(tf_round_fast(\1), (-127.0f)), 127.0f))", body)
    elif name.startswith('clamp_pow') and 'tf_exp2(ceilf(' in body:
        out['c0'] = text
        a = body.replace('tf_exp2(ceilf(', 'tf_exp2(tf_ceil_fast(').replace('tf_exp2(floorf(', 'tf_exp2(tf_floor_fast(')
        out['cA'] = head + sep + a
        out['cB'] = head + sep + a.replace('tf_exp2(tf_', 'tf_exp2_int(tf_')
        assert POW.search(head), name
        out['cD'] = POW.sub(lambda m: POW_D, head, count=1) + sep + body
        out['cF'] = POW.sub(lambda m: POW_F, head, count=1) + sep + body
        out['cC'] = head + sep + body.replace('tf_exp2(ceilf(', 'tf_exp2_int(ceilf(').replace('tf_exp2(floorf(', 'tf_exp2_int(floorf(')
    return out

def main():
    src, dst = sys.argv[1], sys.argv[2]
    for path in glob.glob(os.path.join(src, '*.cu')):
        name = os.path.basename(path)
        for v, text in variants(name, open(path).read()).items():
            os.makedirs(os.path.join(dst, v), exist_ok=True)
            open(os.path.join(dst, v, name), 'w').write(text)
            print(v, name)

if __name__ == '__main__':
    main()
