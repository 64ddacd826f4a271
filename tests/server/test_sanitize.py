"""The upstream's internal errors never reach a client with a traceback or a file path in them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from proxy.upstream.sanitize import sanitize_upstream_error
from tests.support.servers import MODEL, guard, in_memory

TRACEBACK = """Traceback (most recent call last):
  File "/usr/lib/python3.12/site-packages/vllm/entrypoints/openai/api_server.py", line 512, in create_chat_completion
    generator = await handler.create_chat_completion(request, raw_request)
RuntimeError: CUDA error: an illegal memory access was encountered
"""


def envelope(message: str, status: int = 500, kind: str = "InternalServerError") -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}}).encode()


LEAKS = [
    (500, "text/plain", TRACEBACK.encode(), "InternalServerError"),
    (500, "application/json", envelope(TRACEBACK), "InternalServerError"),
    (500, "application/json", envelope("cannot open /home/ops/models/llama/config.json"), "InternalServerError"),
    (500, "application/json", envelope('File "engine.py", line 3, in step'), "InternalServerError"),
    (502, "text/html", b"<pre>C:\\Users\\ops\\vllm\\server.py failed</pre>", "BadGatewayError"),
    (503, "application/json", envelope("see C:\\\\srv\\\\vllm\\\\engine.py", 503), "ServiceUnavailableError"),
    (501, "application/json", envelope("/opt/vllm/x.py: not implemented", 501), "NotImplementedError"),
]


@pytest.mark.parametrize(("status", "content_type", "body", "kind"), LEAKS)
def test_a_5xx_with_internals_becomes_a_generic_error(status: int, content_type: str, body: bytes, kind: str) -> None:
    clean = sanitize_upstream_error(status, content_type, body)
    assert clean is not None
    error = json.loads(clean)["error"]
    assert (error["type"], error["code"], error["param"]) == (kind, status, None)
    assert f"HTTP {status}" in error["message"]
    assert "Traceback" not in error["message"] and "/" not in error["message"] and "\\" not in error["message"]


CLEAN = [
    (500, "application/json", envelope("Internal server error")),  # vLLM's GenerationError
    (503, "application/json", envelope("The server is busy, retry later", 503, "ServiceUnavailableError")),
    (503, "application/json", envelope("upstream http://10.0.0.7:8000/v1/models is unavailable", 503)),  # a URL
    (500, "text/plain", b"Internal Server Error"),
    (500, "application/json", b""),
    (400, "text/plain", TRACEBACK.encode()),  # not an internal error: the client's to see as it is
    (200, "application/json", b'{"path": "/usr/lib/x.py"}'),
    (500, "text/event-stream", TRACEBACK.encode()),  # streams are not read whole
]


@pytest.mark.parametrize(("status", "content_type", "body"), CLEAN)
def test_other_answers_pass_unchanged(status: int, content_type: str, body: bytes) -> None:
    assert sanitize_upstream_error(status, content_type, body) is None


def test_a_5xx_cut_at_its_limit_becomes_a_generic_error_whatever_it_held() -> None:
    clean = sanitize_upstream_error(500, "application/json", b'{"error": {"message": "Internal', cut=True)
    assert clean is not None and json.loads(clean)["error"]["code"] == 500


def broken_upstream() -> Starlette:
    """Serves one model, and answers /version and every generation with a traceback."""

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": 2048}]})

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def version(request: Request) -> Response:
        return PlainTextResponse(TRACEBACK, status_code=500)

    routes = [Route("/v1/models", models), Route("/health", health), Route("/version", version),
              Route("/v1/chat/completions", version, methods=["POST"])]  # fmt: skip
    return Starlette(routes=routes)


@pytest.fixture(scope="module")
def proxy(deepseek_dir: Path) -> Iterator[str]:
    with in_memory(broken_upstream()) as upstream, guard(upstream, deepseek_dir) as server:
        yield server.url


def test_a_traceback_from_the_upstream_never_reaches_the_client(proxy: str) -> None:
    response = httpx.get(f"{proxy}/version")
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("application/json")
    assert b"Traceback" not in response.content and b"/usr/lib" not in response.content
    assert response.json()["error"]["type"] == "InternalServerError"


def test_a_chunked_requests_failed_part_never_shows_its_traceback(proxy: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 3000}], "max_tokens": 5}
    response = httpx.post(f"{proxy}/v1/chat/completions", json=body, headers={"x-token-guard-overflow": "chunk"})
    assert response.status_code == 500 and response.json()["error"]["type"] == "InternalServerError"
    assert b"Traceback" not in response.content and b"/usr/lib" not in response.content
