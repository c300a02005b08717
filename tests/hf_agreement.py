"""Print, per family and level, the worst logit error against transformers and the
greedy-token agreement, on the tiny random checkpoints of tests/test_hf.py.

    python tests/hf_agreement.py

"stock" is transformers' float64 model as it ships (RoPE angles and RMSNorm in
float32); "exact" has those two steps patched to float64, so a float64 level
should differ from it by rounding order only. Level 4 computes in float32.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import test_hf as T  # noqa: E402  (the checkpoints and helpers of the test module)

from levels import hf  # noqa: E402


def main() -> None:
    root = Path(tempfile.mkdtemp())
    print("| family | level | max abs err, stock | exact | greedy tokens (cached, uncached) |")
    print("|---|---|---:|---:|---|")
    for seed, family in enumerate(T.FAMILY_NAMES):
        path = root / family
        with contextlib.redirect_stderr(io.StringIO()):  # transformers' progress bars
            T._build(family, seed).save_pretrained(path)
        config, params = hf.load(path)
        for name in T.LEVEL_DTYPES:
            small = name in ("level0_loops", "level4_triton_kernel")
            tokens = T.TOKENS[:1, :5] if small else T.TOKENS
            module, model = T._level_model(name, config, params)
            tokens_in, valid_in = T._level_inputs(name, tokens)
            logits = module.to_numpy(model.forward(tokens_in, valid=valid_in))
            logits = np.asarray(logits, dtype=np.float64)
            with contextlib.redirect_stderr(io.StringIO()):
                stock = np.abs(logits - T.hf_logits(path, tokens)).max()
                exact = np.abs(logits - T.hf_logits(path, tokens, exact=True)).max()
                prefix, n = ([7, 3], 3) if small else ([7, 3, 50, 21], 8)
                want = T.hf_generate(path, prefix, n)[len(prefix) :]
            agree = []
            for use_cache in (True, False):
                out = model.generate(np.array([prefix]), n, use_cache=use_cache)
                got = np.asarray(module.to_numpy(out)).tolist()[0][len(prefix) :]
                agree.append(f"{sum(a == b for a, b in zip(got, want, strict=True))}/{n}")
            print(f"| {family} | {name} | {stock:.1e} | {exact:.1e} | {', '.join(agree)} |")


if __name__ == "__main__":
    main()
