"""Activations, forward and backward (tests/kernels/src/activations.rs)."""
import torch
import torch.nn.functional as F

BF16 = dict(device="cuda", dtype=torch.bfloat16)
M, N = 16384, 8192
SHAPE = f"{M}x{N}"
SLOPE = 0.01


def swiglu():
    x = torch.randn(M, 2 * N, **BF16)
    return SHAPE, lambda: F.silu(x[:, :N].float()).mul(x[:, N:].float()).to(torch.bfloat16)


def swiglu_bwd():
    x, dout = torch.randn(M, 2 * N, **BF16), torch.randn(M, N, **BF16)

    def f():
        gate, up, g = x[:, :N].float(), x[:, N:].float(), dout.float()
        s = torch.sigmoid(gate)
        dgate = g * up * s * (1 + gate * (1 - s))
        dup = g * gate * s
        return torch.cat([dgate, dup], 1).to(torch.bfloat16)

    return SHAPE, f


def geglu():
    x = torch.randn(M, 2 * N, **BF16)
    return SHAPE, lambda: F.gelu(x[:, :N].float(), approximate="tanh").mul(x[:, N:].float()).to(
        torch.bfloat16
    )


def gelu():
    x = torch.randn(M, N, **BF16)
    return SHAPE, lambda: F.gelu(x)


def gelu_bwd():
    x, dout = torch.randn(M, N, **BF16), torch.randn(M, N, **BF16)
    # What autograd runs for F.gelu's backward.
    return SHAPE, lambda: torch.ops.aten.gelu_backward(dout, x)


def leaky_relu():
    x = torch.randn(M, N, **BF16)
    return SHAPE, lambda: F.leaky_relu(x, SLOPE)


def leaky_relu_bwd():
    x, dout = torch.randn(M, N, **BF16), torch.randn(M, N, **BF16)
    return SHAPE, lambda: torch.ops.aten.leaky_relu_backward(dout, x, SLOPE, False)


def relu_sq():
    x = torch.randn(M, N, **BF16)
    return SHAPE, lambda: torch.relu(x).square()


def relu_sq_bwd():
    x, dout = torch.randn(M, N, **BF16), torch.randn(M, N, **BF16)
    return SHAPE, lambda: 2 * torch.relu(x) * dout


CASES = {
    "swiglu": swiglu,
    "swiglu_bwd": swiglu_bwd,
    "geglu": geglu,
    "gelu": gelu,
    "gelu_bwd": gelu_bwd,
    "leaky_relu": leaky_relu,
    "leaky_relu_bwd": leaky_relu_bwd,
    "relu_sq": relu_sq,
    "relu_sq_bwd": relu_sq_bwd,
}
