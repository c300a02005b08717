"""Level 4 on a real GPU: accuracy against float64 and speed against PyTorch's SDPA backends.

Run by ``benchmarks/gpu_check.sh`` (which also runs the kernel tests on CUDA);
by hand::

    python -m levels.level4_triton_kernel.gpu_bench --out gpu_results --budget-s 240
    python -m levels.level4_triton_kernel.gpu_bench --dry-run   # the plan, no GPU needed

Two passes, each case recorded even when it fails:

1. Accuracy (the flash-attention test rule). For fp16 and bf16, level 4's output
   and gradients are compared with a float64 reference; PyTorch's SDPA in the
   same dtype is compared with the same reference, and level 4 passes when its
   max error is at most twice SDPA's (plus a few ulps). These use the autotuned
   tiles, at sizes the small CPU tests cannot reach, including a T != S case
   whose lengths are not tile multiples.
2. Speed. ``B * H`` fixed, ``T = S`` from 1024 to 8192, ``Dh`` 64 and 128, causal
   on and off, forward and forward + backward, bf16; level 4 against SDPA's
   flash, memory-efficient, cuDNN and math backends (``sdpa_kernel``). Timing is
   ``triton.testing.do_bench`` (warm-up, then the median of repeated runs, CUDA
   events); the first call of each shape runs untimed, so autotuning and
   compilation are not measured. TFLOP/s use ``benchmarks/flops.py``'s
   formula: ``4 B H T S Dh`` for the forward, half of it causal, backward 2.5x.

The budget stops the speed pass cleanly (remaining cases are recorded as
skipped), so the script always writes its results in time.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from benchmarks.flops import attention_flops, attention_fwd_bwd_flops

from .flash_attention import attention

LOWP_FACTOR = 2.0  # the flash-attention rule: at most 2x PyTorch's own error
LOWP_FLOOR = {"float16": 2e-3, "bfloat16": 1.6e-2}  # a few ulps of O(1) values
BATCH, HEADS = 2, 16  # B * H fixed at 32 for the speed pass
SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


@dataclass
class AccuracyCase:
    dtype: str
    B: int
    H: int
    T: int
    S: int
    Dh: int
    causal: bool
    errors: dict = field(default_factory=dict)  # name -> (level 4 error, SDPA error)
    passed: bool | None = None
    note: str = ""


@dataclass
class SpeedCase:
    backend: str  # "level4" or an SDPA backend name
    mode: str  # "fwd" or "fwd+bwd"
    T: int
    Dh: int
    causal: bool
    B: int = BATCH
    H: int = HEADS
    dtype: str = "bfloat16"
    ms: float | None = None  # median milliseconds
    ms_p20: float | None = None
    ms_p80: float | None = None
    tflops: float | None = None
    note: str = ""

    def flops(self) -> float:
        fn = attention_flops if self.mode == "fwd" else attention_fwd_bwd_flops
        return fn(self.B, self.H, self.T, self.T, self.Dh, causal=self.causal)


def accuracy_plan() -> list[AccuracyCase]:
    """bf16 at the benchmark's head widths (the speed pass reuses these compilations),
    plus one fp16 case with lengths that are not tile multiples, T < S
    (bottom-right causal) and a head width that needs padding (80 -> 128)."""
    cases = [
        AccuracyCase("bfloat16", 2, 4, 1024, 1024, Dh, causal)
        for Dh in (64, 128)
        for causal in (False, True)
    ]
    cases += [AccuracyCase(dtype, 2, 3, 1000, 1537, 80, True) for dtype in ("bfloat16", "float16")]
    return cases


def speed_plan() -> list[SpeedCase]:
    """Ordered so that a budget that runs out drops the largest sizes of the last
    configuration, not a whole mode or head width."""
    cases = []
    for Dh in (64, 128):
        for causal in (False, True):
            for T in (1024, 2048, 4096, 8192):
                for mode in ("fwd", "fwd+bwd"):
                    for backend in ("level4", *SDPA_BACKENDS):
                        cases.append(SpeedCase(backend, mode, T, Dh, causal))
    return cases


# ---------------------------------------------------------------------------
# accuracy
# ---------------------------------------------------------------------------


def _allowed(T: int, S: int, causal: bool, device) -> torch.Tensor | None:
    """(T, S) bool, bottom-right causal, or None when every key is allowed."""
    if not causal:
        return None
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(S, device=device)[None, :]
    return j <= i + (S - T)


def _sdpa_baseline(q, k, v, *, causal: bool):
    """PyTorch's own attention in the same dtype. With T == S, ``is_causal`` (top-left)
    equals the bottom-right rule and lets SDPA pick its flash kernel, the strictest
    baseline; with T != S the bottom-right mask is passed explicitly."""
    T, S = q.shape[-2], k.shape[-2]
    if T == S:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    allowed = _allowed(T, S, causal, q.device)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def _reference(q, k, v, allowed):
    """float64 attention, the reference for both level 4 and SDPA."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B,H,T,S)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(-1) @ v  # (B,H,T,Dh)


def _forward_backward(fn, inputs, d_out, dtype):
    ins = [x.detach().to(dtype).requires_grad_() for x in inputs]
    out = fn(*ins)
    out.backward(d_out.to(dtype))
    return [out.detach(), *(x.grad for x in ins)]


def run_accuracy(case: AccuracyCase, dev: str = "cuda") -> AccuracyCase:
    gen = torch.Generator(device=dev).manual_seed(case.T + case.S + case.Dh)
    dtype = getattr(torch, case.dtype)
    shapes = ((case.T, case.Dh), (case.S, case.Dh), (case.S, case.Dh))
    inputs = [
        torch.randn(case.B, case.H, n, d, generator=gen, device=dev, dtype=torch.float64)
        for n, d in shapes
    ]
    d_out = torch.randn(
        case.B, case.H, case.T, case.Dh, generator=gen, device=dev, dtype=torch.float64
    )
    allowed = _allowed(case.T, case.S, case.causal, dev)
    expected = _forward_backward(lambda *x: _reference(*x, allowed), inputs, d_out, torch.float64)
    ours = _forward_backward(
        lambda q, k, v: attention(q, k, v, causal=case.causal), inputs, d_out, dtype
    )
    base = _forward_backward(
        lambda q, k, v: _sdpa_baseline(q, k, v, causal=case.causal), inputs, d_out, dtype
    )
    case.passed = True
    for name, a, b, ref in zip(("out", "dq", "dk", "dv"), ours, base, expected, strict=True):
        err = (a.double() - ref).abs().max().item()
        base_err = (b.double() - ref).abs().max().item()
        case.errors[name] = (err, base_err)
        if not err <= LOWP_FACTOR * base_err + LOWP_FLOOR[case.dtype]:
            case.passed = False
    return case


# ---------------------------------------------------------------------------
# speed
# ---------------------------------------------------------------------------


def _sdpa_fn(backend: str, causal: bool):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend]

    def fn(q, k, v):
        # T == S here, so SDPA's top-left is_causal equals the bottom-right rule.
        with sdpa_kernel(which):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def run_speed(case: SpeedCase) -> SpeedCase:
    import triton.testing

    dev, dtype = "cuda", getattr(torch, case.dtype)
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (
        torch.randn(case.B, case.H, case.T, case.Dh, generator=gen, device=dev, dtype=dtype)
        for _ in range(3)
    )
    if case.backend == "level4":

        def fn(q, k, v):
            return attention(q, k, v, causal=case.causal)

    else:
        fn = _sdpa_fn(case.backend, case.causal)
    if case.mode == "fwd":

        def call():
            with torch.no_grad():
                fn(q, k, v)

        grads = None
    else:
        for x in (q, k, v):
            x.requires_grad_()
        d_out = torch.randn_like(q)

        def call():
            fn(q, k, v).backward(d_out)

        grads = [q, k, v]
    call()  # untimed: compilation and autotuning happen here
    torch.cuda.synchronize()
    p50, p20, p80 = triton.testing.do_bench(call, grad_to_none=grads, quantiles=[0.5, 0.2, 0.8])
    case.ms, case.ms_p20, case.ms_p80 = p50, p20, p80
    case.tflops = case.flops() / (p50 * 1e-3) / 1e12
    return case


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------


def accuracy_table(cases: list[AccuracyCase]) -> str:
    lines = [
        "accuracy: max |error| vs float64, level 4 / SDPA same dtype (pass: <= 2x SDPA + floor)",
        f"{'dtype':9} {'B':>2} {'H':>2} {'T':>5} {'S':>5} {'Dh':>4} {'causal':6} "
        f"{'out':>17} {'dq':>17} {'dk':>17} {'dv':>17}  result",
    ]
    for c in cases:
        cells = " ".join(
            f"{c.errors[n][0]:8.2e}/{c.errors[n][1]:8.2e}" if n in c.errors else f"{'-':>17}"
            for n in ("out", "dq", "dk", "dv")
        )
        result = {True: "ok", False: "FAIL", None: "not run"}[c.passed]
        lines.append(
            f"{c.dtype:9} {c.B:>2} {c.H:>2} {c.T:>5} {c.S:>5} {c.Dh:>4} {c.causal!s:6} "
            f"{cells}  {result} {c.note}".rstrip()
        )
    return "\n".join(lines)


def speed_table(cases: list[SpeedCase]) -> str:
    """One row per (mode, Dh, causal, T); one column per backend: TFLOP/s (ms)."""
    backends = ("level4", *SDPA_BACKENDS)
    header = f"{'mode':8} {'Dh':>4} {'causal':6} {'T':>5} " + " ".join(f"{b:>16}" for b in backends)
    lines = [
        f"speed: TFLOP/s (median ms), B*H = {BATCH}*{HEADS}, {cases[0].dtype if cases else ''}; "
        "FLOPs 4*B*H*T*S*Dh fwd (causal: half), bwd 2.5x fwd",
        header,
    ]
    rows: dict[tuple, dict[str, SpeedCase]] = {}
    for c in cases:
        rows.setdefault((c.mode, c.Dh, c.causal, c.T), {})[c.backend] = c
    for (mode, Dh, causal, T), by_backend in sorted(rows.items()):
        cells = []
        for b in backends:
            c = by_backend.get(b)
            if c is None or c.ms is None:
                cells.append(f"{(c.note[:16] if c else '') or '-':>16}")
            else:
                cells.append(f"{c.tflops:6.1f} ({c.ms:6.2f})".rjust(16))
        lines.append(f"{mode:8} {Dh:>4} {causal!s:6} {T:>5} " + " ".join(cells))
    return "\n".join(lines)


def _attempt(run, case, deadline: float | None):
    """Run one case; a failure or the time budget becomes the case's note, never an abort."""
    if deadline is not None and time.monotonic() > deadline:
        case.note = "skipped: budget"
        return case
    try:
        return run(case)
    except (
        Exception
    ) as exc:  # one backend failing (cuDNN shape limits, memory) must not lose the rest
        case.note = f"error: {type(exc).__name__}: {exc}".splitlines()[0][:200]
        return case
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def environment() -> dict:
    import triton

    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu_results", help="directory for results")
    parser.add_argument(
        "--budget-s", type=float, default=240.0, help="seconds after which cases are skipped"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the plan; needs no GPU")
    args = parser.parse_args(argv)

    accuracy, speed = accuracy_plan(), speed_plan()
    if args.dry_run:
        print(f"{len(accuracy)} accuracy cases, {len(speed)} speed cases")
        print(accuracy_table(accuracy))
        print(speed_table(speed))
        return 0
    if not torch.cuda.is_available():
        print("gpu_bench needs a CUDA device (use --dry-run to see the plan)")
        return 2

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    print(f"{env['date']}  {env['device']}  torch {env['torch']}  triton {env['triton']}")
    deadline = time.monotonic() + args.budget_s
    for case in accuracy:
        _attempt(run_accuracy, case, deadline)
        print(accuracy_table([case]).splitlines()[-1], flush=True)
    write_results(out, env, accuracy, speed)
    for case in speed:
        _attempt(run_speed, case, deadline)
        result = f"{case.ms:.3f} ms" if case.ms is not None else case.note
        print(f"{case.backend:9} {case.mode:7} Dh={case.Dh:<3} causal={case.causal!s:5} "
              f"T={case.T:<5} {result}", flush=True)  # fmt: skip
        write_results(out, env, accuracy, speed)  # after every case: a kill loses nothing
    print(report_text(env, accuracy, speed))
    failed = [c for c in accuracy if c.passed is not True]
    return 1 if failed else 0


def report_text(env: dict, accuracy: list[AccuracyCase], speed: list[SpeedCase]) -> str:
    title = (
        f"level 4 GPU check, {env['date']}, {env['device']} "
        f"(torch {env['torch']}, triton {env['triton']})"
    )
    return "\n\n".join([title, accuracy_table(accuracy), speed_table(speed)])


def write_results(
    out: Path, env: dict, accuracy: list[AccuracyCase], speed: list[SpeedCase]
) -> None:
    """``gpu_check.txt`` (the tables, with date and device) and ``gpu_check.json`` (every case)."""
    (out / "gpu_check.txt").write_text(report_text(env, accuracy, speed) + "\n")
    payload = {
        **env,
        "accuracy": [asdict(c) for c in accuracy],
        "speed": [asdict(c) | {"flops": c.flops()} for c in speed],
    }
    (out / "gpu_check.json").write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
