"""Print the worst errors of ring and all-gather attention (values and gradients) on 2 and 3
CPU processes against single-process float64 attention, and of the model over a sharded
sequence, from the cases of tests/test_parallel.py.

    python tests/parallel_agreement.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import parallel_cases  # noqa: E402
import test_parallel  # noqa: E402


def main() -> None:
    for world in (2, 3):
        worst = test_parallel.spawn(parallel_cases.attention_cases, world, Path(tempfile.mkdtemp()))
        by: dict[str, float] = {}
        for rank in worst:
            for case, error in rank.items():
                method, _, causal = case.split()[:3]
                by[f"{method} {causal}"] = max(by.get(f"{method} {causal}", 0.0), error)
        cells = ", ".join(f"{k}: {v:.1e}" for k, v in sorted(by.items()))
        print(f"{world} processes: {cells}")
    model = test_parallel.spawn(parallel_cases.model_case, 2, Path(tempfile.mkdtemp()))
    print(f"model, 2 processes: {max(e for rank in model for e in rank.values()):.1e}")


if __name__ == "__main__":
    main()
