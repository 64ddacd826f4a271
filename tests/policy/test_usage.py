"""What a keyed request used, read from the end of its answer: usage in each shape vLLM writes, the stream estimate,
and what stands when nothing says."""

from __future__ import annotations

import json

import pytest

from proxy.policy.usage import TAIL_BYTES, AnswerTail, Charge
from proxy.settings.sections import KeySettings

KEY = KeySettings("team", "0" * 64, tokens_per_minute=1000)


def charged(*chunks: bytes, forwarded: bool = True) -> Charge:
    charge = Charge(KEY, 500, 40, forwarded)
    for chunk in chunks:
        charge.tail.feed(chunk)
    return charge


CHAT = {"choices": [{"message": {"content": 'say "prompt_tokens": 999'}}],
        "usage": {"prompt_tokens": 41, "completion_tokens": 7, "total_tokens": 48,
                  "prompt_tokens_details": {"cached_tokens": 3}}}  # fmt: skip
RESPONSES = {"output": [], "usage": {"input_tokens": 41, "output_tokens": 9,
                                     "output_tokens_details": {"reasoning_tokens": 2}}}  # fmt: skip


@pytest.mark.parametrize(("answer", "used"), [(CHAT, 48), (RESPONSES, 50)])
def test_usage_of_a_json_answer(answer: dict[str, object], used: int) -> None:
    charge = charged(json.dumps(answer).encode())
    assert charge.used(200) == used and charge.unused(200) == 500 - used


def test_usage_event_of_a_stream_after_a_long_answer() -> None:
    text = [b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'] * (TAIL_BYTES // 20)
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":41,"completion_tokens":900}}\n\ndata: [DONE]\n\n'
    assert charged(*text, usage).used(200) == 941


def test_anthropic_stream_gives_output_only_and_the_count_stands_for_input() -> None:
    delta = b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":12}}\n\n'
    assert charged(delta, b"event: message_stop\ndata: {}\n\n").used(200) == 40 + 12


def test_a_stream_without_usage_counts_its_events() -> None:
    events = [b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'] * 5 + [b"data: [DONE]\n\n"]
    assert charged(*events).used(200) == 40 + 6


def test_what_stands_when_nothing_says() -> None:
    assert charged(forwarded=False).used(None) == 0  # never reached the upstream
    assert charged(b'{"error":{"message":"boom"}}').used(500) == 40  # an error: the input
    assert charged(b'{"id":"x"}').used(200) == 500  # an answer without usage: the reservation


def test_the_tail_is_bounded() -> None:
    tail = AnswerTail()
    for _ in range(100):
        tail.feed(b"x" * 1000)
    assert tail.usage() is None and tail._size < TAIL_BYTES + 1000


def test_a_chunked_request_is_settled_by_its_merged_usage() -> None:
    charge = charged()
    assert charge.used(200) == 500  # its merged answer did not end: the reservation stands
    charge.merged = 123
    assert charge.used(200) == 123 and charge.unused(200) == 500 - 123
