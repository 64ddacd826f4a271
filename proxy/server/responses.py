"""Errors sent as whole HTTP responses (exchange/answers.py writes them)."""

from __future__ import annotations

from proxy.api.routes import OPENAI
from proxy.errors import GuardError
from proxy.exchange.answers import error_answer
from proxy.exchange.headers import Headers
from proxy.server.asgi import Reply


async def send_error(reply: Reply, error: GuardError, headers: Headers | None = None, envelope: str = OPENAI) -> None:
    """`envelope`: the route's (api/routes.py)."""
    extra, body = error_answer(error, headers, envelope)
    await reply.whole(error.status, extra, body)
