"""Schemas of the kinds clients send: ``SCHEMAS``, twenty, one of each shape the subset
covers, and ``KEYWORDS``, one for each keyword a regular language holds beyond them.

The tests draw outputs under each and validate them with the ``jsonschema`` library;
``ladder bench --scenario serve`` times the compile of each of ``SCHEMAS``. Their strings
and arrays are bounded, so that a language is finite: a model that never chooses a
closing quote of its own (a random one) still ends, pushed there by the mask. Those of
``KEYWORDS`` are as people write them, unbounded where they are: the budget of tokens
ends those (``constrained.masks.Constraint``).
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


KEYWORDS: dict[str, dict] = {
    "format date": {"type": "string", "format": "date"},
    "format time": {"type": "string", "format": "time"},
    "format date-time": {"type": "string", "format": "date-time"},
    "format email": {"type": "string", "format": "email", "maxLength": 24},
    "format uuid": {"type": "string", "format": "uuid"},
    "format ipv4": {"type": "string", "format": "ipv4"},
    "format uri": {"type": "string", "format": "uri"},
    "pattern and length": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 5},
    "oneOf": {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "circle"},
                    "radius": {"type": "integer", "minimum": 1},
                },
                "required": ["kind", "radius"],
            },
            {
                "type": "object",
                "properties": {
                    "kind": {"const": "square"},
                    "side": {"type": "integer", "minimum": 1},
                },
                "required": ["kind", "side"],
            },
            {"type": "null"},
        ]
    },
    "additionalProperties": {"type": "object", "additionalProperties": {"type": "integer"}},
    "properties and more": {
        "type": "object",
        "properties": {"id": {"type": "integer", "minimum": 0}},
        "required": ["id"],
        "additionalProperties": {"type": "boolean"},
        "maxProperties": 3,
    },
    "patternProperties": {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}},
        "patternProperties": {
            "^x-[a-z]+$": {"type": "string", "maxLength": 4},
            "^n[0-9]$": {"type": "integer"},
        },
        "additionalProperties": False,
    },
    "prefixItems": {
        "type": "array",
        "prefixItems": [
            {"type": "number", "minimum": -90, "maximum": 90},
            {"type": "string", "maxLength": 3},
        ],
        "items": False,
    },
    "prefixItems and items": {
        "type": "array",
        "prefixItems": [{"type": "boolean"}],
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2,
        "maxItems": 4,
    },
    "minProperties and maxProperties": {
        "type": "object",
        "properties": {
            "a": {"type": "boolean"},
            "b": {"type": "null"},
            "c": {"type": "integer", "maximum": 9, "minimum": 0},
        },
        "minProperties": 1,
        "maxProperties": 2,
    },
    "multipleOf": {"type": "integer", "multipleOf": 7, "minimum": -50, "maximum": 500},
    "recursive $ref": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer", "minimum": 0, "maximum": 9},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
                },
                "required": ["value"],
            }
        },
        "$ref": "#/$defs/node",
    },
    "uniqueItems": {
        "type": "array",
        "items": {"enum": ["red", "green", "blue", 1, 1.0]},
        "uniqueItems": True,
        "minItems": 1,
    },
}
