"""The JSON-schema guard of structured outputs: a schema rewritten into what xgrammar enforces
exactly, or refused naming the keyword and where it is.

xgrammar accepts some keywords without enforcing them, and its string length rule is wrong;
either would let an invalid document through. This module knows nothing of xgrammar's API or
of tokens: it rewrites plain JSON data (`ninfer.structured` compiles the result).

`oneOf` is taken where its branches are provably exclusive (no document can match two of them),
so that "any of" (what the grammar enforces) is "exactly one of": branches of disjoint JSON
types, or objects told apart by a required property whose `const` / `enum` values differ (a
tagged union, as pydantic writes one). Any other `oneOf` is refused: exclusivity is not a
grammar property.
"""

from __future__ import annotations

import json


class Unenforceable(ValueError):
    """A JSON schema keyword the grammar would not enforce."""


# Keywords xgrammar accepts but does not enforce (it would let invalid documents through):
# refused, as OpenAI's strict mode refuses them.
_UNENFORCED = (
    *("not", "if", "then", "else", "contains", "minContains", "maxContains"),
    *("dependentSchemas", "unevaluatedProperties", "unevaluatedItems"),
)
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SUBSCHEMA_LISTS = ("anyOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "propertyNames")


def enforceable_schema(schema) -> object:
    """`schema` rewritten into what the grammar enforces exactly, or `Unenforceable` naming
    the keyword and where it is (a JSON pointer). A one-element `allOf` is inlined; a `oneOf`
    of exclusive branches becomes their `anyOf`. A string's `minLength` / `maxLength` becomes
    the pattern `^[\\u0020-\\U0010FFFF]{min,max}$`: xgrammar's own length rule lets raw
    control characters into the string (JSON forbids them), and its `.` lets a byte-level
    vocabulary build invalid UTF-8; the code-point class does neither. The pattern admits no
    escapes: a subset of the valid strings."""
    return _enforceable(schema, "", schema)


def _enforceable(schema, where: str, root) -> object:
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    at = where or "/"
    for key in _UNENFORCED:
        if key in out:
            raise Unenforceable(f"{key!r} at {at}")
    if out.get("uniqueItems"):
        raise Unenforceable(f"'uniqueItems' at {at}")
    if "oneOf" in out:
        branches = out.pop("oneOf")
        if "anyOf" in out:
            raise Unenforceable(f"'oneOf' beside 'anyOf' at {at}")
        if not isinstance(branches, list) or not branches:
            raise Unenforceable(f"'oneOf' that is not a non-empty list at {at}")
        pair = _overlapping(branches, root)
        if pair is not None:
            raise Unenforceable(
                f"'oneOf' at {at}: branches {pair[0]} and {pair[1]} are not provably exclusive "
                "(use anyOf, or tell them apart by type or by a required const property)"
            )
        out["anyOf"] = branches
        where_any = f"{where}/oneOf"
    else:
        where_any = f"{where}/anyOf"
    if "allOf" in out:
        parts = out.pop("allOf")
        if not isinstance(parts, list) or len(parts) != 1 or not isinstance(parts[0], dict):
            raise Unenforceable(f"'allOf' with more than one schema at {at}")
        inner = _enforceable(parts[0], f"{where}/allOf/0", root)
        clash = set(inner) & set(out) - {"description", "title"}
        if clash:
            raise Unenforceable(f"'allOf' beside {sorted(clash)} at {at}")
        out.update(inner)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {k: _enforceable(v, f"{where}/{key}/{k}", root) for k, v in out[key].items()}
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            base = where_any if key == "anyOf" else f"{where}/{key}"
            out[key] = [_enforceable(v, f"{base}/{i}", root) for i, v in enumerate(out[key])]
    for key in _SUBSCHEMAS:
        if isinstance(out.get(key), dict):
            out[key] = _enforceable(out[key], f"{where}/{key}", root)
    if "minLength" in out or "maxLength" in out:
        if "pattern" in out or "format" in out:
            raise Unenforceable(f"'pattern' or 'format' with a length bound at {at}")
        lo, hi = out.pop("minLength", 0), out.pop("maxLength", None)
        if not isinstance(lo, int) or (hi is not None and not isinstance(hi, int)):
            raise Unenforceable(f"a length bound that is not an integer at {at}")
        out["pattern"] = length_pattern(lo, hi)
    return out


_CHAR = "[\\u0020-\\U0010FFFF]"  # a code point JSON takes unescaped, space included
_EDGE = "[\\u0021-\\U0010FFFF]"  # the same, space excluded


def length_pattern(lo: int, hi: int | None, trim: bool = False) -> str:
    """The regex of the strings of `lo` to `hi` (None: any number of) code points of `_CHAR`;
    with `trim`, their first and last code points are not a space (`_EDGE`):

        trim, lo >= 2:   EDGE CHAR{lo-2,hi-2} EDGE
        trim, lo <= 1:   EDGE (CHAR{0,hi-2} EDGE)?     the whole optional when lo == 0
    """
    if not trim or (hi is not None and hi < max(lo, 1)):
        return f"^{_CHAR}{{{lo},{'' if hi is None else hi}}}$"
    top = "" if hi is None else hi - 2
    if hi == 1:
        body = _EDGE
    elif lo >= 2:
        body = f"{_EDGE}{_CHAR}{{{lo - 2},{top}}}{_EDGE}"
    else:
        body = f"{_EDGE}({_CHAR}{{0,{top}}}{_EDGE})?"
    return f"^({body})?$" if lo == 0 else f"^{body}$"


# ---- oneOf: provably exclusive branches -------------------------------------------------------
_TYPES = ("null", "boolean", "object", "array", "string", "number")
_MAX_REFS = 8  # a chain of $refs followed before giving up (a cycle proves nothing)


def _overlapping(branches: list, root) -> tuple[int, int] | None:
    """The first pair of branch indices not provably exclusive (None: every pair is)."""
    resolved = [_resolve(b, root) for b in branches]
    for i in range(len(resolved)):
        for j in range(i + 1, len(resolved)):
            if not _exclusive(resolved[i], resolved[j], root):
                return i, j
    return None


def _resolve(schema, root):
    """`schema` with its local `$ref` chain followed (None: not a local reference)."""
    for _ in range(_MAX_REFS):
        if not isinstance(schema, dict) or "$ref" not in schema:
            return schema
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return None
        node = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
        schema = node
    return None


def _exclusive(a, b, root) -> bool:
    """No document matches both `a` and `b`: their JSON types are disjoint, or both are
    objects with a property both require whose allowed values (const / enum) are disjoint."""
    ta, tb = _types(a), _types(b)
    if ta is not None and tb is not None and not ta & tb:
        return True
    if ta != {"object"} or tb != {"object"}:
        return False
    for key in set(_required(a)) & set(_required(b)):
        va, vb = _values(a, key, root), _values(b, key, root)
        if va is not None and vb is not None and not va & vb:
            return True
    return False


def _types(schema) -> set[str] | None:
    """The JSON types `schema` may match (integer counts as number); None: not known."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return {_type_of(schema["const"])}
    if isinstance(schema.get("enum"), list):
        return {_type_of(v) for v in schema["enum"]}
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind
    if not isinstance(kinds, list) or not kinds:
        return None
    found = {"number" if k == "integer" else k for k in kinds}
    return found if found <= set(_TYPES) else None


def _type_of(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), "object")


def _required(schema) -> list:
    names = schema.get("required")
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _values(schema, key: str, root) -> set[str] | None:
    """The values property `key` may take, as canonical JSON (None: not bounded)."""
    prop = _resolve((schema.get("properties") or {}).get(key), root)
    if not isinstance(prop, dict):
        return None
    if "const" in prop:
        return {_canonical(prop["const"])}
    if isinstance(prop.get("enum"), list):
        return {_canonical(v) for v in prop["enum"]}
    return None


def _canonical(value) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 1 and 1.0 are one JSON value
    return json.dumps(value, sort_keys=True)
