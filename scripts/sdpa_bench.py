#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention at the attention example's bench shape,
timed as tilefuse times its kernels (CUDA events, warm-up, L2 flushed before each
run, median of repeats), for the comparison in docs/PERFORMANCE.md.

    python3 scripts/sdpa_bench.py [B H S D [HK]] [--backward]      (default 8 16 4096 128)

HK: key/value heads, each shared by H / HK query heads (grouped-query attention,
`enable_gqa=True`); H by default. --backward: also the backward alone (dQ, dK, dV
from a saved forward; FlashAttention's count, 2.5 times the forward's FLOPs), as
`attention_backward --bench` times tilefuse's.
"""
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def time_ms(fn, warmup=3, reps=20):
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def backward_ms(q, k, v, causal, gqa):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
    dout = torch.randn_like(out)
    return time_ms(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))


def main():
    backward = "--backward" in sys.argv
    args = [x for x in sys.argv[1:] if x != "--backward"]
    b, h, s, d = (int(x) for x in args[0:4]) if len(args) >= 4 else (8, 16, 4096, 128)
    hk = int(args[4]) if len(args) >= 5 else h
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, q [{b}x{h}x{s}x{d}], "
          f"k/v [{b}x{hk}x{s}x{d}] bf16")
    q = torch.randn(b, h, s, d, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(b, hk, s, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    gqa = {"enable_gqa": True} if hk != h else {}
    for causal in (False, True):
        flops = 4 * b * h * s * s * d / (2 if causal else 1)
        tag = "causal" if causal else "non-causal"
        ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa))
        print(f"sdpa default {tag}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s")
        if backward:
            ms = backward_ms(q, k, v, causal, gqa)
            print(f"sdpa default backward {tag}: {ms:.3f} ms, {2.5 * flops / ms / 1e9:.0f} TFLOP/s")
        for name, backend in (
            ("flash", SDPBackend.FLASH_ATTENTION),
            ("cudnn", SDPBackend.CUDNN_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION),
        ):
            try:
                with sdpa_kernel(backend):
                    ms = time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa))
                print(f"sdpa {name} {tag}: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s")
            except RuntimeError as e:
                print(f"sdpa {name} {tag}: unavailable ({str(e).splitlines()[0]})")


if __name__ == "__main__":
    main()
