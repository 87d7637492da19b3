"""PyTorch's side of the reduction cases (tests/kernels/src/reductions.rs):
the same operations in eager PyTorch, at the Rust benchmark's shapes."""
import torch

M, N = 16384, 8192


def _bf16(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def col_sum():
    x = _bf16(M, N)
    return f"{M}x{N}", lambda: x.sum(0, dtype=torch.float32)


def col_max_count():
    x = _bf16(M, N)

    def run():
        return x.amax(0).float(), (x > 0).sum(0, dtype=torch.int32)

    return f"{M}x{N}", run


def total_sum():
    x = _bf16(M, N)
    return f"{M}x{N}", lambda: x.sum(dtype=torch.float32)


def row_sum():
    x = _bf16(M, N)
    return f"{M}x{N}", lambda: x.sum(1, dtype=torch.float32)


def row_mean():
    x = _bf16(M, N)
    return f"{M}x{N}", lambda: x.mean(1)


def long_row_sum():
    m, n = 4, 4 << 20
    x = _bf16(m, n)
    return f"{m}x{n}", lambda: x.sum(1, dtype=torch.float32)


def long_row_argmax():
    m, n = 4, 4 << 20
    x = _bf16(m, n)
    return f"{m}x{n}", lambda: torch.argmax(x, dim=1)


def welford():
    # The Rust kernel returns f32 mean and (population) variance.
    x = _bf16(M, N)
    return f"{M}x{N}", lambda: torch.var_mean(x.float(), dim=1, correction=0)


def softmax():
    x = _bf16(M, N)
    return f"{M}x{N}", lambda: torch.softmax(x, dim=-1)


def softmax_bwd():
    # What autograd runs for softmax's backward, from the forward's output.
    y = torch.softmax(_bf16(M, N), dim=-1)
    dy = _bf16(M, N)
    return f"{M}x{N}", lambda: torch.ops.aten._softmax_backward_data(dy, y, -1, torch.bfloat16)


def batched_softmax():
    b, m, n = 16, 1024, 8192
    x = _bf16(b, m, n)
    return f"{b}x{m}x{n}", lambda: torch.softmax(x, dim=-1)


def logsumexp():
    x = _bf16(M, N)
    return f"{M}x{N}", lambda: torch.logsumexp(x.float(), dim=1)


def row_max_min():
    x = torch.randint(-(1 << 30), 1 << 30, (M, N), device="cuda", dtype=torch.int32)
    return f"{M}x{N}", lambda: torch.aminmax(x, dim=1)


def argmax():
    x = _bf16(M, N)
    return f"{M}x{N}", lambda: torch.argmax(x, dim=1)


def col_argmin():
    x = _bf16(M, N)
    return f"{M}x{N}", lambda: torch.argmin(x, dim=0)


CASES = {
    "col_sum": col_sum,
    "col_max_count": col_max_count,
    "total_sum": total_sum,
    "row_sum": row_sum,
    "row_mean": row_mean,
    "long_row_sum": long_row_sum,
    "long_row_sum_split": long_row_sum,
    "long_row_argmax": long_row_argmax,
    "welford": welford,
    "softmax": softmax,
    "softmax_bwd": softmax_bwd,
    "batched_softmax": batched_softmax,
    "logsumexp": logsumexp,
    "row_max_min": row_max_min,
    "argmax": argmax,
    "col_argmin": col_argmin,
}
