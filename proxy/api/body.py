"""Reading a request body: one JSON object (nesting bounded before it is parsed), its typed fields, and the body
written back with changed fields. Shared by every endpoint's wire model."""

from __future__ import annotations

import json
import re
from typing import Any

from proxy.errors import InvalidRequest
from proxy.settings import ServerSettings

MAX_DEPTH = ServerSettings.max_json_depth


def parse_json_object(raw: bytes, max_depth: int = MAX_DEPTH) -> dict[str, Any]:
    check_depth(raw, max_depth)
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest("The request body is nested too deeply to be read.") from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, got {kind_of(body)}.")
    if _SURROGATE_ESCAPE.search(raw):
        _check_unicode(body)
    return body


# Only a \uD800-\uDFFF escape can put a lone surrogate in the parsed text (raw bytes must be valid UTF-8); a pair of
# them makes one character and is fine. A match only means the whole body is checked, which is exact.
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")


def _check_unicode(body: dict[str, Any]) -> None:
    try:
        json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("unicode_escape").decode()
        raise InvalidRequest(
            f"The request body is not valid Unicode text: it holds a lone surrogate ({bad}), which cannot be encoded."
        ) from None


_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_SQUARE = bytes.maketrans(b"{}", b"[]")


def check_depth(raw: bytes, max_depth: int) -> None:
    """A 400 for arrays and objects nested deeper than `max_depth`, before json.loads builds (or recurses into)
    anything. Only C-speed bytes operations: drop the strings, keep the brackets, then drop the innermost `[]` pairs
    once per level; a body nested d deep is empty after d passes."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # after this, every `"` opens or closes a string
    shape = b"".join(unescaped.split(b'"')[::2]).translate(_SQUARE, _NOT_BRACKET)
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


def model_name(body: dict[str, Any]) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest(f"'model' must be a string, got {kind_of(model)}.", param="model")
    return model or None


def count_field(body: dict[str, Any], key: str) -> int | None:
    """A count as vLLM reads it: an integer, or a number with no fractional part (2.0 is 2)."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        fraction = " with a fractional part" if isinstance(value, float) else ""
        raise InvalidRequest(f"'{key}' must be an integer, got {kind_of(value)}{fraction}.", param=key)
    if value < 0:
        raise InvalidRequest(f"'{key}' must be at least 0, got {value}.", param=key)
    return value


def choices(body: dict[str, Any]) -> int:
    n = body.get("n")
    if isinstance(n, int | float) and not isinstance(n, bool) and n < 1:
        raise InvalidRequest(f"'n' must be at least 1, got {n}.", param="n")
    counted = count_field(body, "n")
    return 1 if counted is None else counted


def check_min_tokens(min_tokens: int | None, max_tokens: int | None) -> None:
    """vLLM refuses a request whose min_tokens exceeds its max_tokens (SamplingParams), with this message."""
    if min_tokens is not None and max_tokens is not None and min_tokens > max_tokens:
        raise InvalidRequest(
            f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.", param="min_tokens"
        )


def flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{key}' must be a boolean, got {kind_of(value)}.", param=key)
    return value


def optional(body: dict[str, Any], key: str, kind: type, expected: str) -> Any:
    value = body.get(key)
    if value is not None and not isinstance(value, kind):
        raise InvalidRequest(f"'{key}' must be {expected}, got {kind_of(value)}.", param=key)
    return value


def kind_of(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def with_changes(body: dict[str, Any], changes: dict[str, Any]) -> bytes:
    """The body re-serialized with only `changes` applied; key order and every other value are kept."""
    return json.dumps({**body, **changes}, ensure_ascii=False, separators=(",", ":")).encode()
