"""The schema keywords a regular language holds (constrained/schema.py), held to ``jsonschema``.

* Every schema of the tests (``constrained.examples``' ``SCHEMAS`` and ``KEYWORDS``, the
  boundaries of tests/test_constrained.py, the function-calling set that compiles): 200
  seeded texts drawn from its DFA, a random live byte at a time, each parses and
  ``jsonschema`` (Draft 2020-12, formats checked) finds it valid.
* Hand-written invalid instances of each keyword's schema: ``jsonschema`` refuses each
  (so it is invalid), and the language does not hold it.
* Exact where a set is small enough to walk whole: ``multipleOf`` over every integer of
  its range, ``date`` over every day of leap and common years, ``ipv4`` over every
  octet, ``uniqueItems``, ``prefixItems`` and ``minProperties``/``maxProperties`` over
  every array or object of a small universe, a recursive ``$ref`` at its depth and one
  past; ``oneOf`` proven exclusive where its branches are, refused where a value valid
  under two branches exists (shown).
* Each keyword of the 2020-12 vocabulary compiled or refused by name, as the table in
  docs/serving_reference.md says; the function-calling schemas, what compiles and what is refused.
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import json
import re
import uuid
from pathlib import Path

import numpy as np
import pytest

from constrained import EmptyLanguage, Language, LanguageTooLarge, UnsupportedSchema
from constrained.automaton import DEAD
from constrained.examples import KEYWORDS, SCHEMAS
from constrained.masks import _distances

jsonschema = pytest.importorskip("jsonschema")  # a dev dependency: a test peer only
from json_oracle import full_time, is_valid, validate  # noqa: E402 (after the skip)
from test_constrained import BOUNDARIES  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FUNCTION_SCHEMAS = json.loads((ROOT / "tests" / "data" / "function_schemas.json").read_text())
SAMPLES = 200


# ----------------------------------------------------------------------------- samples


class Sampler:
    """Texts of a language drawn from its DFA: at each state a live byte class at random,
    then a byte of it, ending at random where the state accepts; after ``wander`` bytes
    only classes that bring an accepting state nearer (so every walk ends)."""

    def __init__(self, language: Language, wander: int = 120):
        dfa = language.dfa
        self.wander = wander
        self.accepting = dfa.accepting.tolist()
        self.bytes_of = [
            np.flatnonzero(dfa.classes == c).tolist() for c in range(dfa.table.shape[1])
        ]
        distance = _distances(dfa.table, dfa.accepting).tolist()
        self.moves = [
            [(c, int(t)) for c, t in enumerate(row) if t != DEAD] for row in dfa.table.tolist()
        ]
        self.nearer = [[(c, t) for c, t in moves if distance[t] < distance[s]]
                       for s, moves in enumerate(self.moves)]  # fmt: skip

    def text(self, rng: np.random.Generator) -> bytes:
        state, out = 0, bytearray()
        while True:
            moves = self.moves[state] if len(out) <= self.wander else self.nearer[state]
            if self.accepting[state] and (not moves or rng.random() < 0.15):
                return bytes(out)
            column, state = moves[int(rng.integers(len(moves)))]
            choices = self.bytes_of[column]
            out.append(choices[int(rng.integers(len(choices)))])


def _schemas_of_the_tests() -> dict[str, object]:
    schemas = {**SCHEMAS, **KEYWORDS}
    schemas |= {f"boundary {i}": s for i, (s, _, _) in enumerate(BOUNDARIES)}
    schemas |= {
        f"function {n}": s for n, s in FUNCTION_SCHEMAS.items() if n not in REFUSED_FUNCTIONS
    }
    return schemas


# What the function-calling set has that the subset refuses, and the keyword named.
REFUSED_FUNCTIONS = {
    "classify_ticket": "uniqueItems",
    "price": "multipleOf",
    "shipping_address": "if",
}


def _drawn(name: str, schema: dict):
    """The people's function-calling schemas (the most states) in the extended run."""
    slow = name.startswith("function ")
    return pytest.param(name, schema, marks=[pytest.mark.extended] if slow else [])


@pytest.mark.parametrize("name, schema", [_drawn(*item) for item in _schemas_of_the_tests().items()])  # fmt: skip
def test_200_texts_drawn_from_every_schema_s_language_validate(name, schema):
    language = Language.schema(schema)
    sampler, rng = Sampler(language), np.random.default_rng(list(name.encode()))
    texts = {sampler.text(rng) for _ in range(SAMPLES)}
    for text in texts:
        validate(json.loads(text), schema)
    assert len(texts) > 1 or language.dfa.states < 40, name  # a sampler that wandered


# ----------------------------------------------------------------------------- refused texts

INVALID = {
    "format date": [
        '"2023-02-29"',
        '"2024-13-01"',
        '"2024-04-31"',
        '"0000-01-01"',
        '"2024-1-01"',
        '"1900-02-29"',
        '"20240101"',
    ],
    "format time": ['"24:00:00Z"', '"12:60:00Z"', '"12:00:00"', '"12:00:00+24:00"', '"12:00Z"'],
    "format date-time": [
        '"2024-02-30T10:00:00Z"',
        '"2024-02-10 10:00:00Z"',
        '"2024-02-10T25:00:00Z"',
    ],
    "format email": ['"no-at-sign"', '"someone.with.a.long.name@example.com"'],
    "format uuid": [
        '"1234"',
        '"0f8fad5b-d9cb-469f-a165-70867728950"',
        '"0f8fad5bd9cb469fa16570867728950e"',
    ],
    "format ipv4": ['"256.1.1.1"', '"1.2.3"', '"1.2.3.4.5"', '"01.2.3.4"', '"1.2.3.-4"'],
    "format uri": ['"no scheme"', '"http://a b"', '"1http://a"', '"http://%zz"'],
    "pattern and length": ['"a"', '"abcdef"', '"ab1"', '"AB"'],
    "oneOf": [
        '{"kind":"circle","side":2}',
        '{"kind":"square","radius":2}',
        '{"kind":"circle"}',
        '{"kind":"triangle","side":1}',
        "0",
    ],
    "additionalProperties": ['{"a":"x"}', '{"a":1,"b":true}', '{"a":1.5}', "[]"],
    "properties and more": ['{"id":1,"x":1}', '{"x":true}', '{"id":1,"x":true,"y":true,"z":true}'],
    "patternProperties": [
        '{"x-a":"toolong"}',
        '{"y":1}',
        '{"n1":"one"}',
        '{"x-":"a"}',
        '{"n10":1}',
    ],
    "prefixItems": ['["a",1]', "[1,2]", '[1,"a",3]', '[91,"a"]'],
    "prefixItems and items": ["[true]", "[1,1]", "[true,1,2,3,4]", "[true,10]", "[true,null]"],
    "minProperties and maxProperties": ["{}", '{"a":true,"b":null,"c":1}', '{"c":10}'],
    "multipleOf": ["8", "-56", "504", "1", "7.5"],
    "recursive $ref": [
        '{"children":[]}',
        '{"value":1,"children":[{"value":10}]}',
        '{"value":1,"children":[{},{}]}',
    ],
    "uniqueItems": ["[]", '["red","red"]', "[1,1.0]", '["green",1,"green"]', '["pink"]'],
}


@pytest.mark.parametrize("name", list(INVALID))
def test_every_hand_written_invalid_instance_is_outside_the_language(name):
    """Each text is invalid (``jsonschema`` says so) and the language does not hold it."""
    schema = KEYWORDS[name]
    language = Language.schema(schema)
    for text in INVALID[name]:
        assert not is_valid(json.loads(text), schema), (name, text)
        assert not language.accepts(text), (name, text)


@pytest.mark.parametrize("name", [n for n in INVALID if n != "format email"])
def test_a_schema_s_pattern_reads_back_as_its_language(name):
    """``Language.pattern`` (its automata written out by state elimination) parsed again:
    the same verdict on drawn texts and on the invalid ones. An automaton too large to
    write out is refused by name (the e-mail met with a length: 153 states)."""
    language = Language.schema(KEYWORDS[name])
    printed = Language.regex(language.pattern)
    sampler, rng = Sampler(language), np.random.default_rng(1)
    for text in [sampler.text(rng) for _ in range(40)] + [t.encode() for t in INVALID[name]]:
        assert printed.accepts(text) == language.accepts(text), (name, text)
    with pytest.raises(ValueError, match="no pattern short enough to print"):
        Language.schema(KEYWORDS["format email"]).pattern  # noqa: B018


def test_the_unsound_object_is_sound():
    """``additionalProperties`` as a schema was read as "any object", and the mask let
    ``{"a":"x"}`` through: now every member is held to it, named or not."""
    schema = KEYWORDS["additionalProperties"]
    language = Language.schema(schema)
    assert not language.accepts('{"a":"x"}') and not language.accepts('{"a":{}}')
    for text in ['{"a":1}', "{}", '{"a":1,"b":-2}', '{"é":0}']:
        assert language.accepts(text) and is_valid(json.loads(text), schema)


# ----------------------------------------------------------------------------- exact sets


def test_multiple_of_holds_exactly_the_multiples_in_range():
    language = Language.schema(KEYWORDS["multipleOf"])  # multiples of 7 from -50 to 500
    for x in range(-80, 560):
        assert language.accepts(str(x)) == (x % 7 == 0 and -50 <= x <= 500), x
    unbounded = Language.schema({"type": "integer", "multipleOf": 3})
    rng = np.random.default_rng(0)
    for x in [0, 3, 999_999_999_999_999, *rng.integers(-(10**15) + 1, 10**15, 300).tolist()]:
        assert unbounded.accepts(str(x)) == (x % 3 == 0), x
    assert not unbounded.accepts("-0") and not unbounded.accepts("03")
    assert not unbounded.accepts(str(10**15 + 2))  # over 15 digits: the bound on a run of digits


@pytest.mark.parametrize("year", [4, 100, 400, 1900, 1999, 2000, 2023, 2024, 2100, 9999])
def test_date_holds_exactly_the_days_of_each_month(year):
    language = Language.schema(KEYWORDS["format date"])
    for month, day in itertools.product(range(0, 14), range(0, 33)):
        text = f"{year:04d}-{month:02d}-{day:02d}"
        assert language.accepts(json.dumps(text)) == _calendar_day(text), text


def _calendar_day(text: str) -> bool:
    try:
        return bool(datetime.date.fromisoformat(text))
    except ValueError:
        return False


def test_time_and_ipv4_and_uuid_by_hand():
    time = Language.schema(KEYWORDS["format time"])
    cases = [("00:00:00Z", True), ("23:59:59.999999999+23:59", True), ("12:00:00-05:30", True),
             ("23:59:59.1234567890Z", False), ("12:00:00z", False), ("7:00:00Z", False)]  # fmt: skip
    for text, ok in cases:
        assert time.accepts(json.dumps(text)) == ok, text
        if ok:
            assert full_time(text)
    ipv4 = Language.schema(KEYWORDS["format ipv4"])
    for octet in range(0, 300):
        for text in (f"{octet}.0.0.1", f"10.{octet}.0.1", f"0{octet}.1.1.1"):
            assert ipv4.accepts(json.dumps(text)) == _ipv4(text), text
    uuids = Language.schema(KEYWORDS["format uuid"])
    for _ in range(50):
        text = str(uuid.uuid4())
        assert uuids.accepts(json.dumps(text)) and uuids.accepts(json.dumps(text.upper()))


def _ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def _arrays(values: list, longest: int):
    for n in range(longest + 1):
        yield from itertools.product(values, repeat=n)


def test_unique_items_holds_exactly_the_arrays_of_distinct_values():
    """Every array of up to 6 of the enumeration's texts (1 and 1.0 one value, written 1)."""
    schema = KEYWORDS["uniqueItems"]
    language = Language.schema(schema)
    for items in _arrays(['"red"', '"green"', '"blue"', "1"], 5):
        text = "[" + ",".join(items) + "]"
        assert language.accepts(text) == is_valid(json.loads(text), schema), text


def test_prefix_items_hold_exactly_the_arrays_they_allow():
    universe = ["true", "false", "0", "5", "null", '"a"', "-1.5"]
    for name in ("prefixItems", "prefixItems and items"):
        schema = KEYWORDS[name]
        language = Language.schema(schema)
        for items in _arrays(universe, 5):
            text = "[" + ",".join(items) + "]"
            assert language.accepts(text) == is_valid(json.loads(text), schema), (name, text)


def test_min_and_max_properties_count_the_members_written():
    schema = KEYWORDS["minProperties and maxProperties"]
    language = Language.schema(schema)
    members = ['"a":true', '"b":null', '"c":3']
    for n in range(4):
        for chosen in itertools.combinations(members, n):
            text = "{" + ",".join(chosen) + "}"
            assert language.accepts(text) == is_valid(json.loads(text), schema), text
    more = Language.schema(KEYWORDS["properties and more"])  # id, then at most two booleans
    assert more.accepts('{"id":0,"x":true,"y":false}') and not more.accepts(
        '{"id":0,"x":true,"y":false,"z":true}'
    )
    assert not more.accepts('{"id":0,"id":true}')  # an extra member never repeats a named one


def test_pattern_properties_write_each_name_under_its_pattern_only():
    language = Language.schema(KEYWORDS["patternProperties"])
    for text, ok in [('{"name":"ab","x-k":"v","n3":7}', True), ('{"x-k":"v","x-k":"w"}', True),
                     ('{"n3":7,"name":"ab"}', False), ('{"name":"a","name":"b"}', False),
                     ('{"n\\u0031":1}', False)]:  # fmt: skip
        assert language.accepts(text) == ok, text


def test_where_regex_dialects_differ_the_text_keeps_to_printable_ascii():
    """``\\d`` is any decimal digit to Python's ``re`` (``jsonschema``'s) and an ASCII one to
    ECMAScript and this subset: a member's name under such a pattern is printable ASCII,
    where they agree, and a property whose name either reading matches is refused; under
    ``\\D`` a string is printable ASCII too (Python's ``\\D`` refuses "٣")."""
    schema = {"type": "object", "patternProperties": {"^\\d+$": {"type": "integer"}},
              "additionalProperties": False}  # fmt: skip
    language = Language.schema(schema)
    assert language.accepts('{"12":1}') and not language.accepts('{"٣":1}')
    assert not is_valid({"٣": 1.5}, schema)  # jsonschema holds "٣" to the pattern's schema
    with pytest.raises(UnsupportedSchema, match="patternProperties"):
        Language.schema(schema | {"properties": {"٣": {"type": "string"}}})
    digits = {"type": "string", "pattern": "^\\D+$"}
    assert not is_valid("٣", digits) and not Language.schema(digits).accepts('"٣"')
    assert Language.schema(digits).accepts('"a-b"')


def test_a_recursive_ref_unrolls_to_its_depth():
    language = Language.schema(KEYWORDS["recursive $ref"])
    node = '{"value":1}'
    for depth in range(1, 5):
        text = node
        for _ in range(depth - 1):
            text = '{"value":1,"children":[' + text + "]}"
        assert language.accepts(text) == (depth <= 3), depth  # schema.DEPTH levels
    looped = Language.schema({"type": "array", "items": {"$ref": "#"}})  # the root, then 3 more
    assert looped.accepts("[[[[]]]]") and not looped.accepts("[[[[[]]]]]")


# ----------------------------------------------------------------------------- oneOf

APART = [
    ({"type": "string"}, {"type": "integer"}),
    ({"type": "integer", "maximum": 5}, {"type": "integer", "minimum": 6}),
    ({"type": "integer", "exclusiveMaximum": 1}, {"type": "number", "minimum": 1}),
    ({"enum": ["a", 1]}, {"enum": ["b", 2, True]}),
    ({"const": 0}, {"type": "integer", "minimum": 1}),
    ({"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "^b"}),
    ({"type": "string", "maxLength": 2}, {"type": "string", "minLength": 3}),
    ({"type": "object", "properties": {"k": {"const": "x"}}, "required": ["k"]},
     {"type": "object", "properties": {"k": {"const": "y"}}, "required": ["k"]}),
    ({"type": "object", "properties": {"a": {}}, "required": ["a"]},
     {"type": "object", "properties": {"b": {}}, "additionalProperties": False}),
    ({"anyOf": [{"type": "null"}, {"type": "boolean"}]}, {"type": "string"}),
]  # fmt: skip
OVERLAPPING = [  # each with a value valid under both
    (({"type": "integer"}, {"type": "number", "maximum": 0}), -1),
    (({"const": 1}, {"const": 1.0}), 1),
    (({"type": "number", "maximum": 1}, {"type": "number", "minimum": 1}), 1),
    (({"type": "string", "pattern": "\\d"}, {"type": "string", "pattern": "^[٣]$"}), "٣"),
    (({"type": "string", "format": "email"}, {"type": "string", "pattern": "^a@b$"}), "a@b"),
    (({"type": "object", "properties": {"a": {}}}, {"type": "object", "properties": {"b": {}}}), {}),
    (({}, {"type": "null"}), None),
]  # fmt: skip


@pytest.mark.parametrize("a, b", APART)
def test_one_of_compiles_where_its_branches_are_proven_apart(a, b):
    schema = {"oneOf": [a, b]}
    sampler, rng = Sampler(Language.schema(schema)), np.random.default_rng(0)
    for _ in range(50):
        validate(json.loads(sampler.text(rng)), schema)


@pytest.mark.parametrize("pair, value", OVERLAPPING)
def test_one_of_is_refused_where_a_value_is_valid_under_two_branches(pair, value):
    a, b = pair
    assert is_valid(value, a) and is_valid(value, b)  # the witness: so oneOf cannot be anyOf
    with pytest.raises(UnsupportedSchema, match="oneOf branches 0 and 1 may both hold one value"):
        Language.schema({"oneOf": [a, b]})


# ----------------------------------------------------------------------------- the table

# A schema using each keyword of JSON Schema 2020-12's validation and applicator
# vocabularies (format as its own rows), and whether it compiles.
VOCABULARY = {
    "type": ({"type": ["string", "null"]}, "compiled"),
    "enum": ({"enum": [1, "a", None]}, "compiled"),
    "const": ({"const": {"a": [1]}}, "compiled"),
    "multipleOf": ({"type": "integer", "multipleOf": 5}, "compiled"),
    "multipleOf (not whole)": ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
    "minimum, maximum": ({"type": "integer", "minimum": -3, "maximum": 3}, "compiled"),
    "exclusiveMinimum, exclusiveMaximum": (
        {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 9},
        "compiled",
    ),
    "minLength, maxLength": ({"type": "string", "minLength": 1, "maxLength": 4}, "compiled"),
    "pattern": ({"type": "string", "pattern": "^[a-z]+$"}, "compiled"),
    "format: date": ({"type": "string", "format": "date"}, "compiled"),
    "format: time": ({"type": "string", "format": "time"}, "compiled"),
    "format: date-time": ({"type": "string", "format": "date-time"}, "compiled"),
    "format: email": ({"type": "string", "format": "email"}, "compiled"),
    "format: uuid": ({"type": "string", "format": "uuid"}, "compiled"),
    "format: ipv4": ({"type": "string", "format": "ipv4"}, "compiled"),
    "format: uri": ({"type": "string", "format": "uri"}, "compiled"),
    "format: others": ({"type": "string", "format": "hostname"}, "format"),
    "minItems, maxItems": ({"type": "array", "minItems": 1, "maxItems": 2}, "compiled"),
    "items": ({"type": "array", "items": {"type": "null"}}, "compiled"),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "null"}]}, "compiled"),
    "uniqueItems (enumeration)": (
        {"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True},
        "compiled",
    ),
    "uniqueItems (other items)": (
        {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "uniqueItems",
    ),
    "contains, minContains, maxContains": (
        {"type": "array", "contains": {"type": "null"}},
        "contains",
    ),
    "properties, required": (
        {"type": "object", "properties": {"a": {}}, "required": ["a"]},
        "compiled",
    ),
    "additionalProperties": (
        {"type": "object", "additionalProperties": {"type": "null"}},
        "compiled",
    ),
    "patternProperties": (
        {"type": "object", "patternProperties": {"^a": {"type": "null"}}},
        "compiled",
    ),
    "minProperties, maxProperties": (
        {"type": "object", "properties": {"a": {}}, "minProperties": 1},
        "compiled",
    ),
    "propertyNames": ({"type": "object", "propertyNames": {"maxLength": 3}}, "propertyNames"),
    "dependentRequired, dependentSchemas": (
        {"type": "object", "dependentRequired": {"a": ["b"]}},
        "dependentRequired",
    ),
    "anyOf": ({"anyOf": [{"type": "null"}, {"type": "boolean"}]}, "compiled"),
    "oneOf (branches apart)": ({"oneOf": [{"type": "null"}, {"type": "boolean"}]}, "compiled"),
    "oneOf (branches that may overlap)": (
        {"oneOf": [{"type": "integer"}, {"type": "number"}]},
        "oneOf",
    ),
    "allOf (one, or objects to merge)": (
        {"allOf": [{"type": "object", "properties": {"a": {}}}, {"required": ["a"]}]},
        "compiled",
    ),
    "allOf (others)": ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "allOf"),
    "not": ({"not": {"type": "null"}}, "not"),
    "if, then, else": ({"if": {"type": "null"}, "then": {}}, "if"),
    "$ref, $defs": ({"$defs": {"a": {"type": "null"}}, "$ref": "#/$defs/a"}, "compiled"),
    "$ref (recursive)": ({"type": "object", "properties": {"next": {"$ref": "#"}}}, "compiled"),
    "unevaluatedProperties, unevaluatedItems": (
        {"type": "object", "unevaluatedProperties": False},
        "unevaluatedProperties",
    ),
}


@pytest.mark.parametrize("row", list(VOCABULARY))
def test_each_keyword_compiles_or_is_refused_by_name_with_why(row):
    schema, outcome = VOCABULARY[row]
    if outcome == "compiled":
        Language.schema(schema)
        return
    with pytest.raises(UnsupportedSchema) as caught:
        Language.schema(schema)
    message = str(caught.value)
    assert caught.value.keyword == outcome and outcome in message, message
    assert ":" in message.split(outcome, 1)[1] or "(" in message, message  # a reason follows


def test_the_docs_table_says_what_each_keyword_does():
    """docs/serving_reference.md's table of keywords: one row per row here, "compiled" or
    "refused" as the schema does."""
    text = (ROOT / "docs" / "serving_reference.md").read_text()
    rows = re.findall(r"^\| (`[^|]+`[^|]*) \| (compiled|refused) \|", text, re.MULTILINE)
    table = {cells.replace("`", "").strip(): status for cells, status in rows}
    assert set(table) == set(VOCABULARY)
    for row, (_, outcome) in VOCABULARY.items():
        assert table[row] == ("compiled" if outcome == "compiled" else "refused"), row


# ----------------------------------------------------------------------------- as people write them


@pytest.mark.extended  # 29 schemas compiled: half a minute on 2 cores
def test_the_function_calling_schemas_compile_but_three():
    """29 schemas as people write them for tools and structured output
    (tests/data/function_schemas.json): 26 compile, and the three refused name the keyword
    (uniqueItems over strings, a multipleOf of 0.01, if/then)."""
    refused = {}
    for name, schema in FUNCTION_SCHEMAS.items():
        try:
            Language.schema(schema)
        except UnsupportedSchema as exc:
            refused[name] = exc.keyword
    assert len(FUNCTION_SCHEMAS) == 29 and refused == REFUSED_FUNCTIONS


def test_a_budget_of_states_or_sets_is_refused_before_it_is_built():
    with pytest.raises(LanguageTooLarge, match="uniqueItems over 13 values"):
        Language.schema({"type": "array", "items": {"enum": list(range(13))}, "uniqueItems": True})
    with pytest.raises(EmptyLanguage, match="minItems 3"):
        Language.schema(
            {"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 3}
        )
