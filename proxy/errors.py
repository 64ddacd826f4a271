"""The guard's own errors, and the one place they become OpenAI-shaped HTTP responses.

    GuardError                      status, message, type, param, code
    ├── InvalidRequest              400  a body or field the guard cannot read
    │   └── ContextLengthExceeded   400  the prompt leaves no room for output
    ├── Unauthorized                401  no valid `Authorization: Bearer <key>` (server.api_keys)
    ├── ModelNotFound               404  a model the guard has no tokenizer for
    ├── PayloadTooLarge             413  a body above server.max_body_bytes
    ├── UpstreamUnavailable         502  connection refused / reset / garbage
    └── UpstreamTimeout             504  the upstream did not answer in time

Library errors (httpx, tokenizers, transformers) are translated into these where they are raised, so the app
only ever handles `GuardError`.
"""

from __future__ import annotations

import json
from typing import Any


class GuardError(Exception):
    status = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None, code: str | int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}

    def json_bytes(self) -> bytes:
        return json.dumps(self.body(), ensure_ascii=False, separators=(",", ":")).encode()

    def sse_bytes(self) -> bytes:
        """The error as vLLM writes it inside a stream that has already started, followed by [DONE]."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\ndata: [DONE]\n\n"


class InvalidRequest(GuardError):
    status = 400
    error_type = "BadRequestError"


class ContextLengthExceeded(InvalidRequest):
    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message, param=param, code="context_length_exceeded")


class Unauthorized(GuardError):
    status = 401
    error_type = "AuthenticationError"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="invalid_api_key")


class PayloadTooLarge(GuardError):
    status = 413
    error_type = "PayloadTooLargeError"


class ModelNotFound(GuardError):
    status = 404
    error_type = "NotFoundError"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="model", code="model_not_found")


class UpstreamUnavailable(GuardError):
    status = 502
    error_type = "BadGatewayError"


class UpstreamTimeout(GuardError):
    status = 504
    error_type = "GatewayTimeoutError"
