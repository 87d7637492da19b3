"""PyTorch's side of the normalization cases (tests/kernels/src/norms.rs):
forwards as a user calls them, backwards as the ATen ops autograd runs
(from the forward's saved mean and rstd), at the Rust benchmark's shapes."""
import torch
import torch.nn.functional as F

M, N = 16384, 8192
EPS = 1e-5


def _bf16(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def layer_norm():
    x, w, b = _bf16(M, N), _bf16(N), _bf16(N)
    return f"{M}x{N}", lambda: F.layer_norm(x, (N,), w, b, EPS)


def _ln_saved():
    x, dy, w, b = _bf16(M, N), _bf16(M, N), _bf16(N), _bf16(N)
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, [N], w, b, EPS)
    return x, dy, w, b, mean, rstd


def layer_norm_bwd():
    x, dy, w, b, mean, rstd = _ln_saved()
    mask = [True, False, False]
    return f"{M}x{N}", lambda: torch.ops.aten.native_layer_norm_backward(
        dy, x, [N], mean, rstd, w, b, mask)[0]


def layer_norm_dwdb():
    x, dy, w, b, mean, rstd = _ln_saved()
    mask = [False, True, True]
    return f"{M}x{N}", lambda: torch.ops.aten.native_layer_norm_backward(
        dy, x, [N], mean, rstd, w, b, mask)[1:]


def rms_norm():
    x, w = _bf16(M, N), _bf16(N)
    return f"{M}x{N}", lambda: F.rms_norm(x, (N,), w, EPS)


def _rms_saved():
    x, dy, w = _bf16(M, N), _bf16(M, N), _bf16(N)
    if hasattr(torch.ops.aten, "_fused_rms_norm"):
        _, rstd = torch.ops.aten._fused_rms_norm(x, [N], w, EPS)
    else:
        rstd = torch.rsqrt(x.float().square().mean(-1, keepdim=True) + EPS)
    return x, dy, w, rstd


def _rms_bwd(dy, x, w, rstd, mask):
    """What autograd runs for F.rms_norm's backward (the fused ATen op where
    this PyTorch has it, else the same math as its decomposition)."""
    if hasattr(torch.ops.aten, "_fused_rms_norm_backward"):
        return torch.ops.aten._fused_rms_norm_backward(dy, x, [N], rstd, w, mask)
    xf, g = x.float(), dy.float()
    xhat = xf * rstd
    dx = None
    if mask[0]:
        wdy = g * w.float()
        dx = ((wdy - xhat * (xhat * wdy).mean(-1, keepdim=True)) * rstd).to(x.dtype)
    dw = (g * xhat).sum(0).to(w.dtype) if mask[1] else None
    return dx, dw


def rms_norm_bwd():
    x, dy, w, rstd = _rms_saved()
    return f"{M}x{N}", lambda: _rms_bwd(dy, x, w, rstd, [True, False])[0]


def rms_norm_dw():
    x, dy, w, rstd = _rms_saved()
    return f"{M}x{N}", lambda: _rms_bwd(dy, x, w, rstd, [False, True])[1]


CASES = {
    "layer_norm": layer_norm,
    "layer_norm_bwd": layer_norm_bwd,
    "layer_norm_dwdb": layer_norm_dwdb,
    "rms_norm": rms_norm,
    "rms_norm_bwd": rms_norm_bwd,
    "rms_norm_dw": rms_norm_dw,
}
