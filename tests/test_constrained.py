"""Constrained decoding (constrained/): the languages, the masks, and generation under them.

* The regex subset matches what Python's ``re`` matches (hypothesis: random patterns and
  strings), through the DFA, the definition's NFA, and the printed pattern read back;
  UTF-8 spells exactly each range of characters.
* A schema's language holds only texts that parse and that the ``jsonschema`` library
  validates (random walks through the DFA of hypothesis-generated schemas), and its
  bounds are exact at the boundary (a value at ``maxLength``, at ``maximum``, one past).
* The fast mask equals the definition's, token for token, on SmolLM2's whole vocabulary,
  at the states that matter by hand: a token across a structural boundary (``"},``),
  a character split across tokens, special and empty tokens, EOS only where the text
  is whole. (50+ generated schemas and patterns, and Gemma 3's vocabulary: the extended
  run, tests/test_constrained_extended.py.)
* Greedy constrained output is the same tokens at every level (float64; level 4 in its
  float32) and the reference model's; a sampled one is the same under the fast mask and
  under the definition.
* Bad schemas and patterns are one clear error naming the keyword; a limit is refused
  before anything large is built.
"""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
import reference as ref
from _helpers import small_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrained import (
    EmptyLanguage,
    Index,
    Language,
    LanguageTooLarge,
    RegexError,
    SchemaError,
    Tokens,
    UnsupportedSchema,
)
from constrained.automaton import DEAD, utf8_sequences
from constrained.definition import Definition, DefinitionConstraint
from constrained.formats import FORMATS
from constrained.regex import parse, to_pattern
from levels import init_params

jsonschema = pytest.importorskip("jsonschema")  # a dev dependency: a test peer only
from json_oracle import validate  # noqa: E402 (after the skip)

# ----------------------------------------------------------------------------- regexes

ALPHABET = 'ab0 -"é€😀'  # ASCII, 2-, 3- and 4-byte characters, and two that need care
_LEAVES = ["a", "b", "0", " ", "-", '"', "é", "€", "😀", ".", r"\d", r"\w", r"\s", r"\-"]
_CLASSES = ["[ab]", "[^a]", "[a-z]", "[é-😀]", "[^€]", r"[\d-]", "[-a]", r"[^\s]", "[0-9a-f]"]


def _patterns() -> st.SearchStrategy[str]:
    leaf = st.sampled_from(_LEAVES + _CLASSES)
    quantifier = st.sampled_from(["*", "+", "?", "{2}", "{0,2}", "{1,3}", "{2,}", "+?"])
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, min_size=2, max_size=3).map("".join),
            st.lists(inner, min_size=2, max_size=3).map(lambda o: "(?:" + "|".join(o) + ")"),
            st.tuples(inner, quantifier).map(lambda p: f"(?:{p[0]}){p[1]}"),
            inner.map(lambda p: f"({p})"),
        ),
        max_leaves=6,
    )


def _walk_text(language: Language, rng: np.random.Generator, most: int = 400) -> bytes | None:
    """A random string of the language: a walk through its DFA, a random byte of a random
    live class at each state, ending in an accepting state at random; after ``most // 4``
    bytes only classes that bring an accepting state nearer (None: too long)."""
    dfa, state, out = language.dfa, 0, bytearray()
    distance = _distances(dfa)
    while len(out) < most:
        if dfa.accepting[state] and (rng.random() < 0.3 or len(out) > most // 4):
            return bytes(out)
        live = np.flatnonzero(dfa.table[state] != DEAD)
        if not live.size:
            return bytes(out)
        if len(out) > most // 4:
            live = live[distance[dfa.table[state, live]] < distance[state]]
        column = int(rng.choice(live))
        byte = int(rng.choice(np.flatnonzero(dfa.classes == column)))
        out.append(byte)
        state = dfa.step(state, byte)
    return None


def _distances(dfa) -> np.ndarray:
    """``(N,)``: the fewest bytes from each state to an accepting one."""
    distance = np.where(dfa.accepting, 0, np.iinfo(np.int64).max // 2)
    while True:
        nxt = np.where(dfa.table >= 0, distance[dfa.table], np.iinfo(np.int64).max // 2)
        better = np.minimum(distance, nxt.min(axis=1) + 1)
        if (better == distance).all():
            return distance
        distance = better


def _python_agrees(pattern: str, text: str) -> bool:
    return re.fullmatch(pattern, text, re.ASCII) is not None


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pattern=_patterns(), texts=st.lists(st.text(ALPHABET, max_size=6), max_size=6),
       seed=st.integers(0, 2**32 - 1))  # fmt: skip
def test_a_pattern_matches_what_python_re_matches(pattern, texts, seed):
    """The DFA, the definition's NFA and the printed tree read back all accept exactly
    the strings ``re.fullmatch`` (ASCII classes, as this subset has them) accepts: random
    strings, and strings of the language (random walks through the DFA), which ``re``
    must match too."""
    language = Language.regex(pattern)
    definition = Definition(language.nfa)
    printed = Language.regex(to_pattern(language.tree))
    rng = np.random.default_rng(seed)
    walked = [t for t in (_walk_text(language, rng, most=40) for _ in range(6)) if t is not None]
    for data in [t.encode() for t in texts] + walked:
        want = _python_agrees(pattern, data.decode())
        assert language.accepts(data) == want, (pattern, data)
        assert definition.accepts(data) == want, (pattern, data)
        assert printed.accepts(data) == want, (to_pattern(language.tree), data)
    assert all(_python_agrees(pattern, t.decode()) for t in walked)


@pytest.mark.parametrize(
    "lo, hi",
    [(0, 0x7F), (0x7F, 0x80), (0x7FF, 0x800), (0xFFFF, 0x10000), (0x10FFFF, 0x10FFFF),
     (0xD7FF, 0xE000), (0x3FF, 0x1001), (0x1F600, 0x1F64F), (0x80, 0xFFFF)],
)  # fmt: skip
def test_utf8_sequences_spell_exactly_the_range(lo, hi):
    """Every character of ``lo..hi`` (surrogates aside) is spelled by one sequence of byte
    ranges, and nothing else is: checked against Python's own UTF-8 for every code point
    in and around the range."""
    sequences = [s for a, b in ((lo, min(hi, 0xD7FF)), (max(lo, 0xE000), hi)) if a <= b
                 for s in utf8_sequences(a, b)]  # fmt: skip

    def spelled(data: bytes) -> int:
        return sum(
            len(s) == len(data) and all(f <= x <= t for (f, t), x in zip(s, data, strict=True))
            for s in sequences
        )

    for cp in range(max(lo - 64, 0), min(hi + 64, 0x10FFFF) + 1):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        assert spelled(chr(cp).encode()) == int(lo <= cp <= hi), hex(cp)


def test_dot_and_classes_are_ecmascript_s_and_ascii():
    dot = Language.regex(".")
    assert not any(dot.accepts(c) for c in "\n\r\u2028\u2029")
    assert all(dot.accepts(c) for c in "a\t€😀\x00")
    assert Language.regex(r"\d").accepts("7") and not Language.regex(r"\d").accepts("٣")
    assert Language.regex(r"\w+").accepts("a_Z9") and not Language.regex(r"\w").accepts("é")


# ----------------------------------------------------------------------------- schemas


_PATTERNS = [r"^[a-c]{1,3}$", r"x", r"^\d{2}-\d$", r"(?:é|€)$", r'^[^"]?$']


def _schemas() -> st.SearchStrategy[dict]:
    small = st.integers(-20, 20)
    string = st.one_of(
        st.tuples(st.integers(0, 3), st.integers(0, 4)).map(
            lambda b: {"type": "string", "minLength": min(b), "maxLength": max(b)}
        ),
        st.sampled_from(_PATTERNS).map(lambda p: {"type": "string", "pattern": p}),
    )
    integer = st.tuples(small, small, st.booleans()).map(
        lambda b: {
            "type": "integer",
            "minimum" if b[2] else "exclusiveMinimum": min(b[:2]) - 1,
            "maximum": max(b[:2]),
        }  # fmt: skip
    )
    number = st.tuples(small, small).map(
        lambda b: {"type": "number", "minimum": min(b), "maximum": max(b)}
    )
    formatted = st.sampled_from(sorted(FORMATS)).map(lambda f: {"type": "string", "format": f})
    multiple = st.tuples(st.integers(2, 9), small).map(
        lambda t: {"type": "integer", "multipleOf": t[0], "minimum": t[1], "maximum": t[1] + 40}
    )
    scalars = st.one_of(
        string, integer, number, formatted, multiple, st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.lists(st.one_of(st.text("aé\"\\\n😀", max_size=3), small, st.booleans(), st.none()),
                 min_size=1, max_size=3).map(lambda v: {"enum": v}),
    )  # fmt: skip

    def compound(inner):
        obj = st.lists(st.tuples(st.sampled_from("pqrs"), inner, st.booleans()), min_size=1,
                       max_size=3, unique_by=lambda t: t[0]).map(
            lambda ps: {"type": "object", "properties": {n: s for n, s, _ in ps},
                        "required": [n for n, _, r in ps if r]}
        )  # fmt: skip
        arr = st.tuples(inner, st.integers(0, 1), st.integers(1, 3)).map(
            lambda t: {"type": "array", "items": t[0], "minItems": t[1], "maxItems": t[2]}
        )
        either = st.lists(inner, min_size=2, max_size=2).map(lambda o: {"anyOf": o})
        others = st.tuples(inner, st.integers(0, 2)).map(
            lambda t: {"type": "object", "additionalProperties": t[0], "maxProperties": t[1]}
        )
        patterned = st.tuples(inner, inner).map(
            lambda t: {"type": "object", "properties": {"p": t[0]},
                       "patternProperties": {"^q[0-9]?$": t[1]}, "additionalProperties": False}
        )  # fmt: skip
        prefixed = st.tuples(inner, inner, st.sampled_from([False, {"type": "null"}])).map(
            lambda t: {"type": "array", "prefixItems": [t[0], t[1]], "items": t[2]}
        )
        unique = st.lists(st.sampled_from([1, "a", True, None, 2.5]), min_size=1, max_size=4).map(
            lambda v: {"type": "array", "items": {"enum": v}, "uniqueItems": True}
        )
        tagged = st.lists(inner, min_size=2, max_size=2).map(
            lambda o: {"oneOf": [{"type": "object", "properties": {"t": {"const": i}, "v": s},
                                  "required": ["t"]} for i, s in enumerate(o)]}
        )  # fmt: skip
        return st.one_of(obj, arr, either, others, patterned, prefixed, unique, tagged)

    return st.recursive(scalars, compound, max_leaves=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=_schemas(), seed=st.integers(0, 2**32 - 1))
def test_every_text_of_a_schema_s_language_validates(schema, seed):
    """Random texts of the language of a random schema: each parses as JSON and the
    ``jsonschema`` library finds it valid."""
    language = Language.schema(schema)
    rng = np.random.default_rng(seed)
    texts = [t for t in (_walk_text(language, rng) for _ in range(12)) if t is not None]
    assert texts
    for text in texts:
        validate(json.loads(text), schema)  # formats checked


BOUNDARIES = [
    ({"type": "string", "maxLength": 3}, ['"abc"', '"€😀é"', '""', r'"\n\"\\"', r'"\u00e9ab"'],
     ['"abcd"', '"€😀éa"', r'"\q"', '"\n"', r'"\ud800"']),
    ({"type": "string", "minLength": 2, "maxLength": 2}, ['"ab"', '"😀😀"'], ['"a"', '"abc"']),
    ({"type": "integer", "minimum": -7, "maximum": 120}, ["-7", "0", "120", "99"],
     ["-8", "121", "-0", "007", "1.0", "1e2"]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, ["1", "9"], ["0", "10"]),
    ({"type": "number", "minimum": -1, "maximum": 2}, ["-1", "-1.0", "2", "2.000", "1.999", "-0.5", "0"],
     ["-1.01", "2.001", "2.5", "3", "1e0", "-2"]),
    ({"type": "number"}, ["-0.5e+10", "1E3", "0"], ["01", ".5", "1."]),
    ({"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
     ["[true]", "[true,false]"], ["[]", "[true,true,true]", "[true, false]"]),
    ({"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "boolean"},
      "c": {"type": "null"}}, "required": ["b"]},
     ['{"b":true}', '{"a":null,"b":false}', '{"b":true,"c":null}', '{"a":null,"b":true,"c":null}'],
     ['{}', '{"a":null}', '{"b":true,"a":null}', '{"b":true,}', '{,"b":true}']),
    ({"type": "object", "properties": {"a": {"type": "null"}}}, ["{}", '{"a":null}'], ['{"a":1}']),
    ({"type": "string", "pattern": "^a+$"}, ['"a"', '"aaa"'], ['""', '"ab"']),
    ({"type": "string", "pattern": "b"}, ['"b"', '"abc"', '"\\"b\\\\"'], ['"a"', '""']),
    ({"type": "string", "pattern": '^"$'}, [r'"\""'], ['"""']),
    ({"type": "string", "pattern": "^(?:a|b)$"}, ['"a"', '"b"'], ['"ab"', '""']),
    ({"enum": ["a\nb", 1.5, None, [1, {"x": "é"}]]}, [r'"a\nb"', "1.5", "null", '[1,{"x":"é"}]'],
     ['"a\nb"', "1.50", "[1,{\"x\":\"e\"}]"]),
    ({}, ['{"a":[1,{"b":null}]}', '"x"', "[]"], ["[[[[1]]]]", "{'a':1}"]),
]  # fmt: skip


@pytest.mark.parametrize("schema, accepted, refused", BOUNDARIES)
def test_a_schema_s_bounds_are_exact(schema, accepted, refused):
    """At and just past each bound, by hand: what the language accepts is what jsonschema
    validates (and a text it refuses is invalid, or a spelling the language leaves out:
    a space, a key out of order, ``-0``, an exponent under bounds, a surrogate escape)."""
    language = Language.schema(schema)
    for text in accepted:
        assert language.accepts(text), text
        jsonschema.validate(json.loads(text), schema)
    for text in refused:
        assert not language.accepts(text), text


BAD_SCHEMAS = [
    ({"type": "string", "format": "hostname"}, UnsupportedSchema, "format"),
    ({"type": "number", "multipleOf": 0.1}, UnsupportedSchema, "multipleOf"),
    ({"type": "array", "uniqueItems": True}, UnsupportedSchema, "uniqueItems"),
    ({"type": "array", "prefixItems": [{}], "uniqueItems": True}, UnsupportedSchema,
     "uniqueItems"),
    ({"oneOf": [{"type": "integer"}, {"type": "number", "maximum": 0}]}, UnsupportedSchema,
     "oneOf"),
    ({"not": {"type": "null"}}, UnsupportedSchema, "not"),
    ({"if": {"type": "null"}}, UnsupportedSchema, "if"),
    ({"type": "array", "contains": {"type": "null"}}, UnsupportedSchema, "contains"),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, UnsupportedSchema, "allOf"),
    ({"type": "object", "properties": {"ab": {}}, "patternProperties": {"^a": {}}},
     UnsupportedSchema, "patternProperties"),
    ({"type": "object", "additionalProperties": {}, "minProperties": 2}, UnsupportedSchema,
     "minProperties"),
    ({"type": "number", "minimum": 0.5}, UnsupportedSchema, "minimum"),
    ({"type": "number", "exclusiveMinimum": 0}, UnsupportedSchema, "exclusiveMinimum"),
    ({"maxLength": 3}, UnsupportedSchema, "maxLength"),
    ({"type": "string", "minimum": 3}, UnsupportedSchema, "minimum"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"],
      "additionalProperties": False}, EmptyLanguage, "required 'b'"),
    ({"type": "object", "properties": {"a": {}}, "maxProperties": 1, "required": ["a", "b"]},
     EmptyLanguage, "maxProperties 1"),
    ({"$defs": {"n": {"$ref": "#/$defs/n"}}, "$ref": "#/$defs/n"}, EmptyLanguage, "no value"),
    ({"$ref": "#/$defs/missing"}, SchemaError, "$ref"),
    ({"$ref": "https://example.com/a.json"}, UnsupportedSchema, "$ref"),
    ({"type": "text"}, SchemaError, "type"),
    ({"type": "string", "maxLength": -1}, SchemaError, "maxLength"),
    ({"type": "string", "pattern": "a(?=b)"}, SchemaError, "pattern"),
    ({"type": "string", "pattern": "^a|b"}, SchemaError, "pattern"),
    ({"type": "string", "maxLength": 10**6}, LanguageTooLarge, "maxLength 1000000"),
    ({"type": "array", "maxItems": 5000}, LanguageTooLarge, "maxItems 5000"),
    ({"type": "array", "items": {"enum": list(range(20))}, "uniqueItems": True},
     LanguageTooLarge, "uniqueItems over 20 values"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, EmptyLanguage, "between"),
    ({"type": "string", "enum": [1, 2]}, EmptyLanguage, "enum"),
    ({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 3},
     EmptyLanguage, "minItems 3"),
]  # fmt: skip


@pytest.mark.parametrize("schema, error, says", BAD_SCHEMAS, ids=[s for *_, s in BAD_SCHEMAS])
def test_a_schema_outside_the_subset_is_refused_by_name(schema, error, says):
    """One line naming the keyword; a bound over the limit is refused as the schema is read,
    before any pattern or automaton is built (``schema_to_regex`` raises it)."""
    from constrained.schema import schema_to_regex

    with pytest.raises(error) as caught:
        Language.schema(schema)
    assert says in str(caught.value) and "\n" not in str(caught.value)
    if isinstance(caught.value, SchemaError):
        assert caught.value.keyword in says
    if error is LanguageTooLarge:
        with pytest.raises(LanguageTooLarge):
            schema_to_regex(schema)


@pytest.mark.parametrize(
    "pattern, error, says",
    [("a{2000}", RegexError, "over the limit of 1000"), ("(a", RegexError, "never closed"),
     ("a)", RegexError, "unmatched"), (r"(a)\1", RegexError, "backreference"),
     ("a(?=b)", RegexError, "lookaround"), ("a^b", RegexError, "anchor ^"),
     (r"\bword", RegexError, "word boundary"), ("*a", RegexError, "nothing to repeat"),
     ("[z-a]", RegexError, "out of order"), (r"[^\u{0}-\u{10FFFF}]", EmptyLanguage, "empty"),
     ("(?:[a-z]{0,1000}){0,1000}", LanguageTooLarge, "over 200000 states")],
)  # fmt: skip
def test_a_pattern_outside_the_subset_or_matching_nothing_is_refused(pattern, error, says):
    """A malformed pattern as it is parsed; a large one as its NFA reaches the limit, before
    the subset construction starts; an empty language once its DFA shows it."""
    with pytest.raises(error, match=re.escape(says)):
        Language.regex(pattern)


# ----------------------------------------------------------------------------- masks


@pytest.fixture(scope="module")
def smollm2_tokens(smollm2_gguf):
    from levels import gguf

    tokenizer = gguf.load_tokenizer(smollm2_gguf)
    return tokenizer, Tokens.from_tokenizer(tokenizer)


def test_the_token_bytes_are_what_the_tokenizer_decodes(smollm2_tokens):
    """Any run of tokens: their bytes joined are the text ``decode`` gives (split
    characters included, where the run completes them); special tokens have none."""
    tokenizer, tokens = smollm2_tokens
    rng = np.random.default_rng(0)
    for _ in range(300):
        ids = [int(i) for i in rng.integers(0, len(tokens), 6)]
        joined = b"".join(tokens.bytes[i] or b"" for i in ids)
        assert joined.decode(errors="replace") == tokenizer.decode(ids, skip_special_tokens=True)
    specials = [i for i, b in enumerate(tokens.bytes) if b is None]
    assert tokenizer.id_to_token(specials[0]) == "<|endoftext|>" and len(specials) == 17


def check_masks(index: Index, definition: Definition, texts: list[bytes]) -> int:
    """The fast mask equals the definition's after each of ``texts``; -> how many compared."""
    for text in texts:
        constraint = index.constraint()
        for token in _tokens_spelling(index.tokens, text):
            constraint.advance(token)
        fast = constraint.allowed()
        slow = definition.allowed(text, index.tokens.bytes, index.stop_ids.tolist())
        differ = np.flatnonzero(fast != slow)
        assert not differ.size, (text, [(int(t), index.tokens.bytes[t]) for t in differ[:5]])
    return len(texts)


def _tokens_spelling(tokens: Tokens, text: bytes) -> list[int]:
    """Single-byte tokens spelling ``text`` (a byte-level vocabulary has one per byte)."""
    single = {b: i for i, b in enumerate(tokens.bytes) if b is not None and len(b) == 1}
    return [single[bytes([c])] for c in text]


def _ids_of(tokens: Tokens, *pieces: bytes) -> list[int]:
    return [tokens.bytes.index(p) for p in pieces]


def test_the_fast_mask_is_the_definition_s_at_the_states_that_matter(smollm2_tokens):
    """SmolLM2's 49,152 tokens, mask against mask, at texts chosen by hand: between JSON
    tokens, inside a string (almost every token allowed), at a split character, at an
    accepting state (EOS allowed), a whole text with nothing more allowed but EOS; and the
    cases named: a token across a structural boundary is allowed exactly where both its
    sides are, the second half of a character only after its first."""
    _, tokens = smollm2_tokens
    schema = {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "string", "maxLength": 4}}, "required": ["b"]}, "n": {"type": "integer",
        "minimum": 0, "maximum": 99}}, "required": ["a"]}  # fmt: skip
    language = Language.schema(schema)
    eos = 2  # <|im_end|>
    index, definition = Index(language, tokens, (eos,)), Definition(language.nfa)
    euro = "€".encode()
    texts = [b"", b"{", b'{"a":{"b":"', b'{"a":{"b":"x', b'{"a":{"b":"xy' + euro[:1],
             b'{"a":{"b":"xy' + euro[:2], b'{"a":{"b":"abcd', b'{"a":{"b":""},"n":1',
             b'{"a":{"b":""}}']  # fmt: skip
    assert check_masks(index, definition, texts) == 9
    # "}, across the end of the string, the inner object and the comma before "n".
    boundary = _ids_of(tokens, b'"},')
    where = {t: bool(_after(index, t).allowed()[boundary[0]]) for t in texts}
    assert where[b'{"a":{"b":"x'] and where[b'{"a":{"b":"abcd'] and not where[b'{"a":{"b":"xy\xe2']
    assert sum(where.values()) == 3  # and after the empty string's opening quote
    # The second half of "€" only after its first byte; its first only where 3 bytes fit.
    (half,) = _ids_of(tokens, euro[1:2])
    assert _after(index, b'{"a":{"b":"xy' + euro[:1]).allowed()[half]
    assert not _after(index, b'{"a":{"b":"xy').allowed()[half]
    # EOS where the text is whole (and then only EOS), nowhere else.
    assert _after(index, b'{"a":{"b":""}}').allowed().tolist().count(True) == 1
    assert not _after(index, b'{"a":{"b":""},"n":1').allowed()[eos]


def _after(index: Index, text: bytes):
    constraint = index.constraint()
    for token in _tokens_spelling(index.tokens, text):
        constraint.advance(token)
    return constraint


# A vocabulary small enough for a random model at every level: specials (no text), the
# printable bytes, JSON's structural pairs, the euro sign whole and in pieces, an empty one.
SPECIALS = [None, None, None]  # pad 0, bos 1, eos 2
VOCAB = SPECIALS + [bytes([b]) for b in range(0x20, 0x7F)] + [
    b'{"', b'":', b'",', b'"}', b'"},', b"},", b'""', "€".encode(), b"\xe2", b"\x82\xac",
    b"\xe2\x82", b"\xac", b"", b'":"', b"12",
]  # fmt: skip
EOS = 2


def test_special_and_empty_tokens_are_never_allowed():
    """A special token and an empty one add no text: never allowed, by either path (the
    prefix rule alone would allow an empty token forever, and the text would never end)."""
    tokens = Tokens.from_list(VOCAB)
    language = Language.regex('(?:[a-c"]|€)*')
    index, definition = Index(language, tokens, (EOS,)), Definition(language.nfa)
    for text in (b"", b"a", b'"\xe2', b"\xe2\x82"):
        fast = index.mask(index.dfa.walk(0, text))
        assert (fast == definition.allowed(text, tokens.bytes, [EOS])).all()
        assert not fast[[0, 1, VOCAB.index(b"")]].any()
        assert fast[EOS] == language.accepts(text)


SCHEMA = {
    "type": "object",
    "properties": {
        "k": {"type": "string", "maxLength": 3},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["k", "n"],
}


def _constrained_reference(config, params, prompt, n, index) -> list[int]:
    """Greedy under the mask with the float64 reference model: a full forward per step."""
    constraint, out = index.constraint(), []
    for _ in range(n):
        logits = ref.decoder_only_forward(config, params, np.array([prompt + out]))[:, -1]
        token = int(np.argmax(constraint.apply(logits)))
        out.append(token)
        if token == EOS:
            return out
        constraint.advance(token)
    return out


def _schema_case(case):
    """SCHEMA's index over VOCAB, and a random model (seeded) at the level to run under it:
    ``(index, config, params, model)``."""
    index = Index(Language.schema(SCHEMA), Tokens.from_list(VOCAB), (EOS,))
    config = small_config(case.tiny, vocab_size=len(VOCAB), max_seq_len=40)
    params = init_params(config, "decoder_only", seed=3, scheme="random")
    return index, config, params, case.build("DecoderOnlyTransformer", config, params)


@pytest.mark.best_dtype
@pytest.mark.interpreter_extended()  # level 4 under Triton's interpreter: 30 steps, seconds
def test_greedy_constrained_output_is_the_same_tokens_at_every_level(case):
    """A random model (seeded) under SCHEMA's mask: each level's ``stream`` gives the
    reference model's tokens, ending at EOS with a text that validates; unconstrained, the
    same model writes something else (the premise)."""
    index, config, params, model = _schema_case(case)
    prompt, n = [5, 40, 17], 30
    got = list(model.stream(prompt, n, constraint=index.constraint(), stop_ids=(EOS,)))
    want = _constrained_reference(config, params, prompt, n, index)
    assert got == want
    text = b"".join(VOCAB[t] for t in got[:-1])
    assert got[-1] == EOS and len(got) < n
    jsonschema.validate(json.loads(text), SCHEMA)
    free = list(model.stream(prompt, len(got), stop_ids=(EOS,)))
    assert free != got


@pytest.mark.best_dtype
@pytest.mark.interpreter_extended()  # level 4 under Triton's interpreter: seconds
def test_speculation_under_the_mask_gives_the_masked_greedy_tokens(case):
    """Drafts verified under the mask: the n-gram draft's guesses and another model's (which
    knows nothing of the schema, so some of its guesses leave the language and are rejected
    by the rule, their p being 0) give the tokens of masked greedy decoding, at every level."""
    from engine import ModelDraft, NGramDraft

    index, config, params, model = _schema_case(case)
    prompt, n = [5, 40, 17], 30
    want = list(model.stream(prompt, n, constraint=index.constraint(), stop_ids=(EOS,)))
    other = case.build("DecoderOnlyTransformer", config,
                       init_params(config, "decoder_only", seed=4, scheme="random"))  # fmt: skip
    for draft in (NGramDraft(), ModelDraft(other)):
        got = list(model.stream(prompt, n, constraint=index.constraint(), stop_ids=(EOS,),
                                draft=draft, draft_tokens=4))  # fmt: skip
        assert got == want, type(draft).__name__


def test_sampling_under_the_fast_mask_draws_the_definition_s_tokens():
    """Temperature 1, top-k and top-p over the masked logits: the same seeded draws give
    the same tokens whether the mask comes from the index or from the definition."""
    import levels

    tokens = Tokens.from_list(VOCAB)
    language = Language.schema(SCHEMA)
    config = small_config(False, vocab_size=len(VOCAB), max_seq_len=64)
    model = levels.load("level1_numpy").DecoderOnlyTransformer(
        config, init_params(config, "decoder_only", seed=4, scheme="random")
    )
    for seed in range(4):
        options = dict(temperature=1.0, top_k=40, top_p=0.95, seed=seed, stop_ids=(EOS,))
        fast = Index(language, tokens, (EOS,)).constraint()
        slow = DefinitionConstraint(Definition(language.nfa), tokens.bytes, (EOS,))
        a = list(model.stream([7], 50, constraint=fast, **options))
        b = list(model.stream([7], 50, constraint=slow, **options))
        assert a == b and a[-1] == EOS
        jsonschema.validate(json.loads(b"".join(VOCAB[t] for t in a[:-1])), SCHEMA)


def test_a_token_the_mask_refused_cannot_be_taken():
    index = Index(Language.regex("ab"), Tokens.from_list(VOCAB), (EOS,))
    constraint = index.constraint()
    with pytest.raises(ValueError, match="not allowed"):
        constraint.advance(VOCAB.index(b"b"))
    with pytest.raises(ValueError, match="not allowed"):
        constraint.advance(EOS)  # the text is not whole yet
    assert parse("ab") == index.language.tree


# ----------------------------------------------------------------------------- the commands


@pytest.mark.extended  # SmolLM2 loaded twice, and two answers
def test_ladder_generate_follows_a_regex_and_chat_a_schema(capsys, tmp_path, smollm2_gguf):
    from ladder.cli import main as ladder

    common = ["--level", "3", "--no-compile", "--threads", "1"]
    assert (
        ladder(["generate", "-p", "The Berlin wall fell in", "--regex", " [0-9]{4}", *common]) == 0
    )
    out = capsys.readouterr().out.rstrip("\n")
    assert re.fullmatch(r"The Berlin wall fell in [0-9]{4}", out), out
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
              "required": ["city"]}  # fmt: skip
    (tmp_path / "city.json").write_text(json.dumps(schema))
    question = "What is the capital of France? Answer in JSON."
    assert (
        ladder(["chat", "-p", question, "--json-schema", str(tmp_path / "city.json"), *common]) == 0
    )
    jsonschema.validate(json.loads(capsys.readouterr().out), schema)


@pytest.mark.parametrize(
    "flags, says",
    [(["--regex", "a(?=b)"], "--regex: lookaround"),
     (["--json-schema", "missing.json"], "--json-schema missing.json: No such file"),
     (["--json-schema", "pyproject.toml"], "not JSON"),
     (["--regex", "a{5000}"], "over the limit of 1000")],
)  # fmt: skip
def test_a_bad_schema_or_pattern_is_one_line_before_the_model_loads(capsys, flags, says):
    from ladder.cli import main as ladder

    start = time.perf_counter()
    assert ladder(["chat", "-p", "Hi", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and says in err, err
    assert time.perf_counter() - start < 5  # refused before any model loads


def test_the_benchmark_s_walk_stays_in_the_language_and_its_replay_takes_the_same_tokens():
    """benchmarks/constrained.py times ``_replay`` over the tokens ``_walk`` chose: a walk
    of allowed tokens whose text is a prefix of the language (whole where it ended), and a
    replay that takes every one of them again."""
    from benchmarks.constrained import STOPS, _replay, _walk

    tokens = Tokens.from_list(VOCAB)  # ids 0 and 2, SmolLM2's end-of-turn ids, are specials here
    index = Index(Language.schema(SCHEMA), tokens, STOPS)
    path, visits = _walk(index, np.random.default_rng(0))
    text = b"".join(tokens.bytes[t] for t in path if t not in STOPS)
    assert visits and path[-1] in STOPS and index.language.accepts(text)  # it ended the text
    _replay(index, path, np.zeros((1, len(tokens))))  # raises if a token is not allowed


def test_an_index_keeps_at_most_its_budget_of_masks(monkeypatch):
    """Past ``MASK_BYTES`` the oldest masks are dropped (and computed again if reached)."""
    from constrained import masks

    index = Index(Language.regex("[a-c]{0,40}"), Tokens.from_list(VOCAB), (EOS,))
    monkeypatch.setattr(masks, "MASK_BYTES", 5 * len(np.packbits(np.zeros(len(VOCAB), bool))))
    first = index.mask(0).copy()
    for state in range(1, 12):
        index.mask(state)
    assert len(index._masks) == 5 and 0 not in index._masks
    assert (index.mask(0) == first).all()


# ----------------------------------------------------------------------------- the budget

# Every byte a token of its own, and a few longer tokens across JSON's structure.
BYTES_VOCAB = SPECIALS + [bytes([b]) for b in range(256) if b not in (0, 1, 2)] + [
    b'{"', b'":', b'",', b'"}', b'"},', b"},", b'""', b'":"', b"12", b"true", b"null"]  # fmt: skip


def test_the_distance_to_the_end_is_the_shortest_way_in_one_byte_tokens():
    """``Index.distance`` against this file's own relaxation over the DFA's bytes (with a
    token for every byte the two are one measure), and a state where no one-byte token
    can end the text is far (a vocabulary without the bytes of "ï")."""
    for language in (Language.schema(SCHEMA), Language.json_object()):
        index = Index(language, Tokens.from_list(BYTES_VOCAB), (EOS,))
        assert (index.distance == _distances(language.dfa)).all()
    enum = Language.schema({"enum": ["naïve"]})
    index = Index(enum, Tokens.from_list(VOCAB), (EOS,))
    assert index.distance[0] >= 1 << 30 and index.distance[enum.dfa.walk(0, '"naï'.encode())] == 3


@pytest.mark.parametrize("extra", [0, 1, 5, 40])
def test_a_budget_ends_every_text_with_the_end_token_within_it(extra):
    """Random walks of allowed tokens (the hardest model: it never chooses to close), under
    each example schema and any object, with a budget from the least that can work (the
    shortest text's one-byte tokens and the end token: every step forced) up: each ends
    with EOS within its budget, and its text validates."""
    from constrained.examples import SCHEMAS

    tokens = Tokens.from_list(BYTES_VOCAB)
    rng = np.random.default_rng(extra)
    for schema in [*SCHEMAS.values(), None]:
        language = Language.json_object() if schema is None else Language.schema(schema)
        index = Index(language, tokens, (EOS,))
        budget = int(index.distance[0]) + 1 + extra
        for _ in range(5):
            constraint, taken = index.constraint(budget), []
            while not taken or taken[-1] != EOS:
                assert len(taken) < budget, (schema, taken)
                token = int(rng.choice(np.flatnonzero(constraint.allowed())))
                constraint.advance(token)
                taken.append(token)
            value = json.loads(b"".join(BYTES_VOCAB[t] for t in taken[:-1]))
            if schema is not None:
                jsonschema.validate(value, schema)
            assert constraint.ended and constraint.budget >= 0


def test_a_budget_with_room_to_spare_changes_no_mask():
    """Inside a string (where a character keeps the distance to the end), with room for
    every state's distance the mask is the cached one; with room for one less than the
    distance here, only the tokens that bring the end nearer are left (the closing quote,
    not a character)."""
    tokens = Tokens.from_list(BYTES_VOCAB)
    index = Index(Language.schema(SCHEMA), tokens, (EOS,))
    text = b'{"k":"'
    state = index.dfa.walk(0, text)
    quote, a = BYTES_VOCAB.index(b'"'), BYTES_VOCAB.index(b"a")
    for room, same in [(index.farthest, True), (int(index.distance[state]) - 1, False)]:
        constraint = index.constraint(len(text) + 2 + room)  # 2: this token, and the end
        for byte in text:
            constraint.advance(BYTES_VOCAB.index(bytes([byte])))
        allowed = constraint.allowed()
        assert (allowed == index.mask(state)).all() == same
        assert allowed[quote] and allowed[a] == same and not (allowed & ~index.mask(state)).any()


def test_a_budget_too_small_takes_the_shortest_way_and_runs_out():
    """One-byte tokens only, and a budget one short of the shortest text and its end token:
    every token brings the end one byte nearer, the text is whole at the last token, and
    there is no room left for the end token (the engine's "length")."""
    tokens = Tokens.from_list(SPECIALS + [bytes([b]) for b in range(3, 256)])
    index = Index(Language.schema(SCHEMA), tokens, (EOS,))
    budget = int(index.distance[0])
    constraint, rng = index.constraint(budget), np.random.default_rng(0)
    for _ in range(budget):
        before = index.distance[constraint.state]
        token = int(rng.choice(np.flatnonzero(constraint.allowed())))
        constraint.advance(token)
        assert token != EOS and index.distance[constraint.state] == before - 1
    assert constraint.accepting and constraint.budget == 0


def test_a_constrained_request_without_max_tokens_gets_the_server_s_budget():
    """``response_format`` and no ``max_tokens``: the request's max_tokens and its
    constraint's budget are ``structured.MAX_TOKENS`` (or the room, if less); a max_tokens
    the client gives is both; an unconstrained request keeps the room."""
    import asyncio
    from types import SimpleNamespace

    from serving.api import Server
    from serving.structured import MAX_TOKENS, Formats
    from serving.worker import Completion

    formats = Formats(tokenizer=None, stop_ids=(EOS,))
    formats._tokens = Tokens.from_list(VOCAB)
    server = SimpleNamespace(formats=formats)
    json_object = {"response_format": {"type": "json_object"}}
    asked = json_object | {"max_tokens": 900}
    for body, room, want in [(json_object, 2000, MAX_TOKENS), (json_object, 100, 100),
                             (asked, 900, 900), ({}, 2000, 2000)]:  # fmt: skip
        request = Completion([1, 2], room)
        constraint = asyncio.run(Server._format(server, body, request))
        assert request.max_tokens == want
        assert (constraint is None) == (body == {}) and (
            constraint is None or constraint.budget == want
        )
