"""The one place where the guard's errors become HTTP responses: the error's status (and Retry-After for a 429) with
the error envelope of the endpoint asked: OpenAI's everywhere, except Anthropic's on the Messages API, where vLLM
answers `{"type": "error", "error": {"type", "message"}}` and the `anthropic` SDK expects it."""

from __future__ import annotations

import json

from proxy.api.routes import ANTHROPIC, OPENAI
from proxy.errors import GuardError, TooBusy
from proxy.server.asgi import Headers, Reply


async def send_error(reply: Reply, error: GuardError, headers: Headers | None = None, envelope: str = OPENAI) -> None:
    """`envelope`: the route's (api/routes.py)."""
    extra = list(headers or [])
    if isinstance(error, TooBusy):
        extra.append((b"retry-after", str(error.retry_after_s).encode()))
    body = anthropic_bytes(error) if envelope == ANTHROPIC else error.json_bytes()
    await reply.whole(error.status, extra, body)


def anthropic_bytes(error: GuardError) -> bytes:
    """vLLM's Anthropic envelope: its own error type names (BadRequestError, ...), as its router translates them."""
    body = {"type": "error", "error": {"type": error.error_type, "message": error.message}}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def internal_error() -> GuardError:
    return GuardError("token-guard hit an internal error; the details are in its log.")
