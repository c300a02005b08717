"""The few-rows product's two tables (docs/decoding.md), into ``docs/data/check_cost_cpu.json``.

    python docs/tools/check_cost.py [--out PATH] [--tokens 2,3,...,9]

On SmolLM2-135M-Instruct (``ladder pull smollm2-135m`` first), level 3 compiled, one
thread:

* the check of ``T - 1`` guesses for ``T`` = 2..9, in decode steps, beside its limits:
  ``benchmarks.check_cost.check_cost_records``, what ``ladder bench --scenario
  speculative`` runs;
* the decode step with float32, bfloat16 and int8 weights, timed in turn (``ROUNDS``
  rounds, each step of each format once, from the same 96-token cache), as records of
  the scenario ``"compiled decode"``, the median step each.

Every pass is compiled where the user's cache lacks it (about a minute each here).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
ROUNDS = 30


def _decode_records(config, params) -> list:
    import torch

    import levels
    from benchmarks.records import OK, Record

    L3 = levels.load("level3_sdpa_flash")
    formats = {
        "float32": {},
        "bfloat16": {"dtype": torch.bfloat16},
        "int8": {"weights": "int8"},
    }
    models = {
        name: L3.DecoderOnlyTransformer(config, params, compile=True, **kw)
        for name, kw in formats.items()
    }
    lines = {name: model.prepare_decode(1).line() for name, model in models.items()}
    prompt = torch.arange(1, 97)[None]  # (1, 96)
    caches = {name: model.prefill(prompt)[1] for name, model in models.items()}

    def step(name: str) -> float:
        ids, positions = torch.ones(1, 1, dtype=torch.long), torch.tensor([[96]])
        start = time.perf_counter()
        models[name].transformer(ids, positions, caches[name])  # (1,1,V)
        seconds = time.perf_counter() - start
        caches[name].rollback(96)
        return seconds

    times = {name: [] for name in models}
    for name in models:
        step(name)  # warm-up
    for _ in range(ROUNDS):
        for name in models:
            times[name].append(step(name))
    return [
        Record(
            level="level3:compiled",
            scenario="compiled decode",
            device="cpu",
            dtype=name,
            status=OK,
            median_s=statistics.median(samples),
            min_s=min(samples),
            max_s=max(samples),
            repeats=ROUNDS,
            tokens_per_s=1 / statistics.median(samples),
            description="SmolLM2, 1 thread: one decode step, the formats in turn",
            note=lines[name],
        )  # fmt: skip
        for name, samples in times.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs/data/check_cost_cpu.json"))
    parser.add_argument("--tokens", default="2,3,4,5,6,7,8,9", help="the T to time, in order")
    args = parser.parse_args()
    import torch

    import levels
    from benchmarks import check_cost
    from benchmarks.records import write_json
    from benchmarks.speculative import _loaded
    from levels.level2_torch_manual.arrays import adopt
    from loading.threads import cpu_threads

    config, params, _, _ = _loaded()
    records = []
    with cpu_threads(1), torch.no_grad():
        with adopt():  # the loader's arrays, as `ladder chat` builds the model
            model = levels.load("level3_sdpa_flash").DecoderOnlyTransformer(
                config, params, compile=True
            )
        model.prepare_decode(1)
        for T in [int(t) for t in args.tokens.split(",") if t]:  # each T in turn with the step
            check_cost.TOKENS = (T,)
            line = model.prepare_decode(1, T).line()
            records += check_cost.check_cost_records(model, config, [line], quick=False)
            write_json(records, args.out)  # what is measured so far
            print(records[-2].note, flush=True)
        records += _decode_records(config, params)
        write_json(records, args.out)
    for r in records:
        print(r.scenario, r.shape, r.dtype, f"{r.median_s * 1e3:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
