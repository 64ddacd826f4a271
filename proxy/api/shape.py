"""How much JSON a request body holds, found before json.loads builds anything: its nesting depth and its number of
values (server.max_json_depth, server.max_json_values). A body of millions of `[]` costs seconds and gigabytes as
Python objects, and a deep one makes the parser recurse; these bounds cost only C-speed bytes operations."""

from __future__ import annotations

from typing import Any

from proxy.errors import InvalidRequest

_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_SQUARE = bytes.maketrans(b"{}", b"[]")


def values_bound(raw: bytes) -> int:
    """At C speed and without a copy, an upper bound of the values count_values counts: the `[`, `{` and `,` in `raw`,
    those inside strings included."""
    return raw.count(b"[") + raw.count(b"{") + raw.count(b",")


def check_shape(raw: bytes, max_depth: int, max_values: int) -> bool:
    """A 400 for arrays and objects nested deeper than `max_depth`, or for more than `max_values` values. True when
    the body's strings could hold more than `max_values` values of JSON text (then check_embedded, once parsed)."""
    brackets = raw.count(b"[") + raw.count(b"{")
    bound = len(raw) if len(raw) <= max_values else brackets + raw.count(b",")  # of values, strings included
    if brackets <= max_depth and bound <= max_values:
        return False  # (most bodies) too few brackets to nest that deep, too few bytes or separators for that many
    outside = _outside_strings(raw)
    _check_depth(outside.translate(_SQUARE, _NOT_BRACKET), max_depth)
    values = count_values(outside)
    if values > max_values:
        raise InvalidRequest(
            f"The request body holds {values} JSON values; at most {max_values} are accepted (server.max_json_values)."
        )
    return bound > max_values


def count_values(outside: bytes) -> int:
    """The values in JSON text with its strings taken out (_outside_strings): its `[`, `{` and `,`, which is one per
    array item and object member, plus one per empty array or object."""
    return outside.count(b"[") + outside.count(b"{") + outside.count(b",")


def check_embedded(body: dict[str, Any], max_values: int) -> None:
    """A 400 when the JSON texts in the body's strings that the guard parses, as vLLM does (tool calls' `arguments`),
    hold more than `max_values` values together. Only needed when check_shape says so: else those texts, being part
    of the raw body, are bounded with it."""
    values = sum(count_values(_outside_strings(text.encode(errors="surrogatepass"))) for text in _arguments(body))
    if values > max_values:
        raise InvalidRequest(
            f"The tool calls' arguments in the request body hold {values} JSON values; at most {max_values} are "
            "accepted (server.max_json_values)."
        )


def _arguments(value: Any) -> list[str]:
    """Every string under an `arguments` key, at any depth (chat tool calls, Responses function_call items)."""
    if isinstance(value, list):
        return [text for item in value for text in _arguments(item)]
    if not isinstance(value, dict):
        return []
    found = [value["arguments"]] if isinstance(value.get("arguments"), str) else []
    return found + [text for item in value.values() if isinstance(item, list | dict) for text in _arguments(item)]


def _outside_strings(raw: bytes) -> bytes:
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # after this, every `"` opens or closes a string
    return b"".join(unescaped.split(b'"')[::2])


def _check_depth(shape: bytes, max_depth: int) -> None:
    """`shape` is the body's brackets outside strings, all made square: drop the innermost `[]` pairs once per level;
    a body nested d deep is empty after d passes."""
    too_deep = b"[" * (max_depth + 1)
    for level in range(max_depth):
        if level < 2 and too_deep in shape:  # the plain nesting bomb, with or without leaves, ends here at once
            break
        shorter = shape.replace(b"[]", b"")
        if len(shorter) == len(shape):
            return  # no pairs left: shallow enough (or not JSON, which json.loads will say)
        shape = shorter
    if b"[]" in shape or too_deep in shape:
        raise InvalidRequest(
            f"The request body is nested too deeply: more than {max_depth} levels (server.max_json_depth)."
        )
