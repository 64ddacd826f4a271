"""A client that goes away makes vLLM stop generating: the guard hangs up on vLLM, and vLLM aborts.

Two checks per attempt. The guard's own part, strictly: the recording relay sees it close the upstream connection
within a few seconds of the client leaving. The outcome in vLLM: the request leaves the running gauge without
finishing ("stop" or "length"; 0.31/0.32 do not count client aborts in `finished_reason="abort"`) and the
generation counter stops short of max_tokens. How far short varies: under load vLLM's engine runs hundreds of
tokens ahead of its API server, and a non-streaming request is only aborted once vLLM's event loop gets round to
the closed socket, seconds later on a busy machine (also without the guard).

An attempt that cannot tell (vLLM was not mid-generation when the client left, or finished before its own abort
caught up) is repeated rather than counted either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.e2e.recorder import Mark
from tests.e2e.stack import Stack
from tests.e2e.wire import metric
from tests.support.polling import eventually

pytestmark = pytest.mark.e2e

MAX_TOKENS = 2000  # about 8 s of decoding, far longer than an abort takes
MESSAGES: list[Any] = [{"role": "user", "content": "Write a very long essay."}]
ATTEMPTS = 3
GUARD_CLOSE_S = 5  # usually well under 1 s; a loaded 2-core machine has shown 3 s


def running(stack: Stack) -> float:
    return metric(stack.metrics(), "vllm:num_requests_running")


def counters(stack: Stack) -> tuple[float, float]:
    """(requests finished by vLLM itself, tokens generated)."""
    text = stack.metrics()
    finished = sum(metric(text, "vllm:request_success_total", finished_reason=reason) for reason in ("stop", "length"))
    return finished, metric(text, "vllm:generation_tokens_total")


def settled(stack: Stack) -> tuple[float, float]:
    assert eventually(lambda: running(stack) == 0, timeout_s=15), "vLLM still generating 15 s after the disconnect"
    time.sleep(0.5)  # the counters are published a moment after the gauge
    return counters(stack)


def assert_guard_hung_up(stack: Stack, mark: Mark) -> None:
    left = time.monotonic()
    if eventually(lambda: stack.recorder.closed_by_guard_since(mark) > 0, timeout_s=GUARD_CLOSE_S):
        return
    late = eventually(lambda: stack.recorder.closed_by_guard_since(mark) > 0, timeout_s=20)
    after = f"only after {time.monotonic() - left:.1f} s" if late else "not within 20 s"
    pytest.fail(f"the client left; the guard closed its connection to vLLM {after} (allowed: {GUARD_CLOSE_S} s)")


def assert_disconnect_aborts(stack: Stack, leave_early: Callable[[], bool]) -> None:
    """`leave_early` starts a long generation through the guard and goes away; False if vLLM was not mid-way."""
    inconclusive: list[str] = []
    for _ in range(ATTEMPTS):
        before, mark = counters(stack), stack.recorder.mark()
        in_time = leave_early() and stack.recorder.sent_since(mark)
        if in_time:
            assert_guard_hung_up(stack, mark)
        finished, generated = settled(stack)
        if not in_time or generated == before[1]:
            inconclusive.append("vLLM was not mid-generation when the client left")
        elif finished != before[0]:
            inconclusive.append("the guard hung up, but vLLM finished before noticing")
        else:
            assert generated - before[1] < MAX_TOKENS
            time.sleep(1)
            assert counters(stack)[1] == generated, "tokens still being generated after the abort"
            return
    pytest.fail(f"no attempt showed an abort: {inconclusive}")


def test_stream_disconnect_aborts_generation(stack: Stack) -> None:
    def leave_early() -> bool:
        before = counters(stack)[1]
        with stack.guarded.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, stream=True
        ) as stream:
            for index, _ in enumerate(stream):
                if index == 2:
                    break
            # Still running, with most of the answer to go: what follows can only end by an abort.
            return running(stack) == 1 and counters(stack)[1] - before < MAX_TOKENS / 2

    assert_disconnect_aborts(stack, leave_early)


def test_non_streaming_disconnect_aborts_generation(stack: Stack) -> None:
    def leave_early() -> bool:
        body = {"model": "tiny", "messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0}
        with httpx.Client(timeout=httpx.Timeout(120, read=1.0)) as client, pytest.raises(httpx.ReadTimeout):
            client.post(stack.proxy_url + "/v1/chat/completions", json=body)
        return True  # 2000 tokens never finish within 1 s; whether the request got to vLLM is checked after

    assert_disconnect_aborts(stack, leave_early)
