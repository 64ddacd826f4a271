"""Every error body the guard sends is written here, and nowhere else: a whole JSON answer in the envelope of the
endpoint asked, the event that ends a stream whose status is already sent, and the raw HTTP reply the protocol layer
writes before any app has seen the request (tests/test_error_bodies.py holds every other module to it).

    OpenAI's envelope      {"error": {"message", "type", "param", "code"}}   every route but the Messages API's
    Anthropic's envelope   {"type": "error", "error": {"type", "message"}}   /v1/messages and its count and render
                                                                             routes, as vLLM answers them there: its
                                                                             exception names as the type up to 0.32,
                                                                             Anthropic's own types from 0.33
"""

from __future__ import annotations

import json
from enum import StrEnum
from http import HTTPStatus
from typing import Any

from proxy.errors import GuardError, GuardUnavailable, TooBusy

Headers = list[tuple[bytes, bytes]]  # as exchange/headers.py's, which this layer cannot import
DONE = b"data: [DONE]\n\n"
ERROR_EVENT_STARTS = (b'data: {"error"', b"event: error\n")  # how a stream's error event opens: OpenAI's, Anthropic's


class Envelope(StrEnum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"  # vLLM 0.31/0.32 (and an upstream of unknown version): vLLM's exception names as the type
    ANTHROPIC_TYPES = "anthropic-types"  # vLLM 0.33+: Anthropic's own types, by status (ANTHROPIC_TYPE)


ANTHROPIC = (Envelope.ANTHROPIC, Envelope.ANTHROPIC_TYPES)
# vLLM 0.33's _ANTHROPIC_ERROR_TYPE_BY_STATUS (entrypoints/anthropic/protocol.py); any other status is api_error from
# 500 up and invalid_request_error below (translate_error_type)
ANTHROPIC_TYPE = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
}  # fmt: skip


def anthropic_type(status: int) -> str:
    """Anthropic's error type for a status, as vLLM 0.33+ names it on the Messages API."""
    return ANTHROPIC_TYPE.get(status) or ("api_error" if status >= 500 else "invalid_request_error")


def body(error: GuardError, envelope: Envelope = Envelope.OPENAI) -> dict[str, Any]:
    """The error's body as a dict. On the Messages API the types are vLLM's own names (BadRequestError, ...), as its
    router translates them into Anthropic's envelope up to 0.32; from 0.33 Anthropic's, which its SDKs dispatch on."""
    if envelope is Envelope.ANTHROPIC_TYPES:
        return {"type": "error", "error": {"type": anthropic_type(error.status), "message": error.message}}
    if envelope is Envelope.ANTHROPIC:
        return {"type": "error", "error": {"type": error.error_type, "message": error.message}}
    return {"error": {"message": error.message, "type": error.error_type, "param": error.param, "code": error.code}}


def json_bytes(error: GuardError, envelope: Envelope = Envelope.OPENAI) -> bytes:
    return json.dumps(body(error, envelope), ensure_ascii=False, separators=(",", ":")).encode()


def answer(
    error: GuardError, headers: Headers | None = None, envelope: Envelope = Envelope.OPENAI
) -> tuple[Headers, bytes]:
    """A whole answer's headers (`headers`, and the error's own: Retry-After for a 429 or the guard's 503) and body;
    its status is the error's. `envelope`: the route's (api/routes.py)."""
    extra = list(headers or [])
    if isinstance(error, TooBusy | GuardUnavailable):
        extra.append((b"retry-after", str(error.retry_after_s).encode()))
    return extra, json_bytes(error, envelope)


def stream_event(error: GuardError, envelope: Envelope = Envelope.OPENAI) -> bytes:
    """The event that tells a client its stream failed after its 200 went out, as vLLM writes it: on OpenAI's routes
    a `data:` event (json.dumps' own spacing) and then [DONE]; on the Messages API Anthropic's `event: error`, without
    [DONE], which Messages streams never send. The `anthropic` SDK raises an `event: error` as an APIStatusError and
    skips an event without a name, so an OpenAI-shaped error would end its stream as if nothing went wrong."""
    if envelope in ANTHROPIC:
        return b"event: error\ndata: " + json.dumps(body(error, envelope)).encode() + b"\n\n"
    return b"data: " + json.dumps(body(error)).encode() + b"\n\n" + DONE


def relayed_event(upstream_body: dict[str, Any]) -> bytes:
    """The upstream's own error, already in OpenAI's envelope, relayed as the event that ends a chunked stream."""
    return b"data: " + json.dumps(upstream_body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n" + DONE


def raw_reply(error: GuardError) -> bytes:
    """A whole HTTP/1.1 reply that closes the connection, for the protocol layer (server/protocol.py), which answers
    before a route, and so an envelope, is known: OpenAI's."""
    payload = json_bytes(error)
    head = (
        f"HTTP/1.1 {error.status} {_phrase(error.status)}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + payload


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:  # a reason phrase may be empty (RFC 9112, 4)
        return ""
