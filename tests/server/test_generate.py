"""Token-in generation end to end: httpx -> token-guard on loopback -> the simulator in memory: the token ids are the
count, sampling_params.max_tokens is clamped in place, a prompt of the window is refused before it reaches vLLM."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.polling import eventually
from tests.support.servers import MODEL, InMemorySim

PATH = "/inference/v1/generate"
WINDOW = 2048


def generate(proxy: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{proxy}{PATH}", json={"model": MODEL, **body}, timeout=30)


def test_the_token_ids_are_the_count_and_a_fitting_request_goes_as_sent(proxy: str, sim: InMemorySim) -> None:
    body = {"model": MODEL, "token_ids": [19923, 2058, 14], "sampling_params": {"max_tokens": 4, "n": 2},
            "return_token_ids": True}  # fmt: skip
    raw = json.dumps(body, separators=(", ", ": ")).encode()  # spacing the guard would not write: bytes kept
    response = httpx.post(f"{proxy}{PATH}", content=raw, headers={"content-type": "application/json"})
    usage = response.json()["usage"]
    assert response.status_code == 200 and response.headers["x-token-guard-action"] == "pass"
    assert response.headers["x-token-guard-prompt-tokens"] == "3" == str(usage["prompt_tokens"])
    assert response.headers["x-token-guard-count-source"] == "local" and usage["completion_tokens"] == 8
    assert sim.stats.requests[-1] == body


def test_max_tokens_over_the_room_is_clamped_inside_sampling_params(proxy: str, sim: InMemorySim) -> None:
    sampling = {"max_tokens": 100, "min_tokens": 50, "temperature": 0.7}
    response = generate(proxy, {"token_ids": [7] * (WINDOW - 20), "sampling_params": sampling, "request_id": "mine"})
    assert response.status_code == 200 and response.headers["x-token-guard-action"] == "clamp"
    assert response.headers["x-token-guard-max-tokens"] == "20" and response.json()["usage"]["completion_tokens"] == 20
    forwarded = sim.stats.requests[-1]
    assert forwarded["sampling_params"] == {"max_tokens": 20, "min_tokens": 20, "temperature": 0.7}
    assert forwarded["request_id"] == "mine"


def test_a_prompt_of_the_window_is_refused_without_reaching_vllm(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    response = generate(proxy, {"token_ids": [7] * WINDOW, "sampling_params": {"max_tokens": 1}})
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded" and error["param"] == "token_ids"
    assert "your request has 2048 input tokens" in error["message"] and sim.stats.received == before


def test_a_stream_passes_byte_for_byte(proxy: str, sim: InMemorySim) -> None:
    body = {"model": MODEL, "token_ids": [5, 6], "sampling_params": {"max_tokens": 3}, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{proxy}{PATH}", json=body) as response:
        received = b"".join(response.iter_bytes())
        assert response.headers["x-token-guard-max-tokens"] == "3"
    assert received.endswith(b"data: [DONE]\n\n") and b'"completion_tokens":3' in received
    assert eventually(lambda: sim.tap.bodies[-1] == received)


def test_media_parts_are_partial_and_not_clamped(proxy: str, sim: InMemorySim) -> None:
    parts = [{"type": "image_url", "url": "https://example.com/cat.png"}]
    response = generate(proxy, {"token_ids": [7] * 10, "sampling_params": {"max_tokens": 5000}, "content_parts": parts})
    assert (
        response.headers["x-token-guard-action"] == "partial"
        and response.headers["x-token-guard-prompt-tokens"] == "10"
    )
    assert sim.stats.requests[-1]["sampling_params"] == {"max_tokens": 5000}


@pytest.mark.parametrize(
    "body",
    [{"token_ids": [], "sampling_params": {}}, {"token_ids": [1, -1], "sampling_params": {}}, {"token_ids": [1]},
     {"token_ids": [1], "sampling_params": {"max_tokens": "x"}}],
)  # fmt: skip
def test_malformed_requests_are_400s_before_vllm(proxy: str, sim: InMemorySim, body: dict[str, Any]) -> None:
    before = sim.stats.received
    assert generate(proxy, body).status_code == 400 and sim.stats.received == before
