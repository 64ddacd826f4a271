"""Batch chat end to end: httpx (the OpenAI SDK has no method for it) -> token-guard on loopback -> the vLLM simulator
in memory (0.31 profile, which refuses every overflow): each conversation counted as chat, the shared limit clamped for
the longest, a conversation that cannot fit refused and named, the prompt tokens the batch's usage."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.servers import MODEL, InMemorySim

PATH = "/v1/chat/completions/batch"
WINDOW = 2048
HI = [{"role": "user", "content": "Hi"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOL = {"type": "function", "function": {"name": "weather", "description": "Weather in a city", "parameters": CITY}}


def essay(words: int) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " ".join(["word"] * words)}]


def batch(proxy: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{proxy}{PATH}", json={"model": MODEL, **body}, headers=headers, timeout=30)


def test_a_batch_that_fits_is_forwarded_as_sent_and_counted_as_vllm_charges(proxy: str, sim: InMemorySim) -> None:
    raw = json.dumps({"model": MODEL, "messages": [HI, essay(40)], "max_tokens": 4, "tools": [TOOL]}).encode()
    response = httpx.post(f"{proxy}{PATH}", content=raw, headers={"content-type": "application/json"})
    body = response.json()
    assert response.status_code == 200 and len(body["choices"]) == 2
    assert response.headers["x-token-guard-action"] == "pass" and response.headers["x-token-guard-max-tokens"] == "4"
    assert int(response.headers["x-token-guard-prompt-tokens"]) == body["usage"]["prompt_tokens"]  # tools unrendered
    assert sim.stats.requests[-1] == json.loads(raw)


def test_the_limit_is_clamped_for_the_longest_where_vllm_alone_refuses(proxy: str, sim: InMemorySim) -> None:
    request = {"model": MODEL, "messages": [HI, essay(1900)], "max_tokens": 500, "min_tokens": 300}
    direct = sim.client.post(PATH, json=request)
    assert direct.status_code == 400 and "you requested 500 output tokens" in direct.text
    response = batch(proxy, request)
    assert response.status_code == 200 and response.headers["x-token-guard-action"] == "clamp"
    usage = response.json()["usage"]
    limit = int(response.headers["x-token-guard-max-tokens"])
    longest = WINDOW - limit
    assert sim.stats.requests[-1]["max_tokens"] == sim.stats.requests[-1]["min_tokens"] == limit < 300
    assert int(response.headers["x-token-guard-prompt-tokens"]) == usage["prompt_tokens"] > longest
    assert usage["completion_tokens"] == 2 * limit


def test_a_conversation_that_cannot_fit_is_refused_without_reaching_vllm(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    response = batch(proxy, {"messages": [HI, HI, essay(2100)], "max_tokens": 5})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "messages"
    assert "That is conversation 2 (messages[2]) of 3." in error["message"]
    assert response.headers["x-token-guard-action"] == "reject" and sim.stats.received == before


@pytest.mark.parametrize("choice", ["truncate", "chunk"])
def test_truncate_and_chunk_say_why_they_do_not_apply(proxy: str, choice: str) -> None:
    response = batch(proxy, {"messages": [essay(2100)], "max_tokens": 5}, **{"x-token-guard-overflow": choice})
    assert response.status_code == 400 and f"The {choice} policy was not applied" in response.json()["error"]["message"]


def test_a_batch_far_over_is_refused_from_its_size(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    response = batch(proxy, {"messages": [HI, essay(40000)]})
    assert response.status_code == 400 and response.headers["x-token-guard-count-source"] == "size"
    assert sim.stats.received == before


@pytest.mark.parametrize(
    "body,fragment",
    [({"messages": [HI], "n": 2}, "do not support `n > 1`"), ({"messages": HI}, "messages[0] must be a non-empty"),
     ({"messages": [HI, [{"content": "x"}]]}, "Conversation 1 (messages[1])")],
)  # fmt: skip
def test_malformed_batches_are_400s_before_vllm(
    proxy: str, sim: InMemorySim, body: dict[str, Any], fragment: str
) -> None:
    before = sim.stats.received
    response = batch(proxy, body)
    assert response.status_code == 400 and fragment in response.json()["error"]["message"]
    assert sim.stats.received == before
