"""Cohere's /v2/embed end to end: httpx -> token-guard on loopback -> the vLLM simulator in memory (0.31): texts
counted as vLLM bills them, its own cuts (END by default) counted as what it keeps, NONE over the window refused
before it reaches vLLM, the truncate policy answered by asking vLLM for its own cut."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.servers import MODEL, InMemorySim

WINDOW = 2048
LONG = "word " * 3000


def embed(proxy: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{proxy}/v2/embed", json={"model": MODEL, **body}, headers=headers, timeout=30)


def billed(response: httpx.Response) -> int:
    assert response.status_code == 200, response.text
    tokens: int = response.json()["meta"]["billed_units"]["input_tokens"]
    return tokens


def test_texts_are_counted_as_vllm_bills_them_and_go_as_sent(proxy: str, sim: InMemorySim) -> None:
    body = {"model": MODEL, "texts": ["Hello world", "東京の天気は？"], "embedding_types": ["float", "base64"]}
    raw = json.dumps(body, indent=1).encode()
    response = httpx.post(f"{proxy}/v2/embed", content=raw, headers={"content-type": "application/json"})
    assert response.headers["x-token-guard-action"] == "pass" and "x-token-guard-max-tokens" not in response.headers
    assert int(response.headers["x-token-guard-prompt-tokens"]) == billed(response) > 0
    assert sim.stats.requests[-1] == body


def test_text_inputs_are_counted_as_the_conversations_vllm_renders(proxy: str) -> None:
    inputs = [{"content": [{"type": "text", "text": "Hello there"}, {"type": "text", "text": "and more"}]}]
    response = embed(proxy, {"inputs": inputs})
    assert response.headers["x-token-guard-action"] == "pass"
    assert int(response.headers["x-token-guard-prompt-tokens"]) == billed(response)


@pytest.mark.parametrize(
    "body,kept",
    [({"texts": [LONG]}, WINDOW), ({"texts": [LONG], "truncate": "START"}, WINDOW),
     ({"texts": [LONG, LONG], "max_tokens": 10}, 20)],
)  # fmt: skip
def test_vllms_own_cut_is_counted_as_what_it_keeps(proxy: str, body: dict[str, Any], kept: int) -> None:
    response = embed(proxy, body)  # END by default: vLLM keeps each text's first max_tokens (or window) tokens
    assert response.headers["x-token-guard-action"] == "pass"
    assert int(response.headers["x-token-guard-prompt-tokens"]) == billed(response) == kept


def test_none_over_the_window_or_max_tokens_is_refused_without_reaching_vllm(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    over = embed(proxy, {"texts": ["short", LONG], "truncate": "NONE"})
    error = over.json()["error"]
    assert over.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "texts"
    assert "contains 3001 input tokens" in error["message"] and "texts 2 of 2" in error["message"]
    capped = embed(proxy, {"texts": ["word " * 20], "truncate": "NONE", "max_tokens": 10})
    assert capped.status_code == 400 and capped.json()["error"]["message"].startswith(
        "Input of 21 tokens exceeds max_tokens=10 with truncate=NONE"
    )
    assert sim.stats.received == before


def test_the_truncate_policy_never_overrides_none(proxy: str, sim: InMemorySim) -> None:
    # NONE says the inputs are not to be cut; the embedding of a cut input would be another input's
    before = sim.stats.received
    response = embed(proxy, {"texts": [LONG, "short"], "truncate": "NONE"}, **{"x-token-guard-overflow": "truncate"})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded"
    assert "send truncate (END or START)" in error["message"] and sim.stats.received == before
    asked = embed(proxy, {"texts": [LONG, "short"], "truncate": "END"}, **{"x-token-guard-overflow": "truncate"})
    assert asked.headers["x-token-guard-action"] == "pass" and int(asked.headers["x-token-guard-prompt-tokens"]) == \
        billed(asked)  # fmt: skip


@pytest.mark.parametrize("body", [{"texts": []}, {"texts": ["a"], "images": ["x"]}, {"texts": ["a"], "truncate": "no"}])
def test_malformed_requests_are_400s_before_vllm(proxy: str, sim: InMemorySim, body: dict[str, Any]) -> None:
    before = sim.stats.received
    assert embed(proxy, body).status_code == 400 and sim.stats.received == before
