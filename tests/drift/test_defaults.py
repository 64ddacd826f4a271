"""Learning a server's --default-chat-template-kwargs from its POST /tokenize: a Qwen3 served with thinking off by
default (the zoo's real tokenizer and template, behind an upstream that renders with that default)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from proxy.api.chat import parse_chat
from proxy.counting.local_count import count_chat
from proxy.counting.registry import ModelRegistry
from proxy.counting.tokenizer import load_tokenizer
from proxy.drift.defaults import learn
from proxy.server.running import ServerThread
from proxy.settings import UpstreamSettings, load_settings
from proxy.upstream.client import Upstream
from proxy.upstream.http import HttpClient
from tests.support import zoo
from tests.support.servers import MODEL


def upstream_with_defaults(defaults: dict[str, Any]) -> Starlette:
    """/tokenize as vLLM answers it when started with --default-chat-template-kwargs `defaults`."""
    tok = load_tokenizer(str(zoo.family_dir("qwen3")), None, "auto", defaults)

    async def tokenize(request: Request) -> JSONResponse:
        body = await request.json()
        count = await count_chat(tok, parse_chat(json.dumps(body).encode()))
        return JSONResponse({"count": count, "max_model_len": 2048, "tokens": []})

    return Starlette(routes=[Route("/tokenize", tokenize, methods=["POST"])])


def learned(url: str, family: str) -> dict[str, Any]:
    settings = load_settings({"model.name": MODEL, "model.tokenizer": str(zoo.family_dir(family))}, environ={})
    registry = ModelRegistry.from_settings(settings.models, settings.counting)

    async def go() -> None:
        settings = UpstreamSettings(urls=(url,))
        upstream = Upstream(settings, HttpClient(settings))
        try:
            await learn(registry, upstream)
        finally:
            await upstream.aclose()

    asyncio.run(go())
    return dict(registry.resolve(MODEL).tokenizer.default_kwargs)


@pytest.fixture(scope="module", params=[{"enable_thinking": False}, {}], ids=["thinking-off", "no-defaults"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, Any]]]:
    with ServerThread(upstream_with_defaults(request.param)) as server:
        yield server.url, request.param


def test_a_servers_default_switch_is_learned_from_tokenize(served: tuple[str, dict[str, Any]]) -> None:
    url, defaults = served
    assert learned(url, "qwen3") == defaults


def test_templates_without_a_known_switch_are_left_alone(served: tuple[str, dict[str, Any]]) -> None:
    url, _ = served
    assert learned(url, "llama3.1") == {}  # Llama 3.1's template reads neither switch: nothing to learn
