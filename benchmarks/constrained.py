"""What constrained decoding costs (``constrained/``), in the ``serve`` scenario group.

In this process, over SmolLM2's vocabulary (49,152 tokens), for each of the twenty
schemas of ``constrained.examples``:

* ``serve index``: the compile of the schema to its DFA, which is what a request waits
  for (the masks are computed as states are reached), and beside it the whole index,
  every state's mask computed up front, as engines that build it before decoding do;
* ``serve mask``: the steady-state cost a token pays, ``apply`` (the mask of its state,
  unpacked, and the logits outside it set to ``-inf``) and ``advance`` (its bytes through
  the DFA), over a walk of random allowed tokens through the language, timed once the
  walk's masks are cached; its note gives the cost of a state's first visit (the trie
  walk). The ``serve`` scenario's servers give the other side of the ratio: the compiled
  decode step's time per token (``serve step``), and the throughput of eight clients
  under eight schemas at once (``serve constrained``, ``serve.py``).

Each walk is checked before it is timed: every text it writes is a string of the
language (the timed loop is the checked one, repeated).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .measure import TimingPolicy, cpu_timer, measure
from .records import OK, WRONG, Record

WALK = 64  # tokens at most in a timed walk
STOPS = (0, 2)  # SmolLM2's <|endoftext|> and <|im_end|>
ONCE = TimingPolicy(warmup=1, min_repeat=1, max_repeat=3, min_time_s=0.0)


def _stats(stats) -> dict:
    return {"median_s": stats.median, "q1_s": stats.q1, "q3_s": stats.q3, "min_s": stats.min,
            "max_s": stats.max, "repeats": stats.n, "calls_per_sample": stats.number}  # fmt: skip


def constrained_records(path) -> list[Record]:
    """The index and mask records over the tokenizer of the GGUF file at ``path``."""
    from constrained import Index, Language, Tokens
    from constrained.examples import SCHEMAS
    from levels import gguf

    tokens = Tokens.from_tokenizer(gguf.load_tokenizer(path))
    shape = {"V": len(tokens)}
    records, per_token, first_visits = [], {}, []
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((1, len(tokens))).astype(np.float32)  # (1, V)
    for name, schema in SCHEMAS.items():
        compiled = measure(lambda s=schema: Language.schema(s), cpu_timer(), ONCE)
        language = Language.schema(schema)
        whole = measure(partial(_whole_index, language, tokens), cpu_timer(), ONCE)
        records.append(Record(
            level=name, scenario="serve index", device="cpu", dtype="-",
            shape=shape | {"states": language.dfa.states}, **_stats(compiled),
            description="the schema compiled to its DFA (masks computed as states are reached)",
            note=f"{language.dfa.states} states; every state's mask up front: {whole.median:.3f} s",
        ))  # fmt: skip
        index = Index(language, tokens, STOPS)
        path_, visits = _walk(index, rng)
        first_visits += visits
        right = language.accepts(b"".join(tokens.bytes[t] for t in path_ if t not in STOPS))
        stats = measure(partial(_replay, index, path_, logits), cpu_timer(), TimingPolicy())
        per_token[name] = (stats.median / len(path_), right)
    costs = np.array([c for c, _ in per_token.values()])
    slowest = max(per_token, key=lambda n: per_token[n][0])
    right = all(r for _, r in per_token.values())
    records.append(Record(
        level="constrained (apply + advance)", scenario="serve mask", device="cpu",
        dtype="float32", shape=shape | {"schemas": len(per_token)},
        status=OK if right else WRONG, median_s=float(np.median(costs)),
        q1_s=float(np.percentile(costs, 25)), q3_s=float(np.percentile(costs, 75)),
        min_s=float(costs.min()), max_s=float(costs.max()), repeats=len(costs),
        max_error=0.0 if right else 1.0, error_of="walks outside their language", error_bound=0.0,
        description="per token, its state's mask cached: the median over the 20 schemas' walks",
        note=(f"slowest {slowest} {costs.max() * 1e6:.0f} us; a state's first visit (the trie "
              f"walk) median {np.median(first_visits) * 1e3:.2f} ms, max "
              f"{np.max(first_visits) * 1e3:.1f} ms over {len(first_visits)} states"),
    ))  # fmt: skip
    return records


def _whole_index(language, tokens) -> None:
    """Every state's mask, from a fresh index (nothing cached)."""
    from constrained import Index

    Index(language, tokens, STOPS).build()


def _walk(index, rng) -> tuple[list[int], list[float]]:
    """A walk of random allowed tokens (until an end-of-turn id or ``WALK`` tokens) -> the
    tokens, and the seconds each new state's first mask took."""
    import time

    constraint, path, visits, seen = index.constraint(), [], [], set()
    for _ in range(WALK):
        start = time.perf_counter()
        allowed = constraint.allowed()
        if constraint.state not in seen:
            seen.add(constraint.state)
            visits.append(time.perf_counter() - start)
        token = int(rng.choice(np.flatnonzero(allowed)))
        path.append(token)
        if token in STOPS:
            break
        constraint.advance(token)
    return path, visits


def _replay(index, path: list[int], logits) -> None:
    """What a request's tokens pay along ``path``: the mask applied, the token taken."""
    constraint = index.constraint()
    for token in path:
        constraint.apply(logits)
        if token not in STOPS:
            constraint.advance(token)
