#!/usr/bin/env python3
"""Merges one run's corpus benchmark logs into the markdown table of
docs/PERFORMANCE.md: tilefuse untuned and tuned (`corpus --bench`, with
TILEFUSE_AUTOTUNE off and cached), PyTorch eager and torch.compile
(`corpus_bench.py`), each as milliseconds and a share of the device-to-device
copy bandwidth the Rust side measured in the same run.

    python3 scripts/corpus_table.py UNTUNED.log TUNED.log TORCH.log
"""
import re, sys

BENCH = re.compile(r"^bench (\S+) (\S+): ([0-9.]+) ms, ([0-9.]+) GB/s")
# Since 2026-12-01 a line also gives the share of a copy of the case's own bytes.
SAME = re.compile(r"([0-9.]+)% of a copy of its bytes")
TORCH = re.compile(r"^torch (\S+) (\S+): eager ([0-9.]+) ms, compile ([0-9.]+) ms")
COPY = re.compile(r"device-to-device copy ([0-9.]+) GB/s")


def read(path, rx):
    out, copy = {}, None
    for line in open(path, errors="replace"):
        m = COPY.search(line)
        if m:
            copy = float(m.group(1))
        m = rx.match(line.strip())
        # A case any of whose kernels ran at the default for want of a tuned
        # config (`corpus --bench` under TILEFUSE_AUTOTUNE=cached marks it
        # `, default]`) has no tuned figure.
        if m and ", default" not in line:
            same = SAME.search(line)
            out[m.group(1)] = m.groups()[1:] + (same.group(1) if same else None,)
    return out, copy


def main():
    untuned, copy = read(sys.argv[1], BENCH)
    tuned, copy2 = read(sys.argv[2], BENCH)
    torch, _ = read(sys.argv[3], TORCH)
    copy = copy or copy2
    print(f"Device-to-device copy: {copy:.0f} GB/s (bytes read + written).\n")
    # The share of a copy of the kernel's own bytes, for the better of the
    # untuned and tuned runs, where the logs have it.
    print("| kernel | shape | untuned | tuned | PyTorch eager | torch.compile | tuned vs compile | of a copy of its bytes |")
    print("|---|---|---|---|---|---|---|---|")
    for name, (shape, ms, gbs, same) in untuned.items():
        bytes_ = float(gbs) * 1e6 * float(ms)
        cell = lambda t: f"{t:.4f} ms ({100 * bytes_ / t / 1e6 / copy:.0f}%)"
        row = [name, shape, cell(float(ms))]
        t_ms = float(tuned[name][1]) if name in tuned else None
        row.append(cell(t_ms) if t_ms else "–")
        best = t_ms or float(ms)
        if name in torch:
            e, c = float(torch[name][1]), float(torch[name][2])
            row += [cell(e), cell(c)]
            row.append(f"{c / best:.2f}x")
        else:
            row += ["–", "–", "–"]
        shares = [(float(ms), same)]
        if name in tuned:
            shares.append((float(tuned[name][1]), tuned[name][3]))
        share = min(shares, key=lambda s: s[0])[1]
        row.append(f"{float(share):.0f}%" if share else "–")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
