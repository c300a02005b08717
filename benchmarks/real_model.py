"""The real-model scenarios: SmolLM2-135M-Instruct's prompt and decode, per level and weight format.

What a user of ``ladder chat`` waits for, measured the harness's way (checked
first, then timed, with the read-only stream of the same run as the ceiling):

* ``real prompt <format>``: the prefill of a 37-token chat prompt (the model's
  own template over one question): tokens/s counts prompt tokens;
* ``real prefill float32``: the prefill of a long prompt (``LONG_PROMPTS``: 256, 1024
  and 2048 random tokens, the same at every level), one thread, the logits of its last
  token only (``prefill(last_only=True)``; ``transformers``' ``logits_to_keep=1``): what
  the attention cores' fast paths are for, level 3 (and level 4 on a GPU) against
  ``transformers``;
* ``real decode <format>``: 16 decode steps from that prompt's cache, greedy,
  each one position against the cache (``cache.rewind`` returns it to the
  prompt before every timed call, so no call pays for a prefill): tokens/s
  counts new tokens, and GB/s the bytes a step reads (every weight in its
  format, and the cache), the figure gpt-fast prints as "bandwidth achieved".

``<format>`` is how the weights are held: ``float32``, ``bfloat16`` (level 3,
and level 4 on a GPU), ``float16`` (on a GPU only), ``int8`` or ``int4``
(level 3's weight-only formats, ``levels/level3_sdpa_flash/quant.py``).
``threads`` is 1 and every core: decode is bound by one core's share of memory
bandwidth, prefill by arithmetic, and they scale differently. Level 3 with its
decode step compiled (``level3:compiled``, ``compile=True``) joins the decode
scenarios; its compile (or its load from the cache) happens when the case is
built, untimed, and its note says which.

``transformers`` joins as a peer on the same file (``from_pretrained(...,
gguf_file=...)``, dequantized, SDPA attention): its ``generate``, greedy, from a cache of
the prompt cropped the same way (``DynamicCache.crop``), and its forward for the prompts.

Every case is checked against the float64 reference of the same file (level
1 in float64, the logits of the step after the prompt) before it is timed.
The file must be in the cache: a run without it reports the scenarios as
unsupported, with the command that pulls it.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from loading.slow import (
    INTERPRETED_SECONDS_PER_LAYER,
    LEVEL0_SECONDS_PER_MAC,
)
from loading.threads import at_this_load, cpu_threads

from .reference import Case, Reference, scaled_error
from .subjects import Subject

MODEL = "smollm2-135m"
QUESTION = "What is the capital of France?"
NEW_TOKENS = 16
CONTEXT = 128  # positions of the KV cache: the prompt and the new tokens, with room
LONG_PROMPTS = (256, 1024, 2048)  # the long prompts' tokens (random ids, seed 0)
FORMATS = ("float32", "bfloat16", "float16", "int8", "int4")
# scaled_error (max |x - ref| / max |ref|, logits up to ~40) bounds per weight format: the
# float32 levels measure ~3e-6; bfloat16 weights and activations ~1e-2 (eps 7.8e-3 through
# 30 layers); int8 weights (half a step of a row's 127-step grid each) with bfloat16
# activations ~2e-2. Five times those leaves room for other machines; a wrong layer
# (a transposed weight, a dropped norm) costs more than 0.3. float16 (eps 9.8e-4, eight
# times finer than bfloat16's, and SmolLM2's activations well inside its range) is held
# to bfloat16's bound. int4 (16 steps a group of 32) measures ~0.1; 0.25 leaves room
# and stays under what a wrong layer costs.
BOUNDS = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 5e-2, "int8": 1e-1, "int4": 2.5e-1}
DTYPE_OF = {
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
    "int8": "float32",
    "int4": "float32",
}
QUANTIZED = ("int8", "int4")
PARAMS = 134.5e6  # SmolLM2-135M's weights: a multiply-add each per token
LAYERS = 30  # SmolLM2-135M's (the slow rungs' costs are loading.slow's, as chat says them)
GROUP = 32  # the int4 groups (levels/level3_sdpa_flash/quant.py's default)
FAST_PATHS = ("level3_sdpa_flash", "level4_triton_kernel")  # where the long prompts run


@dataclass(frozen=True)
class Compile:
    """A compiled pass of the cached model that a step of a run needs (level 3, float32, on a
    CPU): its decode step (``tokens`` 1) or its check of ``tokens - 1`` guesses, for a KV
    cache of ``context`` positions, on ``threads`` threads, its weights in ``weights``. The
    step compiles it (about a minute here) or loads it from the user's cache (a second); the
    command announces the compiles before the step that makes them."""

    context: int
    threads: int
    tokens: int = 1
    weights: str = "float"

    def key_of(self):
        """What the compiled cache's key reads of a model (its config, dtype and weights'
        format: ``levels.level3_sdpa_flash.compiled.cache_key``), to find the file without
        building the model."""
        import types

        import torch

        from levels import gguf

        config = gguf.config_of(_file(), max_seq_len=self.context)
        return types.SimpleNamespace(config=config, dtype=torch.float32, weights=self.weights)


@cache
def _file():
    from levels import registry

    return registry.cached(MODEL)


@cache
def _loaded(dtype: str, length: int = 0):
    """``(config, params, prompt ids)`` of the cached file, params in ``dtype``: the chat
    prompt in a context of ``CONTEXT``, or ``length`` random ids in a context as long."""
    from levels import gguf

    path = _file()
    context = max(CONTEXT, length)
    config, params = gguf.load(path, max_seq_len=context, dtype=np.dtype(dtype))
    if length:
        ids = np.random.default_rng(0).integers(0, config.vocab_size, size=length).tolist()
        return config, params, tuple(ids)
    template, tokenizer = gguf.load_chat_template(path), gguf.load_tokenizer(path)
    text = template.render([{"role": "user", "content": QUESTION}], add_generation_prompt=True)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return config, params, tuple(ids)


@cache
def _truth(length: int = 0) -> np.ndarray:
    """The float64 logits ``(V,)`` of the step after the prompt: the chat prompt's (level 1,
    float64), or the long prompt's of ``length`` tokens (level 2 in float64, its attention
    written out: level 1's numpy took five minutes at 2048 tokens on this two-core
    machine, busy)."""
    import levels

    config, params, ids = _loaded("float64", length)
    if not length:
        model = levels.load("level1_numpy").DecoderOnlyTransformer(config, params)
        return np.asarray(model.prefill(np.array([ids]), last_only=True)[0][0])
    import torch

    level2 = levels.load("level2_torch_manual")
    model = level2.DecoderOnlyTransformer(config, params, dtype=torch.float64)
    with torch.no_grad():
        logits = model.prefill(torch.tensor([ids]), last_only=True)[0]  # (1, V)
    return level2.to_numpy(logits)[0]


def weight_bytes(params: dict[str, np.ndarray], fmt: str) -> float:
    """What one decode step reads of the weights: every parameter once (a tied embedding
    once, as the head; the gather of one row of it is negligible), in ``fmt``. The
    quantized formats count what their kernels read: int8 a byte a weight and a bfloat16
    scale a row; int4 half a byte a weight and a bfloat16 scale and zero a group of 32,
    in rows padded to a multiple of 16 (the CPU kernel's). Norms and biases stay float32."""
    total = 0.0
    for value in params.values():
        if value.ndim != 2 or fmt not in QUANTIZED:
            total += value.size * {"bfloat16": 2, "float16": 2}.get(fmt, 4)
            continue
        rows, cols = value.shape
        if fmt == "int8":
            total += rows * cols + rows * 2
        else:
            padded = -(-rows // 16) * 16
            total += padded * cols / 2 + padded * (cols // GROUP) * 4
    return total


@dataclass(frozen=True)
class RealModel:
    """``phase`` ``"prompt"`` or ``"decode"`` of the real model, weights in ``fmt``; or
    ``"prefill"``, a long prompt of ``length`` tokens."""

    phase: str
    fmt: str
    threads: int
    length: int = 0  # the long prompt's tokens ("prefill"); 0: the chat prompt

    @property
    def scenario(self) -> str:
        return f"real {self.phase} {self.fmt}"

    @property
    def prompt(self) -> int:
        """The prompt's tokens: the long prompt's, or the chat prompt's 37."""
        return self.length or 37

    def shape(self) -> dict[str, int]:
        return {
            "P": self.prompt,
            "new": NEW_TOKENS if self.phase == "decode" else 0,
            "threads": self.threads,
        }

    def flops(self) -> float:
        per_token = 2.0 * PARAMS  # a multiply-add per weight and token
        return per_token * self.tokens()

    def tokens(self) -> int:
        return NEW_TOKENS if self.phase == "decode" else self.prompt

    def unsupported(self, subject: Subject) -> str | None:
        if _file() is None:
            return f"{MODEL} is not cached: ladder pull {MODEL}"
        if subject.name == "transformers":
            return None if self.fmt == "float32" else "float32 only (its CPU matmuls)"
        if self.length and subject.name not in FAST_PATHS:
            return "the long prompts measure the attention cores' fast paths (levels 3 and 4)"
        if not subject.models:
            return "attention only"
        if subject.kind == "python":
            seconds = at_this_load(PARAMS * LEVEL0_SECONDS_PER_MAC)
            return f"about {seconds:.0f} s a token (ladder chat --level 0 runs it)"
        if subject.interpreted:
            seconds = at_this_load(LAYERS * INTERPRETED_SECONDS_PER_LAYER)
            return (
                f"about {seconds:.0f} s a token in Triton's interpreter "
                "(ladder chat --level 4 runs it)"
            )
        if self.fmt in QUANTIZED and not subject.name.startswith("level3"):
            return "level 3's weight format"
        if self.fmt == "float16" and subject.device == "cpu":
            return "a GPU format (PyTorch's CPU float16 products are no decode path)"
        if DTYPE_OF[self.fmt] not in subject.dtypes:
            return f"no {self.fmt} at this level"
        return None

    def record_dtype(self, subject: Subject, dtype: str) -> str:
        """What the table's dtype column says: the weights' format, or what the level computes
        in where it computes in one dtype only (level 0's float64, whatever the file holds)."""
        return subject.effective_dtype(self.fmt)

    def compiles(self, subject: Subject) -> tuple[Compile, ...]:
        """The compiled pass this case needs: ``level3:compiled``'s decode step on a CPU."""
        if self.phase != "decode" or not subject.options.get("compile"):
            return ()
        return () if subject.device.startswith("cuda") else (Compile(CONTEXT, self.threads),)

    def build(self, subject: Subject, dtype: str, reference: Reference) -> Case:
        fmt_dtype = DTYPE_OF[self.fmt]
        config, params, ids = _loaded("float32", self.length)
        truth = _truth(self.length)  # now: the check that follows times the level alone
        note = ""
        threads = self.threads
        # Built, checked and timed at the case's threads: a compiled step is compiled for the
        # threads it runs with, and its note must say how the timed one was had.
        with cpu_threads(threads):
            if subject.name == "transformers":
                step, first = _peer_calls(ids, self.phase)
            else:
                step, first, note = _level_calls(subject, config, params, ids, self.fmt, self.phase)

        def run():
            with cpu_threads(threads):
                return step()

        def error() -> float:
            with cpu_threads(threads):
                return scaled_error(first(), truth)

        bytes_read = None
        if self.phase == "decode":
            cache_per_step = 2 * config.n_layers * config.kv_heads * config.d_head * (len(ids) + 8)
            elem = 2 if fmt_dtype in ("bfloat16", "float16") else 4
            step_bytes = weight_bytes(params, self.fmt)
            bytes_read = NEW_TOKENS * (step_bytes + cache_per_step * elem)
        return Case(
            fn=subject.calls(run, grad=False),
            error=error,
            error_of="logits after the prompt",
            bound=BOUNDS[self.fmt],
            extras={"bytes_read": bytes_read, "note": note},
        )


def _level_calls(subject: Subject, config, params, ids, fmt: str, phase: str):
    """``(timed call, first logits, note)`` for a level: the prefill, or 16 steps from its
    cache; the note says how a compiled decode step was had (compiled, or loaded)."""
    kwargs: dict[str, Any] = {"device": subject.device, **subject.options}
    if subject.kind != "python":
        kwargs["dtype"] = subject.native_dtype(DTYPE_OF[fmt])
    if fmt in QUANTIZED:
        kwargs["weights"] = fmt
    model = subject.module.DecoderOnlyTransformer(config, params, **kwargs)
    note = ""
    if kwargs.get("compile"):
        note = model.prepare_decode(1).line()
    prompt = subject.asarray(np.array([ids]))
    if phase == "prefill":  # the last token's logits only, (1, V)
        call = subject.calls(lambda: model.prefill(prompt, last_only=True)[0], grad=False)
        return call, lambda: subject.to_numpy(call())[0], note
    if phase == "prompt":
        return (
            (lambda: model.prefill(prompt)),
            lambda: subject.to_numpy(subject.calls(lambda: model.prefill(prompt)[0], grad=False)())[
                0, -1
            ],
            note,
        )
    _, kv = subject.calls(
        lambda: model.prefill(subject.asarray(np.array([ids[:-1]]))), grad=False
    )()
    last = subject.asarray(np.array([ids[-1]]))

    def decode():
        kv.rollback(len(ids) - 1)
        token, first = last, None
        for _ in range(NEW_TOKENS):
            logits = subject.to_numpy(model.decode_step(token, kv))  # (1, V)
            first = logits[0] if first is None else first
            token = subject.asarray(logits.argmax(-1))  # greedy, as generate picks
        return first

    return decode, subject.calls(decode, grad=False), note


def _peer_calls(ids, phase: str):
    """``(timed call, first logits)`` for transformers on the same file."""
    import torch

    path = _file()
    model = _peer_model(str(path))
    prompt = torch.tensor([ids])
    if phase == "prefill":  # the last token's logits only, as the levels' last_only

        def last():
            with torch.no_grad():
                return model(prompt, logits_to_keep=1).logits

        return last, lambda: last()[0, -1].double().numpy()
    if phase == "prompt":

        def prefill():
            with torch.no_grad():
                return model(prompt).logits

        return prefill, lambda: prefill()[0, -1].double().numpy()
    with torch.no_grad():
        out = model(prompt[:, :-1], use_cache=True)
        kv = out["cache"] if "cache" in out.keys() else out.past_key_values  # by 5.2x: "cache"
    # The keyword the cache goes back in by: "cache" where forward takes it (later 5.x
    # releases, which warn about the older "past_key_values"), else the older one.
    keyword = (
        "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    )

    def decode(**extra):
        # Back to the prompt but its last token, as the levels rewind: crop takes the number
        # of positions to remove, counted from the end.
        kv.crop(len(ids) - 1 - kv.get_seq_length())
        with torch.no_grad():
            return model.generate(
                prompt,
                **{keyword: kv},
                attention_mask=torch.ones_like(prompt),
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                pad_token_id=0,
                **extra,
            )

    def first():
        out = decode(return_dict_in_generate=True, output_logits=True)
        return out.logits[0][0].double().numpy()

    return decode, first


@cache
def _peer_model(path: str):
    from pathlib import Path

    import torch
    import transformers

    file = Path(path)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    # Its GGUF reader draws its own progress bar (tqdm, on stderr), which the switch above
    # does not reach, nor does TQDM_DISABLE (tqdm reads it when imported): the load's
    # stderr goes nowhere. An error still raises, with its message.
    with contextlib.redirect_stderr(io.StringIO()):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(file.parent),
            gguf_file=file.name,
            dtype=torch.float32,
            quantization_config=transformers.GgufConfig(dequantize=True),
            attn_implementation="sdpa",
        )
    return model.eval()


def workloads(quick: bool) -> list[RealModel]:
    """Every (phase, format, threads): one thread and every core. ``--quick``: float32 on one
    thread, the chat's default (each format costs a model built at every level, and a
    bfloat16 decode without bfloat16 arithmetic tens of seconds: most of a quick run)."""
    all_cores = os.cpu_count() or 1
    threads = (1,) if quick or all_cores == 1 else (1, all_cores)
    chat = [
        RealModel(phase, fmt, n)
        for n in threads
        for fmt in (FORMATS[:1] if quick else FORMATS)
        for phase in ("prompt", "decode")
    ]
    # The long prompts: float32, one thread, as transformers is compared (not in a quick run:
    # seconds a call, and a float64 reference of each).
    return chat + ([] if quick else [RealModel("prefill", "float32", 1, n) for n in LONG_PROMPTS])
