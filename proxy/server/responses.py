"""The one place where the guard's errors become HTTP responses: the OpenAI error envelope with the error's status
(and Retry-After for a 429)."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.responses import Response

from proxy.errors import GuardError, TooBusy

JSON = "application/json"


def error_response(error: GuardError, headers: Mapping[str, str] | None = None) -> Response:
    headers = dict(headers or {})
    if isinstance(error, TooBusy):
        headers["retry-after"] = str(error.retry_after_s)
    return Response(error.json_bytes(), status_code=error.status, headers=headers, media_type=JSON)
