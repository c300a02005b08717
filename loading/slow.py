"""What a model costs at the rungs that take seconds a token: level 0 (pure Python) and
level 4 on a CPU (its kernels in Triton's interpreter), and what a run says of it.

* **before the model loads**, a warning: what a new token and a prompt token cost, and
  (level 0) the memory its weights take as Python floats;
* **before an answer**, what its prompt should take, from its length;
* **while the prompt runs**, its progress on stderr: the prompt goes through the model in
  pieces of ``PIECE_S`` seconds or more (each against the cache of the ones before, the
  same logits as one pass), and after each one a count of the tokens done, the time and
  what is left at the pace so far: in place on a terminal, a line each elsewhere. A piece
  pays again what a pass pays once (level 0's output layer, level 4's kernel launches), so
  the pieces are long enough that this adds at most ``PIECES_COST`` to the prompt: at
  level 4 a short prompt is one piece.

The costs are measured (docs/benchmarks.md, "The slow rungs"): level 0's seconds per
multiply-add of the model's weights, level 4's seconds a layer for each token, which depend
on the interpreter's programs, not on the arithmetic; both on a third of a core, and said at
the share of a core the load average leaves now (``threads.at_this_load``). ``ladder chat``
prints the warning and the prompt's progress (ladder/slow.py); the bench's rows say them. They
move with what else runs on the machine: the count while the prompt runs is the honest
figure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PIECE_S = 10.0  # seconds of the prompt between two reports of its progress, at least
PIECES_COST = 0.1  # what going through the prompt in pieces may add to its time, at most
LEVEL0_BYTES_PER_PARAM = 32  # a Python float in a list (SmolLM2-135M at level 0)
# Level 0's seconds per multiply-add of the weights (a term of sum(map(mul, ...)) over Python
# floats, and the rest of the step), on a third of a core (threads.MEASURED_SHARE): SmolLM2
# wrote 6.2 s a token, and read its 31-token prompt in 159 s, 4.4e-8 s a multiply-add
# with its pieces.
LEVEL0_SECONDS_PER_MAC = 4.6e-8
# Level 4's seconds a layer on a CPU, where Triton's interpreter runs its kernels (the
# attention and the norms; the products are torch's): its cost is the kernels it launches,
# a few a layer, each a fixed cost, and their programs, one a row of the prompt. A new token
# is a launch of each (4.9 s for SmolLM2's 30 layers); a prompt is a launch of each, and
# 0.6 s a token more (its 31 tokens in 24.0 s); measured as level 0's figure is.
INTERPRETED_SECONDS_PER_LAYER = 0.165
INTERPRETED_PROMPT_SECONDS_PER_LAYER = 0.02  # a token of the prompt, past the launches


@dataclass(frozen=True)
class Cost:
    """What a model costs at a slow rung: ``prompt_s`` a prompt token, ``once_s`` once a
    prompt (level 0: the output layer, at its last token only; level 4: the launches of
    its kernels), ``token_s`` a new token."""

    prompt_s: float
    once_s: float
    token_s: float

    def prompt(self, tokens: int) -> float:
        """Seconds for a prompt of ``tokens`` tokens."""
        return tokens * self.prompt_s + self.once_s

    def piece(self) -> int:
        """Prompt tokens between two reports of its progress: about ``PIECE_S`` seconds of
        them, and enough that the fixed part each piece costs again (``once_s``) adds at
        most ``PIECES_COST`` to the prompt's time."""
        fixed = math.ceil(self.once_s / (PIECES_COST * self.prompt_s))
        return max(1, round(PIECE_S / self.prompt_s), fixed)


def cost(level, config, device: str = "cpu") -> Cost | None:
    """The cost of ``config``'s model at ``level`` here, or None at a rung that takes
    milliseconds a token."""
    from .threads import at_this_load

    if level.FACTS.array == "python":
        n, head = _parameters(config)
        per_mac = at_this_load(LEVEL0_SECONDS_PER_MAC)
        return Cost((n - head) * per_mac, head * per_mac, n * per_mac)
    if level.FACTS.interpreted and not device.startswith("cuda"):
        layer = at_this_load(INTERPRETED_SECONDS_PER_LAYER)  # a pass's kernels, once a layer
        prompt = at_this_load(INTERPRETED_PROMPT_SECONDS_PER_LAYER)
        return Cost(config.n_layers * prompt, config.n_layers * layer, config.n_layers * layer)
    return None


def _parameters(config) -> tuple[int, int]:
    """The model's parameters, and those of its output layer (a multiply-add each a token)."""
    from levels.common.params import param_shapes

    n = sum(int(np.prod(s)) for s in param_shapes(config, "decoder_only").values())
    return n, config.vocab_size * config.d_model


def warning(level, config, device: str = "cpu") -> str | None:
    """The line before a slow rung's model loads, or None."""
    found = cost(level, config, device)
    if found is None:
        return None
    each = (
        f"about {found.token_s:.0f} s a new token here, after the prompt (its time is said "
        "when it starts)"
    )
    if level.FACTS.array == "python":
        memory = _parameters(config)[0] * LEVEL0_BYTES_PER_PARAM / 1e9
        return (
            f"level 0 computes in pure Python: this model takes {each}, and {memory:.0f} GB for "
            "its weights as Python floats; it works, slowly"
        )
    return (
        "level 4 runs its kernels in Triton's interpreter here (no GPU): this model takes "
        f"{each}; level 3 runs it in milliseconds; it works, slowly"
    )
