"""Constrained decoding at full size (the extended run, which CI makes).

* Masks: the fast path's allowed set equals the definition's, token for token, over the
  whole vocabulary of SmolLM2 (49,152 tokens) and of Gemma 3 (262,144), at every state a
  random walk reaches in the languages of hypothesis-generated schemas and patterns
  (the walk takes random allowed tokens, so it crosses structural boundaries inside
  tokens and splits characters the way the vocabulary does), and after hypothesis-drawn
  strings spelled byte by byte. Run with ``-s`` for the counts.
* Outputs: 380 seeded generations, 10 under each of the 20 schemas of
  ``constrained.examples.SCHEMAS`` and the 18 of its ``KEYWORDS``, at temperature 1 from
  a random model over SmolLM2's vocabulary (it writes whatever the mask leaves: the
  hardest test of the mask, and of the budget, which alone ends the unbounded ones):
  every output ends at EOS within its 300 tokens, parses, and the ``jsonschema`` library
  validates it (formats checked); and SmolLM2 itself, greedy, under each schema.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_constrained import _patterns, _schemas

from constrained import Index, Language, Tokens
from constrained.definition import Definition
from constrained.examples import KEYWORDS, SCHEMAS

jsonschema = pytest.importorskip("jsonschema")  # a dev dependency: a test peer only
from json_oracle import validate  # noqa: E402 (after the skip)

pytestmark = pytest.mark.extended

COUNTS: collections.Counter = collections.Counter()


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    for key, n in sorted(COUNTS.items()):
        print(f"\nmask equality: {key}: {n}")


def _tokenizer(path):
    from levels import gguf

    return gguf.load_tokenizer(path)


@pytest.fixture(scope="module")
def smollm2_vocabulary(smollm2_gguf) -> Tokens:
    return Tokens.from_tokenizer(_tokenizer(smollm2_gguf))


@pytest.fixture(scope="module")
def gemma3_tokenizer(gemma3_gguf):
    return _tokenizer(gemma3_gguf)  # 262,144 pieces: seconds, once


@pytest.fixture(scope="module")
def gemma3_vocabulary(gemma3_tokenizer) -> Tokens:
    return Tokens.from_tokenizer(gemma3_tokenizer)


STOP = {"smollm2": (0, 2), "gemma3": (1, 106)}  # <|endoftext|> <|im_end|>; <eos> <end_of_turn>


def _compare_walk(name: str, tokens: Tokens, language: Language, seed: int, steps: int) -> None:
    """A walk of random allowed tokens from the start: at each state, the fast mask and the
    definition's over the whole vocabulary."""
    index, definition = Index(language, tokens, STOP[name]), Definition(language.nfa)
    rng = np.random.default_rng(seed)
    constraint, text = index.constraint(), b""
    for _ in range(steps):
        fast = constraint.allowed()
        slow = definition.allowed(text, tokens.bytes, STOP[name])
        differ = np.flatnonzero(fast != slow)
        assert not differ.size, (language.pattern, text, [tokens.bytes[t] for t in differ[:5]])
        COUNTS[f"{name} states"] += 1
        COUNTS[f"{name} tokens compared"] += len(fast)
        token = int(rng.choice(np.flatnonzero(fast)))
        if token in STOP[name]:
            break
        constraint.advance(token)
        text += tokens.bytes[token]


def _compare_text(name: str, tokens: Tokens, language: Language, text: bytes) -> None:
    """After ``text`` (when it is a prefix of the language), the two masks."""
    index, definition = Index(language, tokens, STOP[name]), Definition(language.nfa)
    state = index.dfa.walk(0, text)
    slow = definition.allowed(text, tokens.bytes, STOP[name])
    if state < 0:
        assert not slow.any()
        return
    assert (index.mask(state) == slow).all(), (language.pattern, text)
    COUNTS[f"{name} states"] += 1
    COUNTS[f"{name} tokens compared"] += len(slow)


def examples(n: int):
    """``n`` examples, no deadline (a state of Gemma's vocabulary takes a second)."""
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck),
                    database=None)  # fmt: skip


@examples(50)
@given(schema=_schemas(), seed=st.integers(0, 2**32 - 1))
def test_smollm2_masks_equal_the_definition_over_generated_schemas(
    smollm2_vocabulary, schema, seed
):
    COUNTS["smollm2 schemas"] += 1
    _compare_walk("smollm2", smollm2_vocabulary, Language.schema(schema), seed, steps=8)


@examples(50)
@given(pattern=_patterns(), seed=st.integers(0, 2**32 - 1), text=st.text('ab0 -"é€😀', max_size=5))
def test_smollm2_masks_equal_the_definition_over_generated_patterns(
    smollm2_vocabulary, pattern, seed, text
):
    COUNTS["smollm2 patterns"] += 1
    language = Language.regex(pattern)
    _compare_walk("smollm2", smollm2_vocabulary, language, seed, steps=6)
    data = text.encode()
    for cut in sorted({len(data), len(data) - 1, len(data) // 2}):  # some cut mid-character
        _compare_text("smollm2", smollm2_vocabulary, language, data[: max(cut, 0)])


@examples(50)
@given(schema=_schemas(), seed=st.integers(0, 2**32 - 1))
def test_gemma3_masks_equal_the_definition_over_generated_schemas(gemma3_vocabulary, schema, seed):
    COUNTS["gemma3 schemas"] += 1
    _compare_walk("gemma3", gemma3_vocabulary, Language.schema(schema), seed, steps=4)


@examples(30)
@given(pattern=_patterns(), seed=st.integers(0, 2**32 - 1))
def test_gemma3_masks_equal_the_definition_over_generated_patterns(
    gemma3_vocabulary, pattern, seed
):
    COUNTS["gemma3 patterns"] += 1
    _compare_walk("gemma3", gemma3_vocabulary, Language.regex(pattern), seed, steps=3)


def test_gemma3_token_bytes_are_what_it_decodes(gemma3_tokenizer, gemma3_vocabulary):
    """Every text token of Gemma's that is not BPE's (its added ones: "\n\n", runs of
    spaces, <start_of_image>) and a sample of the others decode to their bytes; a byte
    token (<0xE2>) is its byte, whole characters from a run of them."""
    tokenizer = gemma3_tokenizer
    added = [i for i, t in tokenizer.get_added_tokens_decoder().items() if not t.special]
    rng = np.random.default_rng(1)
    for i in added + [int(i) for i in rng.integers(0, len(gemma3_vocabulary), 3000)]:
        data = gemma3_vocabulary.bytes[i]
        if data is not None and data.decode(errors="ignore").encode() == data:  # whole characters
            assert data.decode() == tokenizer.decode([i], skip_special_tokens=True), i
    euro = [tokenizer.token_to_id(f"<0x{b:02X}>") for b in "€".encode()]
    assert b"".join(gemma3_vocabulary.bytes[i] for i in euro) == "€".encode()
    assert tokenizer.decode(euro) == "€" and len(added) > 100


def test_gemma3_masks_at_the_states_that_matter(gemma3_vocabulary):
    """By hand, on Gemma's vocabulary (whose byte tokens <0xE2> spell a character the
    vocabulary lacks, and whose text tokens include "\\n\\n" and runs of spaces)."""
    language = Language.schema(SCHEMAS["product"], whitespace=True)
    for text in [b"", b"{", b'{ "name"', b'{"name":"\xe2', b'{"name":"\xe2\x82', b'{"name":"ab',
                 b'{"name":"x","price":100', b'{"name":"x","price":1,"tags":[],"in_stock":true}']:  # fmt: skip
        _compare_text("gemma3", gemma3_vocabulary, language, text)


# ----------------------------------------------------------------------------- outputs

VALIDITY: dict[str, collections.Counter] = {}


def test_380_sampled_outputs_under_38_schemas_all_validate(smollm2_vocabulary):
    """Ten seeded generations under each schema at temperature 1, from a random model over
    SmolLM2's vocabulary at level 2, with a budget of 300 tokens: each ends at EOS within
    it, parses, validates. Prints the table."""
    import torch

    import levels
    from levels import TransformerConfig, init_params

    config = TransformerConfig(vocab_size=len(smollm2_vocabulary), d_model=32, n_heads=2,
                               d_ff=64, n_layers=1, max_seq_len=320)  # fmt: skip
    params = init_params(config, "decoder_only", seed=0, scheme="random")
    model = levels.load("level2_torch_manual").DecoderOnlyTransformer(
        config, params, dtype=torch.float32
    )
    stops = STOP["smollm2"]
    table = []
    for name, schema in (SCHEMAS | KEYWORDS).items():
        index = Index(Language.schema(schema), smollm2_vocabulary, stops)
        counts = collections.Counter()
        for seed in range(10):
            tokens = list(model.stream([1, 9, 42], 300, temperature=1.0, seed=seed,
                                       constraint=index.constraint(300), stop_ids=stops))  # fmt: skip
            counts["generated"] += 1
            counts["tokens"] += len(tokens)
            assert tokens[-1] in stops, (name, seed)
            text = b"".join(smollm2_vocabulary.bytes[t] for t in tokens[:-1]).decode()
            value = json.loads(text)
            counts["parsed"] += 1
            validate(value, schema)
            counts["valid"] += 1
            VALIDITY.setdefault(name, collections.Counter())[text] += 1
        table.append((name, counts, len(VALIDITY[name])))
    print("\n| schema | generated | parsed | valid | distinct | tokens, mean |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, c, distinct in table:
        print(f"| {name} | {c['generated']} | {c['parsed']} | {c['valid']} | {distinct} | "
              f"{c['tokens'] / c['generated']:.1f} |")  # fmt: skip
    assert sum(c["valid"] for _, c, _ in table) == 380


@pytest.mark.real_model
def test_smollm2_greedy_answers_under_every_schema_validate(smollm2_gguf, smollm2_vocabulary):
    """SmolLM2 at level 3 (float32), asked in its chat template for JSON, greedy, under each
    schema: every answer ends at end-of-turn, parses and validates."""
    import levels
    from levels import gguf

    config, params = gguf.load(smollm2_gguf, max_seq_len=512)
    model = levels.load("level3_sdpa_flash").DecoderOnlyTransformer(config, params)
    tokenizer = gguf.load_tokenizer(smollm2_gguf)
    template = gguf.load_chat_template(smollm2_gguf, True)
    stops = STOP["smollm2"]
    for name, schema in SCHEMAS.items():
        question = f"Give an example of {name} as JSON following this schema: {json.dumps(schema)}"
        text = template.render([{"role": "user", "content": question}], add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        index = Index(Language.schema(schema), smollm2_vocabulary, stops)
        tokens = list(model.stream(ids, 160, constraint=index.constraint(), stop_ids=stops))
        assert tokens[-1] in stops, name
        answer = tokenizer.decode(tokens[:-1])
        print(f"\n{name}: {answer}")
        jsonschema.validate(json.loads(answer), schema)
