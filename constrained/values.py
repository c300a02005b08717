"""JSON values as JSON Schema reads them: which type a value has, and when two are equal.

1.0 is an integer and true is not; 1 and 1.0 are one value, true and 1 two; objects are
equal member for member whatever their order.
"""

from __future__ import annotations

import json


def is_type(value, kind: str) -> bool:
    """Whether ``value`` is of JSON Schema's ``kind``."""
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


def same(value) -> str:
    """A key equal for two values exactly where JSON Schema finds them equal."""
    if isinstance(value, float) and value.is_integer():
        return json.dumps(int(value))
    if isinstance(value, list):
        return "[" + ",".join(same(x) for x in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + same(value[k]) for k in sorted(value)) + "}"
    return json.dumps(value)


def distinct(values: list) -> list:
    """``values`` without repeats (the first of each class of equal ones, in order)."""
    seen: dict[str, object] = {}
    for v in values:
        seen.setdefault(same(v), v)
    return list(seen.values())
