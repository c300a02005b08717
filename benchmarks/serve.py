"""The ``serve`` scenario: ``ladder serve`` under load, timed from outside, as its clients see it.

Two servers (level 3, SmolLM2, float32, one thread) on 127.0.0.1 and a free port,
started and stopped here, one after the other: ``--max-batch 1 --compile`` (one
request at a time, the compiled decode step) and ``--max-batch 8`` (continuous
batching, a batch decoded eagerly, its matrices in oneDNN's layout for a few rows:
serve's default, ``--weights blocked``). Every request of the timed runs is greedy, and its
answer is checked against the same request asked alone first, on the same server:

* ``clients=1`` (both servers) and ``clients=8`` (the batching one): eight requests of
  ``NEW`` tokens (16 with ``--quick``), one after the other, then all at once: the tokens per second of the
  whole, and each request's wait and time to its first token (the server's own
  ``timings``). Their ratios are what batching requests together buys;
* ``arrivals``: ``ARRIVALS`` requests (10 with ``--quick``) arriving at random (a
  Poisson process at ``RATE`` a second), each to be answered: none lost;
* ``shared prefix``: ``PREFIXED`` requests behind one system prompt of about 200 tokens,
  one after the other: the prompt tokens each one's prefill computed (``prompt_tokens -
  cached_tokens``) and its time to the first token, the first request against the rest;
* ``serve constrained``: the eight requests of ``clients=8`` again, all at once, without a
  schema, each under one of eight (``response_format``; ``constrained.examples``), and
  all under one long string's (``LONG``), in turn ``ROUNDS`` times: the throughputs;
* ``serve step``: the compiled server's time per output token (the median of its answers'
  ``timings``), which a token's mask (``serve mask``, ``constrained.py``) is set against.
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
import urllib.request

import numpy as np

from serving.launch import serving

from .constrained import constrained_records
from .real_model import Compile
from .records import FIGURE, OK, WRONG, Record
from .startup import CHAT_CONTEXT

NEW, NEW_QUICK = 32, 16  # tokens per request of the throughput runs (--quick: 16)
ARRIVALS, ARRIVALS_QUICK, ARRIVAL_NEW = 200, 10, 8
RATE = 4.0  # arrivals per second, on average
ROUNDS = 3  # eight at once without schemas, then with, taken in turn this many times
PREFIXED = 5  # requests behind one system prompt: the first computes it, the others find it
SYSTEM = (
    "You are a careful assistant for a museum of natural history. Answer in one short "
    "sentence, name the gallery where the visitor can see what they ask about, and never "
    "invent an exhibit: the galleries are Dinosaurs, Minerals, Oceans, Birds, Insects, "
    "Human Origins and Meteorites. "
) * 3  # about 200 tokens with the template's
COMMON = ("--threads", "1", "--level", "3", "--max-queue", "1000")  # both servers'
BATCHED = "ladder serve --max-batch 8"
COMPILED = "ladder serve --max-batch 1 --compile"


# The schemas of the constrained run, one per client: those of nested objects and arrays.
CONSTRAINED = ("person", "tags", "point", "optional properties", "nested", "references",
               "product", "log")  # fmt: skip


# A schema whose answers all run their NEW tokens: one long string, every character a step.
LONG = {"type": "object", "properties": {"answer": {"type": "string", "minLength": 160,
        "maxLength": 320}}, "required": ["answer"]}  # fmt: skip


def _ask(base: str, messages: list[dict], new: int, response_format: dict | None = None) -> dict:
    body = {"messages": messages, "temperature": 0, "max_tokens": new}
    if response_format is not None:
        body["response_format"] = response_format
    request = urllib.request.Request(
        f"{base}/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.load(r)


def _question(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Tell me one fact about the number {i}."}]


def _together(base: str, jobs: list, start_at: list[float] | None = None) -> tuple[float, list]:
    """Every job ``(messages, new)`` on its own thread (at ``start_at`` seconds, if given);
    -> the seconds until the last answer, and the answers (None where one failed)."""
    answers: list = [None] * len(jobs)

    def one(i: int) -> None:
        if start_at is not None:
            time.sleep(max(0.0, start_at[i] - (time.perf_counter() - begin)))
        with contextlib.suppress(OSError, ValueError):
            answers[i] = _ask(base, *jobs[i])

    begin = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - begin, answers


def _waits(answers: list) -> np.ndarray:
    """Each answer's wait in the queue plus its time to the first token, seconds."""
    return np.array(
        [a["timings"]["queued_s"] + a["timings"]["time_to_first_token_s"] for a in answers if a]
    )


def _once(seconds: float) -> dict:
    """The statistics of one sample: a load run is timed once, as a whole."""
    return {"median_s": seconds, "q1_s": seconds, "q3_s": seconds, "min_s": seconds,
            "max_s": seconds, "repeats": 1}  # fmt: skip


def _record(
    level: str,
    clients: int,
    seconds: float,
    answers: list,
    alone: list,
    scenario="serve",
    **shape,
) -> Record:
    tokens = sum(a["usage"]["completion_tokens"] for a in answers if a)
    right = all(
        a and a["choices"][0]["message"]["content"] == b
        for a, b in zip(answers, alone, strict=True)
    )
    waits = _waits(answers)
    per_request = [  # tokens/s of a request's decode: 1 / its mean time per token after the first
        1 / a["timings"]["time_per_output_token_s"]
        for a in answers
        if a and a["usage"]["completion_tokens"] > 1
    ]
    return Record(
        level=level,
        scenario=scenario,
        device="cpu",
        dtype="float32",
        shape={"clients": clients, "requests": len(answers), **shape},
        status=OK if right else WRONG,
        **_once(seconds),
        tokens_per_s=tokens / seconds,
        max_error=0.0 if right else 1.0,
        error_of="answers != alone",
        error_bound=0.0,
        description="level 3, SmolLM2, float32, 1 thread"
        + (
            ", its decode step compiled"
            if level == COMPILED
            else ", a batch decoded eagerly (serve's default weights: blocked, where oneDNN runs)"
        ),
        note=(
            f"wait + first token p50 {np.percentile(waits, 50):.2f} s, p99 "
            f"{np.percentile(waits, 99):.2f} s; decode {np.median(per_request):.1f} tok/s a request"
        ),
    )


def _one_after_another(base: str, level: str, jobs: list) -> tuple[list[str], Record]:
    """Each job asked once untimed (the answers every later one is held to), then all of them
    one after the other, timed -> ``(answers alone, the record)``."""
    alone = [_ask(base, *job)["choices"][0]["message"]["content"] for job in jobs]
    begin = time.perf_counter()
    answers = [_ask(base, *job) for job in jobs]
    new = jobs[0][1]
    return alone, _record(level, 1, time.perf_counter() - begin, answers, alone, new=new)


def serve_compiles(quick: bool) -> tuple[Compile, ...]:
    """What ``ladder serve --max-batch 1 --compile`` compiles before it answers, where the
    cache lacks it: the decode step ``ladder chat`` compiles (the same key)."""
    return (Compile(CHAT_CONTEXT, threads=1),)


def serve_records(quick: bool) -> list[Record]:
    """The measurements above, from the two servers."""
    from .real_model import MODEL, _file

    if _file() is None:
        return [Record(level="ladder serve", scenario="serve", device="cpu", dtype="float32",
                       status=f"skipped: {MODEL} is not cached: ladder pull {MODEL}")]  # fmt: skip
    n_arrivals = ARRIVALS_QUICK if quick else ARRIVALS
    new = NEW_QUICK if quick else NEW
    rng = random.Random(0)
    jobs = [(_question(i), new) for i in range(8)]
    with serving(*COMMON, "--max-batch", "1", "--compile") as base:
        records = [_one_after_another(base, COMPILED, jobs)[1]]
        records.append(_step_record([_ask(base, *job) for job in jobs]))
    records += constrained_records(_file())
    with serving(*COMMON, "--max-batch", "8") as base:
        alone, record = _one_after_another(base, BATCHED, jobs)
        records.append(record)
        seconds, answers = _together(base, jobs)
        records.append(_record(BATCHED, 8, seconds, answers, alone, new=new))
        records += _constrained_records(base, jobs, alone)
        arrivals = [(_question(100 + i), ARRIVAL_NEW) for i in range(n_arrivals)]
        times = np.cumsum([rng.expovariate(RATE) for _ in arrivals]).tolist()
        seconds, answers = _together(base, arrivals, start_at=times)
        answered = sum(
            a is not None and a["choices"][0]["finish_reason"] in ("stop", "length")
            for a in answers
        )
        waits = _waits(answers)
        records.append(
            Record(
                level=BATCHED, scenario="serve arrivals", device="cpu", dtype="float32",
                shape={"requests": n_arrivals, "new": ARRIVAL_NEW},
                status=OK if answered == n_arrivals else WRONG,
                **_once(seconds),
                tokens_per_s=sum(a["usage"]["completion_tokens"] for a in answers if a) / seconds,
                max_error=float(n_arrivals - answered), error_of="requests not answered",
                error_bound=0.0,
                note=(f"{answered} of {n_arrivals} answered, arriving at {RATE:g}/s; wait + first "
                      f"token p50 {np.percentile(waits, 50):.2f} s, p99 {np.percentile(waits, 99):.2f} s"),
            )
        )  # fmt: skip
        shared = [[{"role": "system", "content": SYSTEM}, *_question(i)] for i in range(PREFIXED)]
        answers = [_ask(base, m, 1) for m in shared]
    records.append(_prefix_record(answers))
    return records


def _constrained_records(base: str, jobs: list, alone: list[str]) -> list[Record]:
    """The eight jobs at once three ways, in turn ``ROUNDS`` times (on a shared machine the
    load drifts within seconds; taken in turn, the three see the same drift), each held to
    its answers alone: without a schema (``schemas=0``), each under one of ``CONSTRAINED``
    (``schemas=8``; their answers end sooner, so each request's prefill weighs more in the
    tokens/s), and all under ``LONG`` (``schemas=1``: a string of at least 160 characters,
    so every answer runs its tokens, as the unconstrained ones do, and nearly every
    token reaches a state no request has reached: its mask is a trie walk, then cached).
    -> the round of median tokens/s of each way."""
    from constrained.examples import SCHEMAS

    def under(name: str, schema: dict) -> dict:
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}

    ways = {0: jobs, 8: [(*job, under(n.replace(" ", "_"), SCHEMAS[n]))
                         for job, n in zip(jobs, CONSTRAINED, strict=True)],
            1: [(*job, under("long", LONG)) for job in jobs]}  # fmt: skip
    held = {k: alone if k == 0 else [_ask(base, *job)["choices"][0]["message"]["content"]
                                      for job in batch] for k, batch in ways.items()}  # fmt: skip
    rounds: dict[int, list[Record]] = {k: [] for k in ways}
    for _ in range(ROUNDS):
        for schemas, batch in ways.items():
            seconds, answers = _together(base, batch)
            rounds[schemas].append(_record(BATCHED, 8, seconds, answers, held[schemas],
                                           scenario="serve constrained", new=jobs[0][1],
                                           schemas=schemas))  # fmt: skip
    records = []
    for runs in rounds.values():
        runs.sort(key=lambda r: r.tokens_per_s)
        record = runs[len(runs) // 2]
        record.note += (
            f"; the median of {ROUNDS} rounds, in turn with the others: "
            + ", ".join(f"{r.tokens_per_s:.1f}" for r in runs)
            + " tok/s"
        )
        if any(r.status != OK for r in runs):
            record.status = WRONG
        records.append(record)
    return records


def _step_record(answers: list[dict]) -> Record:
    """The compiled server's time per output token: the median over its answers."""
    steps = np.array([a["timings"]["time_per_output_token_s"] for a in answers])
    return Record(
        level=COMPILED, scenario="serve step", device="cpu", dtype="float32",
        shape={"requests": len(answers), "new": NEW}, median_s=float(np.median(steps)),
        q1_s=float(np.percentile(steps, 25)), q3_s=float(np.percentile(steps, 75)),
        min_s=float(steps.min()), max_s=float(steps.max()), repeats=len(steps),
        tokens_per_s=float(1 / np.median(steps)),
        description="level 3, SmolLM2, float32, 1 thread, its decode step compiled: a token's "
        "time after the first, the median of eight answers' timings",
    )  # fmt: skip


def _prefix_record(answers: list[dict]) -> Record:
    """What the prefix cache saved the requests behind one system prompt after the first:
    the prompt tokens each computed (``prompt_tokens - cached_tokens``), and its time to
    the first token, against the first request's, which computed the whole prompt."""
    usages = [a["usage"] for a in answers]
    computed = [u["prompt_tokens"] - u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    first = [a["timings"]["time_to_first_token_s"] for a in answers]
    prompt = float(np.mean([u["prompt_tokens"] for u in usages[1:]]))
    later = float(np.mean(computed[1:]))
    return Record(
        level=BATCHED, scenario="serve prefix", device="cpu", dtype="float32",
        shape={"requests": len(usages), "prompt": round(prompt)}, status=FIGURE,
        tokens_per_s=None, max_error=None,
        note=(f"the first request prefilled {computed[0]} of {usages[0]['prompt_tokens']} prompt "
              f"tokens (first token {first[0]:.2f} s); the {len(usages) - 1} after it "
              f"{later:.0f} of {prompt:.0f} each (first token {np.median(first[1:]):.2f} s): "
              f"the prefix cache cut their prefill {prompt / later:.1f}x"),
    )  # fmt: skip
