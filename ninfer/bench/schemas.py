"""A dozen JSON schemas of the shapes structured outputs meet (nested objects, enums, arrays
with bounds, anyOf, patterns, numbers, $ref): the validity test's and the grammar engines'
comparison (tools/compare_grammar_engines.py). Strings are bounded so that a random model's
documents end."""

from __future__ import annotations

SCHEMAS = [
    {  # nested objects
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "maxLength": 10},
                    "id": {"type": "integer", "minimum": 0, "maximum": 99999},
                },
                "required": ["name", "id"],
            }
        },
        "required": ["user"],
    },
    {  # enum
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
    },
    {  # array with bounds
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "minItems": 2,
        "maxItems": 4,
    },
    {  # anyOf
        "anyOf": [
            {"type": "integer", "minimum": -50, "maximum": 50},
            {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]},
        ]
    },
    {  # string with a pattern
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
        "required": ["code"],
    },
    {  # numbers with bounds
        "type": "object",
        "properties": {
            "p": {"type": "number", "minimum": -1.5, "maximum": 2.5},
            "n": {"type": "integer", "exclusiveMinimum": 0, "maximum": 1000},
        },
        "required": ["p", "n"],
    },
    {  # booleans and null
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}},
        "required": ["ok", "note"],
    },
    {  # an array of objects
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "k": {"type": "string", "minLength": 1, "maxLength": 4},
                "v": {"type": "integer", "minimum": 0, "maximum": 100},
            },
            "required": ["k", "v"],
        },
        "minItems": 1,
        "maxItems": 3,
    },
    {  # const and an optional property
        "type": "object",
        "properties": {"version": {"const": 2}, "extra": {"type": "string", "maxLength": 5}},
        "required": ["version"],
    },
    {  # nested arrays
        "type": "array",
        "items": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        "minItems": 1,
        "maxItems": 2,
    },
    {  # $defs and $ref
        "$defs": {
            "pt": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 9},
                    "y": {"type": "integer", "minimum": 0, "maximum": 9},
                },
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/pt"}, "b": {"$ref": "#/$defs/pt"}},
        "required": ["a", "b"],
    },
    {"type": "string", "enum": ["alpha", "beta", "gamma delta"]},  # a top-level enum
]
