"""What level 3 buys over level 2, measured in one run on this machine.

1. Attention forward, level 2 (written out: the (B,H,T,S) score matrix in
   memory) vs level 3 (SDPA; on a CPU the fused "flash" kernel, which tiles
   the keys and keeps a running softmax, so the score matrix never exists),
   B=1, H=8, Dh=64, causal, float32, T = S = 1024 and 2048.
2. Greedy generation of 128 tokens with a small decoder-only model: no cache
   (a full forward per token) vs level 2's growing cache vs level 3's static one.
3. Padding waste of a long-tailed (Pareto) mix of lengths, batched in random
   order vs length-bucketed (levels.common.bucketing).

Timing follows the project's one harness (benchmarks/timing.py): warm-up
calls first, then the median (and interquartile range) of repeated samples.

    python scripts/measure_level3.py            # about a minute; --threads 2 for both cores
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.timing import Stats, TimingPolicy, cpu_timer, measure  # noqa: E402
from levels import TransformerConfig, init_params  # noqa: E402
from levels import level2_torch_manual as level2  # noqa: E402
from levels import level3_sdpa_flash as level3  # noqa: E402
from levels.common.bucketing import make_batches, padding_waste  # noqa: E402

POLICY = TimingPolicy(warmup=2, min_repeat=5, max_repeat=15, min_time_s=1.0)


def timed(fn, policy: TimingPolicy = POLICY) -> Stats:
    with torch.no_grad():
        for _ in range(policy.warmup):
            fn()
        return measure(fn, cpu_timer(), policy)


def ms(stats: Stats) -> str:
    return f"{stats.median * 1e3:9.1f} ms (IQR {stats.iqr * 1e3:.1f})"


def attention_rows(lengths: list[int]) -> list[tuple[str, str, str]]:
    rows = []
    B, H, Dh = 1, 8, 64
    for T in lengths:
        g = torch.Generator().manual_seed(T)
        q, k, v = (torch.randn(B, H, T, Dh, generator=g) for _ in range(3))  # (B,H,T,Dh)
        ran = level3.which_backend(q, k, v, causal=True)
        l2 = timed(lambda q=q, k=k, v=v: level2.attention(q, k, v, causal=True))
        l3 = timed(lambda q=q, k=k, v=v: level3.attention(q, k, v, causal=True))
        l3m = timed(lambda q=q, k=k, v=v: level3.attention(q, k, v, causal=True, backend="math"))
        shape = f"T=S={T}"
        rows.append((f"attention fwd {shape}", "level 2 (written out)", ms(l2)))
        rows.append((f"attention fwd {shape}", f"level 3 (SDPA auto -> {ran})", ms(l3)))
        rows.append((f"attention fwd {shape}", "level 3 (SDPA forced math)", ms(l3m)))
        rows.append(
            (
                f"attention fwd {shape}",
                "speed-up level 2 / level 3",
                f"{l2.median / l3.median:9.2f}x",
            )
        )
    return rows


def generation_rows(new_tokens: int) -> list[tuple[str, str, str]]:
    config = TransformerConfig(
        vocab_size=256, d_model=128, n_heads=4, d_ff=512, n_layers=2, max_seq_len=256
    )
    params = init_params(config, "decoder_only", seed=0)
    prefix = torch.randint(
        3, config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0)
    )
    what = f"generate {new_tokens} tokens (D=128, 2 layers, prompt 16)"
    m2 = level2.DecoderOnlyTransformer(config, params).eval()
    m3 = level3.DecoderOnlyTransformer(config, params).eval()
    one = TimingPolicy(warmup=1, min_repeat=3, max_repeat=5, min_time_s=0.0)
    results = {
        "level 3, no cache": timed(lambda: m3.generate(prefix, new_tokens, use_cache=False), one),
        "level 2, growing cache": timed(lambda: m2.generate(prefix, new_tokens), one),
        "level 3, static cache": timed(lambda: m3.generate(prefix, new_tokens), one),
    }
    assert torch.equal(
        m3.generate(prefix, new_tokens), m3.generate(prefix, new_tokens, use_cache=False)
    ), "cached and uncached generation disagree"
    rows = [
        (what, name, f"{ms(s)}  {new_tokens / s.median:7.0f} tok/s") for name, s in results.items()
    ]
    speedup = results["level 3, no cache"].median / results["level 3, static cache"].median
    rows.append((what, "speed-up static cache / no cache", f"{speedup:9.2f}x"))
    return rows


def padding_rows() -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(0)
    # Pareto(1.5): most sequences short, a few very long, as in real corpora.
    lengths = np.minimum(1 + (rng.pareto(1.5, 10_000) * 32).astype(int), 2048)
    what = f"padding waste, {len(lengths)} Pareto lengths (median {int(np.median(lengths))}, max {lengths.max()})"
    rows = []
    for label, kw in (
        ("batch_size=32", {"batch_size": 32}),
        ("max_tokens=16384", {"max_tokens": 16384}),
    ):
        plain = padding_waste(make_batches(lengths, bucketed=False, **kw), lengths)
        bucketed = padding_waste(make_batches(lengths, bucketed=True, **kw), lengths)
        rows.append((what, f"{label}: random -> bucketed", f"{plain:6.2f} -> {bucketed:.3f}"))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    parser.add_argument("--new-tokens", type=int, default=128)
    # One thread by default: on a shared machine, a thread pool that waits for
    # a busy core makes small ops (a decode step) 10x slower and the numbers
    # unrepeatable. Pass --threads 2 to use both cores of an idle machine.
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}"
    )
    print(f"level 2: {level2.describe()}")
    print(f"level 3: {level3.describe()}")
    rows = attention_rows(args.lengths) + generation_rows(args.new_tokens) + padding_rows()
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    last = None
    for row in rows:
        if row[0] != last:
            print()
            last = row[0]
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
