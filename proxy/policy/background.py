"""Background responses (`background: true` on /v1/responses): vLLM answers `queued` at once and runs the request
after that answer has ended, so the guard cannot see its end in the answer. The guard names the response itself
(vLLM stores a response under the body's `request_id`, a random one when the body has none), so that either front end
knows which stored response to follow until it ends, even when the client left or Envoy sends no answer body; or, where
a deployment prefers (`admission.background = "refuse"`), refuses it while admission keeps a budget."""

from __future__ import annotations

import re
import uuid
from dataclasses import replace
from typing import Any

from proxy.api.responses import ResponsesRequest
from proxy.api.routes import ID
from proxy.errors import InvalidRequest
from proxy.settings import AdmissionSettings

REFUSED = (
    "This gateway does not take background responses while it admits requests by their KV cost "
    '(admission.background = "refuse"): send the request without `background: true`.'
)

UNNAMEABLE = (
    "A background response's request_id must be 1 to 256 letters, digits, '.', '_', ':' or '-', starting with a letter "
    "or digit: the id it is retrieved by (GET /v1/responses/{id})."
)
FOLLOWABLE = re.compile(ID)


def admitting(admission: AdmissionSettings) -> bool:
    """Whether admission keeps a budget (tokens, "auto", or requests) that background work could run past."""
    return bool(admission.max_inflight_tokens) or admission.max_inflight_requests > 0


def named(req: ResponsesRequest, admission: AdmissionSettings) -> tuple[ResponsesRequest, str | None]:
    """The request as forwarded, and the id vLLM stores it under when it runs in the background (None: it does not).
    The client's own `request_id` is kept; else the guard sets one, as vLLM would (`resp_` and a random hex)."""
    if not req.background:
        return req, None
    if admission.background == "refuse" and admitting(admission):
        raise InvalidRequest(REFUSED, param="background")
    if req.request_id is not None:
        if FOLLOWABLE.fullmatch(req.request_id) is None:  # the guard asks vLLM for it by this id, in a path
            raise InvalidRequest(UNNAMEABLE, param="request_id")
        return req, req.request_id
    response_id = f"resp_{uuid.uuid4().hex}"
    body: dict[str, Any] = {**req.body, "request_id": response_id}
    return replace(req, body=body, request_id=response_id), response_id
