"""PyTorch's side of the scan cases (tests/kernels/src/scans.rs): the same
operations in eager PyTorch, at the Rust benchmark's shapes."""
import torch


def cumsum():
    x = torch.randn(16384, 8192, device="cuda", dtype=torch.bfloat16)
    return "16384x8192", lambda: torch.cumsum(x, dim=1)


def cummax():
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    return "16384x4096", lambda: torch.cummax(x, dim=1).values


def position_ids():
    b, s = 8192, 4096
    # As the Rust benchmark's: left padding of up to s/3, then 10% holes.
    pad = torch.randint(0, s // 3 + 1, (b, 1), device="cuda")
    cols = torch.arange(s, device="cuda")[None, :]
    mask = ((cols >= pad) & (torch.rand(b, s, device="cuda") > 0.1)).long()

    def run():
        # Hugging Face's form (`masked_fill_` in place).
        ids = mask.cumsum(-1) - 1
        return ids.masked_fill_(mask == 0, 1)

    return f"{b}x{s}", run


CASES = {
    "cumsum": cumsum,
    "cummax": cummax,
    "position_ids": position_ids,
}
