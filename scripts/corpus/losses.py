"""PyTorch's side of the loss cases (tests/kernels/src/losses.rs), at the
Rust benchmark's shapes: losses on f32 upcasts of bf16 logits, as training
code writes them; the cross-entropy backward as the ATen ops autograd runs."""
import torch
import torch.nn.functional as F

M, N = 16384, 8192
IGNORE = -100


def _labels():
    # Every tenth row (from the fourth) ignored, as the Rust case does.
    labels = torch.randint(0, N, (M,), device="cuda", dtype=torch.int64)
    labels[3::10] = IGNORE
    return labels


def _log_probs():
    return torch.log_softmax(torch.randn(M, N, device="cuda"), dim=-1).to(torch.bfloat16)


def cross_entropy():
    logits = 4 * torch.rand(M, N, device="cuda", dtype=torch.bfloat16) - 2
    labels = _labels()
    return f"{M}x{N}", lambda: F.cross_entropy(logits.float(), labels, reduction="none")


def cross_entropy_bwd():
    logits = 4 * torch.rand(M, N, device="cuda", dtype=torch.bfloat16) - 2
    labels = _labels()
    dloss = torch.rand(M, device="cuda")
    # What autograd saved in the forward (log_softmax's output) and runs in
    # the backward of F.cross_entropy(logits.float(), …, reduction="none").
    lsm = torch.log_softmax(logits.float(), dim=-1)
    total_weight = torch.ops.aten.nll_loss_forward(lsm, labels, None, 0, IGNORE)[1]

    def run():
        g = torch.ops.aten.nll_loss_backward(dloss, lsm, labels, None, 0, IGNORE, total_weight)
        g = torch.ops.aten._log_softmax_backward_data(g, lsm, -1, torch.float32)
        return g.to(torch.bfloat16)

    return f"{M}x{N}", run


def kl_div():
    lp, lq = _log_probs(), _log_probs()
    return f"{M}x{N}", lambda: F.kl_div(
        lp.float(), lq.float(), reduction="none", log_target=True).sum(-1)


def jsd():
    lp, lq = _log_probs(), _log_probs()

    def run():
        a, b = lp.float(), lq.float()
        p, q = a.exp(), b.exp()
        lm = torch.log(0.5 * (p + q))
        return (0.5 * (p * (a - lm) + q * (b - lm))).sum(-1)

    return f"{M}x{N}", run


CASES = {
    "cross_entropy": cross_entropy,
    "cross_entropy_bwd": cross_entropy_bwd,
    "kl_div": kl_div,
    "jsd": jsd,
}
