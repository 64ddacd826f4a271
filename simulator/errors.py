"""vLLM's error bodies (docs/vllm-wire-contract.md, section 1): one exception type carries status, type, message and
param, and turns itself into the nested envelope `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
from typing import Any


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
