"""Whether the branches of a ``oneOf`` exclude each other: proven from their schemas, or not.

``oneOf`` holds a value valid under exactly one branch. Where no value is valid under
two branches, that is ``anyOf``, which a language holds (the union). Where some are, it
is not: each branch's language is a subset of its schema's values (one spelling, bounded
runs), so "in this branch's language and in no other's" would still let through a value
another branch's schema accepts. So the proof is about the schemas' values, never the
languages' texts (``1`` and ``1.0`` are two texts and one number). Two schemas are
proven apart where:

* their types share none (an integer is a number);
* both are enumerations (``enum``, ``const``) sharing no value, or one is, and each of
  its values lies outside the other's range of numbers;
* both are numbers whose ranges do not meet;
* both are strings whose characters are known exactly (an enumeration, or a ``pattern``
  without ``.`` or a class escape, whose meanings differ between regex dialects, and
  lengths; not a ``format``, held only as a stated subset) and share no string
  (``algebra.intersection``);
* both are objects, and a property both require has schemas proven apart (the tagged
  union: ``{"kind": {"const": "circle"}}``), or one requires a property the other
  forbids (``additionalProperties: false``, no property or exact pattern for it);
* one is an ``anyOf`` or ``oneOf`` each of whose branches is proven apart from the other.

Anything else may overlap, and the ``oneOf`` is refused.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator

from .algebra import CharDFA, intersection
from .regex import ANY, RegexError, Repeat, alt, concat, literal, parse_search
from .values import distinct, is_type, same

PROVEN = (
    "proven apart are: different types, enum or const values, number ranges, string "
    "patterns, objects told apart by a required property"
)
TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
_INEXACT = re.compile(r"\\[dwsDWS]|(?<!\\)\.")  # what Python's re and ECMAScript read apart


def inexact(pattern: str) -> bool:
    """Whether ``pattern`` holds a construct that regex dialects read apart beyond printable
    ASCII (``.``, ``\\d``, ``\\w``, ``\\s`` and their negations: Unicode classes in Python's
    ``re``, which ``jsonschema`` uses, ASCII ones in ECMAScript and here)."""
    return bool(_INEXACT.search(pattern))


def overlapping(options: list, resolve: Callable) -> Iterator[tuple[int, int]]:
    """The pairs of ``options`` (schemas) not proven apart; ``resolve`` follows a ``$ref``."""
    for i in range(len(options)):
        for j in range(i + 1, len(options)):
            if not apart(options[i], options[j], resolve):
                yield i, j


def apart(a, b, resolve: Callable) -> bool:
    """Whether no value is valid under both ``a`` and ``b`` (False: not proven)."""
    a, b = resolve(a), resolve(b)
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    for one, other in ((a, b), (b, a)):
        for word in ("anyOf", "oneOf"):
            if isinstance(one.get(word), list):
                return all(apart(x, other, resolve) for x in one[word])
    shared = _kinds(a) & _kinds(b)
    if not shared:
        return True
    va, vb = _values(a), _values(b)
    if va is not None and vb is not None:
        return not {same(v) for v in va} & {same(v) for v in vb}
    if shared <= {"integer", "number"}:
        return _numbers_apart(a, b, va, vb)
    if shared == {"string"}:
        ca, cb = _chars(a, va), _chars(b, vb)
        return ca is not None and cb is not None and intersection(ca, cb) is None
    if shared == {"object"}:
        return _objects_apart(a, b, resolve) or _objects_apart(b, a, resolve)
    return False


def _kinds(schema: dict) -> set[str]:
    """The types a value of ``schema`` may have (an integer is a number too)."""
    values = _values(schema)
    if values is not None:
        kinds = {t for v in values for t in TYPES if is_type(v, t)}
    else:
        types = schema.get("type", list(TYPES))
        kinds = set([types] if isinstance(types, str) else types)
    return kinds | ({"integer"} if "number" in kinds else set())


def _values(schema: dict) -> list | None:
    if "const" in schema:
        values = [schema["const"]]
    elif isinstance(schema.get("enum"), list):
        values = schema["enum"]
    else:
        return None
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types
    return distinct([v for v in values if types is None or any(is_type(v, t) for t in types)])


def _range(schema: dict) -> tuple[float, bool, float, bool]:
    """``(low, low reached, high, high reached)`` of a number schema's bounds (at one value,
    an exclusive bound is the tighter)."""

    def given(*words: str) -> list[tuple[float, bool]]:
        bounds = [w for w in words if isinstance(schema.get(w), int | float)]
        return [(schema[w], w in ("minimum", "maximum")) for w in bounds
                if not isinstance(schema[w], bool)]  # fmt: skip

    low = max(
        [(-math.inf, False), *given("minimum", "exclusiveMinimum")], key=lambda t: (t[0], not t[1])
    )
    high = min([(math.inf, False), *given("maximum", "exclusiveMaximum")])
    return (*low, *high)


def _inside(x: float, bounds: tuple) -> bool:
    low, low_in, high, high_in = bounds
    return (x > low or (x == low and low_in)) and (x < high or (x == high and high_in))


def _numbers_apart(a: dict, b: dict, va: list | None, vb: list | None) -> bool:
    if va is not None or vb is not None:  # an enumeration against a range
        values, other = (va, b) if va is not None else (vb, a)
        return not any(_inside(v, _range(other)) for v in values if is_type(v, "number"))
    la, la_in, ha, ha_in = _range(a)
    lb, lb_in, hb, hb_in = _range(b)
    return (
        ha < lb
        or hb < la
        or (ha == lb and not (ha_in and lb_in))
        or (hb == la and not (hb_in and la_in))
    )


def _chars(schema: dict, values: list | None) -> CharDFA | None:
    """The strings ``schema`` accepts, exactly, as characters (None: not known exactly)."""
    if values is not None:
        return CharDFA.of(alt(literal(v) for v in values if isinstance(v, str)))
    if "format" in schema:
        return None
    parts = []
    pattern = schema.get("pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or inexact(pattern):
            return None
        try:
            tree, start, end = parse_search(pattern)
        except RegexError:
            return None
        anything = Repeat(ANY, 0, None)
        parts.append(concat(*([] if start else [anything]), tree, *([] if end else [anything])))
    low, high = schema.get("minLength", 0), schema.get("maxLength")
    parts.append(Repeat(ANY, low, high))
    dfa = CharDFA.of(parts[0])
    for part in parts[1:]:
        dfa = intersection(dfa, CharDFA.of(part))
    return dfa


def _objects_apart(a: dict, b: dict, resolve: Callable) -> bool:
    """A property ``a`` requires that ``b`` requires under a schema apart, or forbids."""
    props_a, props_b = a.get("properties") or {}, b.get("properties") or {}
    required_b = set(b.get("required") or [])
    for name in a.get("required") or []:
        if name in props_a and name in props_b and name in required_b:
            if apart(props_a[name], props_b[name], resolve):
                return True
        if name not in props_b and b.get("additionalProperties") is False:
            patterns = b.get("patternProperties") or {}
            if all(_never_matches(p, name) for p in patterns):
                return True
    return False


def _never_matches(pattern: str, name: str) -> bool:
    """Whether ``pattern`` surely finds no match in ``name`` (False where unsure)."""
    return not may_match(pattern, name, None)


def may_match(pattern: str, name: str, dfa) -> bool:
    """Whether ``pattern`` may find a match in ``name``: under this subset's reading (its
    language of characters ``dfa``, when given) or under Python's ``re``, which
    ``jsonschema`` reads it with (True where either does, or where unsure)."""
    if not isinstance(pattern, str) or (dfa is None and inexact(pattern)):
        return True
    if dfa is not None and dfa.accepts(name):
        return True
    try:
        return re.search(pattern, name) is not None
    except re.error:
        return inexact(pattern)
