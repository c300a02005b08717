"""The ``speculative`` scenario: what speculative decoding buys on a CPU, measured beside its formula.

Level 3, SmolLM2-135M-Instruct in float32, one thread, every pass compiled: the
one-token decode step and the ``k + 1``-token verification (``prepare_decode(1, k + 1)``),
and the int8 and int4 copies' own decode steps. First the check's cost in steps for
``k + 1`` = 2..9 beside its limits (``check_cost.py``); then two tasks, greedy, each answer checked
token for token against plain decoding's before it is timed:

* ``grounded``: a prompt that holds a passage (two Python functions) and asks for it
  rewritten with one name changed (``examples/rewrite.txt``, the README's example): the
  answer copies the prompt, what the n-gram draft (prompt lookup) finds;
* ``chat``: an open question; nothing to copy.

For each draft (the n-gram lookup; the int8 and int4 copies of the model; its first
``LAYERS`` layers) and ``k``, one timed run after a warm-up, and what the formula of
``levels.common.speculative.speedup`` predicts from what the run measured: the
acceptance ``a`` (the tested guesses kept), the draft's cost ``c`` (its time a guess over
a decode step's) and the verification's (a pass's time, drafting left out, over a decode
step's). Times are the decode's: the prompt's pass, the same with and without a draft,
is timed apart and left out. The report's ratios put each draft's tokens/s over plain
decoding's; the records' notes hold ``a``, ``c``, the tokens a pass and both speed-ups.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from loading.threads import cpu_threads

from .check_cost import TOKENS, TOKENS_QUICK, check_cost_records
from .real_model import Compile
from .records import OK, WRONG, Record

# The grounded task's prompt: two Python functions to give back with one name changed. The
# checkout's file, which the README's example of --speculate ngram asks as well.
GROUNDED = Path(__file__).resolve().parents[1] / "examples" / "rewrite.txt"
CHAT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
NEW, NEW_QUICK = 192, 64  # tokens a run
KS, KS_QUICK = (2, 4, 8), (2,)  # the quick run: the commands' default
LAYERS = 10  # of SmolLM2's 30: the layer-skip draft
CONTEXT = 768


def speculative_compiles(quick: bool) -> tuple[Compile, ...]:
    """Every pass the scenario compiles where the cache lacks it: the decode step, the check
    of each ``k``'s guesses, and (the full run) the int8 and int4 copies' decode steps."""
    ks = KS_QUICK if quick else KS
    checks = sorted({k + 1 for k in ks} | set(TOKENS_QUICK if quick else TOKENS))
    steps = [Compile(CONTEXT, threads=1), *(Compile(CONTEXT, 1, tokens=T) for T in checks)]
    steps += [] if quick else [Compile(CONTEXT, 1, weights=fmt) for fmt in ("int8", "int4")]
    return tuple(steps)


def _loaded():
    """``(config, params, tokenizer, template)`` of the cached SmolLM2 file, float32."""
    import dataclasses

    from levels import gguf, unpacked

    from .real_model import _file

    path = _file()
    config, params = unpacked.load(path, dtype=np.float32)
    config = dataclasses.replace(config, max_seq_len=CONTEXT)
    return config, params, gguf.load_tokenizer(path), gguf.load_chat_template(path)


def _drafts(model, config, params, quick: bool) -> dict:
    """The drafts by name: n-gram lookup, the int8 and int4 copies (compiled as the target
    is), the first ``LAYERS`` layers."""
    import levels
    from engine import ModelDraft, commands_ngram

    L3 = levels.load("level3_sdpa_flash")
    drafts = {"ngram": commands_ngram()}
    for fmt in () if quick else ("int8", "int4"):
        copy = L3.DecoderOnlyTransformer(config, params, weights=fmt, compile=True)
        copy.prepare_decode(1)
        drafts[fmt] = ModelDraft(copy)
    if not quick:
        drafts[f"layers:{LAYERS}"] = ModelDraft(model.first_layers(LAYERS))
    return drafts


class _Timed:
    """A draft whose ``propose`` is timed: ``seconds`` in all, for ``guesses`` tokens."""

    def __init__(self, draft):
        self.draft, self.seconds, self.guesses = draft, 0.0, 0

    def propose(self, context, k, row=0, sampling=None):
        start = time.perf_counter()
        tokens, q = self.draft.propose(context, k, row=row, sampling=sampling)
        self.seconds += time.perf_counter() - start
        self.guesses += len(tokens)
        return tokens, q


def speculative_records(quick: bool) -> list[Record]:
    """The measurements above, as records: one per task, draft and ``k``."""
    from .real_model import MODEL, _file

    if _file() is None or not GROUNDED.is_file():
        why = f"{MODEL} is not cached: ladder pull {MODEL}" if _file() is None else (
            f"{GROUNDED} is missing: the prompt is a checkout's file")  # fmt: skip
        return [Record(level="level3:compiled", scenario="speculative", device="cpu",
                       dtype="float32", status=f"skipped: {why}")]  # fmt: skip
    import torch

    import levels
    from engine import Counts
    from levels.common.speculative import speedup
    from levels.level2_torch_manual.arrays import adopt

    config, params, tokenizer, template = _loaded()
    new, ks = (NEW_QUICK, KS_QUICK) if quick else (NEW, KS)
    records = []
    with cpu_threads(1), torch.no_grad():
        # As `ladder chat` builds it: the parameters are the loader's arrays (mapped from the
        # unpacked file), not copies, and so the weights a step streams are those it streams.
        with adopt():
            model = levels.load("level3_sdpa_flash").DecoderOnlyTransformer(
                config, params, compile=True
            )
        compiles = [model.prepare_decode(1).line()]
        checks = sorted({k + 1 for k in ks} | set(TOKENS_QUICK if quick else TOKENS))
        compiles += [model.prepare_decode(1, T).line() for T in checks]
        records += check_cost_records(model, config, compiles, quick)
        drafts = _drafts(model, config, params, quick)
        for task, text in {"grounded": GROUNDED.read_text(), "chat": CHAT}.items():
            prompt = template.render(
                [{"role": "user", "content": text}], add_generation_prompt=True
            )
            ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False).ids])
            model.generate(ids, 8)  # warm-up
            prompt_s = min(_timed(0.0, model.generate, ids, 1)[1] for _ in range(3))
            plain, plain_s = _timed(prompt_s, model.generate, ids, new)
            step_s = plain_s / (new - 1)  # a decode step's, on average over the run
            note = (
                f"the prompt's pass ({ids.shape[1]} tokens, {prompt_s:.2f} s) left out; "
                + "; ".join(compiles)
            )
            records.append(_record(task, "plain", None, new, plain_s, True, note))
            for name, draft in drafts.items():
                for k in ks:
                    model.generate(ids, 8, draft=draft, draft_tokens=k)  # warm-up
                    timed, counts = _Timed(draft), Counts()
                    got, seconds = _timed(prompt_s, model.generate, ids, new, draft=timed,
                                          draft_tokens=k, counts=counts)  # fmt: skip
                    a = counts.acceptance
                    c = timed.seconds / max(timed.guesses, 1) / step_s
                    verify = (seconds - timed.seconds) / counts.passes / step_s
                    predicted = speedup(a, k, c, verify) if np.isfinite(a) else float("nan")
                    tokens_a_pass = (new - 1) / counts.passes
                    figures = {"a": a, "c": c, "verification": verify,
                               "tokens_a_pass": tokens_a_pass, "passes": counts.passes,
                               "drafted": counts.drafted, "accepted": counts.accepted,
                               "measured": plain_s / seconds, "predicted": predicted}  # fmt: skip
                    note = (f"a = {a:.2f}, c = {c:.3f}, verification = {verify:.2f} steps, "
                            f"{tokens_a_pass:.2f} tokens a pass; speed-up "
                            f"{plain_s / seconds:.2f}x measured, {predicted:.2f}x predicted")  # fmt: skip
                    right = bool(torch.equal(got, plain))
                    records.append(_record(task, name, k, new, seconds, right, note, plain_s,
                                           figures))  # fmt: skip
    return records


def _timed(prompt_s: float, call, *args, **kwargs):
    """``call(*args, **kwargs)``'s result and its seconds past the prompt's pass
    (``prompt_s``): the decode's."""
    start = time.perf_counter()
    result = call(*args, **kwargs)
    return result, time.perf_counter() - start - prompt_s


def _record(task, draft, k, new, seconds, right, note, plain_s=None, figures=None) -> Record:
    """One run's record: ``seconds`` of decoding ``new - 1`` tokens after the first."""
    return Record(
        level="level3:compiled" if draft == "plain" else f"level3:compiled + {draft}",
        scenario="speculative plain" if draft == "plain" else "speculative",
        device="cpu", dtype="float32",
        shape={"task": task, **({} if k is None else {"k": k}), "new": new},
        status=OK if right else WRONG,
        median_s=seconds, q1_s=seconds, q3_s=seconds, min_s=seconds, max_s=seconds, repeats=1,
        tokens_per_s=(new - 1) / seconds,
        max_error=0.0 if right else 1.0, error_of="tokens != plain decoding", error_bound=0.0,
        description="SmolLM2, float32, 1 thread, greedy; every pass compiled",
        note=note if plain_s is None else f"{note} (plain: {(new - 1) / plain_s:.1f} tok/s)",
        figures=figures or {},
    )  # fmt: skip
