#!/usr/bin/env python3
"""The parts of `offsets32.patch`'s set-up change one at a time, on any
generated kernels, to run under the runtime's own launch with
`TILEFUSE_OVERRIDE_DIR` (the patch as a whole made cross_entropy_bwd 13% slower
and most pointwise kernels 2-9% faster; which part does which is not known).
From the sources `TILEFUSE_DUMP_DIR` wrote (or `corpus --source --extents`,
which prints what a launch at those extents compiles), writes OUT/<v>/ with the
same file names, for v in the subsets of:

  M  the outermost grid index without its modulo (where the decode's last
     block is a plain one: no split loop, no `starting_at`)
  P  each non-last stride's product in 32 bits: `(c) * tK_sJ` becomes
     `(long long)(int)((unsigned)(c) * (unsigned)tK_sJ)` (simple `(c)` only)
  S  the last stride not multiplied (`* tK_s{rank-1}` dropped; the kernels it
     is run on must have contiguous last axes, as the bench's tensors do)

  0  as generated

On the GPU machine:

  TILEFUSE_DUMP_DIR=/tmp/dump corpus --bench F
  python3 setup_variants.py /tmp/dump /tmp/ovr
  for v in 0 M P S MP MPS; do TILEFUSE_OVERRIDE_DIR=/tmp/ovr/$v corpus --bench F; done
"""
import glob, itertools, os, re, sys

DECODE = re.compile(
    r"  \{ const unsigned int tf_t = \(unsigned int\)\(\((\S+) \+ (B\d+) - 1\) / \2\);\n"
    r"    (tb\d+) = \(long long\)\(tf_pid % tf_t\) \* \2;\n"
    r"    tf_pid /= tf_t; \}\n")


def ranks(text):
    r = {}
    for t, j in re.findall(r"long long t(\d+)_s(\d+),", text):
        r[t] = max(r.get(t, 0), int(j) + 1)
    return r


def no_modulo(text):
    starts = [m.start() for m in re.finditer(r"  \{ const unsigned int tf_t = ", text)]
    blocks = list(DECODE.finditer(text))
    # The outermost dimension is decoded last; only a plain block is changed.
    if not starts or not blocks or blocks[-1].start() != starts[-1]:
        return text
    last = blocks[-1]
    return (text[:last.start()] + f"  {last.group(3)} = (long long)tf_pid * {last.group(2)};\n"
            + text[last.end():])


def products_32(text):
    for t, r in ranks(text).items():
        for j in range(r - 1):
            text = re.sub(r"\(([^()]*)\) \* t%s_s%d\b" % (t, j),
                          r"(long long)(int)((unsigned)(\1) * (unsigned)t%s_s%d)" % (t, j), text)
    return text


def unit_stride(text):
    for t, r in ranks(text).items():
        text = re.sub(r" \* t%s_s%d\b(?!,)" % (t, r - 1), "", text)
    return text


PARTS = {"M": no_modulo, "P": products_32, "S": unit_stride}


def main():
    src, out = sys.argv[1], sys.argv[2]
    files = glob.glob(os.path.join(src, "*.cu"))
    assert files, "no .cu in " + src
    names = ["0"] + ["".join(c) for n in (1, 2, 3) for c in itertools.combinations("MPS", n)]
    for f in files:
        text = open(f).read()
        # The kernel's body only: the prelude's helpers are left alone.
        at = text.index('extern "C"')
        for v in names:
            body = text[at:]
            for p in v if v != "0" else "":
                body = PARTS[p](body)
            os.makedirs(os.path.join(out, v), exist_ok=True)
            open(os.path.join(out, v, os.path.basename(f)), "w").write(text[:at] + body)
        print(os.path.basename(f))


if __name__ == "__main__":
    main()
