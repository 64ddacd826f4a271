"""The one place where the guard's errors become answers, whichever front end sends them: the error's status (and
Retry-After for a 429) with the error envelope of the endpoint asked: OpenAI's everywhere, except Anthropic's on the
Messages API, where vLLM answers `{"type": "error", "error": {"type", "message"}}` and the `anthropic` SDK expects
it."""

from __future__ import annotations

import json

from proxy.api.routes import ANTHROPIC, OPENAI
from proxy.errors import GuardError, TooBusy
from proxy.exchange.headers import Headers


def error_answer(error: GuardError, headers: Headers | None = None, envelope: str = OPENAI) -> tuple[Headers, bytes]:
    """The headers (`headers`, and the error's own) and the body of `error`'s answer; `envelope`: the route's
    (api/routes.py)."""
    extra = list(headers or [])
    if isinstance(error, TooBusy):
        extra.append((b"retry-after", str(error.retry_after_s).encode()))
    return extra, anthropic_bytes(error) if envelope == ANTHROPIC else error.json_bytes()


def anthropic_bytes(error: GuardError) -> bytes:
    """vLLM's Anthropic envelope: its own error type names (BadRequestError, ...), as its router translates them."""
    body = {"type": "error", "error": {"type": error.error_type, "message": error.message}}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def internal_error() -> GuardError:
    return GuardError("token-guard hit an internal error; the details are in its log.")
