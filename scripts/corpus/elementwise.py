"""Elementwise kernels and data movement by offsets (tests/kernels/src/elementwise.rs)."""
import torch

BF16 = dict(device="cuda", dtype=torch.bfloat16)


def add():
    x, y = torch.randn(16384, 8192, **BF16), torch.randn(16384, 8192, **BF16)
    return "16384x8192", lambda: x + y


def concat():
    x, y = torch.randn(16384, 4096, **BF16), torch.randn(16384, 4096, **BF16)
    return "16384x4096+4096", lambda: torch.cat([x, y], 1)


def split():
    x = torch.randn(16384, 8192, **BF16)
    # torch.split gives views; the Rust kernel writes two tensors.
    return "16384x4096+4096", lambda: [t.contiguous() for t in torch.split(x, [4096, 4096], 1)]


def axpby():
    x, y = torch.randn(16384, 8192, **BF16), torch.randn(16384, 8192, **BF16)
    alpha, beta = 1.5, -0.5
    return "16384x8192", lambda: alpha * x + beta * y


def clamp_pow():
    x = torch.randn(16384, 8192, **BF16) * 2

    def f():
        v = x.float().clamp(-2.5, 3.0)
        out = (v.sign() * v.abs().pow(1.7)).to(torch.bfloat16)
        e = x.float().abs().log2()
        pow2 = torch.exp2(e.ceil()) + torch.exp2(e.floor())
        return out, pow2

    return "16384x8192", f


def transpose():
    x = torch.randn(16384, 8192, **BF16)
    return "16384x8192", lambda: x.t().contiguous()


def where_mask():
    mask = torch.randint(0, 2, (16384, 8192), device="cuda", dtype=torch.uint8).bool()
    a, b = torch.randn(16384, 8192, **BF16), torch.randn(16384, 8192, **BF16)
    return "16384x8192", lambda: torch.where(mask, a, b)


CASES = {
    "add": add,
    "concat": concat,
    "split": split,
    "axpby": axpby,
    "clamp_pow": clamp_pow,
    "transpose": transpose,
    "where_mask": where_mask,
}
