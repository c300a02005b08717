"""Text in and out of a GGUF model: its tokenizer, its chat template, and streaming.

A GGUF file carries no ``tokenizer.json``. Its metadata lists the vocabulary
(``tokenizer.ggml.tokens``), each token's type, and either the BPE merges
(byte-level files) or a score per token (SentencePiece files), under the key
names of llama.cpp. ``tokenizer_from_gguf(metadata)`` rebuilds from those a
``tokenizers.Tokenizer``; ``ChatTemplate`` renders the file's Jinja chat
template; ``StreamDecoder`` turns generated ids into text as they arrive.

The peer is ``transformers``: the tokenizer gives the same ids and the same
text as ``AutoTokenizer.from_pretrained(folder, gguf_file=name)``, and the
template the same string as its ``apply_chat_template(..., tokenize=False)``.
Where transformers and llama.cpp (``src/llama-vocab.cpp``) read a file
differently, this module follows transformers, and these are the places:

* ``tokenizer.ggml.pre`` 'smollm' and 'default': transformers cuts words with
  GPT-2's regex. llama.cpp first isolates every digit for 'smollm' (no change
  for SmolLM2, whose merges hold no digit at all), and for 'default' first
  cuts out runs of punctuation and of digits.
* Gemma stores its tokens of 2 to 31 spaces with real spaces; transformers
  respells them "▁▁..." like the text around them, so BPE reaches them.
  llama.cpp matches them in the raw text, as user-defined tokens: a run of
  more than 31 spaces comes out as other tokens.
* SentencePiece merges: llama.cpp joins the neighbours whose union scores
  highest; transformers ranks Gemma's by position in the file instead. For
  Gemma 3 the orders agree: its normal tokens' scores fall with position.
* SentencePiece files of other architectures: transformers always puts a "▁"
  in front of the text, whatever ``tokenizer.ggml.add_space_prefix`` says;
  llama.cpp obeys the flag.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, processors
from tokenizers import pre_tokenizers as pre

# Token types, as llama.cpp writes them (gguf.TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPACE = "\u2581"  # SentencePiece's "▁", a space inside a token

# How text is cut into words before byte-level BPE, by tokenizer.ggml.pre (the regexes of
# Llama 3's and Qwen2's tokenizer.json). None: GPT-2's regex, which ByteLevel applies itself.
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")  # one digit per word
WORD_SPLITS = {"default": None, "gpt2": None, "smollm": None, "llama-bpe": _LLAMA3, "qwen2": _QWEN2}

_GEMMA = ("gemma", "gemma2", "gemma3")  # architectures transformers reads the Gemma way

# The special tokens a chat template may name, and the metadata key of each one's id.
_NAMED = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}


def _key(name: str) -> str:
    return f"tokenizer.ggml.{name}"


def _model_name(metadata: Mapping[str, object]) -> str:
    return repr(metadata.get("general.name", "the model file"))


# ---------------------------------------------------------------------------
# The tokenizer
# ---------------------------------------------------------------------------


def tokenizer_from_gguf(metadata: Mapping[str, object]) -> Tokenizer:
    """The tokenizer the metadata describes; ``encode`` adds BOS / EOS as the file asks."""
    if _key("tokens") not in metadata:
        raise ValueError(f"{_model_name(metadata)} has no tokenizer (no tokenizer.ggml.tokens)")
    _check(metadata)
    kind = metadata.get(_key("model"))
    if kind == "gpt2":
        tokenizer, vocab = _byte_level(metadata)
    elif kind == "llama":
        tokenizer, vocab = _sentencepiece(metadata)
    else:
        raise ValueError(f"unsupported tokenizer.ggml.model {kind!r} (supported: 'gpt2', 'llama')")
    _add_special_tokens(tokenizer, metadata, vocab)
    tokenizer.post_processor = _bos_eos(metadata, add_bos_default=kind == "llama")
    return tokenizer


def _check(metadata) -> None:
    """Per-token lists as long as the vocabulary, special-token ids inside it."""
    n = len(metadata[_key("tokens")])
    for key in map(_key, ("token_type", "scores")):
        if key in metadata and len(metadata[key]) != n:
            raise ValueError(f"{key} has {len(metadata[key])} entries, not {n}")
    for name, i in _named_ids(metadata).items():
        if not 0 <= i < n:
            raise ValueError(f"{_key(_NAMED[name])}_token_id {i} is not among the {n} tokens")


def _byte_to_char() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 byte values: printable Latin-1 stands for itself,
    the other 68 bytes (controls, space, ...) move to U+0100 onwards, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    moved = (b for b in range(256) if b not in printable)
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(moved)}}


def _byte_level(metadata) -> tuple[Tokenizer, dict[str, int]]:
    """Byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2): words -> UTF-8 bytes -> merges."""
    words = metadata.get(_key("pre"), "default")
    if words not in WORD_SPLITS:
        raise ValueError(
            f"unsupported tokenizer.ggml.pre {words!r} (known: {', '.join(WORD_SPLITS)})"
        )
    if _key("merges") not in metadata:
        raise ValueError(
            f"{_model_name(metadata)} has a byte-level vocabulary but no tokenizer.ggml.merges"
        )
    spelling = _byte_to_char()
    alphabet = set(spelling.values())
    # Tokens are stored in that spelling; one that is not (a special token like "<｜end｜>") is
    # respelled from its UTF-8 bytes, as transformers does.
    vocab = {
        (t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode())): i
        for i, t in enumerate(metadata[_key("tokens")])
    }
    # A merge is "left right"; llama.cpp cuts it at the first space after the first character.
    cuts = ((m, m.index(" ", 1)) for m in metadata[_key("merges")])
    merges = [(m[:k], m[k + 1 :]) for m, k in cuts]
    tokenizer = Tokenizer(models.BPE(vocab, merges, dropout=None, fuse_unk=False))
    split = WORD_SPLITS[words]
    if split is None:
        tokenizer.pre_tokenizer = pre.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tokenizer.pre_tokenizer = pre.Sequence(
            [
                pre.Split(Regex(split), "isolated"),
                pre.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer, vocab


def _sentencepiece(metadata) -> tuple[Tokenizer, dict[str, int]]:
    """SentencePiece BPE (Llama 1/2, Gemma): a space is "▁", and a character the vocabulary
    lacks falls back to its UTF-8 bytes, tokens <0x00>..<0xFF>."""
    architecture = metadata.get("general.architecture")
    if architecture == "phi3":  # transformers adds Phi-3's prefix space in a way of its own
        raise ValueError("unsupported SentencePiece tokenizer of architecture 'phi3'")
    gemma = architecture in _GEMMA
    tokens = list(metadata[_key("tokens")])
    if gemma:  # "   " -> "▁▁▁" (module docstring), by transformers' test for such a token
        tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    if _key("merges") in metadata:
        merges = [tuple(m.split(" ", 1)) for m in metadata[_key("merges")]]
    elif gemma:
        merges = _merges(vocab, rank={t: -i for t, i in vocab.items()})
    elif _key("scores") in metadata:
        merges = _merges(vocab, rank=dict(zip(tokens, metadata[_key("scores")], strict=True)))
    else:
        raise ValueError(f"{_model_name(metadata)} has neither tokenizer.ggml.merges nor scores")
    unk = special_tokens(metadata).get("unk_token") if gemma else None  # as transformers' classes
    tokenizer = Tokenizer(
        models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:  # every space becomes "▁" where it stands; nothing is put in front. (transformers
        # also cuts words at " ", which never fires once the normalizer has left none.)
        tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    else:  # "▁" for every space and one in front, which decoding drops again
        tokenizer.pre_tokenizer = pre.Metaspace(SPACE, prepend_scheme="first", split=False)
        steps.append(decoders.Strip(" ", 1, 0))
    tokenizer.decoder = decoders.Sequence(steps)
    return tokenizer, vocab


def _merges(vocab: dict[str, int], rank: Mapping[str, float]) -> list[tuple[str, str]]:
    """SentencePiece keeps no merge list: it joins the neighbours whose union ranks best.
    As BPE merges: every cut of a token into two tokens, the best-ranked token's first; cuts
    of equally ranked tokens by longer left piece, then by file order (transformers' order)."""
    cuts = [
        (rank[token], k, len(token) - k, (token[:k], token[k:]))
        for token in vocab
        for k in range(1, len(token))
        if token[:k] in vocab and token[k:] in vocab
    ]
    cuts.sort(key=lambda cut: cut[:3], reverse=True)  # a stable sort, even reversed
    return [pair for *_, pair in cuts]


def _add_special_tokens(tokenizer: Tokenizer, metadata, vocab: dict[str, int]) -> None:
    """Control tokens (<|im_end|>, <bos>) and the named ones become special tokens: matched
    whole in any text, dropped by ``decode(..., skip_special_tokens=True)``. User-defined ones
    (Gemma's "\\n\\n", <start_of_image>) are matched whole too, but are text. All keep their
    ids. One respelled above is left out, as transformers leaves it out."""
    tokens = metadata[_key("tokens")]
    typed = list(zip(tokens, metadata.get(_key("token_type"), [NORMAL] * len(tokens)), strict=True))
    user = [t for t, kind in typed if kind == USER_DEFINED and t in vocab]
    control = [t for t, kind in typed if kind == CONTROL and t in vocab]
    named = [t for t in special_tokens(metadata).values() if t not in user]
    special = dict.fromkeys(control + named)  # in order, once each
    tokenizer.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    tokenizer.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])


def _named_ids(metadata) -> dict[str, int]:
    """{"bos_token": id, ...} for the named special tokens the file sets."""
    found = {name: metadata.get(_key(f"{key}_token_id")) for name, key in _NAMED.items()}
    return {name: int(i) for name, i in found.items() if i is not None}


def special_tokens(metadata: Mapping[str, object]) -> dict[str, str]:
    """{"bos_token": "<bos>", "eos_token": ..., "unk_token": ..., "pad_token": ...}, those set."""
    tokens = metadata[_key("tokens")]
    return {name: tokens[i] for name, i in _named_ids(metadata).items()}


def _bos_eos(metadata, *, add_bos_default: bool) -> processors.TemplateProcessing:
    """BOS before and EOS after the text, per add_bos_token / add_eos_token. A SentencePiece
    file that does not say adds BOS (llama.cpp's default, and transformers'); others do not."""
    ids, tokens = _named_ids(metadata), special_tokens(metadata)
    add_bos = metadata.get(_key("add_bos_token"), add_bos_default) and "bos_token" in ids
    add_eos = metadata.get(_key("add_eos_token"), False) and "eos_token" in ids
    bos = [(tokens["bos_token"], ids["bos_token"])] if add_bos else []
    eos = [(tokens["eos_token"], ids["eos_token"])] if add_eos else []
    single = [f"{t}:0" for t, _ in bos] + ["$A:0"] + [f"{t}:0" for t, _ in eos]
    pair = single + [f"{t}:1" for t, _ in bos] + ["$B:1"] + [f"{t}:1" for t, _ in eos]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=bos + eos)


# ---------------------------------------------------------------------------
# The chat template
# ---------------------------------------------------------------------------


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, one step stricter. Jinja answers an unsafe attribute
    (``__class__``, ``__globals__``, ``mro``, a list's ``append``) with an undefined value, which
    renders as "" until used further; here the attempt is an error, so the template stops there."""

    def unsafe_undefined(self, obj, attribute):
        kind = type(obj).__name__
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of a {kind} is unsafe"
        )


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks the assistant's text (transformers uses
    it for training masks); rendering keeps what is inside as it is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """Plain JSON (jinja's own tojson escapes <, > and & for HTML)."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class ChatTemplate:
    """A chat template, rendered as ``transformers``' ``apply_chat_template(messages,
    tokenize=False, add_generation_prompt=...)`` renders it: the same sandbox, whitespace rules
    (trim_blocks, lstrip_blocks), globals, filters and variables."""

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None):
        env = _Sandbox(
            trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(
                f"chat template does not parse: {_one_line(exc.message or '')} (line {exc.lineno})"
            ) from None
        self.special_tokens = dict(special_tokens or {})
        self.source = source  # (a template that mentions ``tools`` takes them: serving/tools.py)

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, object]) -> ChatTemplate:
        """The file's ``tokenizer.chat_template``, with its special-token strings."""
        source = metadata.get("tokenizer.chat_template")
        if not source:
            raise ValueError(
                f"{_model_name(metadata)} has no chat template; use ladder generate for plain text"
            )
        return cls(source, special_tokens(metadata) if _key("tokens") in metadata else {})

    def render(
        self, messages: Iterable[Mapping], *, add_generation_prompt: bool = False, **variables
    ) -> str:
        """The prompt for ``messages`` ({"role": ..., "content": ...}); ``variables`` reach the
        template as further names."""
        # As transformers: the template sees fresh dicts, without the keys whose value is None.
        chat = [{k: v for k, v in dict(m).items() if v is not None} for m in messages]
        context = {"tools": None, "documents": None, **self.special_tokens, **variables}
        try:
            return self._template.render(
                messages=chat, add_generation_prompt=add_generation_prompt, **context
            )
        except Exception as exc:  # the template is the file's code: whatever fails is the file's
            reason = _one_line(str(exc)) or type(exc).__name__
            raise ValueError(f"chat template failed: {reason}") from None


# ---------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------


class StreamDecoder:
    """Generated ids in, finished text out: ``push(id)`` returns the text that id completes
    (often "", never part of a character), ``flush()`` what is left at the end. The pieces,
    joined, are exactly ``tokenizer.decode(ids, skip_special_tokens=...)``.

    Decoding each id alone goes wrong three ways. A character split across tokens (byte-level
    BPE cuts an emoji into byte pieces) decodes to U+FFFD halves. ByteFallback decodes a run of
    byte tokens (<0xE2><0x82><0xAC> = "€") as a whole, so an invalid run is all U+FFFD, even its
    complete characters. And a SentencePiece decoder drops the space before its first token only.
    So the decoder keeps a window: the ids of the text printed last (context, for that space rule)
    and those not printed yet. It decodes the window with and without the new ids and prints the
    difference once the text ends in a whole character and no byte run is open; the window then
    restarts at the ids just printed, so the work per id stays small."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True):
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        added = tokenizer.get_added_tokens_decoder()
        self._hidden = {i for i, t in added.items() if t.special} if skip_special_tokens else set()
        byte_tokens = (f"<0x{b:02X}>" for b in range(256))  # what ByteFallback reads as one byte
        self._bytes = {tokenizer.token_to_id(t) for t in byte_tokens} - {None}
        self._window: list[int] = []  # ids: printed context, then pending
        self._printed = 0  # how many ids at the window's start are printed already

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _byte_run_open(self) -> bool:
        """Whether the last pending id that decoding sees is a byte token (its run may yet fail)."""
        seen = [i for i in self._window[self._printed :] if i not in self._hidden]
        return bool(seen) and seen[-1] in self._bytes

    def push(self, token_id: int) -> str:
        """Take one generated id; return the text it completes."""
        self._window.append(int(token_id))
        if self._byte_run_open():
            return ""
        before, text = self._decode(self._window[: self._printed]), self._decode(self._window)
        if len(text) <= len(before) or text.endswith("\ufffd"):  # nothing new, or half a character
            return ""
        self._window = self._window[self._printed :]
        self._printed = len(self._window)
        return text[len(before) :]

    def flush(self) -> str:
        """The text still held back (an unfinished character ends as U+FFFD, as in ``decode``);
        the decoder then starts afresh, ready for the next stream."""
        before, text = self._decode(self._window[: self._printed]), self._decode(self._window)
        self._window, self._printed = [], 0
        return text[len(before) :]


class Holdback:
    """Text to print, minus what could still become a stop string (and what follows one)."""

    def __init__(self, stops: list[str]):
        self.stops, self.text, self.shown, self.stopped = [s for s in stops if s], "", 0, False

    def add(self, piece: str) -> str:
        """Add decoded text; -> what may be printed now."""
        self.text += piece
        for stop in self.stops:
            at = self.text.find(stop)
            if at >= 0:
                self.text, self.stopped = self.text[:at], True
        if self.stopped:
            return self._release(len(self.text))
        # Hold back the longest tail that is the start of a stop string.
        keep = max(
            (n for s in self.stops for n in range(1, len(s)) if self.text.endswith(s[:n])),
            default=0,
        )
        return self._release(len(self.text) - keep)

    def _release(self, upto: int) -> str:
        out, self.shown = self.text[self.shown : upto], max(self.shown, upto)
        return out

    def finish(self) -> str:
        return self._release(len(self.text))


class Text:
    """A generated sequence's text as its ids come (the engine's output processing):
    ``push(id)`` -> the text that may be shown now (a character split across tokens, and
    whatever could still become one of ``stops``, are held back); ``stopped`` once a stop
    string has appeared (the text ends before it); ``close()`` -> the rest, at the end."""

    def __init__(self, tokenizer: Tokenizer, stops=()):
        self.decoder, self.holdback = StreamDecoder(tokenizer), Holdback(list(stops))

    @property
    def stopped(self) -> bool:
        return self.holdback.stopped

    @property
    def text(self) -> str:
        """All of it so far (the held-back tail included, a stop string and after excluded)."""
        return self.holdback.text

    def push(self, token_id: int) -> str:
        return self.holdback.add(self.decoder.push(token_id))

    def close(self) -> str:
        rest = "" if self.stopped else self.holdback.add(self.decoder.flush())
        return rest + self.holdback.finish()
