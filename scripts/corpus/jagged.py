"""PyTorch's side of the jagged and segment cases (tests/kernels/src/jagged.rs),
at the Rust benchmark's shapes: segments by offsets with torch.segment_reduce,
unsorted segment ids with index_add_ / scatter_reduce_."""
import torch

NB, D = 2000, 128
N_ROWS, NSEG = 1 << 21, 2000


def _jagged():
    # The Rust side's segments: lengths (i * 7919) mod 2001, one of them empty.
    lengths = torch.tensor([(i * 7919) % 2001 for i in range(NB)], device="cuda")
    offsets = torch.zeros(NB + 1, dtype=torch.int64, device="cuda")
    offsets[1:] = torch.cumsum(lengths, 0)
    total = int(offsets[-1])
    values = torch.randn(total, D, device="cuda", dtype=torch.bfloat16)
    return values, offsets, lengths, f"{NB}x{total}x{D}"


def jagged_sum():
    # segment_reduce on bf16 accumulates in bf16 (about 4e-2 relative error
    # at ~1000 rows a segment, measured on an H200); the Rust kernel adds in f32.
    values, offsets, _, shape = _jagged()
    return shape, lambda: torch.segment_reduce(values, "sum", offsets=offsets)


def jagged_mean():
    values, offsets, _, shape = _jagged()
    # initial=0: an empty segment's mean is 0 (not NaN), as in the Rust case.
    return shape, lambda: torch.segment_reduce(values, "mean", offsets=offsets, initial=0)


def jagged_softmax():
    values, offsets, lengths, shape = _jagged()
    ids = torch.repeat_interleave(torch.arange(NB, device="cuda"), lengths)

    def run():
        mx = torch.segment_reduce(values, "max", offsets=offsets)
        e = torch.exp(values.float() - mx.float()[ids])
        s = torch.zeros(NB, D, device="cuda").index_add_(0, ids, e)
        return (e / s[ids]).to(torch.bfloat16)

    return shape, run


def _segments():
    values = torch.randn(N_ROWS, D, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, NSEG, (N_ROWS,), device="cuda", dtype=torch.int64)
    return values, ids, f"{N_ROWS}x{D}->{NSEG}"


def segment_sum():
    values, ids, shape = _segments()
    return shape, lambda: torch.zeros(NSEG, D, device="cuda").index_add_(0, ids, values.float())


def segment_max():
    values, ids, shape = _segments()
    index = ids[:, None].expand(-1, D)
    return shape, lambda: torch.full((NSEG, D), float("-inf"), device="cuda").scatter_reduce_(
        0, index, values.float(), "amax")


CASES = {
    "jagged_sum": jagged_sum,
    "jagged_mean": jagged_mean,
    "jagged_softmax": jagged_softmax,
    "segment_sum": segment_sum,
    "segment_max": segment_max,
}
