"""Twenty schemas of the kinds clients send, one of each shape the subset covers.

The tests draw outputs under each and validate them with the ``jsonschema`` library;
``ladder bench --scenario serve`` times the compile of each. Every string and array is
bounded, so that a language is finite: a model that never chooses a closing quote of
its own (a random one) still ends, pushed there by the mask.
"""

from __future__ import annotations

SCHEMAS: dict[str, dict] = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
        },
        "required": ["name", "age"],
    },
    "colour": {"type": "string", "enum": ["red", "green", "blue"]},
    "flag": {"type": "boolean"},
    "maybe text": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
    "integer range": {"type": "integer", "minimum": -50, "maximum": 1234},
    "unit interval": {"type": "number", "minimum": 0, "maximum": 1},
    "tags": {
        "type": "array",
        "items": {"type": "string", "maxLength": 10},
        "minItems": 1,
        "maxItems": 4,
    },
    "point": {
        "type": "object",
        "properties": {
            "x": {"type": "number", "minimum": -100, "maximum": 100},
            "y": {"type": "number", "minimum": -100, "maximum": 100},
        },
        "required": ["x", "y"],
        "additionalProperties": False,
    },
    "optional properties": {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 9},
            "b": {"type": "string", "maxLength": 5},
            "c": {"type": "boolean"},
        },
        "required": ["a"],
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 99999},
                    "email": {"type": "string", "pattern": r"^[a-z]{1,8}@[a-z]{1,8}\.(com|org)$"},
                },
                "required": ["id", "email"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    "constants": {
        "type": "object",
        "properties": {"version": {"const": 2}, "kind": {"const": "event"}},
        "required": ["version", "kind"],
    },
    "matrix": {
        "type": "array",
        "items": {
            "type": "array",
            "items": {"type": "integer", "minimum": 0, "maximum": 9},
            "maxItems": 3,
        },
        "maxItems": 3,
    },
    "references": {
        "$defs": {
            "address": {
                "type": "object",
                "properties": {
                    "street": {"type": "string", "maxLength": 15},
                    "zip": {"type": "string", "pattern": r"^\d{5}$"},
                },
                "required": ["street", "zip"],
            }
        },
        "type": "object",
        "properties": {"home": {"$ref": "#/$defs/address"}, "work": {"$ref": "#/$defs/address"}},
        "required": ["home"],
    },
    "unicode enum": {"enum": ["naïve", "日本", "€uro", "😀"]},
    "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
    "integer or text": {
        "type": ["integer", "string"],
        "minimum": 0,
        "maximum": 100,
        "maxLength": 6,
    },
    "between lengths": {"type": "string", "minLength": 3, "maxLength": 6},
    "exclusive bounds": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10},
    "product": {
        "title": "Product",
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "price": {"type": "number", "minimum": 0, "maximum": 10000},
            "tags": {
                "type": "array",
                "items": {"enum": ["new", "sale", "eco"]},
                "maxItems": 2,
            },
            "in_stock": {"type": "boolean"},
        },
        "required": ["name", "price", "tags", "in_stock"],
    },
    "log": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "level": {"enum": ["info", "warn", "error"]},
                "message": {"type": "string", "maxLength": 16},
            },
            "required": ["level", "message"],
        },
        "minItems": 1,
        "maxItems": 2,
    },
}
