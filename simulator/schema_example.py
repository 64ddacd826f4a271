"""A JSON value that fits a JSON schema, standing in for what vLLM's guided decoding forces a model to write
(a named tool's arguments, a `json_schema` response format). It fits the schema's shape and types, not its meaning."""

from __future__ import annotations

from typing import Any

_MAX_DEPTH = 8  # recursive schemas (a tree of nodes) stop here
_SCALARS: dict[str, Any] = {"string": "the", "integer": 1, "number": 1.5, "boolean": True, "null": None}


def example(schema: Any) -> Any:
    """A value valid for `schema` (local `$ref`s, `anyOf`/`oneOf`/`allOf`, enums, consts and the basic types)."""
    return _value(schema, schema if isinstance(schema, dict) else {}, 0)


def _value(schema: Any, root: dict[str, Any], depth: int) -> Any:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return {}
    if "$ref" in schema:
        return _value(_resolve(schema["$ref"], root), root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return _value(_first_not_null(options), root, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or kind is None:
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {name: _value(sub, root, depth + 1) for name, sub in properties.items()}
    if kind == "array":
        items = schema.get("items")
        return [_value(items, root, depth + 1)] if isinstance(items, dict) else []
    if kind in ("integer", "number") and isinstance(schema.get("minimum"), int | float):
        return schema["minimum"]
    return _SCALARS.get(str(kind))


def _first_not_null(options: list[Any]) -> Any:
    return next((o for o in options if not (isinstance(o, dict) and o.get("type") == "null")), options[0])


def _resolve(ref: Any, root: dict[str, Any]) -> Any:
    """A local reference such as `#/$defs/Address` (pydantic's) or `#/definitions/Address`."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        return {}
    node: Any = root
    for part in ref[2:].split("/"):
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}
