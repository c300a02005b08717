"""``ladder chat`` and ``ladder generate``: a real model at any level, streaming.

What runs is a *model source* (``--model``): a name the ladder knows (pulled
into the cache on first use), a GGUF file, a Hugging Face directory, or a
``ladder train`` checkpoint (generate only: a task's symbols, not text). The
chosen level builds its model from the canonical parameters as for any
other run (``loading``); the tokens come one at a time from the model's
``stream``, the engine's decoding of one request (the ``engine`` package), so a
``--temperature 0`` answer is the same tokens at every level.

Text leaves as it is completed: ``levels.tokenizer``'s stream decoder holds
back the bytes of a character split across tokens, and any text that could
still become a ``--stop`` string is held back until it cannot. An answer
ends at the model's end-of-turn token, a stop string, or ``--max-new-tokens``.

On stderr, after each answer: the prompt's tokens/s (the prefill, time to
the first new token) and the decode's tokens/s (every later token), apart,
as llama.cpp reports them: a prompt is one batched pass, a decode step a
pass per token, and the two are bound by different things (arithmetic for
the first, memory bandwidth for the second; docs/decoding.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import loading
from loading import Loaded, Threads

from . import slow
from .cli import Interrupted, UsageError, check_device

DEFAULT_NEW_TOKENS = 256


# ----------------------------------------------------------------------------- loading


def _check_inputs(kind: str, args, *, chat: bool) -> None:
    """The arguments that go with this kind of model, before anything loads."""
    if kind == "checkpoint":
        if chat:
            raise UsageError(
                f"{getattr(args, 'checkpoint', None) or args.model} is a model trained on a task, which has no text "
                f'to chat in; use ladder generate --model PATH --input "5 9 4 7"'
            )
        if args.prompt is not None:
            raise UsageError("--prompt goes with a text model; a trained checkpoint takes --input")
        if args.input is None:
            raise UsageError(
                "a `ladder train` checkpoint needs --input, the content symbols to continue"
            )
    elif not chat:
        if args.input is not None:
            raise UsageError(
                "--input goes with a `ladder train` checkpoint; a text model takes --prompt"
            )
        if args.prompt is None:
            raise UsageError("generate needs --prompt, the text to continue")


def _level3_options(level, args, dtype: str) -> tuple[str, bool]:
    """``(weights, compile)`` for this level: both level 3's alone. ``ladder chat`` compiles
    by default (``--no-compile``: eager), which pays once and then at every answer;
    ``ladder generate`` compiles when asked (``--compile``): one continuation rarely
    repays a first compile. ``LADDER_COMPILE=0`` makes chat's default eager too (the test
    suite's, which is not about the compiler). Without a C++ compiler the model says so
    and decodes eagerly."""
    weights = getattr(args, "weights", "float") or "float"
    asked = getattr(args, "compile", None)
    is_level3 = level.__name__.endswith("level3_sdpa_flash")
    if not is_level3:
        if weights != "float":
            raise UsageError(f"--weights {weights} is level 3's (--level 3)")
        if asked:
            raise UsageError("--compile is level 3's (--level 3)")
        return "float", False
    if weights == "blocked":  # products of several rows, eager; the compiled step has its own
        if asked:
            raise UsageError(
                "--weights blocked is for eager steps of several rows (ladder serve's "
                "batches); the compiled step (--compile) makes its own products"
            )
        import torch

        from levels.level3_sdpa_flash.blocked import refusal

        reason = refusal(getattr(torch, dtype), args.device)
        if reason is not None:
            raise UsageError(f"--weights blocked {reason}")
        return weights, False
    if asked is None:  # chat's default, unless LADDER_COMPILE=0 says otherwise
        chatty = args.command in ("chat", "serve")  # many answers repay one compile
        return weights, chatty and os.environ.get("LADDER_COMPILE") != "0"
    return weights, asked


def load(args: argparse.Namespace, *, chat: bool) -> Loaded:
    """The model ``args`` names, built at ``args.level`` (``loading.load``); every check
    before the weights load. A known model is pulled with a progress bar first."""
    import levels
    from levels import registry

    from .pull import fetch

    check_device(args.device)
    missing = [m for m in ("gguf", "tokenizers", "jinja2") if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(
            f"real models need {', '.join(missing)}: pip install 'attention-ladder[hf]'"
        )
    level = levels.load(args.level)
    dtype = loading.default_dtype(level, args.dtype)
    weights, compile = _level3_options(level, args, dtype)
    kind, path = loading.source(args.model, hf=getattr(args, "hf", None),
                                checkpoint=getattr(args, "checkpoint", None), fetch=fetch)  # fmt: skip
    _check_inputs(kind, args, chat=chat)
    name = str(args.model or getattr(args, "hf", None) or registry.DEFAULT_MODEL)
    return loading.load(kind, path, level=level, name=name, dtype=dtype, device=args.device,
                        context=args.context, weights=weights, compile=compile,
                        draft=getattr(args, "speculate", None), seed=getattr(args, "seed", None),
                        chat=chat, warn=_say)  # fmt: skip


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _prepare(loaded: Loaded, args, threads: Threads) -> None:
    """Every compiled pass an answer runs, compiled or loaded now, saying which."""
    loading.prepare_all(loaded, threads.n, _say, getattr(args, "draft_tokens", None))


# ----------------------------------------------------------------------------- one answer


@dataclass
class Speed:
    """One answer's two speeds: the prompt (prefill to the first token) and the decode."""

    prompt_tokens: int
    prompt_s: float
    new_tokens: int  # the first comes from the prompt's pass, each later one from a decode step
    decode_s: float  # from the first new token to the last
    speculation: Any = None  # with --speculate: its passes and guesses (engine.Counts)

    def line(self, what: str) -> str:
        """``[prompt ... | decode ... | what]``; the decode only when there were decode steps,
        and with speculation what it drafted and kept."""
        parts = [f"prompt {_tokens(self.prompt_tokens)}"]
        if self.new_tokens == 0:  # interrupted before the prompt's pass ended
            parts[0] += f", no new token after {self.prompt_s:.2f} s"
        else:
            parts[0] += f" in {self.prompt_s:.2f} s ({_rate(self.prompt_tokens, self.prompt_s)})"
        steps = self.new_tokens - 1
        if steps > 0:
            parts.append(
                f"decode {_tokens(steps)} in {self.decode_s:.2f} s ({_rate(steps, self.decode_s)})"
            )
        counts = self.speculation
        if counts is not None and counts.passes:
            parts.append(
                f"speculated: {counts.drafted} drafted, {counts.accepted} kept, "
                f"{steps / counts.passes:.2f} tokens a pass"
            )
        return f"[{' | '.join([*parts, what])}]"


def _tokens(n: int) -> str:
    return f"{n} token{'' if n == 1 else 's'}"


def _rate(n: int, seconds: float) -> str:
    # perf_counter can measure 0 s between two reads on a coarse clock: no rate then.
    return f"{n / seconds:.1f} tok/s" if seconds > 0 else "-"


class PromptTooLong(UsageError):
    """A prompt that leaves no room in the context for the answer asked; the message says
    what the user can change."""


def new_tokens(loaded: Loaded, n_prompt: int, args) -> int:
    """How many new tokens to ask for after a prompt of ``n_prompt`` tokens: ``--max-new-tokens``,
    else ``DEFAULT_NEW_TOKENS`` or the room ``--context`` leaves, whichever is fewer.
    ``PromptTooLong`` when the room is less than ``--max-new-tokens`` (or than one token)."""
    room = loaded.model.config.max_seq_len - n_prompt
    if room < (args.max_new_tokens or 1):
        raise PromptTooLong(_too_long(loaded, n_prompt, args))
    return min(room, args.max_new_tokens or DEFAULT_NEW_TOKENS)


def _too_long(loaded: Loaded, n_prompt: int, args) -> str:
    """Why the prompt does not fit, in what the user controls: the prompt, ``--context`` (and
    how far the model allows it to go), ``--max-new-tokens`` only when it was given."""
    context = loaded.model.config.max_seq_len
    setting = f"--context {context}" + ("" if getattr(args, "context", None) else " (the default)")
    asked = args.max_new_tokens
    room = max(context - n_prompt, 0)
    if asked is None:
        text = f"the prompt is {_tokens(n_prompt)}; {setting} leaves no room for an answer"
    else:
        text = (
            f"the prompt is {_tokens(n_prompt)}; {setting} leaves room for {_tokens(room)}, "
            f"not --max-new-tokens {asked}"
        )
    longest = loaded.model_context
    if longest is None:
        return text
    if n_prompt + (asked or 1) > longest:
        fewer = " or a smaller --max-new-tokens" if asked and n_prompt < longest else ""
        return f"{text} (the model allows at most {longest}: a shorter prompt{fewer})"
    # Room for the answer asked (or a full default one), rounded up to a power of two.
    wanted = n_prompt + (asked or DEFAULT_NEW_TOKENS)
    enough = min(longest, 1 << (wanted - 1).bit_length())
    return f"{text} (the model allows {longest}: try --context {enough})"


def answer(
    loaded: Loaded, ids: list[int], args, out=None, *, index=None, conversation: bool = False
) -> tuple[str, Speed]:
    """Stream the model's continuation of ``ids`` to ``out`` (stdout); -> ``(text, speed)``.
    ``index`` (``constrained.Index``): the answer held to its language, and ended within
    its tokens (the mask keeps room to close it).

    Ctrl-C cuts the answer. In a ``conversation`` it ends that answer alone, marked
    `` [interrupted]``, and the conversation goes on; otherwise (one prompt, the command's
    whole work) the text so far stays printed and ``Interrupted`` says how far it got, so
    that a script sees exit status 130, never a cut answer passed off as a whole one."""
    out = out or sys.stdout
    from levels.tokenizer import Holdback, StreamDecoder

    new = new_tokens(loaded, len(ids), args)
    decoder, holdback = StreamDecoder(loaded.tokenizer), Holdback(args.stop)
    speculation, pieces = {}, {}
    if loaded.draft is not None:
        from engine import Counts

        speculation = {"draft": loaded.draft, "draft_tokens": args.draft_tokens, "counts": Counts()}
    if loaded.cost is not None and not speculation:  # seconds a token: the prompt's progress
        progress = slow.PromptProgress(loaded.cost, len(ids))
        progress.start()
        pieces = {"prefill_piece": loaded.cost.piece(), "on_prefill": progress.done}
    tokens = loaded.model.stream(
        ids,
        new,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop_ids=loaded.stop_ids,
        **speculation,
        **pieces,
        constraint=None if index is None else index.constraint(budget=new),
    )
    start = time.perf_counter()
    first = None
    count = 0
    try:
        for token in tokens:
            count += 1
            first = first or time.perf_counter()
            if token in loaded.stop_ids:
                break
            out.write(holdback.add(decoder.push(token)))
            out.flush()
            if holdback.stopped:
                break
    except KeyboardInterrupt:
        out.write(holdback.add(decoder.flush()))
        if not conversation:
            out.write(holdback.finish() + "\n")
            out.flush()
            raise Interrupted(
                f"interrupted after {_tokens(count)} of the answer (at most {new} asked); "
                "the text above is cut there"
            ) from None
        out.write(" [interrupted]")
    else:
        out.write(holdback.add(decoder.flush()))
    out.write(holdback.finish())
    out.flush()
    end = time.perf_counter()
    first = first or end
    speed = Speed(len(ids), first - start, count, end - first, speculation.get("counts"))
    return holdback.text, speed


def _report(loaded: Loaded, speed: Speed, threads: Threads) -> None:
    report = getattr(loaded.model, "decode_report", None)
    decode = (
        "" if report is None else f", decode {'eager' if report.how == 'eager' else 'compiled'}"
    )
    weights = getattr(loaded.model, "weights", "float")
    fmt = loaded.dtype if weights == "float" else f"{weights} weights"
    where = f"{loaded.level.__name__.rsplit('.', 1)[-1]}, {fmt}{decode}, {threads}"
    print(speed.line(where), file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the commands


def _threads(args, model=None) -> Threads:
    """``--threads``, else the count the load average (or a cached compiled step) gives
    (``loading.threads.choose``)."""
    return loading.choose(args.threads, model)


HELP = """\
/help   this list
/clear  forget the conversation (a --system message stays)
/quit   leave (also /exit, or Ctrl-D)
Anything else is a turn of the conversation; a paste of several lines is one turn."""


def output_language(args: argparse.Namespace):
    """The language ``--json-schema`` or ``--regex`` names, compiled (None: neither), before
    any model loads: a bad file or pattern is one line."""
    from constrained import Language

    path, pattern = getattr(args, "json_schema", None), getattr(args, "regex", None)
    if path is not None:
        try:
            schema = json.loads(path.read_text())
        except OSError as exc:
            raise UsageError(f"--json-schema {path}: {exc.strerror}") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UsageError(f"--json-schema {path}: not JSON ({exc})") from None
        try:
            return Language.schema(schema)
        except ValueError as exc:
            raise UsageError(f"--json-schema {path}: {exc}") from None
    if pattern is not None:
        try:
            return Language.regex(pattern)
        except ValueError as exc:
            raise UsageError(f"--regex: {exc}") from None
    return None


def _index(language, loaded: Loaded):
    """The language over the loaded model's vocabulary (None without one)."""
    if language is None:
        return None
    if loaded.tokenizer is None:
        raise UsageError("--json-schema and --regex go with a text model, not a trained task's")
    from constrained import Index, Tokens

    return Index(language, Tokens.from_tokenizer(loaded.tokenizer), loaded.stop_ids)


def _check_prompt(args) -> None:
    """A ``--prompt`` with no text in it (empty, or only spaces: an unset shell variable,
    most likely) is refused before the model loads, by chat and generate alike."""
    if args.prompt is not None and not args.prompt.strip():
        raise UsageError("--prompt has no text (it is empty, or only spaces)")


def chat(args: argparse.Namespace) -> int:
    _check_prompt(args)
    language = output_language(args)
    loaded = load(args, chat=True)
    index = _index(language, loaded)
    threads = _threads(args, loaded.model)
    messages: list[dict[str, str]] = []
    if args.system is not None:
        messages.append({"role": "system", "content": args.system})
    interactive = args.prompt is None
    if interactive and sys.stdin.isatty():
        print(f"{loaded.name} at {loaded.level.__name__}; /help for the commands", file=sys.stderr)
    with threads.limit():
        for line in [args.prompt] if not interactive else _lines():
            text = line.strip()
            if interactive and _is_command(text):
                if not _command(text, messages):
                    break
                continue
            if not text:
                continue
            try:
                prompt = _fit(loaded, [*messages, {"role": "user", "content": text}], args)
            except PromptTooLong as exc:
                if not interactive:
                    raise
                print(f"not sent: {exc}", file=sys.stderr)  # the conversation goes on without it
                continue
            messages[:] = prompt.messages
            _prepare(loaded, args, threads)  # before the first answer: compiled, or loaded
            reply, speed = answer(loaded, prompt.ids, args, index=index, conversation=interactive)
            print()
            _report(loaded, speed, threads)
            messages.append({"role": "assistant", "content": reply})
    return 0


def _is_command(text: str) -> bool:
    """``/word`` (then anything): a command of the conversation, never sent to the model.
    (A path such as ``/usr/bin`` is not one: it is a turn.)"""
    return re.fullmatch(r"/[A-Za-z]+", text.split(maxsplit=1)[0] if text else "") is not None


def _command(text: str, messages: list[dict[str, str]]) -> bool:
    """Run a ``/command``; -> whether the conversation goes on."""
    word = text.split(maxsplit=1)[0]
    if word in ("/quit", "/exit"):
        return False
    if word == "/clear":
        del messages[int(bool(messages) and messages[0]["role"] == "system") :]
        print("(conversation cleared)", file=sys.stderr)
    elif word == "/help":
        print(HELP, file=sys.stderr)
    else:
        print(f"unknown command {word}; /help lists them", file=sys.stderr)
    return True


PASTE_GAP_S = 0.05  # lines that arrive closer together than this were pasted, not typed


def _lines():
    """The user's turns: lines from a pipe, one turn each, or from the terminal, with a
    prompt, line editing and history (``readline``, where the platform has it).

    On a terminal, the lines of a paste are one turn: those already waiting when a line
    ends are read into it. And ``readline`` matters for long turns too: without it the
    terminal's canonical mode hands ``input()`` at most 4095 bytes of a line and drops the
    rest (Linux's line discipline buffer), silently; ``readline`` reads the keys itself.
    """
    tty = sys.stdin.isatty()
    if tty:
        _line_editing()
    while True:
        try:
            line = input(">>> " if tty else "")
            while tty and _waiting(sys.stdin):
                line += "\n" + input("")
        except EOFError:
            if tty:
                print()  # Ctrl-D: end the prompt's line, so the shell's starts on its own
            return
        yield line


def _line_editing() -> None:
    """Arrows, Home/End, history (up/down) for ``input()``: importing ``readline`` is what
    turns them on. Not every platform has it (Windows); the prompt then works without."""
    try:
        import readline  # noqa: F401
    except ImportError:
        pass


def _waiting(stdin) -> bool:
    """Whether more input is already there (the rest of a paste); a terminal that cannot be
    polled (not a file descriptor ``select`` takes) has none."""
    import select

    try:
        ready, _, _ = select.select([stdin], [], [], PASTE_GAP_S)
    except (OSError, ValueError, TypeError):
        return False
    return bool(ready)


@dataclass
class Prompt:
    """The ids of a conversation's prompt, and the messages they hold (the oldest turns may
    have been dropped to make room)."""

    ids: list[int]
    messages: list[dict[str, str]]


def _fit(loaded: Loaded, messages: list[dict[str, str]], args) -> Prompt:
    """The prompt for ``messages``, dropping the oldest turns (never a system message or the
    last one) while the prompt and a full answer would overflow the context.
    ``PromptTooLong`` when even the last turn alone leaves no room (``messages`` unchanged)."""
    context = loaded.model.config.max_seq_len
    wanted = args.max_new_tokens or DEFAULT_NEW_TOKENS
    first = int(messages[0]["role"] == "system")
    kept = list(messages)
    while True:
        text = loaded.template.render(kept, add_generation_prompt=True)
        # The template writes the special tokens itself (transformers encodes it this way too).
        ids = loaded.tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) + wanted <= context or len(kept) - first <= 1:
            break
        del kept[first : first + 2]  # the oldest question and its answer
    new_tokens(loaded, len(ids), args)  # refuses here, before any turn is dropped
    if len(kept) < len(messages):
        turns = (len(messages) - len(kept)) // 2
        print(f"({turns} oldest turn(s) dropped to fit the context)", file=sys.stderr)
    return Prompt(ids, kept)


def generate(args: argparse.Namespace) -> int:
    _check_prompt(args)
    language = output_language(args)
    loaded = load(args, chat=False)
    index = _index(language, loaded)
    if loaded.spec is not None:
        return _continue_symbols(loaded, args)
    if args.input is not None:
        raise UsageError(
            "--input goes with a `ladder train` checkpoint; a text model takes --prompt"
        )
    if args.prompt is None:
        raise UsageError("generate needs --prompt, the text to continue")
    ids = loaded.tokenizer.encode(args.prompt).ids  # with the BOS the tokenizer adds, if any
    if not ids:
        raise UsageError(f"--prompt {args.prompt!r} encodes to no tokens")
    threads = _threads(args, loaded.model)
    new_tokens(loaded, len(ids), args)  # before the prompt is echoed
    with threads.limit():
        _prepare(loaded, args, threads)  # for these threads
        print(args.prompt, end="", flush=True)
        _, speed = answer(loaded, ids, args, index=index)
    print()
    _report(loaded, speed, threads)
    return 0


def _continue_symbols(loaded: Loaded, args) -> int:
    from lab.inference import continue_symbols

    if args.prompt is not None:
        raise UsageError("--prompt goes with a text model; a trained checkpoint takes --input")
    if args.input is None:
        raise UsageError(
            "a `ladder train` checkpoint needs --input, the content symbols to continue"
        )
    try:
        symbols = [int(s) for s in args.input.replace(",", " ").split()]
    except ValueError:
        raise UsageError(
            f"--input must be integers separated by spaces, got {args.input!r}"
        ) from None
    spec = loaded.spec
    try:
        out = continue_symbols(loaded.model, spec, symbols, max_new_tokens=args.max_new_tokens)
    except ValueError as exc:
        raise UsageError(f"--input: {exc}") from None
    print(
        f"{spec.kind} {spec.task.name}: {' '.join(map(str, symbols))} -> {' '.join(map(str, out))}"
    )
    return 0
