"""Where a decode step's time goes, per level, on the real model (docs/decoding.md).

    python docs/tools/decode_profile.py            # one thread
    python docs/tools/decode_profile.py --threads 2
    python docs/tools/decode_profile.py --layouts   # the weights alone, four ways [--rows 8]
    python docs/tools/decode_profile.py --compiled  # level 3 compiled, per weight format

For SmolLM2-135M-Instruct in float32 (``ladder pull`` first), a 37-token chat
prompt prefilled, then per level:

* ``step``: the median wall time of one decode step (one token against the cache);
* ``weights``: the time of the same step's weight products alone, the model's own
  matrices multiplied by one row in the same order and the same way the level
  does (numpy's ``x @ w.T`` at level 1, ``F.linear`` at levels 2 and 3), and the
  rate at which they stream (bytes of the weights over that time);
* ``rest``: the step minus the weights: everything else (norms, RoPE, the cache
  write, attention, the residual adds, Python), with the number of tensor
  operations a step issues (torch's profiler at levels 2 and 3; the ops-module
  calls at level 1);
* ``copy``: the bytes read plus written per second by one large tensor copy, the
  ceiling the benchmark's "% bw" divides by.

``--layouts`` times level 3's matrices alone, multiplied by one row four ways:
row-major ``(out, in)`` through ``F.linear`` (as ``nn.Linear`` holds them, and
``transformers`` with them), in level 3's layout (each along its longer side)
through ``F.linear``, and cut into two blocks of output columns multiplied by one
``torch.bmm`` (which PyTorch spreads over two threads; its one-row ``F.linear``
does not); and, where this torch has oneDNN's reordered product, in its blocked
layout for eight rows (level 3's ``weights="blocked"``, a server's batch). ``--rows N``
multiplies ``N`` rows at once, as a batch of ``N`` requests does.

Timings are medians of repeated runs on a shared machine: compare the rows of
one run, not runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from threadpoolctl import threadpool_limits

import levels
from benchmarks.real_model import _loaded

LEVELS = ("level1_numpy", "level2_torch_manual", "level3_sdpa_flash")


def _median_s(fn, n: int) -> float:
    fn()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _matrices(model, level: str) -> list:
    """The step's matrices in the order it multiplies them: per layer q/k/v, out, FFN; head."""
    if level == "level1_numpy":
        out = []
        for layer in model.layers:
            a, f = layer.self_attn, layer.ff
            out += [a.w_q, a.w_k, a.w_v, a.w_o, f.w_gate, f.w1, f.w2]
        return out + [model.output_projection]
    out = []
    for layer in model.layers:
        out.append(layer.self_attn.in_proj_weight)
        out += [layer.self_attn.out_proj.weight, layer.linear_gate.weight, layer.linear1.weight]
        out.append(layer.linear2.weight)
    return out + [model.token_embedding.weight]


def decode_step(model, level: str, ids) -> Callable[[], None]:
    """One decode step of ``model`` after the prompt ``ids[:-1]``, as a call that rolls back
    the cache first, so that every call is the same step (the prompt is prefilled once)."""
    L = levels.load(level)
    with torch.no_grad():
        _, cache = model.prefill(L.asarray(np.array([ids[:-1]])))
    token = L.asarray(np.array([ids[-1]]))

    def step():
        cache.rollback(len(ids) - 1)
        with torch.no_grad():
            model.decode_step(token, cache)

    return step


def op_count(model, level: str, step) -> int:
    """The operations one ``step()`` issues: torch's top-level operations (its profiler) at
    the torch levels, calls into the level's ``ops`` module at level 1."""
    if level == "level1_numpy":
        calls = 0
        ops = model.ops
        names = [n for n in dir(ops) if not n.startswith("_") and callable(getattr(ops, n))]
        saved = {n: getattr(ops, n) for n in names}

        def counting(fn):
            def wrapped(*a, **k):
                nonlocal calls
                calls += 1
                return fn(*a, **k)

            return wrapped

        for n in names:
            setattr(ops, n, counting(saved[n]))
        try:
            step()
        finally:
            for n, fn in saved.items():
                setattr(ops, n, fn)
        return calls
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return sum(1 for e in prof.events() if e.cpu_parent is None)


def profile_level(level: str, config, params, ids, repeats: int) -> dict:
    L = levels.load(level)
    torch_level = L.FACTS.array == "torch"
    model = L.DecoderOnlyTransformer(
        config, params, dtype=torch.float32 if torch_level else np.float32
    )
    step = decode_step(model, level, ids)
    step_s = _median_s(step, repeats)
    mats = _matrices(model, level)
    nbytes = sum(m.size * m.itemsize if not torch_level else m.numel() * 4 for m in mats)
    if torch_level:
        xs = {n: torch.randn(1, n) for n in (config.d_model, config.d_ff)}
        with torch.no_grad():
            weights_s = _median_s(lambda: [F.linear(xs[w.shape[1]], w) for w in mats], repeats)
    else:
        xs = {n: np.ones((1, n), np.float32) for n in (config.d_model, config.d_ff)}
        weights_s = _median_s(lambda: [xs[w.shape[1]] @ w.T for w in mats], repeats)
    return {
        "level": level,
        "step_ms": step_s * 1e3,
        "weights_ms": weights_s * 1e3,
        "weights_gbs": nbytes / weights_s / 1e9,
        "rest_ms": (step_s - weights_s) * 1e3,
        "ops": op_count(model, level, step),
        "tok_s": 1.0 / step_s,
    }


def layouts(config, params, repeats: int, rows: int = 1) -> dict[str, tuple[float, float]]:
    """``(ms, GB/s)`` of level 3's matrices multiplied by ``rows`` rows, per layout
    (``--layouts``; ``--rows``: a server's batch, one row each)."""
    from levels.level3_sdpa_flash import blocked, private

    model = levels.load("level3_sdpa_flash").DecoderOnlyTransformer(config, params)
    mats = [w.detach() for w in _matrices(model, "level3_sdpa_flash")]
    nbytes = sum(w.numel() * 4 for w in mats)
    xs = {n: torch.randn(rows, n) for n in (config.d_model, config.d_ff)}
    row_major = [w.contiguous() for w in mats]
    # (2, in, out / 2): block j holds output columns j * out/2 ... as an (in, out/2) matrix
    blocks = [w.t().reshape(w.shape[1], 2, -1).permute(1, 0, 2).contiguous() for w in mats]
    xb = {n: x.expand(2, rows, n) for n, x in xs.items()}
    calls = {
        "row-major, F.linear": lambda: [F.linear(xs[w.shape[1]], w) for w in row_major],
        "level 3's layout, F.linear": lambda: [F.linear(xs[w.shape[1]], w) for w in mats],
        "two column blocks, torch.bmm": lambda: [torch.bmm(xb[b.shape[1]], b) for b in blocks],
    }
    if private.blocked_missing() is None:  # weights="blocked": oneDNN's reordered product
        reordered = [blocked.BlockedWeight(w, floats=False) for w in mats]
        name = f"oneDNN's layout for {blocked.ROWS} rows (weights='blocked')"
        calls[name] = lambda: [w.linear(xs[w.in_features]) for w in reordered]
    with torch.no_grad():
        times = {name: _median_s(call, repeats) for name, call in calls.items()}
    return {name: (1e3 * t, nbytes / t / 1e9) for name, t in times.items()}


def copy_gbs(repeats: int = 10) -> float:
    a = torch.empty(64 * 2**20).normal_()  # 256 MiB
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / _median_s(lambda: b.copy_(a), repeats) / 1e9


def read_gbs(repeats: int = 10) -> float:
    """The fastest read-only stream over 512 MiB (the benchmark's ceiling for "% bw")."""
    from benchmarks.measure import READ_BYTES, read_streams

    return max(
        READ_BYTES / _median_s(fn, repeats) / 1e9 for fn in read_streams("cpu", READ_BYTES).values()
    )


def library_calls(path) -> dict[str, int]:
    """What one step of a compiled library runs: its fused loops (inductor's C++ kernels)
    and its calls into PyTorch's own kernels, counted in the generated wrapper's source."""
    import re
    import zipfile

    with zipfile.ZipFile(path) as package:
        name = next(n for n in package.namelist() if n.endswith("wrapper.cpp"))
        source = package.read(name).decode()
    run = source[source.index("::run_impl(") :]
    calls = {"fused loops": len(re.findall(r"\n\s+cpp_fused_\w+\(", run))}
    for extern in sorted(set(re.findall(r"aoti_torch_cpu_(\w+)\(", run))):
        calls[extern] = len(re.findall(rf"aoti_torch_cpu_{extern}\(", run))
    return calls


def profile_compiled(config, params, ids, repeats: int, weights: str = "float") -> dict:
    """Level 3's compiled decode step (``compile=True``) beside its eager one: their times,
    the weights' bytes a step reads and at what rate, and what the compiled step runs."""
    from benchmarks.real_model import weight_bytes
    from levels.level3_sdpa_flash import compiled

    L3 = levels.load("level3_sdpa_flash")
    fmt = "float32" if weights == "float" else weights
    eager = L3.DecoderOnlyTransformer(config, params, weights=weights)
    fast = L3.DecoderOnlyTransformer(config, params, weights=weights, compile=True)
    report = fast.prepare_decode(1)
    eager_s = _median_s(decode_step(eager, "level3_sdpa_flash", ids), repeats)
    fast_s = _median_s(decode_step(fast, "level3_sdpa_flash", ids), repeats)
    nbytes = weight_bytes(params, fmt)
    return {
        "weights": fmt,
        "eager_ms": eager_s * 1e3,
        "compiled_ms": fast_s * 1e3,
        "speedup": eager_s / fast_s,
        "bytes": nbytes,
        "compiled_gbs": nbytes / fast_s / 1e9,
        "calls": library_calls(compiled.package_path(fast, 1)),
        "report": report.line(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--layouts", action="store_true", help="the weights alone, four ways")
    parser.add_argument("--rows", type=int, default=1, help="with --layouts: rows multiplied")
    parser.add_argument(
        "--compiled", action="store_true", help="level 3 compiled and eager, per weight format"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with threadpool_limits(limits=args.threads, user_api="blas"):
        config, params, ids = _loaded("float32")
        print(
            f"SmolLM2-135M float32, {args.threads} thread(s), copy {copy_gbs():.1f} GB/s, "
            f"read {read_gbs():.1f} GB/s"
        )
        if args.compiled:
            print("| level 3 decode | eager | compiled | speed-up | weights read | rate |")
            print("| --- | ---: | ---: | ---: | ---: | ---: |")
            for weights in ("float", "int8", "int4"):
                r = profile_compiled(config, params, ids, args.repeats, weights)
                print(
                    f"| {r['weights']} | {r['eager_ms']:.1f} ms | {r['compiled_ms']:.1f} ms | "
                    f"{r['speedup']:.2f}x | {r['bytes'] / 1e6:.0f} MB | "
                    f"{r['compiled_gbs']:.1f} GB/s |"
                )
                calls = ", ".join(f"{n} {k}" for k, n in r["calls"].items())
                print(f"|   {r['report']}; a step runs {calls} | | | | | |")
            return
        if args.layouts:
            print(f"| {args.rows} row(s) times every weight | time | GB/s |")
            print("| --- | ---: | ---: |")
            for name, (ms, gbs) in layouts(config, params, args.repeats, args.rows).items():
                print(f"| {name} | {ms:.1f} ms | {gbs:.1f} |")
            return
        print("| level | step | weights | their rate | rest | tensor ops | tokens/s |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for level in LEVELS:
            r = profile_level(level, config, params, ids, args.repeats)
            print(
                f"| {r['level']} | {r['step_ms']:.1f} ms | {r['weights_ms']:.1f} ms | "
                f"{r['weights_gbs']:.1f} GB/s | {r['rest_ms']:.1f} ms | {r['ops']} | "
                f"{r['tok_s']:.1f} |"
            )


if __name__ == "__main__":
    main()
