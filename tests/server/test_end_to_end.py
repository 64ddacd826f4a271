"""End to end over real loopback sockets: the OpenAI SDK -> token-guard -> the vLLM simulator (0.31 profile), the
simulator on a socket of its own too (here the network between the guard and vLLM is part of what is tested)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.server.running import ServerThread
from tests.corpus import CHAT_CASES
from tests.support.polling import eventually
from tests.support.servers import MODEL, Tap, guard, simulator

WINDOW = 2048
WORDS = ["alpha", "beta", "gamma", "東京", "🎉", "def f(x):", "\n", "  indented", "end."]


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[tuple[ServerThread, Any, Tap]]:
    with simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: tuple[ServerThread, Any, Tap], deepseek_dir: Path) -> Iterator[str]:
    with guard(sim[0].url, deepseek_dir) as server:  # max_model_len is discovered from the upstream
        yield server.url


@pytest.fixture
def client(proxy: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=30)


def essay(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] + str(i % 7) for i in range(words))


def test_overflowing_max_tokens_is_clamped_and_the_window_is_used_exactly(client: openai.OpenAI, sim: Any) -> None:
    messages: Any = [{"role": "user", "content": essay(100)}]
    direct = openai.OpenAI(base_url=f"{sim[0].url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        direct.chat.completions.create(model=MODEL, messages=messages, max_tokens=2000)
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=2000)
    reply = raw.parse()
    assert reply.usage is not None
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens == WINDOW
    assert raw.headers["x-token-guard-action"] == "clamp"
    assert int(raw.headers["x-token-guard-prompt-tokens"]) == reply.usage.prompt_tokens
    assert int(raw.headers["x-token-guard-max-tokens"]) == reply.usage.completion_tokens
    assert sim[1].requests[-1]["max_tokens"] == WINDOW - reply.usage.prompt_tokens


def test_request_that_fits_is_forwarded_as_the_exact_bytes(proxy: str, sim: Any) -> None:
    raw = b'{"model":"tiny",  "messages":[{"role":"user","content":"hi \\u00e9"}],"max_tokens":3,"x_extra":[1,{}]}'
    response = httpx.post(f"{proxy}/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.headers["x-token-guard-action"] == "pass"
    assert sim[1].requests[-1] == json.loads(raw)  # parsed by the simulator: same fields, extra kept
    assert response.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("name,case", CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_guard_count_equals_the_upstream_count_for_the_corpus(proxy: str, name: str, case: dict[str, Any]) -> None:
    body = {"model": MODEL, **case, "max_tokens": 1}
    through = httpx.post(f"{proxy}/v1/chat/completions", json=body)
    tokenized = httpx.post(f"{proxy}/tokenize", json={"model": MODEL, **case}).json()["count"]
    assert through.status_code == 200, through.text
    assert int(through.headers["x-token-guard-prompt-tokens"]) == through.json()["usage"]["prompt_tokens"] == tokenized


def test_async_stream_is_clamped_and_reports_usage(proxy: str) -> None:
    async def run() -> tuple[str, Any]:
        client = openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": essay(50)}],
            max_completion_tokens=4000,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage = "", None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            usage = chunk.usage or usage
        await client.close()
        return text, usage

    text, usage = asyncio.run(run())
    assert usage.prompt_tokens + usage.completion_tokens == WINDOW and text


def test_completions_batch_is_clamped_for_the_longest_prompt(client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(model=MODEL, prompt=[essay(10), essay(300)], max_tokens=3000)
    reply = raw.parse()
    longest = int(raw.headers["x-token-guard-prompt-tokens"])
    assert len(reply.choices) == 2 and raw.headers["x-token-guard-action"] == "clamp"
    assert reply.usage is not None and reply.usage.completion_tokens == 2 * (WINDOW - longest)


def test_too_long_prompt_is_rejected_without_reaching_the_upstream(client: openai.OpenAI, sim: Any) -> None:
    before = sim[1].received
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": essay(3000)}], max_tokens=5)
    error = info.value.body
    assert isinstance(error, dict) and error["code"] == "context_length_exceeded"
    assert "maximum context length is 2048 tokens" in error["message"] and error["param"] == "messages"
    assert info.value.response.headers["x-token-guard-action"] == "reject"
    assert sim[1].received == before


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    turns=st.lists(st.tuples(st.sampled_from(["user", "assistant", "system"]), st.integers(0, 900)), min_size=1,
                   max_size=4),
    max_tokens=st.one_of(st.none(), st.integers(1, 5000)),
    field=st.sampled_from(["max_tokens", "max_completion_tokens"]),
)  # fmt: skip
def test_property_upstream_never_sees_an_overflow(
    client: openai.OpenAI, proxy: str, turns: list[tuple[str, int]], max_tokens: int | None, field: str
) -> None:
    messages: Any = [{"role": role, "content": essay(words)} for role, words in turns]
    limit: Any = {field: max_tokens} if max_tokens is not None else {"max_tokens": None}
    count = httpx.post(f"{proxy}/tokenize", json={"model": MODEL, "messages": messages}).json()["count"]
    try:
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, **limit)
    except openai.BadRequestError as exc:
        assert count >= WINDOW, f"rejected a prompt of {count} tokens: {exc}"
        assert isinstance(exc.body, dict) and exc.body["code"] == "context_length_exceeded"
        return
    usage = raw.parse().usage
    assert usage is not None
    assert count < WINDOW and usage.prompt_tokens == count == int(raw.headers["x-token-guard-prompt-tokens"])
    if raw.headers["x-token-guard-action"] == "clamp" or max_tokens is None:
        assert usage.prompt_tokens + usage.completion_tokens == WINDOW
    else:
        assert usage.completion_tokens == max_tokens


def test_stream_bytes_at_the_client_equal_the_bytes_the_upstream_sent(proxy: str, sim: Any) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "stream ✓"}], "max_tokens": 20, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{proxy}/v1/chat/completions", json=body) as response:
        received = b"".join(response.iter_raw())
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-token-guard-action"] == "pass"
    assert eventually(lambda: sim[2].bodies and sim[2].bodies[-1] == received)
    # role chunk, 20 token chunks (the last carries finish_reason, as vLLM's does), usage chunk, [DONE]
    assert received.endswith(b"data: [DONE]\n\n") and received.count(b"data: ") == 1 + 20 + 1 + 1


def test_disconnect_mid_stream_aborts_the_generation(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW, itl_s=0.02) as (sim, stats, _):
        with guard(sim.url, deepseek_dir) as proxy:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 500, "stream": True}
            with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body) as response:
                lines = response.iter_lines()
                for _ in range(3):
                    next(lines)
            assert eventually(lambda: stats.aborted == 1 and stats.active == 0)
            assert stats.completed == 0


def test_disconnect_while_waiting_for_a_non_stream_answer_aborts_it(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW, itl_s=0.02) as (sim, stats, _):
        with guard(sim.url, deepseek_dir) as proxy:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "go"}], "max_tokens": 500}
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=0.5)
            assert eventually(lambda: stats.aborted == 1 and stats.active == 0)


BAD_INPUTS = [
    ("/v1/chat/completions", b"{oops", 400, None),
    ("/v1/chat/completions", b"[]", 400, None),
    ("/v1/chat/completions", b'{"model":"tiny","messages":"hello"}', 400, "messages"),
    ("/v1/chat/completions", b'{"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":"9"}', 400,
     "max_tokens"),
    ("/v1/chat/completions", b'{"model":"tiny","messages":[{"role":"user","content":"x"}],"n":[]}', 400, "n"),
    ("/v1/chat/completions", b'{"model":"tiny","messages":[{"role":"user","content":"x"}],"stream":1}', 400, "stream"),
    ("/v1/chat/completions", b'{"model":"tiny","messages":[{"role":"user","content":5}]}', 400, "messages"),
    ("/v1/chat/completions", b'{"model":"other","messages":[{"role":"user","content":"x"}]}', 404, "model"),
    ("/v1/completions", b'{"model":"tiny","prompt":{"text":"x"}}', 400, "prompt"),
    ("/v1/completions", b'{"model":"tiny","prompt":[]}', 400, "prompt"),
    ("/v1/completions", b'{"model":"tiny","prompt":"x","max_completion_tokens":null,"max_tokens":1.5}', 400,
     "max_tokens"),
    ("/v1/completions", "\ud800".encode("utf-8", "surrogatepass"), 400, None),
]  # fmt: skip


@pytest.mark.parametrize("path,raw,status,param", BAD_INPUTS)
def test_bad_input_gets_an_openai_error_and_the_proxy_keeps_serving(
    proxy: str, client: openai.OpenAI, path: str, raw: bytes, status: int, param: str | None
) -> None:
    response = httpx.post(f"{proxy}{path}", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param and error["message"]
    assert "Traceback" not in response.text
    ok = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "still there?"}], max_tokens=2
    )
    assert ok.usage is not None and ok.usage.completion_tokens == 2


def test_relay_routes_pass_through_unchanged(proxy: str, sim: Any) -> None:
    for method, path, body in [("GET", "/v1/models", None), ("GET", "/version", None),
                               ("POST", "/tokenize", {"model": MODEL, "prompt": "Hello world"}),
                               ("POST", "/detokenize", {"model": MODEL, "tokens": [19923, 2058]})]:  # fmt: skip
        through = httpx.request(method, f"{proxy}{path}", json=body)
        direct = httpx.request(method, f"{sim[0].url}{path}", json=body)
        assert through.status_code == direct.status_code, path
        if path != "/v1/models":  # its `created` changes on every call
            assert through.content == direct.content, path
        assert "x-token-guard-action" not in through.headers


def test_a_path_no_route_declares_is_a_404_that_never_reaches_the_upstream(proxy: str, sim: Any) -> None:
    before = len(sim[2].bodies)
    answer = httpx.get(f"{proxy}/v1/nothing-here?x=1")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "route_not_found"
    assert "/v1/nothing-here" in answer.json()["error"]["message"]
    assert len(sim[2].bodies) == before


def test_unreachable_upstream_is_502_and_unhealthy(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW) as (sim, _, _):
        with guard(sim.url, deepseek_dir) as proxy:
            sim.stop()
            response = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "messages": [
                {"role": "user", "content": "hi"}], "max_tokens": 5})  # fmt: skip
            assert response.status_code == 502 and response.json()["error"]["type"] == "BadGatewayError"
            assert httpx.get(f"{proxy.url}/health").status_code == 503


def test_upstream_timeout_is_504(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW, ttft_s=3.0) as (sim, stats, _):
        with guard(sim.url, deepseek_dir, **{"upstream.read_timeout_s": 0.3}) as proxy:
            response = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "messages": [
                {"role": "user", "content": "hi"}], "max_tokens": 5}, timeout=10)  # fmt: skip
            assert response.status_code == 504 and response.json()["error"]["type"] == "GatewayTimeoutError"
            assert eventually(lambda: stats.aborted == 1)


def test_0_32_profile_through_the_guard_clamps_before_vllm_would(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, profile="0.32", max_model_len=WINDOW) as (sim, stats, _):
        with guard(sim.url, deepseek_dir, **{"model.max_model_len": WINDOW}) as proxy:
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=WINDOW
            )
            usage = raw.parse().usage
            assert usage is not None and usage.prompt_tokens + usage.completion_tokens == WINDOW
            assert raw.headers["x-token-guard-action"] == "clamp"
            assert stats.requests[-1]["max_tokens"] == WINDOW - usage.prompt_tokens


def test_each_singleton_header_appears_once(proxy: str) -> None:
    for stream in (False, True):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": stream}
        response = httpx.post(f"{proxy}/v1/chat/completions", json=body)
        for name in ("date", "server", "content-type", "content-length", "transfer-encoding"):
            assert len(response.headers.get_list(name)) <= 1, (name, response.headers.get_list(name))
