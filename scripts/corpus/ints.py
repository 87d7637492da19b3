"""Integer kernels (tests/kernels/src/ints.rs)."""
import torch

BF16 = dict(device="cuda", dtype=torch.bfloat16)


def histogram():
    n, nbins = 1 << 27, 256
    x = torch.rand(n, device="cuda")
    return f"{n}/{nbins}", lambda: torch.bincount(
        (x * nbins).floor().long().clamp(0, nbins - 1), minlength=nbins
    )


def hash_u32():
    n, seed = 1 << 27, 0x9E3779B9
    x = torch.randint(-(1 << 31), 1 << 31, (n,), device="cuda", dtype=torch.int32)

    def f():
        # u32 arithmetic in int64, masked to 32 bits.
        h = (x.long() & 0xFFFFFFFF) ^ seed
        h = h ^ (h >> 16)
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        h = h ^ (h >> 13)
        h = (h * 0xC2B2AE35) & 0xFFFFFFFF
        h = h ^ (h >> 16)
        return h.to(torch.int32)

    return f"{n}", f


def quantize_i8():
    x = torch.randn(16384, 8192, **BF16)

    def f():
        scale = x.abs().amax(1, keepdim=True).float().clamp_min(1e-12) / 127
        q = (x.float() / scale).round().clamp(-127, 127).to(torch.int8)
        return q, scale

    return "16384x8192", f


def dequantize_i8():
    q = torch.randint(-127, 128, (16384, 8192), device="cuda", dtype=torch.int8)
    scale = torch.rand(16384, 1, device="cuda") * 0.1
    return "16384x8192", lambda: (q.float() * scale).to(torch.bfloat16)


def float_to_int():
    n = 1 << 25
    x = torch.randn(n, device="cuda") * 1e4
    types = [torch.int8, torch.uint8, torch.int16, torch.int32, torch.uint32, torch.int64]
    return f"{n}", lambda: [x.to(t) for t in types]


def int_divmod():
    n = 1 << 27
    a = torch.randint(-(1 << 30), 1 << 30, (n,), device="cuda", dtype=torch.int32)
    b = torch.randint(1, 1000, (n,), device="cuda", dtype=torch.int32)
    return f"{n}", lambda: (torch.div(a, b, rounding_mode="trunc"), torch.fmod(a, b))


def floor_divmod():
    n = 1 << 26
    a = torch.randint(-(1 << 40), 1 << 40, (n,), device="cuda", dtype=torch.int64)
    b = torch.randint(1, 1 << 20, (n,), device="cuda", dtype=torch.int64)
    return f"{n}", lambda: (a // b, a % b)


CASES = {
    "histogram": histogram,
    "hash_u32": hash_u32,
    "quantize_i8": quantize_i8,
    "dequantize_i8": dequantize_i8,
    "float_to_int": float_to_int,
    "int_divmod": int_divmod,
    "floor_divmod": floor_divmod,
}
