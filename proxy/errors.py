"""The guard's own errors: what went wrong, with the status, type, param and code a client is told.

    GuardError                      status, message, type, param, code
    ├── InvalidRequest              400  a body or field the guard cannot read
    │   ├── ContextLengthExceeded   400  the prompt leaves no room for output
    │   ├── RequestTooLarge         400  the prompt (times n) leaves no room in the whole KV budget
    │   ├── CountedUpstreamOnly     400  parts only the upstream can count (images, audio), with no upstream to ask
    │   └── TemplateRefused         400  the model's own chat template refused the messages (the upstream may not)
    ├── Unauthorized                401  no valid `Authorization: Bearer <key>` (server.api_keys, [[keys]])
    ├── PermissionDenied            403  an administrative route without a key of server.admin_api_keys
    ├── ModelNotFound               404  a model the guard has no tokenizer for, or the API key may not use
    ├── RouteNotFound               404  a path the route table does not declare, or closes (api/routes.py)
    ├── ResponseNotFound            404  a stored response the key did not create, or its replica cannot answer for
    ├── MethodNotAllowed            405  a guarded path asked with another method than POST
    ├── RequestTimeout              408  the client sent its body too slowly (server.read_timeout_s)
    ├── PayloadTooLarge             413  a body above server.max_body_bytes
    ├── TooBusy                     429  admission's queue is full or the wait timed out; a key over its quota
    ├── HeaderTooLarge              431  a request line and headers above 64 KiB (server/protocol.py)
    ├── NotReady                    503  still learning the upstream's models, or a window not known yet
    ├── GuardUnavailable            503  with Retry-After: the request bodies held at once are at their limit
    │                                    (server.max_held_body_bytes), or the guard is stopping
    ├── FleetStateUnavailable       503  Redis (redis.url) does not answer in time
    ├── UpstreamFailed              (the upstream's)  its own error told in the guard's words: a 5xx body with
    │                                    internals in it, or a chunked request's chunk that failed mid-stream
    ├── UpstreamUnavailable         502  connection reset, broken answer, garbage
    │   ├── UpstreamRefused         502  no connection could be made: safe to retry on another replica
    │   └── UpstreamTooLarge        502  an answer read whole was larger than its limit (upstream/http.py)
    └── UpstreamTimeout             504  the upstream did not answer in time
        └── UpstreamConnectTimeout  504  no connection in time: safe to retry on another replica

Library errors are translated into these at one boundary each: the HTTP client's in proxy/upstream/http.py, the
template engine's in proxy/counting/render.py, Redis's in proxy/fleet/link.py. The server only ever handles
`GuardError`; proxy/error_bodies.py writes every body that tells a client about one.
"""

from __future__ import annotations

from typing import Any


class GuardError(Exception):
    status = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None, code: str | int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.status

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt whole, whatever the subclass's __init__, when raised in a child process (counting/isolated.py).
        return (_rebuilt, (type(self), self.message, dict(self.__dict__)))


class InvalidRequest(GuardError):
    status = 400
    error_type = "BadRequestError"


class ContextLengthExceeded(InvalidRequest):
    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message, param=param, code="context_length_exceeded")


class RequestTooLarge(InvalidRequest):
    """A request whose KV cost, with the least output it accepts, is over a replica's whole admission budget: it
    could never be admitted, not even alone."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message, param=param, code="request_too_large")


class CountedUpstreamOnly(InvalidRequest):
    """The prompt holds parts whose tokens depend on the model's processor: counting.source "auto" asks the upstream
    to count it instead; a client sees this only when the guard may not ask (counting.source "local")."""


class TemplateRefused(InvalidRequest):
    """The model's own chat template refused to render the messages. vLLM renders them the same way unless it is
    served otherwise (mistral_common where the guard was not told), so counting.source auto asks the upstream."""


class Unauthorized(GuardError):
    status = 401
    error_type = "AuthenticationError"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="invalid_api_key")


class PermissionDenied(GuardError):
    status = 403
    error_type = "PermissionDeniedError"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="permission_denied")


class RouteNotFound(GuardError):
    status = 404
    error_type = "NotFoundError"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="route_not_found")


class ResponseNotFound(GuardError):
    """vLLM's own answer for a response id its store does not hold, word for word (responses/serving.py
    _make_not_found_error): what a key gets for a response it did not create, so that it learns nothing of it."""

    status = 404
    error_type = "invalid_request_error"

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Response with id '{response_id}' not found.", param="response_id")


class MethodNotAllowed(GuardError):
    status = 405
    error_type = "MethodNotAllowedError"


class RequestTimeout(GuardError):
    status = 408
    error_type = "RequestTimeoutError"


class PayloadTooLarge(GuardError):
    status = 413
    error_type = "PayloadTooLargeError"

    @classmethod
    def over(cls, limit: int) -> PayloadTooLarge:
        return cls(f"The request body is larger than the limit of {limit} bytes (server.max_body_bytes).")


class HeaderTooLarge(GuardError):
    status = 431
    error_type = "RequestHeaderFieldsTooLargeError"


class ModelNotFound(GuardError):
    status = 404
    error_type = "NotFoundError"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="model", code="model_not_found")


class TooBusy(GuardError):
    status = 429
    error_type = "RateLimitError"

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message, code="rate_limit_exceeded")
        self.retry_after_s = retry_after_s


class NotReady(GuardError):
    status = 503
    error_type = "ServiceUnavailableError"


class GuardUnavailable(GuardError):
    """The guard cannot take the request now, and says when to try again (Retry-After): the request bodies it holds
    at once are at server.max_held_body_bytes, or it is stopping (another replica will take it)."""

    status = 503
    error_type = "ServiceUnavailableError"

    def __init__(self, message: str, retry_after_s: int, code: str) -> None:
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s

    @classmethod
    def stopping(cls) -> GuardUnavailable:
        return cls("token-guard is stopping; send the request again.", 1, "shutting_down")


class FleetStateUnavailable(GuardError):
    """Redis, where guards share their budgets, did not answer: with redis.failure "closed" the client
    sees it; with "open" the guard admits on its own share instead."""

    status = 503
    error_type = "ServiceUnavailableError"


class UpstreamFailed(GuardError):
    """The upstream's own error, told in the guard's words: a 5xx whose body held internals (a traceback, file paths)
    or was too large to read whole, or a chunked request's chunk that failed after the answer began. Its status is
    the upstream's, and its type the name the guard's own errors give that status."""

    TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError", 404: "NotFoundError",
             405: "MethodNotAllowedError", 408: "RequestTimeoutError", 413: "PayloadTooLargeError",
             429: "RateLimitError", 501: "NotImplementedError", 502: "BadGatewayError",
             503: "ServiceUnavailableError", 504: "GatewayTimeoutError"}  # fmt: skip

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message, code=status)
        self.status = status
        self.error_type = self.TYPES.get(status, "BadRequestError" if status < 500 else "InternalServerError")


class UpstreamUnavailable(GuardError):
    status = 502
    error_type = "BadGatewayError"


class UpstreamRefused(UpstreamUnavailable):
    pass


class UpstreamTooLarge(UpstreamUnavailable):
    pass


class UpstreamTimeout(GuardError):
    status = 504
    error_type = "GatewayTimeoutError"


class UpstreamConnectTimeout(UpstreamTimeout):
    pass


def internal_error() -> GuardError:
    """What a client is told of a failure the guard did not expect (its traceback goes to the log only)."""
    return GuardError("token-guard hit an internal error; the details are in its log.")


def first_error(error: BaseException) -> BaseException:
    """The first leaf of an exception group (a TaskGroup's failure), or the error itself: the one a client is told
    about when several concurrent chunks of its request failed."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _rebuilt(kind: type[GuardError], message: str, state: dict[str, Any]) -> GuardError:
    error = kind.__new__(kind)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error
