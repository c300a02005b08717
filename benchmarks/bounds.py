"""How far from the float64 reference a case may be before it is called wrong.

The runner checks every case against its float64 reference before timing it,
and a case over its bound is reported as wrong and never timed: a fast wrong
answer is not a result. The bounds are on ``max |x - ref| / max(1, max |ref|)``
(see ``scenarios.scaled_error``): loose enough for the rounding of each dtype
on these workloads, tight enough that a real bug (a wrong mask, a dropped
bias, a misaligned causal rule: errors of order 0.1 to 1) fails.

* float64: 1e-9. The levels agree to ~1e-14 in float64 (the test suite holds
  them to 1e-13); one hidden float32 step would show as ~1e-7.
* float32: 1e-3. eps is 1.2e-7; sums over thousands of keys and a few layers
  give up to ~1e-5 here, so two orders of margin.
* float16: 2e-2 and bfloat16: 1e-1. eps is 9.8e-4 and 7.8e-3; a low-precision
  output is a few eps off on values of order one. (The test suite holds the
  levels to the sharper rule, at most 2x PyTorch's own error in the dtype.)

Generated tokens are compared one by one: in float64 and float32 greedy
decoding must reproduce the reference's tokens exactly (the argmax margins of
these random models are far above float32 rounding); in float16 and bfloat16
a near-tie may flip one argmax and everything after it, so up to half the
generated tokens may differ before the case counts as wrong.
"""

from __future__ import annotations

import math

ERROR_BOUNDS = {"float64": 1e-9, "float32": 1e-3, "float16": 2e-2, "bfloat16": 1e-1}


def error_bound(dtype: str) -> float:
    return ERROR_BOUNDS[dtype]


def token_bound(dtype: str, generated: int) -> float:
    """How many of ``generated`` tokens may differ from the reference's."""
    return 0.0 if dtype in ("float64", "float32") else float(math.floor(generated / 2))
