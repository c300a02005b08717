"""A JSON schema, as the regular language (a tree, ``regex.py``) of the JSON texts that
satisfy it.

The language is always a *subset* of the texts the schema accepts: whatever a mask lets
through, a validator accepts. It leaves texts out (one spelling of some values, bounds on
what could run on), never lets one in. Whitespace between the parts only with
``whitespace=True``, at most ``WHITESPACE_RUN`` characters at a time; by default a text is
compact. What each keyword becomes:

* ``type``: ``object``, ``array``, ``string``, ``integer``, ``number``, ``boolean``,
  ``null``, or a list of them (one of them);
* objects: ``properties`` written in the order given, those in ``required`` always,
  the others each present or left out; ``additionalProperties`` and ``patternProperties``
  as schemas: after the named properties, members whose names match a pattern (and no
  other pattern, and no named property) under its schema, and members whose names match
  none under ``additionalProperties`` (never written when it is ``true`` or absent, save
  in an object with neither properties nor patterns: any object); a ``required`` name
  without a property takes the schema its pattern or ``additionalProperties`` gives;
  ``minProperties``/``maxProperties`` count the members written (a member of another
  name can repeat one, which JSON reads as one, so a minimum is reached by the named
  properties and at most one other);
* strings: ``minLength``/``maxLength`` (in characters, as JSON Schema counts them),
  ``pattern`` (searched for, as JSON Schema does: anchor it with ``^...$`` to match the
  whole string; ``constrained.regex`` says which patterns), ``format`` (``formats.py``:
  ``date``, ``time``, ``date-time``, ``email``, ``uuid``, ``ipv4``, ``uri``, each a stated
  subset), any of them together (the languages of characters met by ``algebra.py``); a
  pattern with ``\\D``, ``\\W`` or ``\\S``, which Python's ``re`` (``jsonschema``'s) reads
  over Unicode and this subset (as ECMAScript) over ASCII, keeps to printable ASCII;
* integers: ``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum`` as exact
  digit ranges, ``multipleOf`` a whole number (``numbers.py``); numbers: ``minimum``/
  ``maximum`` with whole-number bounds (then written without an exponent), at most 16
  digits after the point and 3 in an exponent, ``multipleOf`` a whole number (then
  written as integers);
* arrays: ``items``, ``prefixItems`` (the first items, in order; then ``items``'
  schema, none when ``items`` is ``false``, and without ``items`` only as many more as
  ``minItems`` needs), ``minItems``, ``maxItems``, ``uniqueItems`` over an enumeration
  (``enum``, ``const``, ``boolean``, ``null``): an automaton of the values already used;
* ``enum``, ``const`` (beside ``type`` only), ``anyOf``, ``allOf`` of one schema (or of
  objects of ``properties`` and ``required`` only, merged),
  ``oneOf`` where its branches are proven to exclude each other (``exclusive.py``),
  ``$ref`` into the schema (``#``, ``#/$defs/...``), a recursive one unrolled ``depth``
  times (deeper, that branch is left out: an optional member, an empty array);
* an empty schema (or ``true``), an array without ``items``, an object without
  ``properties``: any JSON value, nested at most ``depth`` (default ``DEPTH``) deep.

Annotations (``title``, ``description``, ``default``, ``examples``, ...) change nothing.
Any other keyword is an ``UnsupportedSchema`` naming it and saying why (``REFUSED``): it
would constrain the value, and a mask that ignored it would let through text the schema
refuses. A bound over ``MAX_REPEAT`` (``maxLength``, ``maxItems``) is a
``LanguageTooLarge`` naming it.

A string's characters are written as JSON writes them: any character but ``"``, ``\\``
and the controls below U+0020 as itself, or an escape (``\\"``, ``\\n``, ``\\u00e9``, ...),
each escape one character. Two things are left out, both still valid JSON for every value:
``\\u`` escapes of surrogates (a character outside the BMP is written as itself), and,
under a ``pattern``, a ``format`` or in a member's name matched against names and
patterns, escapes other than those JSON requires (``\\"``, ``\\\\``, and the controls'):
one spelling per string, so that a name differs from another exactly when its text does.
"""

from __future__ import annotations

import json
import math
import re

from . import exclusive, numbers
from .algebra import CharDFA, difference, intersection, to_tree
from .automaton import EmptyLanguage, LanguageTooLarge
from .formats import FORMATS, format_tree
from .regex import (
    ANY,
    EMPTY,
    MAX_REPEAT,
    NOTHING,
    Alt,
    Chars,
    Concat,
    Graph,
    Repeat,
    alt,
    concat,
    literal,
    normalize,
    parse,
    parse_search,
    repeat,
    to_pattern,
)
from .values import distinct, is_type

DEPTH = 3  # how deeply a value of unknown shape may nest, and a recursive $ref unroll
MAX_DIGITS = 30  # an integer bound of more digits than this is refused
WHITESPACE_RUN = 16  # whitespace between two parts, at most (with whitespace=True): room for
# an indented line at the depth a value of unknown shape reaches
UNIQUE_SETS = 4096  # uniqueItems: the sets of values used that its automaton may have

ANNOTATIONS = frozenset(
    (
        "title",
        "description",
        "$schema",
        "$id",
        "$comment",
        "examples",
        "default",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$defs",
        "definitions",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        "discriminator",
    )
)  # fmt: skip  (discriminator: OpenAPI's note on a oneOf, which JSON Schema's validators ignore)
FOR_TYPE = {
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"},
    "object": {"properties", "required", "additionalProperties", "patternProperties",
               "minProperties", "maxProperties"},
    "boolean": set(),
    "null": set(),
}  # fmt: skip
SHAPING = {"type", "enum", "const", "anyOf", "allOf", "oneOf", "$ref"}
KNOWN = SHAPING | set().union(*FOR_TYPE.values())
_COMPLEMENT = (
    "a schema's language is a subset of its values (one spelling each, bounded runs), and "
    "the complement of a subset holds values the inner schema accepts"
)
REFUSED = {
    "not": _COMPLEMENT,
    "if": _COMPLEMENT + " (if/then/else needs the texts where 'if' fails)",
    "then": "it goes with 'if', which is refused",
    "else": "it goes with 'if', which is refused",
    "contains": "an item under both 'items' and 'contains' is the meeting of two languages "
    "whose objects may be written in different orders of properties",
    "propertyNames": "not built here: names are held by properties and patternProperties",
    "dependentRequired": "not built here (which properties follow from which is finite: "
    "write the cases as anyOf)",
    "dependentSchemas": "not built here (write the cases as anyOf)",
    "unevaluatedProperties": "not built here: write additionalProperties",
    "unevaluatedItems": "not built here: write items",
    "additionalItems": "draft 7's form: write prefixItems and items",
}

# A string's character: written as itself, or as one of JSON's escapes (no surrogate \u).
CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u(?:[0-9A-Ca-cE-Fe-f][0-9A-Fa-f]{3}|[Dd][0-7][0-9A-Fa-f]{2}))'
NUMBER = numbers.NUMBER
WHITESPACE = r"[ \t\n\r]"
_CHAR, _NUMBER = parse(CHAR), parse(NUMBER)
QUOTE, COLON, COMMA = literal('"'), literal(":"), literal(",")
PRINTABLE = Chars(((0x20, 0x7E),))


class SchemaError(ValueError):
    """A schema that is malformed, or outside the subset; ``keyword`` is the one at fault."""

    def __init__(self, keyword: str, message: str):
        super().__init__(message)
        self.keyword = keyword


class UnsupportedSchema(SchemaError):
    """A keyword outside the subset (it would constrain what the mask cannot)."""


def dumps(value) -> str:
    """A value as the compact JSON text the constrained output writes."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def schema_to_tree(schema, *, whitespace: bool = False, depth: int = DEPTH):
    """The tree of the JSON texts of values valid under ``schema`` (written as the module
    docstring says). ``EmptyLanguage`` where there are none."""
    tree = _Compiler(schema, whitespace, depth).value(schema, "#")
    if tree == NOTHING:
        raise EmptyLanguage("#: the schema allows no value this subset can write")
    return tree


def schema_to_regex(schema, *, whitespace: bool = False, depth: int = DEPTH) -> str:
    """``schema_to_tree`` as a pattern, to read."""
    return to_pattern(schema_to_tree(schema, whitespace=whitespace, depth=depth))


def any_json_tree(*, whitespace: bool = False, depth: int = DEPTH, top: str | None = None):
    """Any JSON value (``top="object"``: any object), nested at most ``depth`` deep."""
    compiler = _Compiler({}, whitespace, depth)
    return compiler.any_object(depth) if top == "object" else compiler.any_value(depth)


def any_json_regex(*, whitespace: bool = False, depth: int = DEPTH, top: str | None = None) -> str:
    """``any_json_tree`` as a pattern."""
    return to_pattern(any_json_tree(whitespace=whitespace, depth=depth, top=top))


class _Compiler:
    def __init__(self, root, whitespace: bool, depth: int):
        self.root, self.depth = root, depth
        self.ws = repeat(parse(WHITESPACE), 0, WHITESPACE_RUN) if whitespace else EMPTY
        self.comma = concat(self.ws, COMMA, self.ws)
        self.refs: list[str] = []  # the $refs being expanded (a repeat is recursion)
        self._any: dict[int, object] = {}

    # ------------------------------------------------------------------ dispatch

    def value(self, schema, path: str):
        if schema is True:
            return self.any_value(self.depth)
        if schema is False:
            return NOTHING
        if not isinstance(schema, dict):
            raise SchemaError("type", f"{path}: a schema must be an object or a boolean")
        keys = set(schema) - ANNOTATIONS
        unknown = sorted(keys - KNOWN)
        if unknown:
            word = unknown[0]
            why = f": {REFUSED[word]}" if word in REFUSED else ""
            raise UnsupportedSchema(
                word, f"{path}: the keyword '{word}' is not supported (constrained decoding "
                f"would not enforce it){why}",
            )  # fmt: skip
        for word in ("$ref", "anyOf", "allOf", "oneOf"):
            if word in keys and keys != {word}:
                other = sorted(keys - {word})[0]
                raise UnsupportedSchema(
                    other, f"{path}: '{other}' beside '{word}' is not supported"
                )
        if "$ref" in keys:
            return self.ref(schema["$ref"], path)
        if "allOf" in keys:
            return self.value(self.all_of(schema["allOf"], path), f"{path}/allOf")
        if "anyOf" in keys or "oneOf" in keys:
            return self.either(schema, "anyOf" if "anyOf" in keys else "oneOf", path)
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
        return alt(getattr(self, f"of_{t}")(schema, path) for t in types)

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

    def values(self, schema: dict, keys: set, types: list[str] | None, path: str):
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
        kept = [v for v in values if types is None or any(is_type(v, t) for t in types)]
        if not kept:
            raise EmptyLanguage(f"{path}: no value of '{word}' has the type {types}")
        return alt(self.literal(v, word, path) for v in kept)

    def all_of(self, parts, path: str):
        """``allOf``: one schema; or objects of ``type``, ``properties`` and ``required`` only,
        whose properties differ, merged into one (every member of each, every required)."""
        if not isinstance(parts, list) or not parts:
            raise SchemaError("allOf", f"{path}: allOf must be a non-empty list of schemas")
        if len(parts) == 1:
            return parts[0]
        merged: dict = {"type": "object", "properties": {}, "required": []}
        for part in map(self.resolve, parts):
            keys = set(part) - ANNOTATIONS if isinstance(part, dict) else {"?"}
            if (
                not keys <= {"type", "properties", "required"}
                or part.get("type", "object") != "object"
            ):
                raise UnsupportedSchema(
                    "allOf", f"{path}: allOf of more than one schema is supported for objects of "
                    "properties and required only (otherwise each schema's language writes its "
                    "own order of properties, and two such languages can share no text where "
                    "their values meet)",
                )  # fmt: skip
            for name, sub in (part.get("properties") or {}).items():
                if name in merged["properties"]:
                    raise UnsupportedSchema(
                        "allOf", f"{path}: allOf gives property '{name}' two schemas, whose "
                        "meeting is not built here",
                    )  # fmt: skip
                merged["properties"][name] = sub
            merged["required"] += [
                r for r in part.get("required", []) if r not in merged["required"]
            ]
        return merged

    def literal(self, value, word: str, path: str):
        try:
            return literal(dumps(value))
        except ValueError as exc:  # NaN or infinity: not JSON
            raise SchemaError(
                word, f"{path}: {word} holds a value JSON cannot write ({exc})"
            ) from None

    def either(self, schema: dict, word: str, path: str):
        """``anyOf``, or ``oneOf`` once its branches are proven to exclude each other."""
        options = schema[word]
        if not isinstance(options, list) or not options:
            raise SchemaError(word, f"{path}: {word} must be a non-empty list of schemas")
        trees = [self.value(s, f"{path}/{word}/{i}") for i, s in enumerate(options)]
        if word == "oneOf":
            for i, j in exclusive.overlapping(options, self.resolve):
                raise UnsupportedSchema(
                    "oneOf", f"{path}: oneOf branches {i} and {j} may both hold one value "
                    f"({exclusive.PROVEN}); exactly one of two overlapping languages is not "
                    "written here, each being a subset of its schema's values",
                )  # fmt: skip
        return alt(trees)

    def resolve(self, schema):
        """``schema`` with a ``$ref`` (or an ``allOf`` of one) followed, for reading."""
        for _ in range(64):  # a chain of references, not a cycle
            if isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"$ref"}:
                schema = self.target(schema["$ref"], "#")
            elif isinstance(schema, dict) and set(schema) - ANNOTATIONS == {"allOf"}:
                parts = schema["allOf"]
                if not isinstance(parts, list) or len(parts) != 1:
                    return schema
                schema = parts[0]
            else:
                return schema
        return schema

    def target(self, ref, path: str):
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise UnsupportedSchema(
                "$ref", f"{path}: only a $ref into this schema (#/...) is supported, got {ref!r}"
            )
        target = self.root
        for part in ref[2:].split("/") if ref != "#" else ():
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaError("$ref", f"{path}: the $ref {ref} points at nothing")
            target = target[part]
        return target

    def ref(self, ref, path: str):
        """The schema ``ref`` points at; a recursive one expanded at most ``depth`` times
        on one path, deeper ``NOTHING`` (the branch that recurses is left out)."""
        target = self.target(ref, path)
        if self.refs.count(ref) >= self.depth:
            return NOTHING
        self.refs.append(ref)
        try:
            return self.value(target, ref)
        finally:
            self.refs.pop()

    # ------------------------------------------------------------------ scalars

    def of_null(self, schema, path):
        return literal("null")

    def of_boolean(self, schema, path):
        return alt([literal("true"), literal("false")])

    def of_string(self, schema, path):
        """Without ``pattern`` or ``format``, every spelling of the characters; with them,
        the one JSON requires (their languages met with the length's, character by character)."""
        low, high = _range(schema, "minLength", "maxLength", path)
        chars = []
        if "format" in schema:
            chars.append(self.format(schema["format"], path))
        if "pattern" in schema:
            chars.append(self.pattern(schema["pattern"], path))
            if re.search(r"\\[DWS]", schema["pattern"]):
                # \D, \W, \S: here (and in ECMAScript) the complement of an ASCII class, in
                # Python's re (jsonschema's) of a Unicode one; both agree on printable ASCII.
                chars.append(Repeat(PRINTABLE, 0, None))
        if not chars:
            return concat(QUOTE, repeat(_CHAR, low, high), QUOTE)
        if (low, high) != (0, None):
            chars.append(Repeat(ANY, low, high))
        return concat(QUOTE, json_chars(meet(chars)), QUOTE)

    def format(self, name, path: str):
        if name not in FORMATS:
            raise UnsupportedSchema(
                "format", f"{path}: the format {json.dumps(name)} is not supported (only "
                f"{', '.join(FORMATS)}, as constrained/formats.py states them)",
            )  # fmt: skip
        return format_tree(name)

    def pattern(self, pattern, path: str):
        """The characters of the strings ``pattern`` finds a match in."""
        from .regex import RegexError

        try:
            tree, start, end = parse_search(pattern)
        except RegexError as exc:
            raise SchemaError("pattern", f"{path}: pattern: {exc}") from None
        anything = Repeat(ANY, 0, None)  # a search: any text around the match
        return concat(*([] if start else [anything]), tree, *([] if end else [anything]))

    def of_integer(self, schema, path):
        lo, hi = self.bounds(schema, path)
        return self.multiple(parse(numbers.integers(lo, hi)), schema, path)

    def bounds(self, schema: dict, path: str) -> tuple[int | None, int | None]:
        """The least and greatest integer the four bounds allow (None: unbounded)."""
        low, high = _bound(schema, "minimum", path), _bound(schema, "maximum", path)
        xlow = _bound(schema, "exclusiveMinimum", path)
        xhigh = _bound(schema, "exclusiveMaximum", path)
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
        return lo, hi

    def multiple(self, numerals, schema: dict, path: str):
        """``numerals``, the multiples of ``multipleOf`` among them where it is given."""
        if "multipleOf" not in schema:
            return numerals
        m = schema["multipleOf"]
        if isinstance(m, bool) or not isinstance(m, int | float) or not m > 0:
            raise SchemaError("multipleOf", f"{path}: multipleOf must be a number over 0")
        if m != math.floor(m):
            raise UnsupportedSchema(
                "multipleOf", f"{path}: multipleOf {m} is not a whole number: validators "
                "divide in float64, where 0.3 / 0.1 is not whole, so the values they accept are "
                "not the exact decimal multiples a language could hold",
            )  # fmt: skip
        return numbers.multiples(numerals, int(m))

    def of_number(self, schema, path):
        if "multipleOf" in schema:  # whole multiples: written as integers
            return self.of_integer(schema, path)
        for word in ("exclusiveMinimum", "exclusiveMaximum"):
            if word in schema:
                raise UnsupportedSchema(
                    word, f"{path}: {word} on a number is not supported (on an integer it is)"
                )
        low, high = _bound(schema, "minimum", path), _bound(schema, "maximum", path)
        if low is None and high is None:
            return _NUMBER
        for word, b in (("minimum", low), ("maximum", high)):
            if b is not None and (b != math.floor(b) or len(str(abs(int(b)))) > MAX_DIGITS):
                raise UnsupportedSchema(
                    word, f"{path}: a number's {word} must be a whole number here, got {b}"
                )
        lo = None if low is None else int(low)
        hi = None if high is None else int(high)
        if lo is not None and hi is not None and lo > hi:
            raise EmptyLanguage(f"{path}: minimum {lo} is over maximum {hi}")
        return parse(numbers.decimals(lo, hi))

    # ------------------------------------------------------------------ arrays

    def of_array(self, schema, path):
        low, high = _range(schema, "minItems", "maxItems", path)
        items = schema.get("items")
        if items is not None and not isinstance(items, dict | bool):
            raise UnsupportedSchema(
                "items", f"{path}: items must be one schema (a list is prefixItems' job)"
            )
        unique = schema.get("uniqueItems", False)
        if not isinstance(unique, bool):
            raise SchemaError("uniqueItems", f"{path}: uniqueItems must be true or false")
        prefix = schema.get("prefixItems")
        if prefix is not None and (not isinstance(prefix, list) or not prefix):
            raise SchemaError("prefixItems", f"{path}: prefixItems must be a non-empty list")
        if unique and (high is None or high > 1):
            if prefix is not None:
                raise UnsupportedSchema(
                    "uniqueItems", f"{path}: uniqueItems beside prefixItems is not supported"
                )
            return self.unique_items(True if items is None else items, low, high, path)
        if prefix is not None:
            firsts = [self.value(s, f"{path}/prefixItems/{i}") for i, s in enumerate(prefix)]
            if items is None:  # more items only where minItems asks for them, of any value
                more = self.any_value(self.depth - 1)
                return self.prefixed(firsts, more, low, high, max(low - len(firsts), 0))
            return self.prefixed(firsts, self.value(items, f"{path}/items"), low, high, None)
        item = (
            self.any_value(self.depth - 1) if items is None else self.value(items, f"{path}/items")
        )
        return self.sequence(item, low, high)

    def sequence(self, item, low: int, high: int | None):
        """``[``, from ``low`` to ``high`` items with commas between, ``]``."""
        ws = self.ws
        items = concat(item, repeat(concat(self.comma, item), max(low - 1, 0), _less(high)))
        body = EMPTY if high == 0 else items if low else repeat(items, 0, 1)
        return concat(literal("["), ws, body, ws, literal("]"))

    def prefixed(self, firsts: list, more, low: int, high: int | None, most: int | None):
        """``firsts`` in order (a shorter array stops early, at ``low`` items or more), then
        ``more`` items, at most ``most`` of them (None: no limit) and ``high`` in all."""
        k = len(firsts)
        tops = [t for t in (most, None if high is None else high - k) if t is not None]
        top = min(tops, default=None)
        more_items = repeat(concat(self.comma, more), max(low - k, 0), top)
        tail = EMPTY if top is not None and top <= 0 else more_items
        for i in reversed(range(k)):  # what follows once i items are written
            step = concat(self.comma if i else EMPTY, firsts[i], tail)
            if high is not None and i >= high:
                tail = EMPTY
            else:
                tail = step if i < low else repeat(step, 0, 1)
        return concat(literal("["), self.ws, tail, self.ws, literal("]"))

    def unique_items(self, items, low: int, high: int | None, path: str):
        """``uniqueItems`` over a finite set of values: an automaton whose state is the set of
        values already written, each edge one more value not in it."""
        values = self.finite(items)
        if values is None:
            raise UnsupportedSchema(
                "uniqueItems", f"{path}: uniqueItems over items other than an enumeration "
                "(enum, const, boolean, null) is not supported: telling each item from every "
                "earlier one means remembering them all, which no finite automaton does",
            )  # fmt: skip
        n = len(values)
        if low > n:
            raise EmptyLanguage(f"{path}: minItems {low} is more than the {n} distinct values")
        most = n if high is None else min(high, n)
        if sum(math.comb(n, i) for i in range(most + 1)) > UNIQUE_SETS:
            raise LanguageTooLarge(
                f"{path}: uniqueItems over {n} values would track over {UNIQUE_SETS} sets of them"
            )
        texts = [self.literal(v, "enum", path) for v in values]
        ids, edges, accepting, todo = {0: 0}, [], set(), [0]
        while todo:
            used = todo.pop(0)
            count = bin(used).count("1")
            if low <= count:
                accepting.add(ids[used])
            if count == most:
                continue
            for v in range(n):
                if not used >> v & 1:
                    after = used | 1 << v
                    if after not in ids:
                        ids[after] = len(ids)
                        todo.append(after)
                    edges.append(
                        (ids[used], ids[after], concat(self.comma if used else EMPTY, texts[v]))
                    )
        graph = Graph(len(ids), tuple(edges), frozenset(accepting))
        return concat(literal("["), self.ws, graph, self.ws, literal("]"))

    def finite(self, schema) -> list | None:
        """The values ``schema`` allows when they are few and known (None otherwise), one per
        class of JSON equality (1 and 1.0 are one value; true and 1 are two)."""
        schema = self.resolve(schema)
        if not isinstance(schema, dict):
            return None
        keys = set(schema) - ANNOTATIONS
        if keys <= {"anyOf"} and keys:
            parts = [self.finite(s) for s in schema["anyOf"]]
            return None if None in parts else distinct([v for p in parts for v in p])
        types = schema.get("type")
        types = [types] if isinstance(types, str) else types
        if "enum" in keys or "const" in keys:
            values = [schema["const"]] if "const" in keys else schema["enum"]
            return distinct(
                [v for v in values if types is None or any(is_type(v, t) for t in types)]
            )
        if keys == {"type"} and isinstance(types, list) and set(types) <= {"boolean", "null"}:
            return [v for t in types for v in {"boolean": [True, False], "null": [None]}[t]]
        return None

    # ------------------------------------------------------------------ objects

    def of_object(self, schema, path):
        properties = schema.get("properties") or {}
        if not isinstance(properties, dict):
            raise SchemaError("properties", f"{path}: properties must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError("required", f"{path}: required must be a list of property names")
        patterns = schema.get("patternProperties") or {}
        if not isinstance(patterns, dict):
            raise SchemaError("patternProperties", f"{path}: patternProperties must be an object")
        others = schema.get("additionalProperties", True)
        if not isinstance(others, dict | bool):
            raise SchemaError(
                "additionalProperties", f"{path}: additionalProperties must be a schema"
            )
        low, high = _range(schema, "minProperties", "maxProperties", path)
        free = others is True or others == {}  # any other member, of any value
        if not properties and not patterns and free and not required and (low, high) == (0, None):
            return self.any_object(self.depth)
        keys = {p: self.pattern(p, f"{path}/patternProperties") for p in patterns}
        matched = {p: CharDFA.of(t) for p, t in keys.items()}
        schemas = dict(properties)
        for name in required:  # a required name with no property: the schema it falls under
            if name not in schemas:
                schemas[name] = _falls_under(name, matched, patterns, others, path)
        for name in properties:
            for p, dfa in matched.items():
                if exclusive.may_match(p, name, dfa):
                    raise UnsupportedSchema(
                        "patternProperties", f"{path}: property '{name}' also matches the "
                        f"patternProperties pattern {p!r}: its value would be held to both "
                        "schemas, a meeting of two languages not built here",
                    )  # fmt: skip
        named = [
            (concat(literal(dumps(n)), self.ws, COLON, self.ws,
                    self.value(s, f"{path}/properties/{n}")), n in required)
            for n, s in schemas.items()
        ]  # fmt: skip
        must = sum(r for _, r in named)
        if high is not None and must > high:
            raise EmptyLanguage(f"{path}: maxProperties {high} is less than the {must} required")
        kinds = []  # (names, value) of the members beyond the named ones
        names = alt(literal(n) for n in schemas)
        # Where a pattern reads differently in another regex dialect, the names written are
        # printable ASCII, where every dialect reads it alike (no name then matches a pattern
        # under jsonschema's reading that it does not under this one's).
        ascii_only = any(map(exclusive.inexact, keys))
        anything = Repeat(PRINTABLE if ascii_only else ANY, 0, None)
        for p, tree in keys.items():
            rest = [names] + [keys[q] for q in keys if q != p]
            value = self.value(patterns[p], f"{path}/patternProperties/{p}")
            kinds.append((_without(meet([tree, anything] if ascii_only else [tree]), rest), value))
        if isinstance(others, dict) and others != {} or (free and not schemas and not keys):
            value = self.any_value(self.depth - 1) if free else self.value(
                others, f"{path}/additionalProperties"
            )  # fmt: skip
            kinds.append((_without(anything, [names, *keys.values()]), value))
        elif free and low > len(named):  # a minimum the named ones cannot reach
            value = self.any_value(self.depth - 1)
            kinds.append((_without(anything, [names, *keys.values()]), value))
        extra = alt(
            concat(QUOTE, json_chars(n), QUOTE, self.ws, COLON, self.ws, v)
            for n, v in kinds if n != NOTHING
        )  # fmt: skip
        most = len(named) + (extra != NOTHING)
        if low > most:
            if extra == NOTHING:
                raise EmptyLanguage(
                    f"{path}: minProperties {low} is more than the {len(named)} properties allowed"
                )
            raise UnsupportedSchema(
                "minProperties", f"{path}: minProperties {low} needs {low - len(named)} members "
                "beyond the named properties, of distinct names: telling a name from every "
                "earlier one is remembering them all, which no finite automaton does",
            )  # fmt: skip
        ws = self.ws
        if extra == NOTHING and (low, high) == (0, None):
            body = _members(named, self.comma)
        else:
            body = self.counted(named, extra, low, high)
        return concat(literal("{"), ws, body, ws, literal("}"))

    def counted(self, named: list, extra, low: int, high: int | None):
        """The named members in order (each required or not), then members of ``extra``,
        with from ``low`` to ``high`` members in all: an automaton whose state is the next
        named member and the count written so far (kept up to ``high``, or up to ``low``
        where nothing bounds it above; a comma before every member but the first)."""
        cap = high if high is not None else max(low, 1)
        ids: dict[tuple, int] = {}

        def at(key: tuple) -> int:
            return ids.setdefault(key, len(ids))

        def more(c: int) -> int | None:  # the count after one more, None past high
            return None if high is not None and c + 1 > high else min(c + 1, cap)

        at((0, 0))
        edges = []
        for i, (member, required) in enumerate(named):
            for c in range(cap + 1):
                if more(c) is not None:
                    edges.append(
                        (
                            at((i, c)),
                            at((i + 1, more(c))),
                            concat(self.comma if c else EMPTY, member),
                        )
                    )
                if not required:
                    edges.append((at((i, c)), at((i + 1, c)), EMPTY))
        n = len(named)
        accepting = {at((n, c)) for c in range(low, cap + 1)}
        if extra != NOTHING:
            for c in range(cap + 1):
                if more(c) is not None and c + 1 >= low:
                    edges.append(
                        (
                            at((n, c)),
                            at(("more", more(c))),
                            concat(self.comma if c else EMPTY, extra),
                        )
                    )
                if c >= 1 and more(c) is not None:
                    edges.append(
                        (at(("more", c)), at(("more", more(c))), concat(self.comma, extra))
                    )
            accepting |= {ids[k] for k in ids if k[0] == "more"}
        return Graph(len(ids), tuple(edges), frozenset(accepting))

    # ------------------------------------------------------------------ any value

    def any_value(self, depth: int):
        """Any JSON value with at most ``depth`` levels of arrays and objects."""
        if depth not in self._any:
            scalars = [_string(), _NUMBER, literal("true"), literal("false"), literal("null")]
            if depth <= 0:
                self._any[depth] = alt(scalars)
            else:
                array = self.sequence(self.any_value(depth - 1), 0, None)
                self._any[depth] = alt([*scalars, self.any_object(depth), array])
        return self._any[depth]

    def any_object(self, depth: int):
        """Any object whose members hold at most ``depth - 1`` levels more."""
        ws = self.ws
        member = concat(_string(), ws, COLON, ws, self.any_value(depth - 1))
        members = concat(member, repeat(concat(self.comma, member), 0, None))
        return concat(literal("{"), ws, repeat(members, 0, 1), ws, literal("}"))


# ----------------------------------------------------------------------------- pieces


def _string():
    return concat(QUOTE, repeat(_CHAR, 0, None), QUOTE)


def _less(high: int | None) -> int | None:
    return None if high is None else high - 1


def _members(members: list, comma):
    """Properties in order, the required always and the others present or not, with one
    comma between any two written: after the first one written, each later one is
    ``(,p)`` (or ``(,p)?``); the first one written is the first present."""
    if not members:
        return EMPTY

    def after(i: int):
        return concat(*(concat(comma, p) if req else repeat(concat(comma, p), 0, 1)
                        for p, req in members[i:]))  # fmt: skip

    firsts = []
    for i, (p, req) in enumerate(members):
        firsts.append(concat(p, after(i + 1)))
        if req:  # a required one is always written: the first written is at or before it
            return alt(firsts)
    return repeat(alt(firsts), 0, 1)  # all optional: the object may be empty


def meet(trees: list):
    """The strings of characters every one of ``trees`` matches (one tree: itself)."""
    if len(trees) == 1:
        return trees[0]
    dfa = CharDFA.of(trees[0])
    for tree in trees[1:]:
        dfa = intersection(dfa, CharDFA.of(tree))
    return NOTHING if dfa is None else to_tree(dfa)


def _without(tree, others: list):
    """The strings of ``tree`` that none of ``others`` matches whole."""
    dfa = CharDFA.of(tree)
    for other in others:
        if other != NOTHING:
            dfa = difference(dfa, CharDFA.of(other))
    return NOTHING if dfa is None else to_tree(dfa)


def _falls_under(name: str, matched: dict, patterns: dict, others, path: str):
    """The schema of a required ``name`` that ``properties`` lacks: its pattern's, else
    ``additionalProperties``' (true where absent)."""
    under = [p for p, dfa in matched.items() if exclusive.may_match(p, name, dfa)]
    if len(under) > 1:
        raise UnsupportedSchema(
            "patternProperties", f"{path}: required '{name}' matches the patternProperties "
            f"{under[0]!r} and {under[1]!r}, whose schemas are not met here",
        )  # fmt: skip
    if under:
        return patterns[under[0]]
    if others is False:
        raise EmptyLanguage(
            f"{path}: required '{name}' is no property, and additionalProperties is false"
        )
    return others


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


# ----------------------------------------------------------------------------- spelling

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


def json_chars(node):
    """A tree over a string's characters -> the same over its JSON spelling: each character
    as itself where JSON allows, or as the escape JSON requires for it (one spelling each,
    ``json.dumps``' own)."""
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
        return alt(options)
    if isinstance(node, Concat):
        return concat(*(json_chars(p) for p in node.parts))
    if isinstance(node, Alt):
        return alt(json_chars(o) for o in node.options)
    if isinstance(node, Repeat):
        return repeat(json_chars(node.node), node.low, node.high)
    if isinstance(node, Graph):
        return Graph(node.states, tuple((a, b, json_chars(t)) for a, b, t in node.edges),
                     node.accepting)  # fmt: skip
    raise TypeError(f"not a regex tree: {node!r}")
