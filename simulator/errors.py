"""vLLM's error bodies (docs/vllm-wire-contract.md, section 1): one exception type carries status, type, message and
param, and turns itself into the nested envelope `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
from typing import Any

# vLLM 0.33's _ANTHROPIC_ERROR_TYPE_BY_STATUS (entrypoints/anthropic/protocol.py)
ANTHROPIC_TYPE_BY_STATUS = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
}  # fmt: skip


def anthropic_type(status: int) -> str:
    """vLLM 0.33's translate_error_type: the table's, else api_error from 500 up and invalid_request_error below."""
    found = ANTHROPIC_TYPE_BY_STATUS.get(status)
    if found is not None:
        return found
    return "api_error" if status >= 500 else "invalid_request_error"


class ApiError(Exception):
    """An error vLLM would answer with; `body()` is the exact JSON it sends."""

    def __init__(
        self, message: str, *, status: int = 400, type: str = "BadRequestError", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}

    def anthropic_body(self, own_types: bool) -> dict[str, Any]:
        """The body on the Messages API: Anthropic's envelope, the type vLLM's exception name up to 0.32 and
        Anthropic's own from 0.33 (`own_types`: translate_error_type of entrypoints/anthropic/protocol.py)."""
        kind = anthropic_type(self.status) if own_types else self.type
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def anthropic_event(self, own_types: bool) -> str:
        """The Messages stream's error event (pydantic's compact JSON, wrap_data_with_event), without [DONE]."""
        return f"event: error\ndata: {json.dumps(self.anthropic_body(own_types), separators=(',', ':'))}\n\n"

    def sse_event(self) -> str:
        # vLLM writes mid-stream errors with json.dumps defaults: spaces after separators, ASCII escapes.
        return f"data: {json.dumps(self.body())}\n\n"


def validation_error(message: str, *, parameter: str | None = None, value: object = None) -> ApiError:
    """vLLM's VLLMValidationError: `str()` appends ` (parameter=P, value=V)` and `param` is P (section 1.3)."""
    extras = []
    if parameter is not None:
        extras.append(f"parameter={parameter}")
    if value is not None:
        extras.append(f"value={value}")
    text = f"{message} ({', '.join(extras)})" if extras else message
    return ApiError(text, param=parameter)


def request_validation_error(errors: list[str], param: str | None = None) -> ApiError:
    """The request-body validation failure: 400 with type "Bad Request" and vLLM 0.26+'s message layout."""
    label = "error" if len(errors) == 1 else "errors"
    lines = "".join(f"  {error}\n" for error in errors[:10])
    return ApiError(f"{len(errors)} validation {label}:\n{lines}".rstrip(), type="Bad Request", param=param)


def not_found_model(model: str, aliases: list[str] | None) -> ApiError:
    message = f"The model `{model}` does not exist."
    if aliases is not None:
        message += f" Valid aliases: {', '.join(aliases)}."
    return ApiError(message, status=404, type="NotFoundError", param="model")
