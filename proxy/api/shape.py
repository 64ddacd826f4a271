"""How much JSON a request body holds, found before json.loads builds anything: its nesting depth and its number of
values (server.max_json_depth, server.max_json_values). A body of millions of `[]` costs seconds and gigabytes as
Python objects, and a deep one makes the parser recurse; these bounds cost only C-speed bytes operations."""

from __future__ import annotations

from proxy.errors import InvalidRequest

_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_SQUARE = bytes.maketrans(b"{}", b"[]")


def values_bound(raw: bytes) -> int:
    """At C speed and without a copy, an upper bound of the values count_values counts: the `[`, `{` and `,` in `raw`,
    those inside strings included."""
    return raw.count(b"[") + raw.count(b"{") + raw.count(b",")


def check_shape(raw: bytes, max_depth: int, max_values: int) -> None:
    """A 400 for arrays and objects nested deeper than `max_depth`, or for more than `max_values` values."""
    brackets = raw.count(b"[") + raw.count(b"{")
    bound = len(raw) if len(raw) <= max_values else brackets + raw.count(b",")  # of values, strings included
    if brackets <= max_depth and bound <= max_values:
        return  # (most bodies) too few brackets to nest that deep, too few bytes or separators for that many
    outside = _outside_strings(raw)
    _check_depth(outside.translate(_SQUARE, _NOT_BRACKET), max_depth)
    values = count_values(outside)
    if values > max_values:
        raise InvalidRequest(
            f"The request body holds {values} JSON values; at most {max_values} are accepted (server.max_json_values)."
        )


def count_values(outside: bytes) -> int:
    """The values in JSON text with its strings taken out (_outside_strings): its `[`, `{` and `,`, which is one per
    array item and object member, plus one per empty array or object."""
    return outside.count(b"[") + outside.count(b"{") + outside.count(b",")


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
