"""The one place where the guard's errors become HTTP responses: the OpenAI error envelope with the error's status
(and Retry-After for a 429)."""

from __future__ import annotations

from proxy.errors import GuardError, TooBusy
from proxy.server.asgi import Headers, Reply


async def send_error(reply: Reply, error: GuardError, headers: Headers | None = None) -> None:
    extra = list(headers or [])
    if isinstance(error, TooBusy):
        extra.append((b"retry-after", str(error.retry_after_s).encode()))
    await reply.whole(error.status, extra, error.json_bytes())


def internal_error() -> GuardError:
    return GuardError("token-guard hit an internal error; the details are in its log.")
