"""Preflight: four properties checked on the untrained model before any training.

Each is cheap to check on a handful of sequences, and each, when broken,
still lets training *run*: the loss goes down, just towards the wrong model.
Catching them after an hour of training (or never) is the expensive way.

1. ``future_token_independence``: the output at position ``t`` must not change
   when any later decoder input changes. A causal mask that leaks lets the model
   read the answer under teacher forcing; the training loss collapses, then
   free-running generation, which has no future to read, fails.
2. ``padding_invariance``: a sequence's outputs must be the same alone and
   padded inside a batch, whatever token ids sit in the padded slots, and the
   loss of a batch must be the token-weighted mean of its rows' losses. A leak
   through padding makes the model depend on its batch-mates: bucketing, batch
   size or an unlucky shuffle change its predictions.
3. ``finite_gradients``: on a batch with heavily padded rows, the loss and every
   parameter's gradient must be finite, every parameter must get one, and they
   must not depend on what the padded slots hold. A fully masked softmax row
   gives NaN, and one NaN poisons every weight in a single AdamW step.
4. ``cached_decoding``: free-running greedy decoding with the KV cache must give
   the same tokens as recomputing the whole prefix at every step. Evaluation and
   any real use decode with the cache; if it disagrees with the model that was
   trained (the uncached forward), every free-running metric is measuring
   something else.

``run_preflight`` returns one :class:`Check` per property; ``require`` raises
:class:`PreflightError` naming every failed property.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from levels.common.tasks import FIRST_SYMBOL

from .backend import TrainerBackend
from .data import Batch, Example, collate, sequence_length
from .evaluate import greedy_outputs

PROPERTIES = (
    "future_token_independence",
    "padding_invariance",
    "finite_gradients",
    "cached_decoding",
)

# Tolerances, relative to the largest logit magnitude (at least 1):
# * SAME_SHAPE: the two forwards run identical shapes, so the arithmetic is the
#   same up to the masked entries, which contribute exact zeros; anything
#   above a few float32 ulps (1.2e-7) is a real dependence. 1e-5 leaves room
#   for kernels that skip masked blocks.
# * RESHAPED: a row alone vs in a padded batch goes through matmuls of other
#   shapes, whose blocking (and so summation order) differs: float32 round-off
#   of a few hundred ulps over a few layers. 1e-4 is well above that and far
#   below the O(1e-2) change a real leak makes.
SAME_SHAPE = 1e-5
RESHAPED = 1e-4


class PreflightError(RuntimeError):
    """A preflight property failed; ``failed`` lists the property names."""

    def __init__(self, checks: Sequence[Check]):
        self.failed = [c.name for c in checks if not c.ok]
        lines = [f"{c.name}: {c.detail}" for c in checks if not c.ok]
        super().__init__("preflight failed: " + "; ".join(lines))


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def _scale(logits: np.ndarray) -> float:
    return max(1.0, float(np.abs(logits).max()))


def _perturb(tokens: np.ndarray, where: np.ndarray, vocab_size: int, rng) -> np.ndarray:
    """Replace ``tokens`` at ``where`` by a *different* content symbol."""
    n_symbols = vocab_size - FIRST_SYMBOL
    shift = rng.integers(1, n_symbols, size=tokens.shape)  # never 0: always a change
    symbol = np.clip(tokens - FIRST_SYMBOL, 0, n_symbols - 1)
    changed = (symbol + shift) % n_symbols + FIRST_SYMBOL
    return np.where(where, changed, tokens)


# Each check returns "" when the property holds, else what went wrong.


def future_token_independence(backend: TrainerBackend, batch: Batch, rng) -> str:
    """Perturb every decoder input from a random cut on; earlier logits must not move."""
    with backend.inference():
        base = backend.logits(batch)  # (B, T, V)
    lengths = batch.valid.sum(axis=1)  # (B,)
    cut = np.array([rng.integers(1, n) if n > 1 else n for n in lengths])[:, None]  # (B, 1)
    position = np.arange(batch.inputs.shape[1])[None, :]  # (1, T)
    later = batch.valid & (position >= cut)  # (B, T) the inputs we change
    inputs = _perturb(batch.inputs, later, backend.config.vocab_size, rng)
    with backend.inference():
        moved = backend.logits(replace(batch, inputs=inputs))
    diff = np.abs(moved - base).max(axis=-1)  # (B, T)
    earlier = batch.valid & (position < cut)
    leak = float(diff[earlier].max())
    tol = SAME_SHAPE * _scale(base)
    if leak > tol:
        return f"changing later inputs moved earlier logits by {leak:.3g} (> {tol:.1g})"
    # Guard against a vacuous pass: the changed positions must respond.
    if float(diff[later].max(initial=0.0)) <= tol:
        return "the logits did not respond to the inputs at all"
    return ""


def padding_invariance(backend: TrainerBackend, examples: Sequence[Example], rng) -> str:
    """Rows alone vs padded together, junk in padded slots, zero padded logits, token-weighted loss."""
    pad_id = backend.config.pad_id
    batch = collate(examples, pad_id)
    with backend.inference():
        padded = backend.logits(batch)  # (B, T, V)
    tol = RESHAPED * _scale(padded)
    problems = []
    worst = 0.0
    for b, example in enumerate(examples):
        with backend.inference():
            alone = backend.logits(collate([example], pad_id))[0]  # (T_b, V)
        n = alone.shape[0]
        worst = max(worst, float(np.abs(padded[b, :n] - alone).max()))
    if worst > tol:
        problems.append(f"a row alone vs padded in a batch differs by {worst:.3g} (> {tol:.1g})")
    if float(np.abs(padded[~batch.valid]).max(initial=0.0)) != 0.0:
        problems.append("logits at padded positions are not exactly zero")
    junk = replace(
        batch,
        inputs=_perturb(batch.inputs, ~batch.valid, backend.config.vocab_size, rng),
        src=None
        if batch.src is None
        else _perturb(batch.src, ~batch.src_valid, backend.config.vocab_size, rng),
    )
    with backend.inference():
        moved = backend.logits(junk)
    shift = float(np.abs(moved - padded)[batch.valid].max())
    if shift > SAME_SHAPE * _scale(padded):
        problems.append(f"token ids in padded slots moved real logits by {shift:.3g}")
    # The loss must weigh tokens, not rows or padded slots.
    rows = [backend.loss(collate([e], pad_id)) for e in examples]
    counts = [collate([e], pad_id).n_scored for e in examples]
    expected = float(np.dot(rows, counts) / np.sum(counts))
    got = backend.loss(batch)
    if abs(got - expected) > RESHAPED * max(1.0, abs(expected)):
        problems.append(f"batch loss {got:.6g} != token-weighted mean of row losses {expected:.6g}")
    return "; ".join(problems)


def finite_gradients(
    backend: TrainerBackend, examples: Sequence[Example], rng, *, seed: int = 0
) -> str:
    """Finite loss and gradients on a heavily padded batch, and gradients blind to padded slots.

    The randomness (dropout) is reseeded before each backward, so with
    ``config.dropout > 0`` both see the same masks.
    """
    batch = collate(examples, backend.config.pad_id)
    backend.seed(seed)
    loss = backend.loss_and_grads(batch)
    if not np.isfinite(loss):
        return f"the loss is {loss}"
    grads = backend.gradients()  # raises, naming them, if some parameter got no gradient
    bad = [name for name, g in grads.items() if not np.isfinite(g).all()]
    if bad:
        return "non-finite gradients in " + ", ".join(bad)
    vocab = backend.config.vocab_size
    junk = replace(
        batch,
        inputs=_perturb(batch.inputs, ~batch.valid, vocab, rng),
        src=None if batch.src is None else _perturb(batch.src, ~batch.src_valid, vocab, rng),
    )
    backend.seed(seed)
    backend.loss_and_grads(junk)
    moved = backend.gradients()
    scale = max(max(float(np.abs(g).max()) for g in grads.values()), 1e-12)
    worst = max(float(np.abs(moved[n] - grads[n]).max()) for n in grads)
    if worst > SAME_SHAPE * scale:
        return f"token ids in padded slots changed the gradients by {worst:.3g} (scale {scale:.3g})"
    return ""


def cached_decoding(backend: TrainerBackend, examples: Sequence[Example]) -> str:
    """Greedy decoding with and without the KV cache must give the same tokens."""
    cached = greedy_outputs(backend, examples, len(examples), use_cache=True)
    uncached = greedy_outputs(backend, examples, len(examples), use_cache=False)
    differ = sum(a != b for a, b in zip(cached, uncached, strict=True))
    if differ:
        return f"{differ} of {len(examples)} sequences decode differently with the KV cache"
    return ""


def preflight_examples(task, seed: int, n: int = 6) -> list[Example]:
    """``n`` examples of spread-out lengths (shortest to longest), so the batch is padded."""
    pool = sorted(task.sample(64, seed, "preflight"), key=sequence_length)
    picks = np.linspace(0, len(pool) - 1, n).round().astype(int)
    return [pool[i] for i in picks]


def run_preflight(backend: TrainerBackend, task, *, seed: int = 0) -> list[Check]:
    """Check the four properties on ``backend``'s current model; never raises for a failure."""
    examples = preflight_examples(task, seed)
    rng = np.random.default_rng(seed)
    batch = collate(examples, backend.config.pad_id)
    runs: dict[str, Callable[[], str]] = {
        "future_token_independence": lambda: future_token_independence(backend, batch, rng),
        "padding_invariance": lambda: padding_invariance(backend, examples, rng),
        "finite_gradients": lambda: finite_gradients(backend, examples, rng, seed=seed),
        "cached_decoding": lambda: cached_decoding(backend, examples),
    }
    checks = []
    for name in PROPERTIES:
        try:
            problem = runs[name]()
        except Exception as exc:  # a crash inside a check is that property failing
            problem = f"{type(exc).__name__}: {exc}"
        checks.append(Check(name, not problem, problem or "ok"))
    return checks


def require(checks: Sequence[Check]) -> None:
    """Raise :class:`PreflightError` if any check failed."""
    if any(not c.ok for c in checks):
        raise PreflightError(checks)
