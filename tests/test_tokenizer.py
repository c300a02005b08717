"""Text in and out of GGUF models (levels/tokenizer.py).

The peer is ``transformers``: ``AutoTokenizer.from_pretrained(folder, gguf_file=name)``
on the same file must give the same ids (with and without BOS/EOS) and the same
text, and ``apply_chat_template(..., tokenize=False)`` the same prompt. Two real
files, SmolLM2-135M-Instruct (byte-level BPE with merges) and Gemma 3 270M
(SentencePiece, 262k tokens, byte fallback, no merges), and tiny files written
here for the word splits and the SentencePiece flavour the real ones do not
use. Text comparisons are exact: ids and strings have no tolerance.

Hand-written cases pin what needs no peer: the GPT-2 byte spelling of an emoji,
Gemma's byte-fallback ids, what an empty string encodes to, a sandbox escape
that would write a file. ``StreamDecoder`` is held to ``decode`` of all the ids.

Gemma's cases are ``extended`` (CI runs them): reading its 262k-token metadata takes 10-15 s
(``GGUFReader``), transformers' tokenizer 17-25 s (it derives 515k merges in Python);
SmolLM2's take ~10 s together, and the rest of the file ~5 s.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path

import gguf
import jinja2
import pytest
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from levels.tokenizer import ChatTemplate, StreamDecoder, special_tokens, tokenizer_from_gguf

CORPUS = [
    # English
    "The quick brown fox jumps over the lazy dog.",
    "It's true, isn't it? They'll say we've 'quoted' I'M and YOU'RE.",
    # code: indentation, tabs, blank lines
    "def square(x):\n    return x ** 2  # the square\n\n\nclass A:\n\tpass\n",
    "for (int i = 0; i < n; ++i) {\n\t\tsum += a[i];\n}\n",
    # digits
    "1234567890",
    "pi = 3.14159265358979, e = 2.71828",
    "In 2024, 1,000,000 people paid $12.50 each (0x7fff, 1e-9, -42).",
    # unicode: accents, CJK, emoji (with a skin tone and a ZWJ family), combining marks, RTL
    "café naïve résumé Ångström façade",
    "日本語のテキスト、中文文本。한국어",
    "😀👍🏽🤖 👨‍👩‍👧‍👦 🇫🇷",
    "e\u0301 a\u0308 n\u0303 (combining marks)",
    "مرحبا بالعالم",
    "שלום עולם",
    "Ελληνικά и Русский",
    "\U0010fffd \ue000 \U00013000",  # private use, an Egyptian hieroglyph: byte fallback in Gemma
    # whitespace
    "",
    " ",
    "  ",
    "a  b   c    d     e",
    "   leading",
    "trailing   ",
    "\n",
    "\n\n\n",
    "line\r\nbreak",
    "\t\ttabs\t",
    " \n \n ",
    "x" + " " * 40 + "y" + "\t" * 40 + "z" + "\n" * 40,  # past Gemma's longest run tokens (31)
    # the special tokens of both models, inside text and alone
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_end|>",
    "<|endoftext|>x",
    "<<|im_end|>>",
    "<bos>",
    "<eos>text<eos>",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "<unk><pad><mask>",
]
CORPUS.append(" ".join(CORPUS))  # everything at once, one long text


def read_metadata(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items()}


@dataclass
class Model:
    """A GGUF file, its metadata, our tokenizer and the peer's, each built on first use."""

    path: Path

    @cached_property
    def metadata(self) -> dict[str, object]:
        return read_metadata(self.path)

    @cached_property
    def tokenizer(self) -> Tokenizer:
        return tokenizer_from_gguf(self.metadata)

    @cached_property
    def peer(self):
        return transformers.AutoTokenizer.from_pretrained(
            self.path.parent, gguf_file=self.path.name
        )

    def token_id(self, token: str) -> int:
        """The id the file gives ``token`` (from the metadata, not from the code under test)."""
        return self.metadata["tokenizer.ggml.tokens"].index(token)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf) -> Model:
    return Model(smollm2_gguf)


@pytest.fixture(scope="module")
def gemma3(gemma3_gguf) -> Model:
    return Model(gemma3_gguf)


REAL = ["smollm2", pytest.param("gemma3", marks=pytest.mark.extended)]


@pytest.fixture(params=REAL)
def real(request) -> Model:
    return request.getfixturevalue(request.param)


# ---------------------------------------------------------------------------
# Tiny files for what the real ones do not cover: three byte-level word splits,
# and SentencePiece the Llama 2 way (a "▁" in front, merges from scores)
# ---------------------------------------------------------------------------

TRAINING_TEXT = CORPUS * 4


def _train(pre_tokenizer, vocab_size: int, **options) -> dict:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False, **options)
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer)
    return json.loads(tokenizer.to_str())["model"]


def _write_gguf(path: Path, tokens: list[str], types: list[int], add) -> Path:
    """A GGUF file with a tokenizer and just enough of a Llama config for transformers."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_block_count(1)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    add(writer)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _byte_level_file(path: Path, pre: str) -> Path:
    trained = _train(
        pre_tokenizers.ByteLevel(add_prefix_space=False),
        400,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    vocab = sorted(trained["vocab"], key=trained["vocab"].get)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", *vocab]
    types = [3, 3, 3, 4] + [1] * len(vocab)  # control x3, one user-defined, normal

    def add(writer):
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_merges([" ".join(m) for m in trained["merges"]])
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(True)

    return _write_gguf(path, tokens, types, add)


def _sentencepiece_file(path: Path) -> Path:
    trained = _train(pre_tokenizers.Metaspace(), 300)
    pieces = sorted(trained["vocab"], key=trained["vocab"].get)
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = ["<unk>", "<s>", "</s>", "<start_of_turn>", *byte_tokens, *pieces]
    types = [2, 3, 3, 4] + [6] * 256 + [1] * len(pieces)
    # The trainer's pieces in the order it made them: earlier ones score higher.
    scores = [0.0] * (4 + 256) + [-float(i) for i in range(len(pieces))]

    def add(writer):
        writer.add_tokenizer_model("llama")
        writer.add_token_scores(scores)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_unk_token_id(0)
        # no add_bos_token: a SentencePiece file that does not say adds BOS

    return _write_gguf(path, tokens, types, add)


SYNTHETIC = ["gpt2", "llama-bpe", "qwen2", "sentencepiece"]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> dict[str, Model]:
    root = tmp_path_factory.mktemp("gguf")
    files = {pre: _byte_level_file(root / f"{pre}.gguf", pre) for pre in SYNTHETIC[:3]}
    files["sentencepiece"] = _sentencepiece_file(root / "sentencepiece.gguf")
    return {name: Model(path) for name, path in files.items()}


# ---------------------------------------------------------------------------
# The tokenizer against transformers
# ---------------------------------------------------------------------------


def _encode_mismatches(model: Model, texts) -> list:
    found = []
    for text in texts:
        for special in (True, False):
            ours = model.tokenizer.encode(text, add_special_tokens=special).ids
            theirs = model.peer.encode(text, add_special_tokens=special)
            if ours != theirs:
                found.append((text, special, ours, theirs))
    return found


def _random_ids(model: Model, seed: int, count: int) -> list[list[int]]:
    """Id sequences no text encodes to: any token, byte tokens and control tokens mixed in."""
    rng = random.Random(seed)
    kinds = model.metadata["tokenizer.ggml.token_type"]
    by_kind = {k: [i for i, t in enumerate(kinds) if t == k] for k in (3, 4, 6)}
    pools = [range(len(kinds))] + [ids for ids in by_kind.values() if ids]
    return [
        [rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 16))] for _ in range(count)
    ]


def _decode_mismatches(model: Model, sequences) -> list:
    found = []
    for ids in sequences:
        for skip in (True, False):
            ours = model.tokenizer.decode(ids, skip_special_tokens=skip)
            theirs = model.peer.decode(ids, skip_special_tokens=skip)
            if ours != theirs:
                found.append((ids, skip, ours, theirs))
    return found


def _assert_same_pieces(model: Model) -> None:
    """The pieces behind the ids: vocabulary, merges (Gemma's 515k and the tiny SentencePiece
    file's are derived from the vocabulary, on both sides, and their order decides ties a
    corpus may never reach), BPE options and added tokens."""
    ours, theirs = (json.loads(t.to_str()) for t in (model.tokenizer, model.peer.backend_tokenizer))
    for key in ("vocab", "merges", "unk_token", "byte_fallback", "fuse_unk"):
        assert ours["model"][key] == theirs["model"][key], key
    assert ours["added_tokens"] == theirs["added_tokens"]


def test_same_pieces_as_transformers(real):
    _assert_same_pieces(real)


def test_encode_matches_transformers(real):
    assert _encode_mismatches(real, CORPUS) == []


def test_decode_matches_transformers(real):
    encoded = [real.peer.encode(text) for text in CORPUS]
    assert _decode_mismatches(real, encoded + _random_ids(real, seed=0, count=300)) == []


@pytest.mark.parametrize("name", SYNTHETIC)
def test_tiny_files_match_transformers(synthetic, name):
    model = synthetic[name]
    _assert_same_pieces(model)
    assert _encode_mismatches(model, CORPUS) == []
    encoded = [model.peer.encode(text) for text in CORPUS]
    assert _decode_mismatches(model, encoded + _random_ids(model, seed=1, count=100)) == []


def _token_ends(model: Model, text: str) -> set[int]:
    """Where in ``text`` (one byte per character) its tokens end."""
    ends, n = set(), 0
    for token in model.tokenizer.encode(text, add_special_tokens=False).tokens:
        n += len(token)
        ends.add(n)
    return ends


def test_word_splits_on_digits(synthetic):
    # No token crosses a word. Qwen2 makes each digit a word, Llama 3 runs of up to three
    # (123|456|789|0), GPT-2 the whole run, which the merges learned here do cut across.
    digits = "1234567890"
    assert _token_ends(synthetic["qwen2"], digits) == set(range(1, 11))
    assert {3, 6, 9, 10} <= _token_ends(synthetic["llama-bpe"], digits)
    assert not {3, 6, 9} <= _token_ends(synthetic["gpt2"], digits)


def test_round_trip(real):
    # Both vocabularies reach every byte (byte-level, or byte fallback), and no text here holds
    # Gemma's "▁" (which decodes to a space): decoding gives the text back exactly.
    for text in CORPUS:
        ids = real.tokenizer.encode(text, add_special_tokens=False).ids
        assert real.tokenizer.decode(ids, skip_special_tokens=False) == text


# ---------------------------------------------------------------------------
# Hand-written cases
# ---------------------------------------------------------------------------


def test_smollm2_boundaries(smollm2):
    def encode(text):
        return smollm2.tokenizer.encode(text).ids

    assert encode("") == []  # add_bos_token is False
    assert encode(" ") == [smollm2.token_id("Ġ")]  # GPT-2 spells the space byte 0x20 "Ġ"
    assert encode("<|im_end|>") == [2]  # eos_token_id, matched whole
    # 🤖 is F0 9F A4 96; GPT-2's alphabet spells F0 "ð", A4 "¤" (printable Latin-1, themselves),
    # 9F "Ł" and 96 "ĸ" (non-printable, moved to U+0100 + 33 + (byte - 0x7F) = U+0141, U+0138).
    assert "".join(smollm2.tokenizer.encode("🤖").tokens) == "ðŁ¤ĸ"
    ids = encode("<|im_start|>user\nhi<|im_end|>")
    assert (ids[0], ids[-1]) == (1, 2) and len(ids) > 3  # special tokens whole, text between
    assert 1 not in encode("<|im_start")  # half a special token is text


@pytest.mark.extended
def test_gemma3_boundaries(gemma3):
    def encode(text, special=True):
        return gemma3.tokenizer.encode(text, add_special_tokens=special).ids

    bos, eos = 2, 1  # tokenizer.ggml.bos_token_id / eos_token_id; add_bos_token is True
    assert encode("") == [bos]
    assert encode("", special=False) == []
    assert encode(" ") == [bos, gemma3.token_id("▁")]  # no space added in front: just the one
    assert encode("<eos>") == [bos, eos]
    assert encode("🤖") == [bos, gemma3.token_id("🤖")]  # a whole token in Gemma's vocabulary
    assert encode("a\n\nb", special=False) == [gemma3.token_id(t) for t in ("a", "\n\n", "b")]
    # U+10FFFD is in no vocabulary: its UTF-8 bytes F4 8F BF BD, as byte tokens.
    fallback = [gemma3.token_id(f"<0x{b:02X}>") for b in "\U0010fffd".encode()]
    assert encode("\U0010fffd", special=False) == fallback
    assert gemma3.tokenizer.decode(fallback) == "\U0010fffd"


def test_special_tokens_from_metadata(smollm2):
    assert special_tokens(smollm2.metadata) == {
        "bos_token": "<|im_start|>",
        "eos_token": "<|im_end|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|im_end|>",
    }


def _tiny(changes: dict) -> dict[str, object]:
    base = {
        "general.name": "tiny",
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": ["a", "b", "ab"],
        "tokenizer.ggml.token_type": [1, 1, 1],
        "tokenizer.ggml.merges": ["a b"],
    }
    return {k: v for k, v in {**base, **changes}.items() if v is not None}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"tokenizer.ggml.tokens": None}, "'tiny' has no tokenizer"),
        ({"tokenizer.ggml.model": "bert"}, "tokenizer.ggml.model 'bert'"),
        ({"tokenizer.ggml.pre": "falcon"}, "tokenizer.ggml.pre 'falcon'"),
        ({"tokenizer.ggml.merges": None}, "no tokenizer.ggml.merges"),
        ({"tokenizer.ggml.token_type": [1]}, "token_type has 1 entries, not 3"),
        ({"tokenizer.ggml.eos_token_id": 7}, "eos_token_id 7 is not among the 3"),
        (
            {"tokenizer.ggml.model": "llama", "tokenizer.ggml.merges": None},
            "neither tokenizer.ggml.merges nor scores",
        ),
    ],
)
def test_bad_tokenizer_metadata(changes, message):
    with pytest.raises(ValueError, match=message) as error:
        tokenizer_from_gguf(_tiny(changes))
    assert "\n" not in str(error.value)


def test_tiny_metadata_builds():
    # The base of the error cases above is itself valid: each error comes from its one change.
    assert tokenizer_from_gguf(_tiny({})).encode("ab").ids == [2]


# ---------------------------------------------------------------------------
# The chat template
# ---------------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are terse."}
TURNS = [
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Hello. What do you need?"},
    {"role": "user", "content": "Sum 2+2,\n  then  explain 😀."},
]
CHATS = {f"{n} turns": TURNS[:n] for n in (1, 2, 3)} | {
    f"system, {n} turns": [SYSTEM, *TURNS[:n]] for n in (1, 2, 3)
}


@pytest.fixture(scope="module")
def smollm2_template(smollm2) -> ChatTemplate:
    return ChatTemplate.from_gguf(smollm2.metadata)


@pytest.mark.parametrize("prompt", [True, False], ids=["generation_prompt", "no_prompt"])
@pytest.mark.parametrize("chat", list(CHATS))
def test_chat_template_matches_transformers(smollm2, smollm2_template, chat, prompt):
    messages = CHATS[chat]
    expected = smollm2.peer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=prompt
    )
    assert smollm2_template.render(messages, add_generation_prompt=prompt) == expected


def test_chat_template_by_hand(smollm2_template):
    # SmolLM2's template adds its own system prompt when the chat has none.
    assert smollm2_template.render(TURNS[:1], add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n"
    )


# What templates in the wild use: whitespace control, namespace, loop controls, tojson,
# the generation tag, special-token names, a key set to None (dropped), tools left undefined,
# strftime_now (with a format that does not depend on the time).
FEATURES = """\
{{ bos_token }}{% set ns = namespace(n=0) %}
{% for m in messages %}
    {% if m.role == 'system' %}{% continue %}{% endif %}
    {% set ns.n = ns.n + 1 %}
    {%- if m.role == 'assistant' %}{% generation %}[{{ m.content | trim }}]{% endgeneration %}
    {% else %}{{ ns.n }}:{{ m | tojson }}|{{ m.get('name', 'anon') }}
    {% endif %}
    {% if loop.index > 5 %}{% break %}{% endif %}
{% endfor %}
{{ tools is none }} {{ eos_token if add_generation_prompt else '' }}<&>{{ strftime_now('%%') }}"""


@pytest.mark.parametrize("prompt", [True, False])
def test_template_features_match_transformers(smollm2, prompt):
    messages = [SYSTEM, *TURNS, {"role": "user", "content": '<b>"é"</b>', "name": None}]
    ours = ChatTemplate(FEATURES, special_tokens(smollm2.metadata))
    expected = smollm2.peer.apply_chat_template(
        messages, chat_template=FEATURES, tokenize=False, add_generation_prompt=prompt
    )
    assert ours.render(messages, add_generation_prompt=prompt) == expected


@pytest.mark.extended
def test_no_chat_template(gemma3):
    # Gemma 3 270M is a base model: its file has no template.
    with pytest.raises(
        ValueError, match="'Gemma 3 270m' has no chat template; use ladder generate"
    ):
        ChatTemplate.from_gguf(gemma3.metadata)


@pytest.mark.parametrize(
    "source, message",
    [
        ("{% for m in messages %}{{ m.content }}", "does not parse: .*'endfor'"),
        (
            "{{ raise_exception('Only user and\nassistant roles') }}",
            "failed: Only user and assistant roles",
        ),
        ("{{ messages[0].content + 1 }}", "failed: can only concatenate str"),
    ],
)
def test_broken_templates(source, message):
    with pytest.raises(ValueError, match=message) as error:
        ChatTemplate(source).render(TURNS[:1])
    assert "\n" not in str(error.value)


ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__ }}",  # jinja alone renders this as "" and carries on
    "{{ raise_exception.__globals__ }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ self.__init__ }}",
    "{{ 'x' | attr('__class__') }}",
    "{{ dict.mro() }}",
    "{% set _ = messages.append(messages[0]) %}",  # immutable: no writes to the caller's data
]


@pytest.mark.parametrize("source", ESCAPES)
def test_template_escapes_are_refused(source):
    with pytest.raises(ValueError, match="unsafe") as error:
        ChatTemplate(source).render(TURNS[:1])
    assert "\n" not in str(error.value)


def test_template_escape_runs_nothing(tmp_path):
    source = "{{ cycler.__init__.__globals__.__builtins__.open(path, 'w').write('owned') }}"
    # Outside a sandbox this template does write the file, so the last check can fail.
    control, target = tmp_path / "control", tmp_path / "target"
    jinja2.Environment().from_string(source).render(path=str(control))
    assert control.read_text() == "owned"
    with pytest.raises(ValueError, match="unsafe"):
        ChatTemplate(source).render(TURNS[:1], path=str(target))
    assert not target.exists()


# ---------------------------------------------------------------------------
# Streaming
# ---------------------------------------------------------------------------


def _stream(decoder: Tokenizer | StreamDecoder, ids, skip: bool = True) -> list[str]:
    """The pieces of one stream, the flush last (a decoder is reused: flush resets it)."""
    if isinstance(decoder, Tokenizer):
        decoder = StreamDecoder(decoder, skip_special_tokens=skip)
    return [decoder.push(i) for i in ids] + [decoder.flush()]


def _stream_cases(model: Model) -> list[list[int]]:
    """Every prefix of every encoded text (cuts inside emoji and CJK), Gemma's byte tokens
    for whole texts cut at every byte, and the random sequences of the decode test."""
    cases = []
    for text in CORPUS[:-1]:
        ids = model.tokenizer.encode(text).ids
        cases += [ids[:k] for k in range(1, len(ids) + 1)]
    if "<0x00>" in model.metadata["tokenizer.ggml.tokens"]:
        for text in ("😀👍🏽 é 日本語", "\U0010fffd€"):
            raw = [model.token_id(f"<0x{b:02X}>") for b in text.encode()]
            cases += [raw[:k] for k in range(1, len(raw) + 1)]
    return cases + _random_ids(model, seed=2, count=200)


def test_stream_joins_to_decode(real):
    for skip in (True, False):
        decoder = StreamDecoder(real.tokenizer, skip_special_tokens=skip)
        for ids in _stream_cases(real):
            expected = real.tokenizer.decode(ids, skip_special_tokens=skip)
            assert "".join(_stream(decoder, ids)) == expected, ids


def test_stream_is_prompt_and_whole(real):
    # For real text no piece holds U+FFFD, and the text is out as soon as it is whole: after
    # each id, what was printed is decode(ids so far) unless that ends in half a character.
    for text in CORPUS:
        ids = real.tokenizer.encode(text).ids
        decoder, printed = StreamDecoder(real.tokenizer), ""
        for k, token in enumerate(ids, 1):
            printed += decoder.push(token)
            assert "\ufffd" not in printed
            so_far = real.tokenizer.decode(ids[:k])
            whole = not so_far.endswith("\ufffd")
            in_run = real.tokenizer.id_to_token(token).startswith("<0x")  # a byte run may yet fail
            if whole and not in_run:
                assert printed == so_far, (text, k)
        assert printed + decoder.flush() == real.tokenizer.decode(ids)


def test_stream_tiny_sentencepiece(synthetic):
    # The Llama 2 flavour drops the "▁" in front of the first token only.
    model = synthetic["sentencepiece"]
    decoder = StreamDecoder(model.tokenizer)
    for ids in _stream_cases(model):
        assert "".join(_stream(decoder, ids)) == model.tokenizer.decode(ids), ids
    pieces = _stream(model.tokenizer, model.tokenizer.encode("the lazy dog").ids)
    assert "".join(pieces) == "the lazy dog" and not pieces[1].startswith(" ")  # [<s>, "the", ...]


def test_stream_emoji_across_tokens(smollm2):
    ids = smollm2.tokenizer.encode("🤖!").ids  # ðŁ ¤ ĸ !: the emoji's bytes over three tokens
    assert _stream(smollm2.tokenizer, ids) == ["", "", "🤖", "!", ""]


@pytest.mark.extended
def test_stream_byte_fallback(gemma3):
    euro, e_acute = ([gemma3.token_id(f"<0x{b:02X}>") for b in c.encode()] for c in "€é")
    x, bos = gemma3.token_id("x"), 2
    stream = partial(_stream, gemma3.tokenizer)
    # E2 82 AC: nothing until the run of byte tokens has ended.
    assert stream([*euro, x]) == ["", "", "", "€x", ""]
    # A run cut short decodes to one U+FFFD per byte; so does a whole "é" (C3 A9) in a run
    # that fails, which must therefore not be printed before the run ends.
    assert stream(euro[:2]) == ["", "", "\ufffd" * 2]
    assert stream([*e_acute, euro[0]]) == ["", "", "", "\ufffd" * 3]
    # A special token that decoding skips does not end a run: "é", <bos>, E2 is one failed run.
    assert stream([*e_acute, bos, euro[0], x]) == ["", "", "", "", "\ufffd" * 3 + "x", ""]


def test_stream_special_tokens(smollm2):
    ids = smollm2.tokenizer.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert "".join(_stream(smollm2.tokenizer, ids, skip=True)) == "user\nhi"
    assert "".join(_stream(smollm2.tokenizer, ids, skip=False)) == "<|im_start|>user\nhi<|im_end|>"
