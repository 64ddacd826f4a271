"""Counting through the upstream (counting.source): the render endpoints when offered, else POST /tokenize; the
guard's choice per model and per request, and the header, metric and clamp that follow from it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.counting.local_count import count_chat
from proxy.counting.registry import GuardedModel
from proxy.counting.source import Uncounted, chat_tokens, completion_tokens
from proxy.counting.tokenizer import load_tokenizer
from proxy.errors import CountedUpstreamOnly, InvalidRequest, UpstreamTooLarge, UpstreamUnavailable
from proxy.server.running import ServerThread
from proxy.settings import UpstreamSettings
from proxy.upstream.client import Upstream
from proxy.upstream.http import HttpClient
from proxy.upstream.remote_count import RemoteCounter, Reply, chat_tokenize_body, completion_tokenize_body
from tests.support.counting_upstream import IMAGE, IMAGE_TOKENS, STRICT, fake_vllm
from tests.support.polling import eventually
from tests.support.servers import MODEL, guard, simulator


@pytest.fixture(params=[True, False], ids=["render-endpoints", "tokenize-only"])
def upstream(request: pytest.FixtureRequest) -> Iterator[tuple[str, list[str], bool]]:
    app = fake_vllm(request.param)
    with ServerThread(app) as server:
        yield server.url, app.state.seen, request.param


def counted(url: str, body: dict[str, Any]) -> tuple[int, bool | None]:
    async def go() -> tuple[int, bool | None]:
        settings = UpstreamSettings(urls=(url,))
        client = Upstream(settings, HttpClient(settings))
        try:
            counter = RemoteCounter(client)
            return await counter.chat(MODEL, body), counter.renders
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_the_upstream_counts_through_its_render_endpoint_else_tokenize(upstream: tuple[str, list[str], bool]) -> None:
    url, seen, renders = upstream
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, IMAGE]}]}
    assert counted(url, body) == (10 + IMAGE_TOKENS, renders)
    assert seen == (["render"] if renders else ["render", "tokenize"])


def test_a_refusal_of_the_upstream_is_the_clients_400() -> None:
    with ServerThread(fake_vllm(renders=False)) as server, pytest.raises(InvalidRequest, match="System role not"):
        counted(server.url, {"messages": [{"role": "user", "content": "refuse me"}]})


def test_a_counting_answer_is_read_no_further_than_its_limit() -> None:
    """A render answer of 100 MB (35 million token ids) for a prompt of two tokens: the guard stops reading after its
    limit (1 MiB + 16 bytes per byte sent) and fails the count, instead of holding it all in memory."""

    async def huge() -> AsyncIterator[bytes]:
        yield b'{"token_ids": ['
        for _ in range(1600):
            yield b"7, " * 21845
        yield b"7]}"

    async def render(request: Request) -> StreamingResponse:
        return StreamingResponse(huge(), media_type="application/json")

    app = Starlette(routes=[Route("/v1/chat/completions/render", render, methods=["POST"])])
    with ServerThread(app) as server, pytest.raises(UpstreamTooLarge, match="larger than"):
        counted(server.url, {"messages": [{"role": "user", "content": "hi"}]})


def test_tokenize_body_renders_what_chat_would() -> None:
    body = {"messages": [{"role": "assistant", "content": "x", "reasoning_content": "why"}], "documents": [{"t": 1}],
            "reasoning_effort": "none", "max_tokens": 9, "stream": True}  # fmt: skip
    assert chat_tokenize_body("m", body) == {
        "model": "m",
        "messages": [{"role": "assistant", "content": "x", "reasoning": "why"}],  # chat's rename, which /tokenize lacks
        "chat_template_kwargs": {"documents": [{"t": 1}], "reasoning_effort": "none", "enable_thinking": False},
    }


def test_tokenize_body_takes_the_effort_the_chat_path_maps_to() -> None:
    body = {"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "minimal"}
    kwargs = chat_tokenize_body("m", body, {"minimal": "low"})["chat_template_kwargs"]
    assert kwargs == {"reasoning_effort": "low", "enable_thinking": True}
    assert chat_tokenize_body("m", body, {"high": "low"})["chat_template_kwargs"]["reasoning_effort"] == "minimal"


def test_completion_tokenize_body_keeps_add_special_tokens_only_when_sent() -> None:
    body = {"prompt": ["a", "b"], "max_tokens": 3, "add_special_tokens": False}
    assert completion_tokenize_body("m", "a", body) == {"model": "m", "prompt": "a", "add_special_tokens": False}
    assert completion_tokenize_body("m", "a", {"prompt": "a"}) == {"model": "m", "prompt": "a"}


def test_a_reply_says_its_count_or_its_error_in_every_envelope_vllm_uses() -> None:
    assert Reply.of(200, b'{"count": 7, "tokens": []}').tokenized() == 7
    assert Reply.of(200, b'{"token_ids": [1, 2, 3]}').rendered() == 3
    assert Reply.of(200, b'{"count": true}').tokenized() is None and Reply.of(200, b"{}").rendered() is None
    assert Reply.of(400, b'{"count": 7}').tokenized() is None  # only a 200 counts
    assert Reply.of(400, b'{"error": {"message": "Not supported"}}').message() == "Not supported"
    assert Reply.of(400, b'{"object": "error", "message": "old envelope"}').message() == "old envelope"
    assert Reply.of(422, b'{"detail": "bad field"}').message() == "bad field"
    assert Reply.of(502, b"Bad Gateway" + b"!" * 500).message() == "Bad Gateway" + "!" * 189
    assert Reply.of(404, b'{"detail":"Not Found"}\n').no_route
    assert not Reply.of(404, b'{"error": {"message": "The model `x` does not exist."}}').no_route


def test_a_simulator_without_render_endpoints_counts_like_its_generation(deepseek_dir: Path) -> None:
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "東京はどこ？"}]}
    with simulator(deepseek_dir) as (server, _, _):
        count, renders = counted(server.url, body)
        charged = httpx.post(f"{server.url}/v1/chat/completions", json={**body, "max_tokens": 1}).json()
    assert renders is False
    assert count == charged["usage"]["prompt_tokens"]


# --- who counts: per model and per request ---


class Remote:
    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []

    async def chat(self, model: str, body: dict[str, Any], effort_map: Mapping[str, str] | None = None) -> int:
        self.asked.append(body)
        return 999

    async def completion(self, model: str, body: dict[str, Any]) -> list[int]:
        return [999]


def model_with(deepseek_dir: Path, source: str) -> GuardedModel:
    from proxy.counting.text_count import TokenCounter
    from proxy.settings import CountingSettings

    tok = load_tokenizer(str(deepseek_dir))
    return GuardedModel(MODEL, tok, 2048, "config", TokenCounter(tok.backend, CountingSettings()), source, "test")


@pytest.mark.parametrize(
    ("source", "content", "expected"),
    [
        ("auto", "hello", "local"),
        ("auto", [IMAGE], "upstream"),  # per request: only the upstream can count an image
        ("upstream", "hello", "upstream"),  # per model: the start-up check (or the operator) said so
        ("local", "hello", "local"),
    ],
)
def test_who_counts(deepseek_dir: Path, source: str, content: Any, expected: str) -> None:
    model, remote = model_with(deepseek_dir, source), Remote()
    req = parse_chat(json.dumps({"messages": [{"role": "user", "content": content}]}).encode())
    tokens, who = asyncio.run(chat_tokens(model, req, remote))
    assert who == expected
    if expected == "local":
        assert tokens == asyncio.run(count_chat(model.tokenizer, req)) and not remote.asked
    else:
        assert tokens == 999 and remote.asked == [req.body]


class Refusing(Remote):
    """An upstream whose counting endpoint refuses what its generation serves (vLLM 0.31/0.32's /tokenize in mistral
    mode on an assistant turn with tool calls: "tool_calls must be a list, got ValidatorIterator")."""

    async def chat(self, model: str, body: dict[str, Any], effort_map: Mapping[str, str] | None = None) -> int:
        self.asked.append(body)
        raise InvalidRequest("1 validation error: tool_calls must be a list, got ValidatorIterator")

    async def completion(self, model: str, body: dict[str, Any]) -> list[int]:
        raise UpstreamUnavailable("The upstream could not count the prompt (/tokenize: HTTP 500).")


def test_a_count_the_upstream_refuses_is_counted_locally_never_the_clients_error(deepseek_dir: Path) -> None:
    model, remote = model_with(deepseek_dir, "upstream"), Refusing()
    req = parse_chat(json.dumps({"messages": [{"role": "user", "content": "hello"}]}).encode())
    tokens, who = asyncio.run(chat_tokens(model, req, remote))
    assert (tokens, who) == (asyncio.run(count_chat(model.tokenizer, req)), "local") and remote.asked
    completion = parse_completion(b'{"prompt": "hello"}')
    assert asyncio.run(completion_tokens(model, completion, remote)) == ([1], "local")
    assert model.counter.stats().fallbacks == 2  # token_guard_upstream_count_fallbacks


def test_a_prompt_neither_side_can_count_gets_the_upstreams_reason(deepseek_dir: Path) -> None:
    req = parse_chat(json.dumps({"messages": [{"role": "user", "content": [IMAGE]}]}).encode())
    with pytest.raises(InvalidRequest, match="ValidatorIterator"):
        asyncio.run(chat_tokens(model_with(deepseek_dir, "upstream"), req, Refusing()))


def strict_model(tmp_path: Path, deepseek_dir: Path, source: str) -> GuardedModel:
    from proxy.counting.text_count import TokenCounter
    from proxy.settings import CountingSettings

    template = tmp_path / "strict.jinja"
    template.write_text(STRICT)
    tok = load_tokenizer(str(deepseek_dir), chat_template=template)
    return GuardedModel(MODEL, tok, 2048, "config", TokenCounter(tok.backend, CountingSettings()), source, "test")


def test_a_prompt_the_models_template_refuses_is_counted_by_the_upstream_else_forwarded_uncounted(
    tmp_path: Path, deepseek_dir: Path
) -> None:
    req = parse_chat(json.dumps({"messages": [{"role": "user", "content": "refuse me"}]}).encode())
    assert asyncio.run(chat_tokens(strict_model(tmp_path, deepseek_dir, "auto"), req, Remote())) == (999, "upstream")
    with pytest.raises(Uncounted, match="Only user and assistant roles"):
        asyncio.run(chat_tokens(strict_model(tmp_path, deepseek_dir, "auto"), req, Refusing()))
    with pytest.raises(Uncounted):  # counting.source upstream: the upstream failed, then the guard
        asyncio.run(chat_tokens(strict_model(tmp_path, deepseek_dir, "upstream"), req, Refusing()))
    with pytest.raises(InvalidRequest, match="could not render"):  # local: never asks
        asyncio.run(chat_tokens(strict_model(tmp_path, deepseek_dir, "local"), req, Remote()))


def test_an_uncounted_prompt_is_forwarded_for_vllms_own_answer(tmp_path: Path, deepseek_dir: Path) -> None:
    template = tmp_path / "strict.jinja"
    template.write_text(STRICT)
    body = {"model": MODEL, "max_tokens": 5000, "messages": [{"role": "user", "content": "refuse me"}]}
    with (
        ServerThread(fake_vllm(renders=False)) as upstream,
        guard(upstream.url, deepseek_dir, **{"model.chat_template": str(template)}) as proxy,
    ):
        response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200 and response.json()["echo_max_tokens"] == 5000  # forwarded as sent
    assert response.headers["x-token-guard-action"] == "uncounted"
    assert response.headers["x-token-guard-count-source"] == "none"
    assert "x-token-guard-prompt-tokens" not in response.headers


def test_a_local_source_refuses_what_it_cannot_count(deepseek_dir: Path) -> None:
    req = parse_chat(json.dumps({"messages": [{"role": "user", "content": [IMAGE]}]}).encode())
    with pytest.raises(CountedUpstreamOnly, match="image_url part"):
        asyncio.run(chat_tokens(model_with(deepseek_dir, "local"), req, Remote()))


def test_an_image_request_is_counted_upstream_and_clamped_exactly(
    deepseek_dir: Path, upstream: tuple[str, list[str], bool]
) -> None:
    url, _, _ = upstream
    body = {"model": MODEL, "max_tokens": 5000, "messages": [{"role": "user", "content": [IMAGE, IMAGE]}]}
    counted = f'token_guard_count_source_total{{endpoint="/v1/chat/completions",model="{MODEL}",source="upstream"}} 1.0'
    with guard(url, deepseek_dir) as proxy:
        response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=60)
        text = httpx.post(
            f"{proxy.url}/v1/chat/completions",
            json={**body, "messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        # a request's metrics are recorded as its answer ends, which may come just after the client has it all
        assert eventually(lambda: counted in httpx.get(f"{proxy.url}/metrics", timeout=60).text)
    prompt = 10 + 2 * IMAGE_TOKENS
    assert response.headers["x-token-guard-count-source"] == "upstream"
    assert response.headers["x-token-guard-prompt-tokens"] == str(prompt)
    assert response.json()["echo_max_tokens"] == 2048 - prompt
    assert text.headers["x-token-guard-count-source"] == "local"
