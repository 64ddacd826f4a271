"""The largest bodies the guard accepts (just under the 32 MiB default max_body_bytes) cost bounded memory: a prompt
whose size alone proves it cannot fit is refused from that size, without being rendered or encoded; one that is
truncated is counted in slices and encoded with offsets only at its ends. The guard runs in a process of its own, so
its peak memory (VmHWM) is its own."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.processes import Stack, guard_and_simulator, rss_mb
from tests.support.servers import MODEL

CHAT = "/v1/chat/completions"
PEAK_MB = 600  # the guard's documented ceiling for one largest request
AFTER_MB = 250  # what it may keep afterwards


@pytest.fixture(scope="module")
def stack(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with guard_and_simulator(deepseek_dir, tmp_path_factory.mktemp("big")) as running:
        yield running


def varied_words(megabytes: float, seed: int) -> str:
    """Text of fresh words (no cache helps): every word drawn from 50,000 random ones."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(50_000)]
    return " ".join(rng.choice(words) for _ in range(int(megabytes * 2**20 / 6.5)))


def post(stack: Stack, text: str, **headers: str) -> httpx.Response:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 10}).encode()
    return httpx.post(stack.url + CHAT, content=body, timeout=300,
                      headers={"content-type": "application/json", **headers})  # fmt: skip


def test_a_31_mb_prompt_is_refused_from_its_size_in_bounded_memory(stack: Stack) -> None:
    response = post(stack, varied_words(31, seed=1))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "However, your request has at least " in error["message"]
    assert response.headers["x-token-guard-action"] == "reject"
    assert response.headers["x-token-guard-count-source"] == "size"  # a floor, not a count
    assert int(response.headers["x-token-guard-prompt-tokens"]) > 2048
    assert rss_mb(stack.guard_pid, "VmHWM") < PEAK_MB
    assert rss_mb(stack.guard_pid) < AFTER_MB


def test_a_31_mb_prompt_is_not_chunked_once_counting_its_start_proves_it_needs_too_many_parts(stack: Stack) -> None:
    # This vocabulary has tokens of up to 256 bytes: the size floor alone proves the prompt over the window but not
    # over 64 parts; counting the text's start until it passes 64 x 2048 tokens does, without counting all of it.
    response = post(stack, varied_words(31, seed=3), **{"x-token-guard-overflow": "chunk"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "However, your request has at least " in error["message"]
    assert "The chunk policy was not applied: the prompt would take more than 64 parts" in error["message"]
    assert response.headers["x-token-guard-count-source"] == "size"
    assert int(response.headers["x-token-guard-prompt-tokens"]) > 64 * 2048
    assert rss_mb(stack.guard_pid, "VmHWM") < PEAK_MB


def test_a_3_mb_prompt_is_truncated_exactly_in_bounded_memory(stack: Stack) -> None:
    response = post(stack, varied_words(3, seed=2), **{"x-token-guard-overflow": "truncate"})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert response.headers["x-token-guard-action"] == "truncate"
    assert int(response.headers["x-token-guard-prompt-tokens"]) == usage["prompt_tokens"]
    assert usage["prompt_tokens"] + 10 <= 2048
    assert rss_mb(stack.guard_pid, "VmHWM") < PEAK_MB
