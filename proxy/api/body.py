"""Reading a request body: one JSON object in UTF-8 (its nesting and its number of values bounded before it is
parsed, in api/shape.py), its typed fields, and the body written back with changed fields. Shared by every endpoint's
wire model.

JSON text on the wire is UTF-8 (RFC 8259, section 8.1). `json.loads` on bytes, which vLLM's FastAPI uses, would also
read UTF-16 and UTF-32 (it guesses from the first four bytes), and the bounds of api/shape.py count bytes as UTF-8
text: so any other encoding is refused before anything is scanned, and what the guard reads is what vLLM reads. A
UTF-8 byte order mark is accepted, as vLLM accepts it (json.loads drops it), and is not sent again in a rewritten
body."""

from __future__ import annotations

import gc
import json
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from proxy.api.shape import check_embedded, check_shape
from proxy.errors import InvalidRequest
from proxy.settings import ServerSettings

T = TypeVar("T")

MAX_DEPTH = ServerSettings.max_json_depth
MAX_VALUES = ServerSettings.max_json_values


def parse_json_object(raw: bytes, max_depth: int = MAX_DEPTH, max_values: int = MAX_VALUES) -> dict[str, Any]:
    check_encoding(raw)
    strings_hold_more = check_shape(raw, max_depth, max_values)
    try:
        body = without_gc(json.loads, raw)
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid UTF-8: {exc.reason} at byte {exc.start}.") from None
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidRequest("The request body is nested too deeply to be read.") from None
    except ValueError:  # the one other error json.loads raises: int() refuses a literal this long
        raise InvalidRequest(
            f"The request body holds an integer of more than {sys.get_int_max_str_digits()} digits, which neither "
            "the guard nor vLLM reads."
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, got {kind_of(body)}.")
    if _SURROGATE_ESCAPE.search(raw) or (b"\xed" in raw and _SURROGATE_BYTES.search(raw)):
        _check_unicode(body)
    if strings_hold_more:
        check_embedded(body, max_values)
    return body


def check_encoding(raw: bytes) -> None:
    """A 400 for a body json.loads would read as UTF-16 or UTF-32. O(1): the encoding is told by the first four bytes
    alone (a NUL among them, or a byte order mark), exactly as json.detect_encoding tells it."""
    encoding = json.detect_encoding(raw[:4])
    if encoding not in _UTF8:
        raise InvalidRequest(
            f"The request body is {encoding.upper()} text; a JSON request body must be UTF-8 (RFC 8259), and "
            "token-guard reads no other encoding."
        )


def json_arguments(text: str) -> Any:
    """A tool call's `arguments` string parsed as vLLM parses it, or None when it cannot be read (malformed, an integer
    too long, nested deeper than the parser recurses). Its values are bounded with the body's (check_embedded)."""
    try:
        return without_gc(json.loads, text)
    except (ValueError, RecursionError):
        return None


def without_gc(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) with the cyclic garbage collector paused. Building many containers (a parse, an unpickle) otherwise
    sets off collections that scan the whole heap, tripling the time; JSON values hold no cycles, so refcounting
    frees them and the collector has nothing to find in them."""
    if not gc.isenabled():
        return fn(*args)
    gc.disable()
    try:
        return fn(*args)
    finally:
        gc.enable()


_UTF8 = ("utf-8", "utf-8-sig")  # what json.detect_encoding says of UTF-8 text, without and with a byte order mark
# A lone surrogate reaches the parsed text by a \uD800-\uDFFF escape (a pair of them makes one character and is
# fine), or by its three bytes in the raw body (ED A0-BF ..), which json.loads decodes with "surrogatepass" although
# they are not UTF-8. A match only means the whole body is checked, which is exact.
_SURROGATE_ESCAPE = re.compile(rb"\\[uU][dD][89a-fA-F]")
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")


def _check_unicode(body: dict[str, Any]) -> None:
    try:
        json.dumps(body, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("unicode_escape").decode()
        raise InvalidRequest(
            f"The request body is not valid Unicode text: it holds a lone surrogate ({bad}), which cannot be encoded."
        ) from None


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


def token_ids(values: list[Any]) -> bool:
    """Whether every value is a token id (an int >= 0, not a bool), at C speed: a prompt may hold a few hundred
    thousand of them (server.max_json_values), and a Python-level check of each would hold the event loop ~20 ms."""
    return set(map(type, values)) <= {int} and (not values or min(values) >= 0)


def kind_of(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def with_changes(body: dict[str, Any], changes: dict[str, Any]) -> bytes:
    """The body re-serialized with only `changes` applied; key order and every other value are kept."""
    return json.dumps({**body, **changes}, ensure_ascii=False, separators=(",", ":")).encode()
