"""Read request bodies the way vLLM's pydantic models do: lax coercion of scalars, unknown fields ignored, and
every type error collected into one 400 "Bad Request" (docs/vllm-wire-contract.md, section 1.2)."""

from __future__ import annotations

import json
from typing import Any

from simulator.errors import ApiError, request_validation_error

_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}
_MAX_INPUT_CHARS = 200


def parse_json_body(raw: bytes, content_type: str) -> Any:
    """What vLLM does before validation: insist on application/json (validate_json_request), then FastAPI's
    `json.loads` of the bytes, which reads UTF-8 (a byte order mark too), UTF-16 and UTF-32 alike, and decodes a
    surrogate's bytes; a JSON error is a validation error, any other one (bytes no encoding reads, an integer too
    long) FastAPI's 400 "There was an error parsing the body"."""
    media_type = content_type.lower().split(";", maxsplit=1)[0].strip()
    if media_type != "application/json":
        raise request_validation_error(["Unsupported Media Type: Only 'application/json' is allowed"])
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        error = {
            "type": "json_invalid",
            "loc": f"body.{exc.pos}",
            "msg": "JSON decode error",
            "input": "<dict of 0 items>",
            "ctx": {"error": exc.msg},
        }
        raise request_validation_error([str(error)], param=f"body.{exc.pos}") from None
    except ValueError:
        raise ApiError("There was an error parsing the body", type="Bad Request") from None


def _summary(value: Any) -> str:
    if isinstance(value, str):
        return value if len(value) <= _MAX_INPUT_CHARS else value[:_MAX_INPUT_CHARS] + "...[truncated]"
    if isinstance(value, (list, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    return str(value)


class Fields:
    """Typed, lax access to a JSON object's fields; `check()` raises one error naming every bad field."""

    def __init__(self, body: Any) -> None:
        self._errors: list[tuple[str, str]] = []
        if isinstance(body, dict):
            self.body: dict[str, Any] = body
        else:
            self.body = {}
            self._fail("body", "dict_type", "Input should be a valid dictionary", body)

    def invalid(self, loc: str, kind: str, msg: str, value: Any) -> None:
        self._fail(loc, kind, msg, value)

    def _fail(self, loc: str, kind: str, msg: str, value: Any) -> None:
        error = {"type": kind, "loc": loc, "msg": msg, "input": _summary(value)}
        self._errors.append((loc, str(error)))

    def check(self) -> None:
        if self._errors:
            raise request_validation_error([text for _, text in self._errors], param=self._errors[0][0])

    def has(self, name: str) -> bool:
        return name in self.body

    def raw(self, name: str) -> Any:
        return self.body.get(name)

    def require(self, name: str) -> Any:
        if name not in self.body and not self._errors:  # a body that is not an object is one error, not many
            self._fail(f"body.{name}", "missing", "Field required", self.body)
        return self.body.get(name)

    def int_or_none(self, name: str, default: int | None = None) -> int | None:
        value = self.body.get(name, default)
        return None if value is None else self._int(name, value)

    def integer(self, name: str, default: int) -> int:
        value = self.body.get(name, default)
        if value is None:
            self._fail(f"body.{name}", "int_type", "Input should be a valid integer", value)
            return default
        return self._int(name, value)

    def _int(self, name: str, value: Any) -> int:
        if isinstance(value, bool | int):
            return int(value)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                pass
        self._fail(f"body.{name}", "int_type", "Input should be a valid integer", value)
        return 0

    def boolean(self, name: str, default: bool) -> bool:
        value = self.body.get(name, default)
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        self._fail(f"body.{name}", "bool_parsing", "Input should be a valid boolean", value)
        return default

    def bool_or_none(self, name: str, default: bool | None = None) -> bool | None:
        value = self.body.get(name, default)
        return None if value is None else self.boolean(name, bool(default))

    def float_or_none(self, name: str) -> float | None:
        value = self.body.get(name)
        if value is None:
            return None
        if isinstance(value, bool | int | float):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                pass
        self._fail(f"body.{name}", "float_parsing", "Input should be a valid number", value)
        return None

    def str_or_none(self, name: str) -> str | None:
        value = self.body.get(name)
        if value is None or isinstance(value, str):
            return value
        self._fail(f"body.{name}", "string_type", "Input should be a valid string", value)
        return None

    def dict_or_none(self, name: str) -> dict[str, Any] | None:
        value = self.body.get(name)
        if value is None or isinstance(value, dict):
            return value
        self._fail(f"body.{name}", "dict_type", "Input should be a valid dictionary", value)
        return None

    def list_or_none(self, name: str) -> list[Any] | None:
        value = self.body.get(name)
        if value is None or isinstance(value, list):
            return value
        self._fail(f"body.{name}", "list_type", "Input should be a valid list", value)
        return None

    def ints(self, name: str, values: list[Any], *, minimum: int = 0) -> list[int]:
        """A list of token ids (each an int >= minimum)."""
        out = []
        for i, value in enumerate(values):
            if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
                out.append(value)
            else:
                self._fail(f"body.{name}.{i}", "int_type", "Input should be a valid token id", value)
        return out
