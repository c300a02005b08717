"""The stages of a learner's rung, in the course's order: what each asks for, where.

A stage is one idea of the course that a learner writes as code: a function or the method
of a class, in one file of the rung. Its tests are tests of the shared suite, marked
``@pytest.mark.stage(name)``; the suite runs them on a rung in this order, so that the
first stage the report calls wrong is the one to fix first. ``entries`` are the names the
stage writes, as attributes of the rung's package (``"KVCache.update"``): how the suite
tells a stage not written (its own stub raised ``NotImplementedError``) from one that waits
for another, and one of the learner's from one taken from level 1.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """One stage of a rung: its name (the tests' marker), how the report prints it, the
    file of the rung it is written in, the names it writes, what to write in one line,
    and the chapter that teaches it."""

    name: str
    title: str
    file: str | None  # None: nothing to write (the real model runs on the rest)
    entries: tuple[str, ...]
    what: str
    chapter: str

    def not_written(self) -> str:
        """The one line a stub of this stage raises, and the report prints."""
        return f"{self.title}: not written yet: {self.what} ({self.chapter})"


STAGES: tuple[Stage, ...] = (
    Stage(
        "attention",
        "attention",
        "attention.py",
        ("attention",),
        "attention(q, k, v, *, causal, mask, scale): softmax(q k^T * scale) v over the keys a "
        "query may see, bottom-right causal, key heads shared in groups",
        "docs/level0_loops.md#attention-grown-one-idea-at-a-time",
    ),
    Stage(
        "softmax",
        "softmax's numerics",
        "softmax.py",
        ("softmax",),
        "softmax(scores) over the last axis: subtract each row's max, -inf weighs exactly 0; "
        "attention refuses a row with no key (ValueError)",
        "docs/level0_loops.md#the-softmax-and-why-it-subtracts-the-maximum",
    ),
    Stage(
        "rope",
        "RoPE",
        "rope.py",
        ("rope",),
        "rope(x, positions, base): turn each adjacent pair of features (a, b) by "
        "pos * base^(-2i/Dh)",
        "docs/prelude.md#positions-rotary-embeddings",
    ),
    Stage(
        "norms",
        "LayerNorm and RMSNorm",
        "norms.py",
        ("layer_norm", "rms_norm"),
        "layer_norm and rms_norm over the last axis, eps inside the square root",
        "docs/prelude.md#the-block-a-residual-stream-normalised-on-the-way-in",
    ),
    Stage(
        "block",
        "the block",
        "block.py",
        ("MultiHeadAttention.__call__", "EncoderLayer.__call__"),
        "MultiHeadAttention (project, split the heads, RoPE, attend, merge) and the pre-norm "
        "block x + attn(norm1(x)), then x + ffn(norm2(x))",
        "docs/prelude.md#the-block-a-residual-stream-normalised-on-the-way-in",
    ),
    Stage(
        "cache",
        "the KV cache",
        "cache.py",
        ("KVCache.extend", "KVCache.update"),
        "KVCache.extend(positions) and update(index, k, v): append the new slots, return all",
        "docs/level0_loops.md#one-architecture-any-arithmetic",
    ),
    Stage(
        "decoder",
        "the decoder",
        "model.py",
        ("DecoderOnlyTransformer.transformer",),
        "transformer(ids, positions, cache, last): embed, the blocks under what each query "
        "may see, the final norm, the logits",
        "docs/prelude.md#the-head-from-the-stream-to-logits",
    ),
    Stage(
        "real-model",
        "the real model",
        None,
        (),
        "SmolLM2 greedy on your rung, token for token as level 1's",
        "docs/your_rung.md#the-real-model",
    ),
)

BY_NAME = {stage.name: stage for stage in STAGES}


def stage(name: str) -> Stage:
    """The stage called ``name``; ``ValueError`` naming the stages otherwise."""
    if name not in BY_NAME:
        raise ValueError(f"unknown stage {name!r}; the stages are {', '.join(BY_NAME)}")
    return BY_NAME[name]


def stage_names(text: str) -> tuple[str, ...]:
    """A comma-separated list of stages (``"rope,norms"``; ``"all"``: every stage a learner
    writes), checked, in the course's order."""
    written = [s.name for s in STAGES if s.file]
    if text.strip() == "all":
        return tuple(written)
    names = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(names - set(written))
    if unknown or not names:
        raise ValueError(
            f"unknown stage {', '.join(map(repr, unknown)) or repr(text)}; choose from "
            f"{', '.join(written)}, or all"
        )
    return tuple(name for name in written if name in names)
