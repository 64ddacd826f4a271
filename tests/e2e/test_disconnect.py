"""A client that goes away makes vLLM stop generating: the guard closes its upstream request, vLLM aborts.

vLLM 0.31/0.32 do not count client aborts in `vllm:request_success_total{finished_reason="abort"}`, so the proof
is the generation counter: it stops far short of max_tokens, and the running-requests gauge drops to 0.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.e2e.stack import Stack
from tests.e2e.wire import metric, wait_until

pytestmark = pytest.mark.e2e

MAX_TOKENS = 2000  # about 8 s of decoding: an abort shows as a much smaller count, well before that
MESSAGES: list[Any] = [{"role": "user", "content": "Write a very long essay."}]


def running(stack: Stack) -> float:
    return metric(stack.metrics(), "vllm:num_requests_running")


def generated(stack: Stack) -> float:
    return metric(stack.metrics(), "vllm:generation_tokens_total")


def assert_aborted(stack: Stack, before: float) -> None:
    assert wait_until(lambda: running(stack) == 0, timeout=5), "vLLM still generating 5 s after the disconnect"
    stopped_at = generated(stack)
    assert 0 < stopped_at - before < MAX_TOKENS / 2
    assert not wait_until(lambda: generated(stack) > stopped_at, timeout=1)


def test_stream_disconnect_aborts_generation(stack: Stack) -> None:
    before = generated(stack)
    with stack.guarded.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True
    ) as stream:
        for index, _ in enumerate(stream):
            if index == 5:
                break
        assert running(stack) == 1
    assert_aborted(stack, before)


def test_non_streaming_disconnect_aborts_generation(stack: Stack) -> None:
    before = generated(stack)
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0}
    with httpx.Client(timeout=httpx.Timeout(120, read=1.0)) as client, pytest.raises(httpx.ReadTimeout):
        client.post(stack.proxy_url + "/v1/chat/completions", json=body)
    assert_aborted(stack, before)
