"""An error sent as a whole HTTP response, with its status (error_bodies.py writes its headers and body)."""

from __future__ import annotations

from proxy import error_bodies
from proxy.error_bodies import Envelope
from proxy.errors import GuardError
from proxy.exchange.headers import Headers
from proxy.server.asgi import Reply


async def send_error(
    reply: Reply, error: GuardError, headers: Headers | None = None, envelope: Envelope = Envelope.OPENAI
) -> None:
    """`envelope`: the route's (api/routes.py)."""
    extra, body = error_bodies.answer(error, headers, envelope)
    await reply.whole(error.status, extra, body)
