"""Gathers, scatters, rotary embedding and dropout (tests/kernels/src/movement.rs)."""
import torch
import torch.nn.functional as F

BF16 = dict(device="cuda", dtype=torch.bfloat16)
V, D, T = 32000, 4096, 16384


def embedding():
    w = torch.randn(V, D, **BF16)
    ids = torch.randint(0, V, (T,), device="cuda")
    return f"{T}x{D}/V{V}", lambda: F.embedding(ids, w)


def embedding_bwd():
    dout = torch.randn(T, D, **BF16)
    ids = torch.randint(0, V, (T,), device="cuda")
    # What autograd runs for F.embedding's backward.
    return f"{T}x{D}/V{V}", lambda: torch.ops.aten.embedding_dense_backward(dout, ids, V, -1, False)


def moe_dispatch():
    t, d, e, cap = 16384, 4096, 64, 320
    x = torch.randn(t, d, **BF16)
    expert = torch.randint(0, e, (t,), device="cuda")
    # Capacity-based dispatch as Switch/GShard implementations write it: each
    # token's slot from a cumulative sum of the one-hot routing, the kept rows
    # copied to their place, a dropped token sent to one spare row (no host
    # sync, no masking by a data-dependent shape).
    out = torch.empty(e * cap + 1, d, **BF16)

    def run():
        onehot = F.one_hot(expert, e)
        slot = ((onehot.cumsum(0) - 1) * onehot).sum(1)
        row = torch.where(slot < cap, expert * cap + slot, e * cap)
        return out.index_copy_(0, row, x)

    return f"{t}x{d}/E{e}", run


def index_select():
    x = torch.randn(16384, 8192, **BF16)
    idx = torch.randint(0, 8192, (4096,), device="cuda", dtype=torch.int32)
    return "16384x8192->4096", lambda: x.index_select(1, idx)


def rope():
    b, s, h, d = 4, 4096, 32, 128
    x = torch.randn(b, s, h, d, **BF16)
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d)
    ang = torch.outer(torch.arange(s, device="cuda", dtype=torch.float32), inv_freq)
    # Hugging Face's form: full-width tables in x's dtype, and x rotated by halves.
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :].to(torch.bfloat16)
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :].to(torch.bfloat16)

    def rotate_half(t):
        return torch.cat([-t[..., d // 2:], t[..., : d // 2]], -1)

    return f"{b}x{s}x{h}x{d}", lambda: (x * cos + rotate_half(x) * sin).to(torch.bfloat16)


def dropout():
    x = torch.randn(16384, 8192, **BF16)
    return "16384x8192", lambda: F.dropout(x, 0.1, training=True)


def dropout_bwd():
    dout = torch.randn(16384, 8192, **BF16)
    mask = torch.rand(16384, 8192, device="cuda") > 0.1
    # What autograd runs for dropout's backward (the mask was stored).
    return "16384x8192", lambda: torch.ops.aten.native_dropout_backward(dout, mask, 1 / 0.9)


CASES = {
    "embedding": embedding,
    "embedding_bwd": embedding_bwd,
    "moe_dispatch": moe_dispatch,
    "index_select": index_select,
    "rope": rope,
    "dropout": dropout,
    "dropout_bwd": dropout_bwd,
}
