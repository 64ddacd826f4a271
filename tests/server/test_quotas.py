"""Per-key quotas end to end: the real `openai` SDK -> token-guard with [[keys]] -> the simulator (in memory).
OpenAI's x-ratelimit-* headers on every answer to a keyed request, 429 with Retry-After when a key is over, unused
tokens given back from the answer's usage, a key's model list and output cap, a key given by its SHA-256."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.policy.quota import duration
from proxy.server.running import ServerThread
from tests.support.documents import document
from tests.support.leaving import leave_before_the_headers
from tests.support.polling import eventually
from tests.support.servers import (
    MODEL,
    InMemorySim,
    keyed_guard,
    simulator,
    simulator_in_memory,
    wait_healthy,
)

KEYS = f"""
[[keys]]
name = "small"
key = "sk-small"
tokens_per_minute = 1000
requests_per_minute = 100

[[keys]]
name = "few"
key = "sk-few"
requests_per_minute = 2

[[keys]]
name = "capped"
key = "sk-capped"
tokens_per_minute = 1000000
max_output_tokens = 5
models = ["{MODEL}"]

[[keys]]
name = "elsewhere"
key = "sk-elsewhere"
tokens_per_minute = 1000000
models = ["another-model"]

[[keys]]
name = "metered"
key = "sk-metered"
requests_per_minute = 1

[[keys]]
name = "claude"
key = "sk-claude"
requests_per_minute = 1
max_output_tokens = 7

[[keys]]
name = "hashed"
key_sha256 = "{hashlib.sha256(b"sk-hashed").hexdigest()}"
tokens_per_minute = 1000000

[[keys]]
name = "peeked"
key = "sk-peeked"
tokens_per_minute = 50000
requests_per_minute = 50

[[keys]]
name = "chunky"
key = "sk-chunky"
tokens_per_minute = 1000000

[[keys]]
name = "per-minute-3000"
key = "sk-3000"
tokens_per_minute = 3000

[[keys]]
name = "counter"
key = "sk-counter"
tokens_per_minute = 100000
requests_per_minute = 100

[[keys]]
name = "drained"
key = "sk-drained"
tokens_per_minute = 1000

[[keys]]
name = "free"
key = "sk-free"
max_output_tokens = 100
"""
AUTH_PLAIN = {"Authorization": "Bearer plain"}  # a client key is not the metrics key
RATE_HEADERS = [f"x-ratelimit-{kind}-{what}" for what in ("tokens", "requests") for kind in ("limit", "remaining",
                                                                                             "reset")]  # fmt: skip


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(deepseek_dir, max_model_len=2048) as running:
        yield running


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "guard.toml"
    path.write_text('[server]\napi_keys = ["plain"]\nmetrics_api_key = "sk-scrape"\n' + KEYS)
    return path


@pytest.fixture(scope="module")
def served(sim: InMemorySim, deepseek_dir: Path, config: Path) -> Iterator[ServerThread]:
    with keyed_guard(sim, deepseek_dir, config) as server:
        wait_healthy(server.url)
        yield server


@pytest.fixture(scope="module")
def proxy(served: ServerThread) -> str:
    return served.url


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's buckets (this process's, no Redis here) on a stopped clock: nothing refills while a test looks,
    so what a key was charged and given back shows exactly in its remaining tokens."""
    now = time.monotonic() * 1000
    monkeypatch.setattr("proxy.exchange.quotas._now_ms", lambda: now)


def client(proxy: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy}/v1", api_key=key, max_retries=0, timeout=30)


def chat(oai: openai.OpenAI, max_tokens: int, **extra: Any) -> Any:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}],
                            "max_tokens": max_tokens, **extra}  # fmt: skip
    return oai.chat.completions.with_raw_response.create(**body)


def test_a_key_over_its_tokens_per_minute_gets_429_with_retry_after(proxy: str) -> None:
    oai = client(proxy, "sk-small")
    first = chat(oai, 400)
    prompt = int(first.headers["x-token-guard-prompt-tokens"])
    assert first.headers["x-ratelimit-limit-tokens"] == "1000"
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 1000 - (prompt + 400)
    assert first.headers["x-ratelimit-limit-requests"] == "100"
    assert chat(oai, 400).status_code == 200
    with pytest.raises(openai.RateLimitError) as refused:
        chat(oai, 400)
    error = refused.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded"
    assert "Rate limit reached for API key `small` on tokens per min (TPM): Limit 1000" in error.message
    headers = error.response.headers
    assert int(headers["retry-after"]) >= 1 and all(name in headers for name in RATE_HEADERS)
    assert int(headers["x-ratelimit-remaining-tokens"]) < prompt + 400


def test_requests_per_minute(proxy: str) -> None:
    oai = client(proxy, "sk-few")
    assert chat(oai, 1).headers["x-ratelimit-remaining-requests"] == "1"
    assert chat(oai, 1).headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError, match=r"requests per min \(RPM\): Limit 2") as refused:
        chat(oai, 1)
    assert int(refused.value.response.headers["retry-after"]) >= 1
    assert "x-ratelimit-limit-tokens" not in refused.value.response.headers  # no token limit on this key


def test_unused_tokens_come_back_from_the_usage(proxy: str) -> None:
    """A forced JSON answer ends long before max_tokens: the key pays its usage, not its reservation."""
    oai = client(proxy, "sk-hashed")
    reply = chat(oai, 1000, response_format={"type": "json_object"})
    usage = reply.parse().usage
    assert usage.completion_tokens < 100
    charged_then = 1_000_000 - int(reply.headers["x-ratelimit-remaining-tokens"])
    assert charged_then == usage.prompt_tokens + 1000  # charged: the input and the output cap
    assert 1_000_000 - remaining(proxy, "sk-hashed") <= usage.total_tokens


def test_streams_give_back_by_their_usage_event(proxy: str) -> None:
    oai = client(proxy, "sk-hashed")
    for options in ({"include_usage": True}, None):
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1000,
                                "stream": True, "response_format": {"type": "json_object"}}  # fmt: skip
        if options:
            body["stream_options"] = options
        with oai.chat.completions.with_streaming_response.create(**body) as stream:
            assert all(name in stream.headers for name in RATE_HEADERS[:3])
            events = sum(1 for line in stream.iter_lines() if line.startswith("data:"))
        spent = 1_000_000 - remaining(proxy, "sk-hashed")
        assert spent < 100 + events  # far below the 1000 reserved


STREAMS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 2, "max_tokens": 1000,
                              "response_format": {"type": "json_object"}}),
    ("/v1/completions", {"prompt": "Once upon a time", "n": 2, "max_tokens": 7}),
    ("/inference/v1/generate", {"token_ids": [9, 8, 7, 6], "sampling_params": {"n": 2, "max_tokens": 5}}),
]  # fmt: skip


@pytest.mark.parametrize(("path", "fields"), STREAMS, ids=["chat", "completions", "token-in"])
@pytest.mark.parametrize("options", [None, {"include_usage": False, "continuous_usage_stats": True}],
                         ids=["no options", "usage off"])  # fmt: skip
def test_a_stream_that_asks_no_usage_pays_exactly_and_gets_the_stream_it_asked_for(
    proxy: str, sim: InMemorySim, frozen: None, path: str, fields: dict[str, Any], options: dict[str, Any] | None
) -> None:
    """The guard asks vLLM for the usage event of a limited key's stream: the key pays what vLLM says it used, not
    a count of events, and the client gets the bytes vLLM sends a stream that did not ask (the usage event taken
    out, the fingerprint back on each finish event)."""
    body: dict[str, Any] = {"model": MODEL, "stream": True, **fields}
    if options is not None:
        body["stream_options"] = options
    headers = {"x-request-id": f"exact-{path}-{options is None}"}  # vLLM makes it the answer's id
    before = remaining(proxy, "sk-hashed")
    guarded = httpx.post(proxy + path, json=body, headers={**headers, "Authorization": "Bearer sk-hashed"})
    assert sim.stats.requests[-1]["stream_options"]["include_usage"] is True  # what the guard sent
    direct = sim.client.post(path, json=body, headers=headers)
    assert guarded.status_code == direct.status_code == 200
    assert unstamped(guarded.content) == unstamped(direct.content) and b'"usage":{' not in guarded.content
    asked = sim.client.post(path, json={**body, "stream_options": {"include_usage": True}}).text
    usage = json.loads(asked.split("data: ")[-2])["usage"]
    assert before - remaining(proxy, "sk-hashed") == usage["prompt_tokens"] + usage["completion_tokens"]


def unstamped(stream: bytes) -> bytes:
    """A stream without its events' creation times (each request's own second)."""
    return re.sub(rb'"created":\d+', b'"created":0', stream)


def test_the_keys_output_cap_clamps(proxy: str, sim: InMemorySim) -> None:
    reply = chat(client(proxy, "sk-capped"), 300)
    assert reply.headers["x-token-guard-action"] == "clamp" and reply.headers["x-token-guard-max-tokens"] == "5"
    assert sim.stats.requests[-1]["max_tokens"] == 5 and reply.parse().usage.completion_tokens == 5
    unsaid = client(proxy, "sk-capped").chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}]
    )
    assert unsaid.headers["x-token-guard-max-tokens"] == "5" and sim.stats.requests[-1]["max_tokens"] == 5


def test_anthropic_messages_are_capped_and_limited_in_anthropics_shape(proxy: str, sim: InMemorySim) -> None:
    claude = anthropic.Anthropic(base_url=proxy, api_key="sk-claude", max_retries=0, timeout=30)
    reply = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=500, messages=[{"role": "user", "content": "Hi"}]
    )
    assert reply.headers["x-token-guard-max-tokens"] == "7" and sim.stats.requests[-1]["max_tokens"] == 7
    assert reply.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(anthropic.RateLimitError) as refused:
        claude.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "RateLimitError"
    assert int(refused.value.response.headers["retry-after"]) >= 1


def test_a_model_the_key_may_not_use_is_not_found(proxy: str) -> None:
    with pytest.raises(openai.NotFoundError) as refused:
        chat(client(proxy, "sk-elsewhere"), 5)
    assert refused.value.code == "model_not_found" and "do not have access" in refused.value.message
    assert "x-ratelimit-remaining-tokens" in refused.value.response.headers
    claude = anthropic.Anthropic(base_url=proxy, api_key="sk-elsewhere", max_retries=0, timeout=30)
    with pytest.raises(anthropic.NotFoundError) as in_anthropic_shape:
        claude.messages.create(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hi"}])
    assert in_anthropic_shape.value.body == {
        "type": "error",
        "error": {"type": "NotFoundError", "message": f"The model `{MODEL}` does not exist or you do not have "
                                                      "access to it."},
    }  # fmt: skip


def test_a_key_lists_only_its_models(proxy: str) -> None:
    assert [m.id for m in client(proxy, "sk-capped").models.list()] == [MODEL]
    assert [m.id for m in client(proxy, "sk-elsewhere").models.list()] == []
    assert [m.id for m in client(proxy, "sk-hashed").models.list()] == [MODEL]  # a key without a list sees all
    assert [m.id for m in client(proxy, "plain").models.list()] == [MODEL]


def test_every_answer_to_a_keyed_request_tells_its_quota(proxy: str) -> None:
    oai = client(proxy, "sk-hashed")
    overflow = httpx.post(f"{proxy}/v1/chat/completions", headers={"Authorization": "Bearer sk-hashed"},
                          json={"model": MODEL, "messages": [{"role": "user", "content": "word " * 3000}]})  # fmt: skip
    assert overflow.status_code == 400 and all(name in overflow.headers for name in RATE_HEADERS[:3])
    bad = httpx.post(f"{proxy}/v1/chat/completions", headers={"Authorization": "Bearer sk-hashed"}, content=b"{")
    assert bad.status_code == 400 and "x-ratelimit-limit-tokens" in bad.headers
    responses = oai.responses.with_raw_response.create(model=MODEL, input="Hi", max_output_tokens=5)
    assert responses.headers["x-ratelimit-limit-tokens"] == "1000000"
    capped = client(proxy, "sk-capped").responses.with_raw_response.create(model=MODEL, input="Hi")
    usage = capped.parse().usage
    assert capped.headers["x-token-guard-max-tokens"] == "5" and usage is not None and usage.output_tokens == 5
    plain = client(proxy, "plain")  # a key of server.api_keys: no name, no quota
    assert "x-ratelimit-limit-tokens" not in chat(plain, 5).headers
    with pytest.raises(openai.AuthenticationError):
        chat(client(proxy, "sk-unknown"), 5)


def test_the_log_line_names_the_key_and_what_it_paid(proxy: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="token_guard.requests")
    reply = chat(client(proxy, "sk-hashed"), 4, extra_headers={"x-request-id": "quota-log"})
    total = reply.parse().usage.total_tokens

    def line() -> dict[str, Any]:
        return next((f for r in caplog.records if (f := getattr(r, "fields", {})).get("request_id") == "quota-log"), {})

    assert eventually(lambda: bool(line()))
    assert line()["key"] == "hashed" and line()["charged_tokens"] == total


def test_metrics_per_key(proxy: str) -> None:
    oai = client(proxy, "sk-metered")
    reply = chat(oai, 3)
    with pytest.raises(openai.RateLimitError):
        chat(oai, 3)
    metrics = httpx.get(f"{proxy}/metrics", headers={"Authorization": "Bearer sk-scrape"}).text
    total = reply.parse().usage.total_tokens
    assert f'token_guard_key_tokens_charged_total{{key="metered"}} {float(total)}' in metrics
    assert 'token_guard_key_requests_limited_total{key="metered"} 1.0' in metrics
    for shown in (httpx.get(f"{proxy}/metrics").text, httpx.get(f"{proxy}/metrics", headers=AUTH_PLAIN).text):
        assert "token_guard_requests_total" in shown  # a scrape without the metrics key still works,
        assert "metered" not in shown and "token_guard_key_" not in shown  # and names no key


def count_tokens(proxy: str, key: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    response = httpx.post(f"{proxy}/v1/messages/count_tokens", headers={"x-api-key": key}, json=body)
    assert response.status_code == 200
    return response


def test_a_request_alone_over_the_keys_tokens_per_minute_is_refused_not_run_into_debt(proxy: str, frozen: None) -> None:
    with pytest.raises(openai.RateLimitError) as refused:
        chat(client(proxy, "sk-3000"), 5, n=500)  # (prompt + 5) x 500: more than a whole minute of the key's
    error = refused.value
    assert error.status_code == 429 and error.code == "rate_limit_exceeded"
    assert "Request too large for API key `per-minute-3000` on tokens per min (TPM): Limit 3000" in error.message
    assert "must be reduced" in error.message
    assert remaining(proxy, "sk-3000") == 3000  # nothing charged: no debt
    assert chat(client(proxy, "sk-3000"), 5, n=50).status_code == 200  # what fits in the minute runs


def test_counting_is_charged_the_tokens_counted(proxy: str, frozen: None) -> None:
    counted = count_tokens(proxy, "sk-counter")
    tokens = counted.json()["input_tokens"]
    assert int(counted.headers["x-ratelimit-remaining-tokens"]) == 100000 - tokens == remaining(proxy, "sk-counter")
    assert counted.headers["x-ratelimit-remaining-requests"] == "99"
    too_long = httpx.post(f"{proxy}/v1/chat/completions", headers={"Authorization": "Bearer sk-counter"},
                          json={"model": MODEL, "messages": [{"role": "user", "content": "word " * 3000}]})  # fmt: skip
    assert too_long.status_code == 400  # refused once counted: the count is charged all the same
    assert remaining(proxy, "sk-counter") == 100000 - tokens - int(too_long.headers["x-token-guard-prompt-tokens"])
    bad = httpx.post(f"{proxy}/v1/chat/completions", headers={"Authorization": "Bearer sk-counter"}, content=b"{")
    assert bad.status_code == 400 and bad.headers["x-ratelimit-remaining-requests"] == "97"  # a request, unread


def test_a_key_with_nothing_left_gets_nothing_counted(proxy: str, frozen: None) -> None:
    long = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 1800}]}  # 9 KB, fits the window
    headers = {"x-api-key": "sk-drained"}
    first = httpx.post(f"{proxy}/v1/messages/count_tokens", headers=headers, json=long)
    assert first.status_code == 200 and first.json()["input_tokens"] > 1000  # the key had something left: answered,
    assert int(first.headers["x-ratelimit-remaining-tokens"]) == 0  # and charged into debt
    for body in (long, {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}):  # a large one, a small one
        refused = httpx.post(f"{proxy}/v1/messages/count_tokens", headers=headers, json=body)
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "RateLimitError"
        owed = first.json()["input_tokens"] - 1000
        assert int(refused.headers["retry-after"]) == math.ceil((owed + 1) * 60 / 1000)  # until one token is back
    large = httpx.post(f"{proxy}/v1/messages/count_tokens", headers=headers, json=long)
    assert "x-token-guard-prompt-tokens" not in large.headers  # refused before it was counted


def told(answer: httpx.Response | Any) -> dict[str, str]:
    return {name: answer.headers[name] for name in RATE_HEADERS if name in answer.headers}


def test_relay_requests_cost_a_request_and_no_token_and_a_405_costs_nothing(proxy: str, frozen: None) -> None:
    """GET /v1/models and /tokenize (relay routes) are charged one request each, no token; a method a guarded route
    does not take is answered from a look that charges nothing. All carry the six headers."""
    auth = {"Authorization": "Bearer sk-peeked"}
    charged = chat(client(proxy, "sk-peeked"), 10)
    total = charged.parse().usage.total_tokens  # what the key pays once the answer ended: its usage
    models = httpx.get(f"{proxy}/v1/models", headers=auth)
    tokenize = httpx.post(f"{proxy}/tokenize", headers=auth, json={"model": MODEL, "prompt": "Hi"})
    wrong_method = httpx.get(f"{proxy}/v1/chat/completions", headers=auth)  # the guard's own 405
    statuses = [a.status_code for a in (models, tokenize, wrong_method)]
    assert statuses == [200, 200, 405]
    tokens = {"x-ratelimit-limit-tokens": "50000", "x-ratelimit-remaining-tokens": str(50000 - total),
              "x-ratelimit-reset-tokens": duration(math.ceil(total * 60000 / 50000))}  # fmt: skip
    for answer, left in ((models, 48), (tokenize, 47), (wrong_method, 47)):
        reset = duration(math.ceil((50 - left) * 60000 / 50))
        requests = {"x-ratelimit-limit-requests": "50", "x-ratelimit-remaining-requests": str(left),
                    "x-ratelimit-reset-requests": reset}  # fmt: skip
        assert told(answer) == {**tokens, **requests}
    again = chat(client(proxy, "sk-peeked"), 10)
    assert again.headers["x-ratelimit-remaining-requests"] == "46"  # the 405's look took none of the 50
    listed = httpx.get(f"{proxy}/v1/models", headers={"Authorization": "Bearer sk-capped"})  # its list, filtered
    assert listed.json()["data"] and told(listed)["x-ratelimit-limit-tokens"] == "1000000"


def test_clients_without_a_limited_key_get_no_quota_headers_and_cost_no_look(
    served: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    quotas = served.app.quotas
    looks: list[str] = []
    peek = quotas.peek

    async def counted(key: Any) -> Any:
        looks.append(key.name)
        return await peek(key)

    monkeypatch.setattr(quotas, "peek", counted)
    url = served.url
    for key in ("plain", "sk-free"):  # nameless; named without limits
        answers = [httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}),
                   httpx.post(f"{url}/tokenize", headers={"Authorization": f"Bearer {key}"},
                              json={"model": MODEL, "prompt": "Hi"}),
                   httpx.get(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}),
                   chat(client(url, key), 3)]  # fmt: skip
        assert all(told(answer) == {} for answer in answers)
    assert told(httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": "Hi"})) == {}  # no key at all
    assert looks == []
    assert told(httpx.get(f"{url}/v1/chat/completions", headers={"Authorization": "Bearer sk-peeked"}))
    assert looks == ["peeked"]  # one look for a limited key's 405


def filler_word(proxy: str) -> str:
    """A word the simulator writes a few tokens into every answer: a stop string that ends each part early."""
    text = (
        client(proxy, "plain")
        .chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=30)
        .choices[0]
        .message.content
    )
    assert text is not None
    return text.split()[3]


def remaining(proxy: str, key: str) -> int:
    """A key's tokens left, from a look that charges nothing (the 405 of a method the chat route does not take)."""
    return int(httpx.get(f"{proxy}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}).headers[
        "x-ratelimit-remaining-tokens"])  # fmt: skip


def test_a_chunked_request_pays_what_its_parts_used(proxy: str, frozen: None) -> None:
    """Parts that stop early give back their unused output, streamed or not, usage asked for or not: the key pays
    its parts' prompt + completion tokens, not the input + output cap reserved."""
    oai = openai.OpenAI(base_url=f"{proxy}/v1", api_key="sk-chunky", max_retries=0, timeout=120,
                        default_headers={"x-token-guard-overflow": "chunk"})  # fmt: skip
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": document(3000)}],
                            "max_tokens": 200, "stop": [filler_word(proxy)]}  # fmt: skip
    before = remaining(proxy, "sk-chunky")
    whole = oai.chat.completions.with_raw_response.create(**body)
    parts = int(whole.headers["x-token-guard-chunks"])
    usage = whole.parse().usage
    assert whole.headers["x-token-guard-action"] == "chunk" and parts >= 2 and usage is not None
    assert usage.completion_tokens < 200  # every part stopped early
    reserved = before - int(whole.headers["x-ratelimit-remaining-tokens"])
    assert reserved == usage.prompt_tokens + 200  # charged: every part's input and its share of the output cap
    used = usage.prompt_tokens + usage.completion_tokens
    assert remaining(proxy, "sk-chunky") == before - used
    for options in ({"include_usage": True}, None):
        start = remaining(proxy, "sk-chunky")
        streamed: dict[str, Any] = {**body, "stream": True, **({"stream_options": options} if options else {})}
        with oai.chat.completions.with_streaming_response.create(**streamed) as stream:
            assert stream.headers["x-token-guard-action"] == "chunk"
            events = [line for line in stream.iter_lines() if line.startswith("data:")]
        assert ('"usage":{' in events[-2]) == bool(options)  # the usage chunk only when asked for
        # settled once the answer's last byte is out: a moment after the client has read it
        expected = start - used  # the same parts, the same usage
        assert eventually(lambda: remaining(proxy, "sk-chunky") == expected)  # noqa: B023 (called at once)


def test_a_reduced_chunked_request_pays_its_parts_and_the_combining_request(
    sim: InMemorySim, deepseek_dir: Path, config: Path, frozen: None
) -> None:
    """chunk_merge = "reduce": the usage summed over the parts and the request that combines their answers, which
    was not reserved up front (the key pays it afterwards), streamed or not."""
    with keyed_guard(sim, deepseek_dir, config, **{"policy.chunk_merge": "reduce"}) as server:
        wait_healthy(server.url)
        oai = chunky(server.url)
        before = remaining(server.url, "sk-chunky")
        used = reduced_whole(oai)
        assert remaining(server.url, "sk-chunky") == before - used
        streamed = {**REDUCED, "stream": True, "stream_options": {"include_usage": True}}
        with oai.chat.completions.with_streaming_response.create(**streamed) as stream:
            assert stream.headers["x-token-guard-merge"] == "reduce"
            # read to the end: a client that leaves part way has the combining request aborted (the next test)
            events = [line for line in stream.iter_lines() if line.startswith("data:")]
        assert events[-1] == "data: [DONE]" and f'"total_tokens":{used}' in events[-2]  # the same usage, streamed
        assert eventually(lambda: remaining(server.url, "sk-chunky") == before - 2 * used)  # settled after the end


def test_a_combining_request_its_client_left_pays_its_cost(deepseek_dir: Path, config: Path, frozen: None) -> None:
    """A client that leaves while the combining request streams has vLLM abort it, and it never tells its usage: the
    key pays the parts' usage and the combining request's cost (input + output cap), as a reservation would have
    held; not the parts alone. The simulator fills every output cap, so that is what the request whole used."""
    with simulator(deepseek_dir, max_model_len=2048, itl_s=0.05) as paced, \
            keyed_guard(paced[0].url, deepseek_dir, config, **{"policy.chunk_merge": "reduce"}) as server:  # fmt: skip
        wait_healthy(server.url)
        oai = chunky(server.url)
        before = remaining(server.url, "sk-chunky")
        used = reduced_whole(oai)
        with oai.chat.completions.with_streaming_response.create(**REDUCED, stream=True) as stream:
            assert stream.headers["x-token-guard-merge"] == "reduce"
            next(line for line in stream.iter_lines() if line.startswith("data:"))  # ~1.2 s of tokens still to come
        assert eventually(lambda: remaining(server.url, "sk-chunky") == before - 2 * used)


def test_a_chunked_request_whose_client_left_while_its_chunks_queued_pays_nothing(
    deepseek_dir: Path, config: Path, frozen: None
) -> None:
    """While another request's stream holds the whole KV budget, a chunked request's chunks wait in admission's
    queue; its client leaves: no chunk ever reached the upstream, and its key gets its whole reservation back."""
    flags = {"admission.max_inflight_tokens": 4000, "admission.queue_timeout_s": 60}
    with simulator(deepseek_dir, max_model_len=2048, itl_s=0.05) as (sim, stats, _), \
            keyed_guard(sim.url, deepseek_dir, config, **flags) as server:  # fmt: skip
        wait_healthy(server.url)
        before, gate = remaining(server.url, "sk-chunky"), server.app.upstream.admission
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3900, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, headers=AUTH_PLAIN) as holder:
            lines = holder.iter_lines()  # kept: the holder reads on while the chunked request waits
            assert holder.status_code == 200 and next(lines).startswith("data:")
            received = stats.received
            chunked = {"model": MODEL, "messages": [{"role": "user", "content": document(3000)}], "max_tokens": 100}
            path = "/v1/chat/completions"
            leave_before_the_headers(server.url, path, chunked, "sk-chunky", 1, lambda: gate.queued, overflow="chunk")
            assert eventually(lambda: gate.queued == 0)
            assert stats.received == received  # no chunk went upstream
        assert eventually(lambda: remaining(server.url, "sk-chunky") == before)


REDUCED: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": document(3000)}], "max_tokens": 24}


def chunky(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-chunky", max_retries=0, timeout=120,
                         default_headers={"x-token-guard-overflow": "chunk"})  # fmt: skip


def reduced_whole(oai: openai.OpenAI) -> int:
    """The tokens a reduced chunked request used, non-streamed: its parts' and its combining request's."""
    whole = oai.chat.completions.with_raw_response.create(**REDUCED)
    usage = whole.parse().usage
    assert whole.headers["x-token-guard-merge"] == "reduce" and usage is not None
    parts = int(whole.headers["x-token-guard-chunks"])
    assert usage.completion_tokens == 24 * (parts + 1)  # the parts' and the combining request's
    used: int = usage.prompt_tokens + usage.completion_tokens
    return used
