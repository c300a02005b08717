"""Held-out metrics: how well a model does, teacher-forced and free-running.

* ``heldout_loss``: the masked cross-entropy, averaged over every scored
  held-out token (not over batches, so batch boundaries do not matter);
* ``token_accuracy``: teacher-forced, the fraction of scored tokens whose
  argmax is the target;
* ``teacher_forced_exact``: the fraction of sequences with *every* scored
  token right under teacher forcing;
* ``greedy_exact``: the fraction of sequences the model reproduces exactly
  when it runs free (greedy, with the KV cache): it feeds back its own
  predictions, so one early mistake is never corrected by the reference.
  This is the number that says the task is solved.

For seq2seq, free-running output must match the target up to and including
its EOS (generation stops at EOS, so a premature EOS is a miss). For the cycle
task the model is given each prompt and must produce the continuation;
prompts of equal length are generated together, because generation takes
every prefix token as real (no left padding).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence

import numpy as np

from levels.common.bucketing import pad_batch
from levels.common.tasks import DecoderOnlyExample, Seq2SeqExample

from .backend import TrainerBackend
from .data import Example, fixed_batches


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax, max-subtracted so exp never overflows; float64 for the sums."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def teacher_forced(
    backend: TrainerBackend, examples: Sequence[Example], batch_size: int
) -> dict[str, float]:
    """``heldout_loss``, ``token_accuracy`` and ``teacher_forced_exact`` over ``examples``."""
    nll = correct = scored = exact = rows = 0.0
    with backend.inference():
        for batch in fixed_batches(examples, batch_size, backend.config.pad_id):
            logp = _log_softmax(backend.logits(batch))  # (B, T, V)
            target_logp = np.take_along_axis(logp, batch.targets[..., None], axis=-1)[..., 0]
            hit = (logp.argmax(axis=-1) == batch.targets) & batch.scored  # (B, T)
            nll -= float(target_logp[batch.scored].sum())
            correct += float(hit.sum())
            scored += float(batch.scored.sum())
            # A row is exact when no scored position misses.
            exact += float((hit == batch.scored).all(axis=1).sum())
            rows += batch.inputs.shape[0]
    return {
        "heldout_loss": nll / scored,
        "token_accuracy": correct / scored,
        "teacher_forced_exact": exact / rows,
    }


def greedy_outputs(
    backend: TrainerBackend, examples: Sequence[Example], batch_size: int, *, use_cache: bool
) -> list[tuple[int, ...]]:
    """Free-running greedy output for every example, in order (for the cycle task:
    the continuation after the prompt; for seq2seq: the tokens after BOS)."""
    outputs: list[tuple[int, ...] | None] = [None] * len(examples)
    with backend.inference():
        if isinstance(examples[0], Seq2SeqExample):
            groups = _chunks(list(range(len(examples))), batch_size)
        else:
            by_prompt: dict[int, list[int]] = defaultdict(list)
            for i, e in enumerate(examples):
                by_prompt[e.prompt_len].append(i)
            groups = [c for ids in by_prompt.values() for c in _chunks(ids, batch_size)]
        for ids in groups:
            chunk = [examples[i] for i in ids]
            for i, out in zip(ids, _generate(backend, chunk, use_cache=use_cache), strict=True):
                outputs[i] = out
    return outputs  # type: ignore[return-value]


def _chunks(ids: list[int], size: int) -> list[list[int]]:
    return [ids[i : i + size] for i in range(0, len(ids), size)]


def _generate(
    backend: TrainerBackend, chunk: Sequence[Example], *, use_cache: bool
) -> list[tuple[int, ...]]:
    pad_id = backend.config.pad_id
    if isinstance(chunk[0], Seq2SeqExample):
        src, src_valid = pad_batch([e.src for e in chunk], pad_id)  # (B, S)
        longest = max(len(e.scored) for e in chunk)
        out = backend.to_numpy(
            backend.model.generate(
                backend.to_native(src),
                src_valid=backend.to_native(src_valid),
                max_new_tokens=longest,
                use_cache=use_cache,
            )
        )  # (B, 1 + n)
        return [tuple(int(t) for t in row[1:]) for row in out]
    assert all(isinstance(e, DecoderOnlyExample) for e in chunk)
    P = chunk[0].prompt_len
    prefix = np.array([e.tokens[:P] for e in chunk], dtype=np.int64)  # (B, P)
    longest = max(len(e.scored) for e in chunk)
    out = backend.to_numpy(
        backend.model.generate(backend.to_native(prefix), longest, use_cache=use_cache)
    )  # (B, P + longest)
    return [tuple(int(t) for t in row[P:]) for row in out]


def is_exact(example: Example, output: Sequence[int]) -> bool:
    """Whether a free-running ``output`` reproduces the example's scored tokens."""
    want = example.scored
    return tuple(output[: len(want)]) == tuple(want)


def evaluate(
    backend: TrainerBackend,
    examples: Sequence[Example],
    batch_size: int,
    *,
    seen: Collection[Example] = frozenset(),
) -> dict[str, float]:
    """Every held-out metric of the module docstring.

    ``greedy_exact_unseen`` repeats ``greedy_exact`` over the examples not in
    ``seen`` (the training set): independent draws of short strings collide,
    and a model could reproduce those from memory.
    """
    metrics = teacher_forced(backend, examples, batch_size)
    outputs = greedy_outputs(backend, examples, batch_size, use_cache=True)
    hits = [is_exact(e, o) for e, o in zip(examples, outputs, strict=True)]
    metrics["greedy_exact"] = sum(hits) / len(hits)
    unseen = [hit for e, hit in zip(examples, hits, strict=True) if e not in seen]
    metrics["greedy_exact_unseen"] = sum(unseen) / len(unseen) if unseen else float("nan")
    return metrics
