"""A fake vLLM that counts (its own count: 10 per message, 256 per image), with or without vLLM's render endpoints,
and a chat template stricter than the one it renders with: what the counting-source tests and the Envoy rig need."""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.support.servers import MODEL

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
IMAGE_TOKENS = 256  # what the fake upstream's processor makes of an image


def fake_count(body: dict[str, Any]) -> int:
    """The fake upstream's own count: 10 per message, and IMAGE_TOKENS per image part."""
    images: int = sum(isinstance(p, dict) and p.get("type") == "image_url" for m in body["messages"]
                 for p in (m["content"] if isinstance(m["content"], list) else []))  # fmt: skip
    return 10 * len(body["messages"]) + IMAGE_TOKENS * images


def fake_vllm(renders: bool) -> Starlette:
    """An upstream that counts images, with or without vLLM's render endpoints (--enable-scale-out)."""
    seen: list[str] = []

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"data": [{"id": MODEL, "max_model_len": 2048, "root": None}]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({})

    async def render(request: Request) -> JSONResponse:
        seen.append("render")
        if not renders:  # as vLLM 0.32 answers without --enable-scale-out (0.31: 404)
            return JSONResponse({"detail": "Forbidden"}, status_code=403)
        return JSONResponse({"token_ids": [7] * fake_count(await request.json())})

    async def tokenize(request: Request) -> JSONResponse:
        seen.append("tokenize")
        body = await request.json()
        if body.get("messages") == [{"role": "user", "content": "refuse me"}]:
            return JSONResponse({"error": {"message": "System role not supported", "code": 400}}, status_code=400)
        return JSONResponse({"count": fake_count(body), "max_model_len": 2048, "tokens": []})

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse({"object": "chat.completion", "echo_max_tokens": body.get("max_tokens")})

    app = Starlette(routes=[
        Route("/v1/models", models), Route("/health", health), Route("/tokenize", tokenize, methods=["POST"]),
        Route("/v1/chat/completions/render", render, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
    ])  # fmt: skip
    app.state.seen = seen
    return app


STRICT = (  # a template stricter than the one vLLM renders with (mistral_common, where the guard was not told)
    "{% for m in messages %}{% if m['content'] == 'refuse me' %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
)
