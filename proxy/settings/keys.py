"""The `[[keys]]` tables: named API keys with their quotas, checked once. A key is given as itself (`key`) or as the
hex of its SHA-256 (`key_sha256`), so that the file need not hold the secret; only the digest is kept."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from proxy.settings import checks as v
from proxy.settings.sections import KeySettings

HEX_DIGEST = re.compile(r"^[0-9a-fA-F]{64}$")

KEY_SCHEMA: dict[str, Callable[[Any], Any]] = {
    "name": v.nonempty_text,
    "key": v.nonempty_text,
    "key_sha256": lambda value: _digest(value),
    "tokens_per_minute": v.integer(1),
    "requests_per_minute": v.integer(1),
    "max_output_tokens": v.integer(1),
    "models": lambda value: _models(value),
    "prompt_embeds": v.boolean,
}


def parse_keys(tables: list[dict[str, Any]], origin: str) -> tuple[KeySettings, ...]:
    """Every [[keys]] table as a KeySettings; a ValueError names the entry, the field and what was expected."""
    keys = tuple(_key(i, table, origin) for i, table in enumerate(tables))
    _unique([k.name for k in keys], "name", origin)
    _unique([k.key_sha256 for k in keys], "key", origin)
    return keys


def _key(index: int, table: dict[str, Any], origin: str) -> KeySettings:
    where = f"keys[{index}]" + (f" ({table['name']})" if isinstance(table.get("name"), str) else "")
    unknown = sorted(set(table) - set(KEY_SCHEMA))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown key (in {origin}); expected one of {', '.join(KEY_SCHEMA)}")
    if "name" not in table:
        raise ValueError(f"{where}.name: required (in {origin})")
    if ("key" in table) == ("key_sha256" in table):
        raise ValueError(f"{where}.key: expected exactly one of key or key_sha256 (in {origin})")
    parsed: dict[str, Any] = {}
    for field, value in table.items():
        try:
            parsed[field] = KEY_SCHEMA[field](value)
        except ValueError as exc:
            shown = "(hidden)" if field == "key" else repr(value)  # a secret never goes to a log
            raise ValueError(f"{where}.{field}: expected {exc}, got {shown} (in {origin})") from None
    secret = parsed.pop("key", None)
    if secret is not None:
        parsed["key_sha256"] = hashlib.sha256(secret.encode()).hexdigest()
    return KeySettings(**parsed)


def _digest(value: Any) -> str:
    if not isinstance(value, str) or not HEX_DIGEST.match(value.strip()):
        raise ValueError("64 hex digits (the SHA-256 of the key)")
    return value.strip().lower()


def _models(value: Any) -> tuple[str, ...]:
    names = v.list_of(v.nonempty_text)(value)
    if not names:
        raise ValueError("a non-empty list of model names")
    return tuple(names)


def _unique(values: list[str], field: str, origin: str) -> None:
    seen: set[str] = set()
    for index, value in enumerate(values):
        if value in seen:
            raise ValueError(f"keys[{index}].{field}: expected each key's {field} to be unique (in {origin})")
        seen.add(value)
