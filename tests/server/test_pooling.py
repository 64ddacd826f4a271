"""Embeddings, /pooling, /classify, score and rerank end to end: the real `openai` SDK (and httpx where
it has no method) -> token-guard on loopback -> the vLLM simulator in memory (0.31 profile)."""

from __future__ import annotations

import base64
import struct
from typing import Any

import httpx
import openai
import pytest

from tests.support.polling import eventually
from tests.support.servers import MODEL, InMemorySim

WINDOW = 2048
SYSTEM = {"role": "system", "content": "Be brief."}
TRUNCATE = {"x-token-guard-overflow": "truncate"}


def essay(words: int) -> str:
    return " ".join(f"word{i % 50}" for i in range(words))


def test_embeddings_that_fit_pass_byte_for_byte(oai: openai.OpenAI, sim: InMemorySim) -> None:
    raw = oai.embeddings.with_raw_response.create(model=MODEL, input=["Hello there.", "東京の天気は？"])
    reply = raw.parse()
    assert raw.headers["x-token-guard-action"] == "pass"
    assert int(raw.headers["x-token-guard-prompt-tokens"]) == reply.usage.prompt_tokens > 0
    assert eventually(lambda: sim.tap.bodies[-1] == raw.http_response.content)  # the tap records after the answer
    assert sim.stats.requests[-1]["encoding_format"] == "base64"  # the SDK's default, forwarded as sent
    assert len(reply.data) == 2 and len(reply.data[0].embedding) > 0


def test_float_vectors_and_token_id_inputs(proxy: str) -> None:
    body = {"model": MODEL, "input": [[1, 2, 3], [4, 5]], "encoding_format": "float"}
    response = httpx.post(f"{proxy}/v1/embeddings", json=body)
    assert response.headers["x-token-guard-prompt-tokens"] == "5" == str(response.json()["usage"]["prompt_tokens"])
    assert all(isinstance(x, float) for x in response.json()["data"][0]["embedding"])


def test_an_input_over_the_window_is_refused_without_reaching_vllm(oai: openai.OpenAI, sim: InMemorySim) -> None:
    before = sim.stats.received
    with pytest.raises(openai.BadRequestError) as caught:
        oai.embeddings.create(model=MODEL, input=["short", essay(3000)])
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "context_length_exceeded" and body["param"] == "input"
    assert "maximum context length is 2048 tokens" in body["message"] and "input 2 of 2" in body["message"]
    assert caught.value.response.headers["x-token-guard-action"] == "reject"
    assert sim.stats.received == before


def test_truncate_never_cuts_an_input_into_another(oai: openai.OpenAI, sim: InMemorySim) -> None:
    # the embedding of a cut input is another input's: refused whatever the policy, saying how to ask vLLM's cut
    before = sim.stats.received
    with pytest.raises(openai.BadRequestError) as caught:
        oai.embeddings.create(model=MODEL, input=[essay(3000), "short"], extra_headers=TRUNCATE)
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
    assert "The truncate policy was not applied" in body["message"] and "truncate_prompt_tokens" in body["message"]
    assert sim.stats.received == before
    raw = oai.embeddings.with_raw_response.create(model=MODEL, input=[essay(3000), "short"],
                                                   extra_body={"truncate_prompt_tokens": -1})  # fmt: skip
    assert raw.headers["x-token-guard-action"] == "pass"  # the client's own cut, counted as vLLM makes it
    assert int(raw.headers["x-token-guard-prompt-tokens"]) == raw.parse().usage.prompt_tokens > WINDOW


def test_a_prompt_of_exactly_the_window_fits(proxy: str) -> None:
    response = httpx.post(f"{proxy}/v1/embeddings", json={"model": MODEL, "input": list(range(WINDOW))})
    assert response.status_code == 200 and response.headers["x-token-guard-action"] == "pass"


def test_chunk_is_refused_with_the_reason(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="chunk policy was not applied"):
        oai.embeddings.create(model=MODEL, input=essay(3000), extra_headers={"x-token-guard-overflow": "chunk"})


def test_the_clients_own_truncation_is_counted(proxy: str, sim: InMemorySim) -> None:
    body = {"model": MODEL, "input": essay(3000), "truncate_prompt_tokens": 100}
    response = httpx.post(f"{proxy}/v1/embeddings", json=body)
    assert response.headers["x-token-guard-action"] == "pass"
    assert response.headers["x-token-guard-prompt-tokens"] == "100" == str(response.json()["usage"]["prompt_tokens"])


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/embeddings", {"messages": [SYSTEM, {"role": "user", "content": "Hi"}]}),
        ("/v1/embeddings", {"input": [{"role": "user", "content": "Hi there"}]}),
        ("/v1/embeddings", {"messages": [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b c"}]]}),
        ("/pooling", {"input": "Hello pooling"}),
        ("/classify", {"input": ["one", "two words"]}),
        ("/invocations", {"input": "through SageMaker"}),
        ("/v1/embeddings/", {"input": "a trailing slash"}),
    ],
)
def test_each_form_and_route_is_counted_as_vllm_counts_it(proxy: str, path: str, body: dict[str, Any]) -> None:
    response = httpx.post(f"{proxy}{path}", json={"model": MODEL, **body})
    assert response.status_code == 200, response.text
    assert response.headers["x-token-guard-action"] == "pass"
    assert int(response.headers["x-token-guard-prompt-tokens"]) == response.json()["usage"]["prompt_tokens"]


def test_chat_form_over_the_window_is_refused_under_truncate(proxy: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": essay(3000)}]}
    response = httpx.post(f"{proxy}/v1/embeddings", json=body, headers=TRUNCATE)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank", "/score", "/v1/score"])
def test_score_and_rerank_count_a_lower_bound(proxy: str, path: str) -> None:
    pair = {"query": "hello", "documents": ["a b", "c d e"]} if "rerank" in path else \
        {"text_1": "hello", "text_2": ["a b", "c d e"]}  # fmt: skip
    response = httpx.post(f"{proxy}{path}", json={"model": MODEL, **pair})
    assert response.status_code == 200, response.text
    assert response.headers["x-token-guard-action"] == "partial"
    # the simulator is a bi-encoder, for which the lower bound is exact
    assert int(response.headers["x-token-guard-prompt-tokens"]) == response.json()["usage"]["prompt_tokens"]


def test_a_document_over_the_window_is_refused_unless_the_client_cuts(proxy: str, sim: InMemorySim) -> None:
    body = {"model": MODEL, "query": "hello", "documents": ["short", essay(3000)]}
    before = sim.stats.received
    refused = httpx.post(f"{proxy}/rerank", json=body)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    assert sim.stats.received == before
    also = httpx.post(f"{proxy}/rerank", json=body, headers=TRUNCATE)  # the score of a cut document is another's
    assert also.status_code == 400 and sim.stats.received == before
    asked = httpx.post(f"{proxy}/rerank", json={**body, "truncate_prompt_tokens": -1})
    assert asked.status_code == 200 and sim.stats.requests[-1]["truncate_prompt_tokens"] == -1


def test_metrics_label_the_pooling_endpoints(proxy: str, oai: openai.OpenAI) -> None:
    oai.embeddings.create(model=MODEL, input="hi")
    text = httpx.get(f"{proxy}/metrics").text
    assert 'endpoint="/v1/embeddings"' in text


def test_the_simulator_answers_base64_as_float32(sim: InMemorySim) -> None:
    url = "/v1/embeddings"
    floats = sim.client.post(url, json={"model": MODEL, "input": "x", "encoding_format": "float"}).json()
    packed = sim.client.post(url, json={"model": MODEL, "input": "x", "encoding_format": "base64"}).json()
    raw = base64.b64decode(packed["data"][0]["embedding"])
    decoded = struct.unpack(f"<{len(raw) // 4}f", raw)
    assert decoded == pytest.approx(floats["data"][0]["embedding"], rel=1e-6)


def test_a_plugins_pooling_request_is_forwarded_uncounted(proxy: str, sim: InMemorySim) -> None:
    response = httpx.post(f"{proxy}/pooling", json={"model": MODEL, "data": {"image_url": "x"}})
    assert response.headers["x-token-guard-action"] == "partial" and sim.stats.requests[-1]["data"] == {
        "image_url": "x"
    }
