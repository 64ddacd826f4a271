"""Embeddings, score and rerank against a real vLLM 0.32.0 serving the tiny model as an embedding model
(`--runner pooling --convert embed`), with the real `openai` SDK: the guard's count equals vLLM's
`usage.prompt_tokens` on a corpus of input forms, an input over the window is refused without reaching vLLM, and
truncate never cuts one (the client's own truncate_prompt_tokens is counted); Cohere's /v2/embed is counted as vLLM
bills it (`meta.billed_units`).

One version only, in a stack of its own started for this module and stopped after it (about 50 s of `make e2e`, most
of it vLLM's start-up): the pooling code of 0.31.0 and 0.32.0 is the same apart from the wording of the 400 (read in
their sources; this module also passed against 0.31.0 with VERSION changed), and a second pooling vLLM would add as
much again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e import runtime
from tests.e2e.runtime import MAX_MODEL_LEN, SERVED_NAME
from tests.e2e.wire import GUARD_ACTION, GUARD_PROMPT, metric, words

pytestmark = pytest.mark.e2e
VERSION = "0.32.0"
TRUNCATE = {"x-token-guard-overflow": "truncate"}
HI = [{"role": "user", "content": "Hello there"}]


class Pooling:
    def __init__(self, vllm: str, proxy: str) -> None:
        self.vllm, self.proxy = vllm, proxy
        self.http = httpx.Client(timeout=120)
        self.guarded = openai.OpenAI(base_url=proxy + "/v1", api_key="x", max_retries=0, timeout=120)
        self.direct = openai.OpenAI(base_url=vllm + "/v1", api_key="x", max_retries=0, timeout=120)

    def seen(self, route: str) -> float:
        time.sleep(0.5)  # vLLM counts a request once its response is sent, a moment after the client has it
        return metric(self.http.get(self.vllm + "/metrics").text, "http_requests_total", handler=route)


@pytest.fixture(scope="module", params=[VERSION])
def pooling(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pooling]:
    workdir: Path = tmp_path_factory.mktemp("pooling")
    model_dir = runtime.tiny_model(runtime.vllm_venv(min(runtime.VERSIONS)) / "bin" / "python")
    extra = ["--runner", "pooling", "--convert", "embed"]
    vllm = runtime.start_vllm(runtime.vllm_venv(request.param), model_dir, workdir / "vllm", extra)
    proxy = None
    try:
        proxy = runtime.start_proxy(vllm.url, model_dir, workdir / "guard")  # it waits for vLLM itself
        vllm.wait_ready("/v1/models", 240)
        proxy.wait_ready("/health", 60)
        stack = Pooling(vllm.url, proxy.url)
        yield stack
        stack.http.close()
    finally:
        for process in (proxy, vllm):
            if process is not None:
                process.stop()


@pytest.mark.parametrize(
    "body",
    [
        {"input": "Hello world, this is a test."},
        {"input": ["東京の天気は？ 🌧️", "short", words(300)]},
        {"input": [[1, 2, 3], [40, 50]]},
        {"messages": [{"role": "system", "content": "Be brief."}, *HI]},
        {"messages": HI, "add_generation_prompt": True},
        {"input": [HI, [*HI, {"role": "assistant", "content": "Hi!"}]]},
    ],
    ids=["string", "strings", "token ids", "chat", "chat + generation prompt", "batch of chats"],
)
def test_the_guards_count_is_what_vllm_charges(pooling: Pooling, body: dict[str, Any]) -> None:
    response = pooling.http.post(pooling.proxy + "/v1/embeddings", json={"model": SERVED_NAME, **body})
    assert response.status_code == 200, response.text
    assert response.headers[GUARD_ACTION] == "pass"
    assert int(response.headers[GUARD_PROMPT]) == response.json()["usage"]["prompt_tokens"]


def test_the_sdk_passes_through_and_score_and_rerank_are_counted(pooling: Pooling) -> None:
    raw = pooling.guarded.embeddings.with_raw_response.create(model=SERVED_NAME, input=["one", "two words"])
    assert int(raw.headers[GUARD_PROMPT]) == raw.parse().usage.prompt_tokens
    for path, pair in (("/rerank", {"query": "hello", "documents": ["a b", "c d e"]}),
                       ("/score", {"text_1": "hello", "text_2": ["a b", "c d e"]})):  # fmt: skip
        response = pooling.http.post(pooling.proxy + path, json={"model": SERVED_NAME, **pair})
        assert response.status_code == 200, response.text
        assert response.headers[GUARD_ACTION] == "partial"  # a bi-encoder here: the lower bound is exact
        assert int(response.headers[GUARD_PROMPT]) == response.json()["usage"]["prompt_tokens"]


def test_truncate_never_cuts_an_input_and_the_clients_own_cut_is_counted(pooling: Pooling) -> None:
    too_long = words(3000)
    with pytest.raises(openai.BadRequestError, match="maximum context length is 2048"):
        pooling.direct.embeddings.create(model=SERVED_NAME, input=too_long)
    before = pooling.seen("/v1/embeddings")
    with pytest.raises(openai.BadRequestError, match="The truncate policy was not applied"):
        pooling.guarded.embeddings.create(model=SERVED_NAME, input=[too_long, "short"], extra_headers=TRUNCATE)
    assert pooling.seen("/v1/embeddings") == before
    raw = pooling.guarded.embeddings.with_raw_response.create(
        model=SERVED_NAME, input=[too_long, "short"], extra_body={"truncate_prompt_tokens": -1}
    )
    assert raw.headers[GUARD_ACTION] == "pass"
    assert int(raw.headers[GUARD_PROMPT]) == raw.parse().usage.prompt_tokens > MAX_MODEL_LEN
    chat = {"model": SERVED_NAME, "messages": [{"role": "user", "content": too_long}], "truncate_prompt_tokens": -1}
    cut = pooling.http.post(pooling.proxy + "/v1/embeddings", json=chat)
    assert cut.status_code == 200 and cut.json()["usage"]["prompt_tokens"] == MAX_MODEL_LEN


def test_over_the_window_is_refused_without_reaching_vllm(pooling: Pooling) -> None:
    before = pooling.seen("/v1/embeddings")
    with pytest.raises(openai.BadRequestError) as caught:
        pooling.guarded.embeddings.create(model=SERVED_NAME, input=["short", words(2049)])
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
    assert "contains 2049 input tokens" in body["message"]
    exactly = pooling.guarded.embeddings.with_raw_response.create(model=SERVED_NAME, input=[words(2048)])
    assert exactly.headers[GUARD_ACTION] == "pass" and exactly.parse().usage.prompt_tokens == MAX_MODEL_LEN
    assert pooling.seen("/v1/embeddings") == before + 1  # only the one that fits


# --- Cohere's /v2/embed ------------------------------------------------------------------------------------------

TWO_PARTS = [{"content": [{"type": "text", "text": "Hello there"}, {"type": "text", "text": "and more"}]}]


@pytest.mark.parametrize(
    "body",
    [
        {"texts": ["Hello world, this is a test.", "東京の天気は？ 🌧️", words(300)]},
        {"inputs": TWO_PARTS},
        {"texts": [words(3000), "short"]},  # truncate END by default: vLLM keeps the first 2048
        {"texts": [words(3000)], "truncate": "START", "max_tokens": 100},
        {"texts": [words(50)], "truncate": "NONE", "max_tokens": 50},
    ],
    ids=["texts", "text inputs", "END to the window", "START to max_tokens", "NONE within max_tokens"],
)
def test_cohere_embed_is_counted_as_vllm_bills_it(pooling: Pooling, body: dict[str, Any]) -> None:
    response = pooling.http.post(pooling.proxy + "/v2/embed", json={"model": SERVED_NAME, **body})
    assert response.status_code == 200, response.text
    assert response.headers[GUARD_ACTION] == "pass"
    assert int(response.headers[GUARD_PROMPT]) == response.json()["meta"]["billed_units"]["input_tokens"]


def test_cohere_none_is_refused_before_vllm_whatever_the_policy(pooling: Pooling) -> None:
    before = pooling.seen("/v2/embed")
    over_body = {"model": SERVED_NAME, "texts": ["a", words(3000)], "truncate": "NONE"}
    over = pooling.http.post(pooling.proxy + "/v2/embed", json=over_body)
    assert over.status_code == 400, over.text
    assert over.json()["error"]["code"] == "context_length_exceeded"
    capped = {"model": SERVED_NAME, "texts": [words(60)], "truncate": "NONE", "max_tokens": 50}
    direct = pooling.http.post(pooling.vllm + "/v2/embed", json=capped)  # vLLM refuses it once it has embedded it
    assert direct.status_code == 400 and "Input of 60 tokens exceeds max_tokens=50" in direct.text
    guarded = pooling.http.post(pooling.proxy + "/v2/embed", json=capped)
    assert guarded.status_code == 400 and guarded.json()["error"]["message"] == direct.json()["error"]["message"]
    assert pooling.seen("/v2/embed") == before + 1  # only the direct one
    none_body = {"model": SERVED_NAME, "texts": [words(3000)], "truncate": "NONE"}
    refused = pooling.http.post(pooling.proxy + "/v2/embed", json=none_body, headers=TRUNCATE)  # NONE: not to be cut
    assert refused.status_code == 400 and "send truncate (END or START)" in refused.json()["error"]["message"]
    assert pooling.seen("/v2/embed") == before + 1
