"""Through the guard, a 0.34 vLLM's answers reach the client byte for byte as vLLM wrote them: no null
`prompt_tokens_details` or `annotations` brought back, the Responses' prompt-cache echo kept, orjson's floats kept
(docs/vllm-wire-contract.md, section 14), a clamped request's answer included."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.servers import MODEL, Tap, guard, simulator

WINDOW = 2048


@pytest.fixture(scope="module", name="stack")
def fixture_stack(deepseek_dir: Path) -> Iterator[tuple[str, Tap]]:
    with (
        simulator(deepseek_dir, profile="0.34", max_model_len=WINDOW) as (sim, _, tap),
        guard(sim.url, deepseek_dir) as proxy,
    ):
        yield proxy.url, tap


@pytest.fixture(name="oai")
def fixture_oai(stack: tuple[str, Tap]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{stack[0]}/v1", api_key="unused", max_retries=0, timeout=60) as client:
        yield client


def _vllm_wrote(tap: Tap, since: int) -> bytes:
    """The one generation or pooling answer the simulator wrote since `since` (the guard's own probes aside); the
    tap records it once the simulator's send returns, which can be after the client has read it."""
    for _ in range(200):
        answers = [body for body in tap.bodies[since:] if body.startswith((b'{"id"', b"data: ", b"event: "))]
        if answers:
            break
        time.sleep(0.025)
    assert len(answers) == 1, answers
    return answers[0]


def test_chat_answer_is_vllms(oai: openai.OpenAI, stack: tuple[str, Tap]) -> None:
    since = len(stack[1].bodies)
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4
    )
    assert raw.content == _vllm_wrote(stack[1], since)
    body = json.loads(raw.content)
    assert "prompt_tokens_details" not in body["usage"] and "annotations" not in body["choices"][0]["message"]
    usage = raw.parse().usage
    assert usage is not None and usage.prompt_tokens_details is None


def test_clamped_chat_answer_is_vllms(oai: openai.OpenAI, stack: tuple[str, Tap]) -> None:
    """The guard lowers max_tokens to what the window holds; the answer stays vLLM's own."""
    since = len(stack[1].bodies)
    raw = oai.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=WINDOW * 4
    )
    assert raw.headers["x-token-guard-action"] == "clamp"
    assert raw.content == _vllm_wrote(stack[1], since)
    usage = json.loads(raw.content)["usage"]
    assert "prompt_tokens_details" not in usage and usage["total_tokens"] == WINDOW


def test_completion_and_its_stream_are_vllms(oai: openai.OpenAI, stack: tuple[str, Tap]) -> None:
    since = len(stack[1].bodies)
    raw = oai.completions.with_raw_response.create(model=MODEL, prompt="Hello", max_tokens=WINDOW * 4)
    assert raw.content == _vllm_wrote(stack[1], since)
    assert "prompt_tokens_details" not in json.loads(raw.content)["usage"]
    since = len(stack[1].bodies)
    with oai.completions.with_streaming_response.create(
        model=MODEL, prompt="Hello", max_tokens=3, stream=True, stream_options={"include_usage": True}
    ) as streamed:
        text = b"".join(streamed.iter_bytes())
    assert text == _vllm_wrote(stack[1], since)


def test_responses_prompt_cache_echo_is_vllms(oai: openai.OpenAI, stack: tuple[str, Tap]) -> None:
    since = len(stack[1].bodies)
    raw = oai.responses.with_raw_response.create(
        model=MODEL, input="Hello", max_output_tokens=4, prompt_cache_key="user-7", safety_identifier="hash-42",
        prompt_cache_retention="in_memory",
    )  # fmt: skip
    assert raw.content == _vllm_wrote(stack[1], since)
    response = raw.parse()
    assert (response.prompt_cache_key, response.safety_identifier) == ("user-7", "hash-42")
    assert response.prompt_cache_retention == "in_memory"


def test_embeddings_keep_orjsons_float32_digits(oai: openai.OpenAI, stack: tuple[str, Tap]) -> None:
    since = len(stack[1].bodies)
    raw = oai.embeddings.with_raw_response.create(model=MODEL, input=["Hello", "world"], encoding_format="float")
    assert raw.content == _vllm_wrote(stack[1], since)
    vectors: list[Any] = [item.embedding for item in raw.parse().data]
    assert all(len(repr(value).lstrip("-0.")) <= 12 for vector in vectors for value in vector)


def test_pooling_keeps_orjsons_floats(stack: tuple[str, Tap]) -> None:
    since = len(stack[1].bodies)
    answer = httpx.post(f"{stack[0]}/pooling", json={"model": MODEL, "input": "tree sun dog hello 196"}, timeout=60)
    assert answer.status_code == 200
    assert answer.content == _vllm_wrote(stack[1], since)
    assert b"0.0000" in answer.content and b"e-05" not in answer.content  # a value under 1e-4, as orjson writes it


def test_chunked_chat_merged_answer_keeps_vllms_keys(stack: tuple[str, Tap]) -> None:
    """The guard writes a chunked request's answer itself; it keeps the keys 0.34 left out left out."""
    since = len(stack[1].bodies)
    with openai.OpenAI(base_url=f"{stack[0]}/v1", api_key="unused", max_retries=0, timeout=120,
                       default_headers={"x-token-guard-overflow": "chunk"}) as client:  # fmt: skip
        messages: Any = [{"role": "user", "content": "Summarise. " + "the cat sat on the mat. " * 900}]
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=16)
    assert raw.headers["x-token-guard-action"] == "chunk"
    merged = json.loads(raw.content)
    for _ in range(200):  # the last chunk's answer is recorded once the simulator's send returns
        chunks = [json.loads(body) for body in stack[1].bodies[since:] if body.startswith(b'{"id"')]
        if len(chunks) == int(raw.headers["x-token-guard-chunks"]):
            break
        time.sleep(0.025)
    last = chunks[-1]
    assert list(merged) == list(last) and list(merged["usage"]) == list(last["usage"])
    assert list(merged["choices"][0]["message"]) == list(last["choices"][0]["message"])
    assert "prompt_tokens_details" not in merged["usage"] and "annotations" not in merged["choices"][0]["message"]
    assert merged["usage"]["prompt_tokens"] == sum(chunk["usage"]["prompt_tokens"] for chunk in chunks)
