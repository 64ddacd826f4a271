"""Value checkers for the settings: each returns the parsed value or raises ValueError saying what was expected
(the settings loader adds the key and where the value came from)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any


def integer(low: int, high: int | None = None) -> Callable[[Any], int]:
    expected = f"an integer from {low} to {high}" if high else f"an integer >= {low}"

    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(expected)
        try:
            number = int(value)
        except ValueError:
            raise ValueError(expected) from None
        if number < low or (high is not None and number > high):
            raise ValueError(expected)
        return number

    return check


def positive_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("a number of seconds > 0") from None
    if isinstance(value, bool) or not number > 0:
        raise ValueError("a number of seconds > 0")
    return number


def non_negative_float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("a number >= 0") from None
    if isinstance(value, bool) or not number >= 0:
        raise ValueError("a number >= 0")
    return number


def nonempty_text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("a non-empty string")
    return value.strip()


def url(value: Any) -> str:
    text = nonempty_text(value)
    if not re.match(r"^https?://[^/\s]+", text):
        raise ValueError("an http:// or https:// URL")
    return text.rstrip("/")


def urls(value: Any) -> tuple[str, ...]:
    """One URL or several: a list, or a comma-separated string (as an environment variable or a flag gives them)."""
    try:
        return list_of(url)(value)
    except ValueError:
        raise ValueError("an http:// or https:// URL, or a list of them (or a comma-separated string)") from None


def redis_url(value: Any) -> str | None:
    if value in (None, ""):
        return None
    text = nonempty_text(value)
    if not re.match(r"^(rediss?://[^/\s]+|unix://\S+)", text):
        raise ValueError("a redis://, rediss:// or unix:// URL")
    return text


def lease_seconds(value: Any) -> float:
    """Long enough for a renewal to get through (renewed every third of it), short enough to free a dead guard's."""
    number = positive_float(value)
    if not 0.5 <= number <= 3600:
        raise ValueError("a number of seconds from 0.5 to 3600")
    return number


def fraction(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("a number from 0 to 1") from None
    if isinstance(value, bool) or not 0 <= number <= 1:
        raise ValueError("a number from 0 to 1")
    return number


def log_level(value: Any) -> str:
    levels = ("critical", "error", "warning", "info", "debug")
    if not isinstance(value, str) or value.lower() not in levels:
        raise ValueError("one of " + ", ".join(levels))
    return value.lower()


def default_max_tokens(value: Any) -> int | str | None:
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            percent = float(value.strip()[:-1])
        except ValueError:
            raise ValueError('a token count or a percentage of the window such as "50%"') from None
        if not 0 < percent <= 100:
            raise ValueError("a percentage above 0% and at most 100%")
        return value.strip()
    try:
        return integer(1)(value)
    except ValueError:
        raise ValueError('a token count >= 1 or a percentage of the window such as "50%"') from None


def choice(*options: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if not isinstance(value, str) or value not in options:
            raise ValueError("one of " + ", ".join(repr(o) for o in options))
        return value

    return check


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        return value.lower() in ("true", "1", "yes", "on")
    raise ValueError("true or false")


def any_text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("a string")
    return value


def template(*fields: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        text = any_text(value)
        try:
            text.format(**{f: 1 for f in fields})
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"a template using only {', '.join('{' + f + '}' for f in fields)} ({exc!r})") from None
        return text

    return check


def list_of(check: Callable[[Any], Any]) -> Callable[[Any], tuple[Any, ...]]:
    def parse(value: Any) -> tuple[Any, ...]:
        items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise ValueError("a list (or a comma-separated string)")
        try:
            return tuple(check(item) for item in items)
        except ValueError as exc:
            raise ValueError(f"a list of {exc}") from None

    return parse


def route_path(value: Any) -> str:
    """A path as a route declares it: from /, printable, no query, fragment, backslash or dot segment."""
    text = nonempty_text(value)
    segments = text.split("/")
    if not text.startswith("/") or not text.isprintable() or any(c in text for c in " ?#\\%") or any(
        s in (".", "..") for s in segments
    ):  # fmt: skip
        raise ValueError("a path starting with / (no spaces, query, fragment, percent-escape or dot segment)")
    return text


def path_prefix(value: Any) -> str:
    """A prefix of whole path segments, as a gateway route matches it: a route path, neither / nor ending in one."""
    text = route_path(value)
    if text.endswith("/"):
        raise ValueError("a path prefix starting with / and not ending with one (e.g. /llama)")
    return text


def optional_text(value: Any) -> str | None:
    return None if value in (None, "") else nonempty_text(value)


def budget(value: Any) -> int | str:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return integer(0)(value)
    except ValueError:
        raise ValueError('a token count >= 0 (0 = off) or "auto"') from None


def path_value(value: Any) -> Path:
    return Path(nonempty_text(value)).expanduser()


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")  # vLLM 0.33's ReasoningEffort


def effort_map(value: Any) -> dict[str, str]:
    """vLLM's --reasoning-effort-map (0.33+): a JSON object from requested efforts to the ones the template takes."""
    mapping = json_object(value)
    if not all(isinstance(v, str) for v in mapping.values()):
        raise ValueError("an object mapping reasoning efforts to strings")
    if unknown := sorted(set(mapping) - set(REASONING_EFFORTS)):
        raise ValueError(f"unknown efforts {unknown}; keys must be among {list(REASONING_EFFORTS)}")
    return mapping


def json_object(value: Any) -> dict[str, Any]:
    """A table in TOML, or a JSON object in an environment variable or a flag (as vLLM's flag takes it)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError("a JSON object") from None
    if not isinstance(value, dict):
        raise ValueError("a table (TOML) or a JSON object")
    return dict(value)
