"""What a client is told when a chunk of its chunked stream fails after the answer began: the upstream's own error
envelope as it said it, else the guard's UpstreamFailed with the upstream's status; never the upstream's internals."""

from __future__ import annotations

import json

import pytest

from proxy.errors import UpstreamFailed
from proxy.upstream.chunks import ChunkFailed

SAID = {"error": {"message": "The engine is dead", "type": "InternalServerError", "param": None, "code": 500}}
TRACEBACK = 'Traceback (most recent call last):\n  File "/usr/lib/vllm/engine.py", line 3, in step\nRuntimeError: x'


def test_the_upstreams_own_envelope_is_relayed_as_it_said_it() -> None:
    failed = ChunkFailed(500, json.dumps(SAID).encode(), "application/json")
    assert failed.relayed() == SAID


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [(500, b"Internal Server Error", "InternalServerError"), (404, b'{"detail": "Not Found"}', "NotFoundError"),
     (503, b"", "ServiceUnavailableError")],
)  # fmt: skip
def test_a_body_that_is_no_envelope_becomes_the_guards_error_with_the_upstreams_status(
    status: int, body: bytes, kind: str
) -> None:
    failed = ChunkFailed(status, body, "text/plain")
    error = failed.error()
    assert failed.relayed() is None and isinstance(error, UpstreamFailed)
    assert (error.status, error.code, error.error_type, error.message) == (status, status, kind, body.decode())


@pytest.mark.parametrize("body", [TRACEBACK.encode(), json.dumps({"error": {"message": TRACEBACK}}).encode()])
def test_a_body_with_the_upstreams_internals_is_withheld(body: bytes) -> None:
    failed = ChunkFailed(500, body, "application/json")
    error = failed.error()
    assert failed.relayed() is None and error.error_type == "InternalServerError"
    assert "Traceback" not in error.message and "/usr/lib" not in error.message and "HTTP 500" in error.message


def test_a_body_cut_at_its_limit_is_withheld_whatever_it_held() -> None:
    failed = ChunkFailed(502, json.dumps(SAID).encode(), "application/json", cut=True)
    assert failed.relayed() is None and failed.error().error_type == "BadGatewayError"
