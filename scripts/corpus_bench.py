#!/usr/bin/env python3
"""PyTorch's side of the corpus benchmark: each corpus case's operation in
eager PyTorch and under torch.compile (Triton), at the shape the Rust side
(`tests/kernels/src/bin/corpus.rs --bench`) uses, timed the same way: CUDA
events around one call, L2 flushed before each, 5 warm-ups, median of 50.

    python3 scripts/corpus_bench.py [FILTER[,FILTER...]]

Prints one line per case:
    torch NAME SHAPE: eager MS ms, compile MS ms
The cases live in scripts/corpus/*.py: each module has CASES, a dict from the
case's name to a function returning (shape string, eager callable) where the
callable runs the operation on inputs it already holds.
"""
import importlib, os, pkgutil, sys, time
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import corpus  # noqa: E402

FLUSH = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


def timeit(f, warmup=5, reps=50):
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        FLUSH.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        f()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2]


def main():
    flt = sys.argv[1] if len(sys.argv) > 1 else None
    torch.manual_seed(0)
    for mod in pkgutil.iter_modules(corpus.__path__):
        m = importlib.import_module(f"corpus.{mod.name}")
        for name, make in m.CASES.items():
            # Comma-separated parts, a case matching any (as `corpus --bench`).
            if flt and not any(p and p in name for p in flt.split(",")):
                continue
            try:
                shape, fn = make()
                eager = timeit(fn)
                t0 = time.time()
                compiled = torch.compile(fn)
                compiled()  # compile once before timing
                ctime = time.time() - t0
                comp = timeit(compiled)
                print(f"torch {name} {shape}: eager {eager:.4f} ms, compile {comp:.4f} ms "
                      f"(compiled in {ctime:.0f} s)", flush=True)
            except Exception as e:  # one case failing must not hide the others
                print(f"torch {name}: error: {type(e).__name__}: {str(e)[:300]}", flush=True)
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
