"""One record per request: filled in along the request path, then logged as one line and fed to the metrics."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict, dataclass, field

log = logging.getLogger("token_guard.requests")

REQUEST_ID = "x-request-id"


@dataclass
class RequestRecord:
    request_id: str
    method: str
    endpoint: str
    guarded: bool
    started: float = field(default_factory=time.perf_counter)
    model: str | None = None
    prompt_tokens: int | None = None
    action: str | None = None
    max_tokens_before: int | None = None
    max_tokens_after: int | None = None
    chunks: int | None = None
    truncated_tokens: int | None = None
    count_s: float | None = None
    queue_s: float | None = None
    status: int | None = None
    upstream_first_byte_s: float | None = None
    upstream_s: float | None = None
    upstream_error: str | None = None
    client_gone: bool = False
    total_s: float | None = None

    def finish(self, status: int) -> None:
        self.status = status if self.status is None else self.status
        self.total_s = time.perf_counter() - self.started


def request_id(given: str | None) -> str:
    """The client's X-Request-Id when it sent a usable one (vLLM puts it in the response id), else a new one."""
    if given and len(given) <= 256 and given.isprintable():
        return given
    return uuid.uuid4().hex


def log_fields(record: RequestRecord) -> dict[str, object]:
    return {k: _round(v) for k, v in asdict(record).items() if k != "started" and v not in (None, False)}


def log_line(fields: dict[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in fields.items())


def _round(value: object) -> object:
    return round(value, 4) if isinstance(value, float) else value
