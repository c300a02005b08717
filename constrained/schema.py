"""A JSON schema, as the regular expression of the JSON texts that satisfy it.

The subset, and what each part becomes (whitespace between the parts only with
``whitespace=True``, as ``[ \\t\\n\\r]*``; by default a text is compact):

* ``type``: ``object``, ``array``, ``string``, ``integer``, ``number``, ``boolean``,
  ``null``, or a list of them (one of them);
* objects: ``properties`` written in the order given, those in ``required`` always,
  the others each present or left out; no other property is ever written (so
  ``additionalProperties`` is read and never needed); ``{"type": "object"}`` alone is
  any object;
* strings: ``minLength``/``maxLength`` (in characters, as JSON Schema counts them),
  ``pattern`` (searched for, as JSON Schema does: anchor it with ``^...$`` to match the
  whole string; ``constrained.regex`` says which patterns);
* integers: ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``, as
  exact digit ranges (``0|[1-9][0-9]?|1[0-4][0-9]|150`` for 0 to 150); numbers:
  ``minimum``/``maximum`` with whole-number bounds (then written without an exponent),
  at most 16 digits after the point and 3 in an exponent (``FRACTION``, ``EXPONENT``);
* arrays: ``items``, ``minItems``, ``maxItems``;
* ``enum``, ``const`` (beside ``type`` only), ``anyOf``, ``allOf`` of one schema,
  ``$ref`` to ``#/$defs/...`` (or ``#/definitions/...``), not recursive;
* an empty schema (or ``true``), an array without ``items``, an object without
  ``properties``: any JSON value, nested at most ``depth`` (default ``DEPTH``) deep.

Annotations (``title``, ``description``, ``default``, ``examples``, ...) change nothing.
Any other keyword is an ``UnsupportedSchema`` naming it (``format``, ``multipleOf``,
``uniqueItems``, ``oneOf``, ``not``, ``patternProperties``, ...): it would constrain the
value, and a mask that ignored it would let through text the schema refuses. A bound
over ``MAX_REPEAT`` (``maxLength``, ``maxItems``) is a ``LanguageTooLarge`` naming it.

A string's characters are written as JSON writes them: any character but ``"``, ``\\``
and the controls below U+0020 as itself, or an escape (``\\"``, ``\\n``, ``\\u00e9``, ...),
each escape one character. Two things are left out, both still valid JSON for every value:
``\\u`` escapes of surrogates (a character outside the BMP is written as itself), and,
under a ``pattern``, escapes other than those JSON requires (``\\"``, ``\\\\``, and the
controls').
"""

from __future__ import annotations

import json
import math

from .automaton import EmptyLanguage, LanguageTooLarge
from .regex import MAX_REPEAT, Alt, Chars, Concat, Repeat, normalize, parse_search, to_pattern

DEPTH = 3  # how deeply a value of unknown shape may nest (json_object, an array without items)
MAX_DIGITS = 30  # an integer bound of more digits than this is refused

ANNOTATIONS = frozenset(
    ("title", "description", "$schema", "$id", "$comment", "examples", "default",
     "deprecated", "readOnly", "writeOnly", "$defs", "definitions")
)  # fmt: skip
FOR_TYPE = {
    "string": {"minLength", "maxLength", "pattern"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
    "array": {"items", "minItems", "maxItems"},
    "object": {"properties", "required", "additionalProperties"},
    "boolean": set(),
    "null": set(),
}
SHAPING = {"type", "enum", "const", "anyOf", "allOf", "$ref"}
KNOWN = SHAPING | set().union(*FOR_TYPE.values())

# A string's character: written as itself, or as one of JSON's escapes (no surrogate \u).
CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9A-Ca-cE-Fe-f][0-9A-Fa-f]{3}|[Dd][0-7][0-9A-Fa-f]{2}))'
STRING = f'"{CHAR}*"'
# A number's fraction has at most 16 digits and its exponent at most 3: past float64's 17
# significant digits and its exponents of 308 a digit changes nothing a client reads, and
# an unbounded run of digits is a loop a model can stay in until its tokens run out.
FRACTION = r"\.[0-9]{1,16}"
EXPONENT = r"[eE][+-]?[0-9]{1,3}"
NUMBER = rf"-?(?:0|[1-9][0-9]*)(?:{FRACTION})?(?:{EXPONENT})?"
WHITESPACE = r"[ \t\n\r]*"
_META = set("\\^$.|?*+()[]{}/-\"'")


class SchemaError(ValueError):
    """A schema that is malformed, or outside the subset; ``keyword`` is the one at fault."""

    def __init__(self, keyword: str, message: str):
        super().__init__(message)
        self.keyword = keyword


class UnsupportedSchema(SchemaError):
    """A keyword outside the subset (it would constrain what the mask cannot)."""


def escape(text: str) -> str:
    """``text`` as a pattern that matches exactly it."""
    return "".join("\\" + c if c in _META else c for c in text)


def dumps(value) -> str:
    """A value as the compact JSON text the constrained output writes."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def schema_to_regex(schema, *, whitespace: bool = False, depth: int = DEPTH) -> str:
    """The regular expression whose strings are the JSON texts of values valid under
    ``schema`` (written as the module docstring says)."""
    return _Compiler(schema, whitespace, depth).value(schema, "#")


def any_json_regex(*, whitespace: bool = False, depth: int = DEPTH, top: str | None = None) -> str:
    """Any JSON value (``top="object"``: any object), nested at most ``depth`` deep."""
    compiler = _Compiler({}, whitespace, depth)
    return compiler.any_object(depth) if top == "object" else compiler.any_value(depth)


class _Compiler:
    def __init__(self, root, whitespace: bool, depth: int):
        self.root, self.depth = root, depth
        self.ws = WHITESPACE if whitespace else ""
        self.refs: list[str] = []  # the $refs being expanded (a repeat is recursion)

    # ------------------------------------------------------------------ dispatch

    def value(self, schema, path: str) -> str:
        if schema is True:
            return self.any_value(self.depth)
        if schema is False:
            raise EmptyLanguage(f"{path}: the schema false allows no value")
        if not isinstance(schema, dict):
            raise SchemaError("type", f"{path}: a schema must be an object or a boolean")
        keys = set(schema) - ANNOTATIONS
        unknown = sorted(keys - KNOWN)
        if unknown:
            raise UnsupportedSchema(
                unknown[0], f"{path}: the keyword '{unknown[0]}' is not supported (constrained "
                "decoding would not enforce it)",
            )  # fmt: skip
        for word in ("$ref", "anyOf", "allOf"):
            if word in keys and keys != {word}:
                other = sorted(keys - {word})[0]
                raise UnsupportedSchema(
                    other, f"{path}: '{other}' beside '{word}' is not supported"
                )
        if "$ref" in keys:
            return self.ref(schema["$ref"], path)
        if "allOf" in keys:
            parts = schema["allOf"]
            if not isinstance(parts, list) or len(parts) != 1:
                raise UnsupportedSchema(
                    "allOf", f"{path}: allOf of more than one schema is not supported"
                )
            return self.value(parts[0], f"{path}/allOf/0")
        if "anyOf" in keys:
            options = schema["anyOf"]
            if not isinstance(options, list) or not options:
                raise SchemaError("anyOf", f"{path}: anyOf must be a non-empty list of schemas")
            return _alt(self.value(s, f"{path}/anyOf/{i}") for i, s in enumerate(options))
        types = self.types(schema, path)
        if "enum" in keys or "const" in keys:
            return self.values(schema, keys, types, path)
        if types is None:
            specific = sorted(keys - SHAPING)
            if specific:
                raise UnsupportedSchema(
                    specific[0], f"{path}: '{specific[0]}' without a 'type' is not supported"
                )
            return self.any_value(self.depth)
        for key in keys - SHAPING:
            if not any(key in FOR_TYPE[t] for t in types):
                raise UnsupportedSchema(key, f"{path}: '{key}' does not apply to type {types}")
        return _alt(getattr(self, f"of_{t}")(schema, path) for t in types)

    def types(self, schema: dict, path: str) -> list[str] | None:
        if "type" not in schema:
            return None
        types = schema["type"]
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list) or not types or any(t not in FOR_TYPE for t in types):
            raise SchemaError(
                "type", f"{path}: type must be one of {', '.join(FOR_TYPE)} (or a list of them), "
                f"got {json.dumps(schema['type'])}",
            )  # fmt: skip
        return list(dict.fromkeys(types))

    def values(self, schema: dict, keys: set, types: list[str] | None, path: str) -> str:
        """``enum`` / ``const``: the literal texts of those values the ``type`` admits."""
        word = "const" if "const" in keys else "enum"
        extra = sorted(keys - {"type", word})
        if extra:
            raise UnsupportedSchema(
                extra[0], f"{path}: '{extra[0]}' beside '{word}' is not supported"
            )
        values = [schema["const"]] if word == "const" else schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError("enum", f"{path}: enum must be a non-empty list")
        kept = [v for v in values if types is None or any(_is(v, t) for t in types)]
        if not kept:
            raise EmptyLanguage(f"{path}: no value of '{word}' has the type {types}")
        try:
            return _alt(escape(dumps(v)) for v in kept)
        except ValueError as exc:  # NaN or infinity: not JSON
            raise SchemaError(
                word, f"{path}: {word} holds a value JSON cannot write ({exc})"
            ) from None

    def ref(self, ref, path: str) -> str:
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise UnsupportedSchema(
                "$ref", f"{path}: only a $ref into this schema (#/...) is supported, got {ref!r}"
            )
        if ref in self.refs:
            raise UnsupportedSchema(
                "$ref",
                f"{path}: the $ref {ref} is recursive, which no regular expression can follow",
            )
        target = self.root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaError("$ref", f"{path}: the $ref {ref} points at nothing")
            target = target[part]
        self.refs.append(ref)
        try:
            return self.value(target, ref)
        finally:
            self.refs.pop()

    # ------------------------------------------------------------------ the types

    def of_null(self, schema, path) -> str:
        return "null"

    def of_boolean(self, schema, path) -> str:
        return "(?:true|false)"

    def of_string(self, schema, path) -> str:
        low, high = _range(schema, "minLength", "maxLength", path)
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                raise UnsupportedSchema(
                    "pattern", f"{path}: pattern beside minLength/maxLength is not supported "
                    "(write the length into the pattern, as {m,n})",
                )  # fmt: skip
            return '"' + self.pattern(schema["pattern"], path) + '"'
        bounds = "*" if (low, high) == (0, None) else _bounds(low, high)
        return f'"{CHAR}{bounds}"'

    def pattern(self, pattern, path: str) -> str:
        from .regex import ANY, RegexError

        try:
            tree, start, end = parse_search(pattern)
        except RegexError as exc:
            raise SchemaError("pattern", f"{path}: pattern: {exc}") from None
        anything = Repeat(_json_chars(ANY), 0, None)  # a search: any text around the match
        parts = ([] if start else [anything]) + [_json_chars(tree)] + ([] if end else [anything])
        return to_pattern(Concat(tuple(parts)))

    def of_integer(self, schema, path) -> str:
        low, high = _bound(schema, "minimum", path), _bound(schema, "maximum", path)
        xlow, xhigh = (
            _bound(schema, "exclusiveMinimum", path),
            _bound(schema, "exclusiveMaximum", path),
        )
        lows = [math.ceil(b) for b in (low,) if b is not None]
        lows += [math.floor(b) + 1 for b in (xlow,) if b is not None]
        highs = [math.floor(b) for b in (high,) if b is not None]
        highs += [math.ceil(b) - 1 for b in (xhigh,) if b is not None]
        lo, hi = max(lows, default=None), min(highs, default=None)
        for name, b in (("minimum", lo), ("maximum", hi)):
            if b is not None and len(str(abs(b))) > MAX_DIGITS:
                raise LanguageTooLarge(f"{path}: {name} {b} has over {MAX_DIGITS} digits")
        if lo is not None and hi is not None and lo > hi:
            raise EmptyLanguage(f"{path}: no integer lies between the bounds {lo} and {hi}")
        return _integers(lo, hi)

    def of_number(self, schema, path) -> str:
        for word in ("exclusiveMinimum", "exclusiveMaximum"):
            if word in schema:
                raise UnsupportedSchema(
                    word, f"{path}: {word} on a number is not supported (on an integer it is)"
                )
        low, high = _bound(schema, "minimum", path), _bound(schema, "maximum", path)
        if low is None and high is None:
            return f"(?:{NUMBER})"
        for word, b in (("minimum", low), ("maximum", high)):
            if b is not None and (b != math.floor(b) or len(str(abs(int(b)))) > MAX_DIGITS):
                raise UnsupportedSchema(
                    word, f"{path}: a number's {word} must be a whole number here, got {b}"
                )
        lo = None if low is None else int(low)
        hi = None if high is None else int(high)
        if lo is not None and hi is not None and lo > hi:
            raise EmptyLanguage(f"{path}: minimum {lo} is over maximum {hi}")
        options = []
        if hi is None or hi >= 0:  # the values >= 0: magnitudes from max(lo, 0) to hi
            options.append(_magnitudes(max(lo or 0, 0), hi))
        if lo is None or lo < 0:  # the negative values: magnitudes from max(-hi, 0) to -lo
            options.append(
                "-" + _magnitudes(0 if hi is None else max(-hi, 0), None if lo is None else -lo)
            )
        return _alt(options)

    def of_array(self, schema, path) -> str:
        low, high = _range(schema, "minItems", "maxItems", path)
        if "items" in schema:
            if not isinstance(schema["items"], dict | bool):
                raise UnsupportedSchema(
                    "items", f"{path}: items must be one schema (a list is prefixItems' job)"
                )
            item = self.value(schema["items"], f"{path}/items")
        else:
            item = self.any_value(self.depth - 1)
        return self.sequence("\\[", "\\]", item, low, high)

    def sequence(self, opening: str, closing: str, item: str, low: int, high: int | None) -> str:
        """``opening``, from ``low`` to ``high`` items with commas between, ``closing``."""
        ws, comma = self.ws, f"{self.ws},{self.ws}"
        if high == 0:
            return f"{opening}{ws}{closing}"
        rest = _bounds(max(low - 1, 0), None if high is None else high - 1)
        items = f"{item}(?:{comma}{item}){rest}"
        return f"{opening}{ws}{items if low else f'(?:{items})?'}{ws}{closing}"

    def of_object(self, schema, path) -> str:
        properties = schema.get("properties")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError("required", f"{path}: required must be a list of property names")
        if properties is None:
            if required:
                raise UnsupportedSchema(
                    "required", f"{path}: required names properties without 'properties'"
                )
            return self.any_object(self.depth)
        if not isinstance(properties, dict):
            raise SchemaError("properties", f"{path}: properties must be an object")
        missing = [r for r in required if r not in properties]
        if missing:
            raise UnsupportedSchema(
                "required", f"{path}: required property '{missing[0]}' has no schema in properties"
            )
        ws = self.ws
        members = [
            (f"{escape(dumps(name))}{ws}:{ws}" + self.value(s, f"{path}/properties/{name}"), name in required)
            for name, s in properties.items()
        ]  # fmt: skip
        return f"\\{{{ws}{_members(members, f'{ws},{ws}')}{ws}\\}}"

    # ------------------------------------------------------------------ any value

    def any_value(self, depth: int) -> str:
        """Any JSON value with at most ``depth`` levels of arrays and objects."""
        scalars = f"{STRING}|{NUMBER}|true|false|null"
        if depth <= 0:
            return f"(?:{scalars})"
        inner = self.any_value(depth - 1)
        array = self.sequence("\\[", "\\]", inner, 0, None)
        return f"(?:{scalars}|{self.any_object(depth)}|{array})"

    def any_object(self, depth: int) -> str:
        """Any object whose members hold at most ``depth - 1`` levels more."""
        ws = self.ws
        member = f"{STRING}{ws}:{ws}{self.any_value(depth - 1)}"
        return f"\\{{{ws}(?:{member}(?:{ws},{ws}{member})*)?{ws}\\}}"


# ----------------------------------------------------------------------------- pieces


def _alt(options) -> str:
    options = list(dict.fromkeys(options))
    return options[0] if len(options) == 1 else "(?:" + "|".join(options) + ")"


def _bounds(low: int, high: int | None) -> str:
    if high is None:
        return {0: "*", 1: "+"}.get(low, f"{{{low},}}")
    return f"{{{low}}}" if low == high else f"{{{low},{high}}}"


def _members(members: list[tuple[str, bool]], comma: str) -> str:
    """Properties in order, the required always and the others present or not, with one
    comma between any two written: after the first one written, each later one is
    ``(,p)`` (or ``(,p)?``); the first one written is the first present."""
    if not members:
        return ""

    def after(i: int) -> str:
        return "".join(f"(?:{comma}{p})" + ("" if req else "?") for p, req in members[i:])

    firsts = []
    for i, (p, req) in enumerate(members):
        firsts.append(p + after(i + 1))
        if req:  # a required one is always written: the first written is at or before it
            return _alt(firsts)
    return f"(?:{_alt(firsts)})?"  # all optional: the object may be empty


def _is(value, kind: str) -> bool:
    """Whether ``value`` is of JSON Schema's ``kind`` (1.0 is an integer, true is not)."""
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    return {
        "null": value is None,
        "boolean": isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }[kind]


def _range(schema: dict, least: str, most: str, path: str) -> tuple[int, int | None]:
    """``(schema[least] or 0, schema[most] or None)``, checked, and in order."""
    low, high = _count(schema, least, path, 0), _count(schema, most, path, None)
    if high is not None and high < low:
        raise EmptyLanguage(f"{path}: {most} {high} is less than {least} {low}")
    return low, high


def _count(schema: dict, word: str, path: str, default):
    value = schema.get(word, default)
    if value is default:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(
            word, f"{path}: {word} must be a non-negative integer, got {json.dumps(value)}"
        )
    if value > MAX_REPEAT:
        raise LanguageTooLarge(f"{path}: {word} {value} is over the limit of {MAX_REPEAT}")
    return value


def _bound(schema: dict, word: str, path: str):
    value = schema.get(word)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SchemaError(word, f"{path}: {word} must be a number, got {json.dumps(value)}")
    return value


def _integers(lo: int | None, hi: int | None) -> str:
    """The integers from ``lo`` to ``hi`` (None: unbounded) as decimal text."""
    options = []
    if hi is None or hi >= 0:
        options.append(_naturals(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:  # magnitudes from max(-hi, 1) to -lo
        options.append(
            "-" + _naturals(1 if hi is None or hi >= 0 else -hi, None if lo is None else -lo)
        )
    return _alt(options)


def _magnitudes(lo: int, hi: int | None) -> str:
    """The decimals from ``lo`` to ``hi`` (naturals; None: unbounded), without an exponent:
    an integer part in ``[lo, hi)`` with any fraction, or ``hi`` itself with a zero one."""
    fraction = f"(?:{FRACTION})?"
    if hi is None:
        return f"{_naturals(lo, None)}{fraction}"
    top = rf"{hi}(?:\.0{{1,16}})?"
    return top if lo == hi else _alt([_naturals(lo, hi - 1) + fraction, top])


def _naturals(lo: int, hi: int | None) -> str:
    """The whole numbers from ``lo`` to ``hi`` (None: unbounded), no leading zeros."""
    options = []
    top_digits = len(str(hi)) if hi is not None else len(str(lo))
    for n in range(len(str(lo)), top_digits + 1):  # one number of digits at a time
        first = 0 if n == 1 else 10 ** (n - 1)
        a, b = max(lo, first), min(hi if hi is not None else 10**n - 1, 10**n - 1)
        if a <= b:
            options.append(_same_length(str(a), str(b)))
    if hi is None:  # and every number with more digits
        options.append(f"[1-9][0-9]{{{top_digits},}}")
    return _alt(options)


def _same_length(a: str, b: str) -> str:
    """The numbers from ``a`` to ``b``, both of the same number of digits."""
    if not a:
        return ""
    if a == b:
        return a
    if a[0] == b[0]:
        return a[0] + _same_length(a[1:], b[1:])
    rest = len(a) - 1
    options = []
    low_rest, high_rest = a[1:], b[1:]
    if set(low_rest) <= {"0"} and set(high_rest) <= {"9"}:  # the whole span at once
        return f"[{a[0]}-{b[0]}]" + _digits(rest)
    options.append(a[0] + _same_length(low_rest, "9" * rest))
    if int(b[0]) - int(a[0]) > 1:
        options.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}]" + _digits(rest))
    options.append(b[0] + _same_length("0" * rest, high_rest))
    return _alt(options)


def _digits(n: int) -> str:
    return "[0-9]" * n if n < 3 else f"[0-9]{{{n}}}"


# ----------------------------------------------------------------------------- patterns

_RAW = normalize([(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x10FFFF)])  # not " \ or a control
_SHORT = {
    0x22: '\\"',
    0x5C: "\\\\",
    0x08: "\\b",
    0x0C: "\\f",
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
}


def _json_chars(node):
    """A tree over a string's characters -> the same over its JSON spelling: each character
    as itself where JSON allows, or as the escape JSON requires for it."""
    from .regex import literal

    if isinstance(node, Chars):
        raw = normalize(
            (max(lo, a), min(hi, b))
            for lo, hi in node.ranges
            for a, b in _RAW
            if lo <= b and a <= hi
        )
        escaped = [c for c in [*range(0x20), 0x22, 0x5C] if c in node]
        options = ([Chars(raw)] if raw else []) + [
            literal(_SHORT.get(c, f"\\u{c:04x}")) for c in escaped
        ]
        return options[0] if len(options) == 1 else Alt(tuple(options)) if options else Chars(())
    if isinstance(node, Concat):
        return Concat(tuple(_json_chars(p) for p in node.parts))
    if isinstance(node, Alt):
        return Alt(tuple(_json_chars(o) for o in node.options))
    if isinstance(node, Repeat):
        return Repeat(_json_chars(node.node), node.low, node.high)
    raise TypeError(f"not a regex tree: {node!r}")
