"""Each release's answer shapes, as the simulator's profiles write them (docs/vllm-wire-contract.md, section 14):
0.32 keeps its own, 0.33 and 0.34 write what their released sources write."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.upstream.admission import kv_capacity
from simulator import SimulatorSettings
from tests.support.sim_fixtures import RunningSim, fixture_sim_tokenizer_dir, running_simulator, sse_json  # noqa: F401

HELLO = [{"role": "user", "content": "Hello"}]
KV_TOKENS = 4096
# a /pooling prompt one of whose vector's values is under 1e-4 (3.9e-05): Python writes it 3.8652...e-05
SMALL_VALUE_PROMPT = "tree sun dog hello 196"


@pytest.fixture(scope="module", name="sims")
def fixture_sims(sim_tokenizer_dir: Path) -> Iterator[dict[str, RunningSim]]:
    started: dict[str, RunningSim] = {}
    contexts = []
    try:
        for profile in ("0.32", "0.33", "0.34"):
            settings = SimulatorSettings(tokenizer=sim_tokenizer_dir, profile=profile, kv_capacity_tokens=KV_TOKENS)
            context = running_simulator(settings)
            started[profile] = context.__enter__()
            contexts.append(context)
        yield started
    finally:
        for context in reversed(contexts):
            context.__exit__(None, None, None)


def _raw(sim: RunningSim, path: str, body: dict[str, Any]) -> str:
    response = sim.client.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.text


@pytest.mark.parametrize(("profile", "omitted"), [("0.32", False), ("0.33", False), ("0.34", True)])
def test_null_prompt_tokens_details_and_annotations(sims: dict[str, RunningSim], profile: str, omitted: bool) -> None:
    """0.34's UsageInfo and ChatMessage exclude a null prompt_tokens_details and annotations; before, both are null."""
    sim = sims[profile]
    chat = json.loads(_raw(sim, "/v1/chat/completions", {"messages": HELLO, "max_tokens": 3}))
    completion = json.loads(_raw(sim, "/v1/completions", {"prompt": "Hello", "max_tokens": 3}))
    embedding = json.loads(_raw(sim, "/v1/embeddings", {"input": "Hello"}))
    message = chat["choices"][0]["message"]
    assert ("annotations" not in message) is omitted
    assert list(message)[:3] == ["role", "content", "refusal"]
    for usage in (chat["usage"], completion["usage"], embedding["usage"]):
        assert ("prompt_tokens_details" not in usage) is omitted
        assert usage["completion_tokens_details"] is None  # still written, null
        if not omitted:
            assert usage["prompt_tokens_details"] is None


@pytest.mark.parametrize(("profile", "omitted"), [("0.33", False), ("0.34", True)])
def test_generate_usage_null_details(sims: dict[str, RunningSim], profile: str, omitted: bool) -> None:
    body = {"token_ids": [1, 2, 3, 4], "sampling_params": {"max_tokens": 3}}
    usage = json.loads(_raw(sims[profile], "/inference/v1/generate", body))["usage"]
    assert ("prompt_tokens_details" not in usage) is omitted and usage["completion_tokens"] == 3


@pytest.mark.parametrize("profile", ["0.32", "0.33", "0.34"])
def test_stream_usage_chunk_never_carries_null_details(sims: dict[str, RunningSim], profile: str) -> None:
    body = {"messages": HELLO, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_json(_raw(sims[profile], "/v1/chat/completions", body))
    assert events[-1]["choices"] == []
    assert list(events[-1]["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]


CACHE_REQUEST = {
    "input": "Hello", "max_output_tokens": 3, "prompt_cache_key": "user-7", "safety_identifier": "hash-42",
    "prompt_cache_retention": "in-memory", "prompt_cache_options": {"mode": "explicit", "prewarm": True},
}  # fmt: skip
CACHE_ECHO = {
    "prompt_cache_options": {"mode": "explicit", "ttl": "30m", "comparison_response_id": None},
    "prompt_cache_key": "user-7", "prompt_cache_retention": "in_memory", "safety_identifier": "hash-42",
}  # fmt: skip


@pytest.mark.parametrize(("profile", "echoes"), [("0.32", False), ("0.33", True), ("0.34", True)])
def test_responses_echo_prompt_cache_fields(sims: dict[str, RunningSim], profile: str, echoes: bool) -> None:
    """0.33's ResponsesResponse echoes four more request fields, between `prompt` and `service_tier`."""
    sim = sims[profile]
    whole = json.loads(_raw(sim, "/v1/responses", CACHE_REQUEST))
    events = sse_json_named(_raw(sim, "/v1/responses", {**CACHE_REQUEST, "stream": True}))
    for answer in (whole, events[0]["response"], events[-1]["response"]):
        keys = list(answer)
        between = keys[keys.index("prompt") + 1 : keys.index("service_tier")]
        if echoes:
            assert between == ["prompt_cache_options", "prompt_cache_key", "prompt_cache_retention", "reasoning",
                               "safety_identifier"]  # fmt: skip
            assert {key: answer[key] for key in CACHE_ECHO} == CACHE_ECHO
        else:
            assert between == ["reasoning"]


def test_responses_echo_nulls_when_not_asked(sims: dict[str, RunningSim]) -> None:
    whole = json.loads(_raw(sims["0.34"], "/v1/responses", {"input": "Hello", "max_output_tokens": 3}))
    assert {key: whole[key] for key in CACHE_ECHO} == dict.fromkeys(CACHE_ECHO)


def sse_json_named(body: str) -> list[dict[str, Any]]:
    """A Responses stream's payloads (`event: name` / `data: {...}` blocks)."""
    return [json.loads(line[len("data: ") :]) for line in body.splitlines() if line.startswith("data: ")]


def test_033_embeddings_are_orjson_float32(sims: dict[str, RunningSim]) -> None:
    """0.33 writes /v1/embeddings with orjson from a float32 ndarray; 0.32 with starlette's json.dumps."""
    orjson = pytest.importorskip("orjson")
    numpy = pytest.importorskip("numpy")
    for profile in ("0.33", "0.34"):
        raw = _raw(sims[profile], "/v1/embeddings", {"input": ["Hello", "world"]})
        answer = json.loads(raw)
        arrays = [numpy.array(item["embedding"], dtype=numpy.float32) for item in answer["data"]]
        expected = {**answer, "data": [{**item, "embedding": arrays[i]} for i, item in enumerate(answer["data"])]}
        assert raw.encode() == orjson.dumps(expected, option=orjson.OPT_SERIALIZE_NUMPY)
        assert all(len(repr(value).replace("-", "").lstrip("0.")) <= 12 for value in answer["data"][0]["embedding"])
    raw = _raw(sims["0.32"], "/v1/embeddings", {"input": ["Hello", "world"]})
    assert raw == json.dumps(json.loads(raw), ensure_ascii=False, separators=(",", ":"))
    assert any(len(repr(value)) > 14 for value in json.loads(raw)["data"][0]["embedding"])  # float64 digits


def test_033_pooling_floats_print_as_orjson(sims: dict[str, RunningSim]) -> None:
    orjson = pytest.importorskip("orjson")
    old = _raw(sims["0.32"], "/pooling", {"input": SMALL_VALUE_PROMPT})
    assert "e-05" in old and old == json.dumps(json.loads(old), ensure_ascii=False, separators=(",", ":"))
    for profile in ("0.33", "0.34"):
        raw = _raw(sims[profile], "/pooling", {"input": SMALL_VALUE_PROMPT})
        assert "e-05" not in raw and "0.0000" in raw
        assert raw.encode() == orjson.dumps(json.loads(raw))


def test_classify_stays_on_json_response(sims: dict[str, RunningSim]) -> None:
    raw = _raw(sims["0.34"], "/classify", {"input": "Hello"})
    assert raw == json.dumps(json.loads(raw), ensure_ascii=False, separators=(",", ":"))


NEW_034 = ["enable_extensible_kv_cache", "_extensible_kv_cache_resolved"]


@pytest.mark.parametrize("profile", ["0.32", "0.33", "0.34"])
def test_cache_config_info(sims: dict[str, RunningSim], profile: str) -> None:
    """vllm:cache_config_info: CacheConfig.metrics_info() of each release, and the guard's parser reads it."""
    response = sims[profile].client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    line = next(row for row in response.text.splitlines() if row.startswith("vllm:cache_config_info{"))
    labels = dict(pair.split("=", 1) for pair in line[line.index("{") + 1 : line.rindex("}")].split(","))
    assert labels["engine"] == '"0"' and list(labels)[-1] == "engine"
    assert ("simple_cpu_offload_num_blocks" in labels) is (profile != "0.32")
    assert all((name in labels) is (profile == "0.34") for name in NEW_034)
    assert labels["gpu_memory_utilization"] == ('"None"' if profile == "0.34" else '"0.92"')
    assert kv_capacity(response.text) == KV_TOKENS
