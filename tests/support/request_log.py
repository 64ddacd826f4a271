"""Reading a request's log line back: its fields as the log handler got them, and what they say of the changes the
x-token-guard-* headers told the client, so that a test can hold the two to each other."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from tests.support.polling import eventually

# each x-token-guard-* header a changed request carries, and the log field that must say the same
SAID_BY = {
    "x-token-guard-prompt-tokens": "prompt_tokens",
    "x-token-guard-action": "action",
    "x-token-guard-max-tokens": "max_tokens_after",
    "x-token-guard-chunks": "chunks",
    "x-token-guard-chunk-tokens": "chunk_tokens",
    "x-token-guard-dropped-messages": "dropped_messages",
    "x-token-guard-truncated-tokens": "truncated_tokens",
    "x-token-guard-count-source": "count_source",
    "x-token-guard-next-turn-tokens": "next_turn_tokens",
}


def logged(caplog: pytest.LogCaptureFixture, request_id: str) -> dict[str, object]:
    """The fields of the one request line logged for `request_id` (caplog set to INFO on token_guard.requests)."""

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if getattr(r, "fields", {}).get("request_id") == request_id]

    assert eventually(lambda: bool(lines()))
    (line,) = lines()
    fields: dict[str, object] = line.fields  # type: ignore[attr-defined]
    return fields


def changes_told(headers: Mapping[str, str]) -> dict[str, str]:
    """The x-token-guard-* headers of an answer that tell a change (not the queue time, which the log holds in s)."""
    return {k: v for k, v in headers.items() if k.startswith("x-token-guard-") and k != "x-token-guard-queue-ms"}


def as_headers(fields: dict[str, object]) -> dict[str, str]:
    """What a log line says of the changes, written as the headers that tell them."""
    said = {header: str(fields[name]) for header, name in SAID_BY.items() if name in fields}
    if fields.get("thinking") == "disabled":
        said["x-token-guard-thinking"] = "disabled"
    elif fields.get("thinking") == "lowered":
        said["x-token-guard-thinking"] = f"budget_tokens={fields['thinking_budget']}"
    if fields.get("merge") == "reduce":
        said["x-token-guard-merge"] = "reduce"
    elif fields.get("merge") == "concat":
        said["x-token-guard-merge"] = "concat (the combining request would not fit)"
    return said
