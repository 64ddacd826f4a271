"""What a keyed request used, read from the end of its answer: usage in each shape vLLM writes, the output events of a
stream that says none, and what stands when nothing says: nothing for a request never handed upstream, the
reservation for one whose client left before its usage came."""

from __future__ import annotations

import json

import pytest

from proxy.policy.usage import TAIL_BYTES, AnswerTail, Charge, TokenEvents
from proxy.settings.sections import KeySettings

KEY = KeySettings("team", "0" * 64, tokens_per_minute=1000)


def charged(*chunks: bytes, forwarded: bool = True, stream: bool = False) -> Charge:
    charge = Charge(KEY, 500, 40)
    if forwarded:
        charge.hand(True)
    if stream:
        charge.tail.events = TokenEvents()
    for chunk in chunks:
        charge.tail.feed(chunk)
    return charge


CHAT = {"choices": [{"message": {"content": 'say "prompt_tokens": 999'}}],
        "usage": {"prompt_tokens": 41, "completion_tokens": 7, "total_tokens": 48,
                  "prompt_tokens_details": {"cached_tokens": 3}}}  # fmt: skip
RESPONSES = {"output": [], "usage": {"input_tokens": 41, "output_tokens": 9,
                                     "output_tokens_details": {"reasoning_tokens": 2}}}  # fmt: skip


# vLLM with --enable-prompt-tokens-details: Anthropic's input_tokens leave out the prompt's cached part
MESSAGES = {"type": "message", "content": [{"type": "text", "text": '"cache_read_input_tokens": 500'}],
            "usage": {"input_tokens": 30, "output_tokens": 5, "cache_creation_input_tokens": 4,
                      "cache_read_input_tokens": 7}}  # fmt: skip


@pytest.mark.parametrize(("answer", "used"), [(CHAT, 48), (RESPONSES, 50), (MESSAGES, 46)])
def test_usage_of_a_json_answer(answer: dict[str, object], used: int) -> None:
    charge = charged(json.dumps(answer).encode())
    assert charge.used(200) == used and charge.unused(200) == 500 - used


def test_the_whole_prompt_of_an_anthropic_answer_with_cached_tokens() -> None:
    assert charged(json.dumps(MESSAGES).encode()).tail.usage() == (41, 5)  # 30 + 4 created + 7 read


def test_usage_event_of_a_stream_after_a_long_answer() -> None:
    text = [b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'] * (TAIL_BYTES // 20)
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":41,"completion_tokens":900}}\n\ndata: [DONE]\n\n'
    assert charged(*text, usage).used(200) == 941


def test_anthropic_stream_gives_output_only_and_the_count_stands_for_input() -> None:
    delta = b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":12}}\n\n'
    assert charged(delta, b"event: message_stop\ndata: {}\n\n").used(200) == 40 + 12


def chunk(delta: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": json.loads(delta), "logprobs": None, "finish_reason": finish}
    event = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


def test_a_chat_stream_without_usage_counts_the_events_that_carry_output() -> None:
    """vLLM's role event carries no token; every later event carries at least one (the last, its finish, too)."""
    events = [chunk('{"role":"assistant","content":""}'), *[chunk('{"content":"x"}')] * 5,
              chunk('{"content":""}', "length"), b"data: [DONE]\n\n"]  # fmt: skip
    assert charged(*events, stream=True).used(200) == 40 + 6


@pytest.mark.parametrize(
    "event",
    [
        b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a",'
        b'"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n',
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":" a",'
        b'"sequence_number":4}\n\n',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
        b'"text":" a"}}\n\n',
        b'data: {"request_id":"r","usage":null,"output_mode":"tokens","choices":[{"index":0,"finish_reason":null,'
        b'"stop_reason":null,"token_ids":[1201],"logprobs":null}],"prompt_token_ids":[1,2]}\n\n',
    ],
    ids=["completions", "responses", "anthropic", "token-in"],
)
def test_each_shape_of_output_event_counts_once(event: bytes) -> None:
    assert charged(event * 3, stream=True).used(200) == 40 + 3


def test_an_event_cut_between_pieces_counts_once_and_a_role_event_never() -> None:
    role, token = chunk('{"role":"assistant","content":""}'), chunk('{"content":"x"}')
    stream = role + token * 3
    for at in range(1, len(stream)):  # every place a piece boundary can fall
        assert charged(stream[:at], stream[at:], stream=True).used(200) == 40 + 3, at
    assert charged(*(stream[i : i + 1] for i in range(len(stream))), stream=True).used(200) == 40 + 3  # bytewise


def test_text_that_looks_like_an_event_inside_a_string_does_not_count() -> None:
    sly = chunk(json.dumps({"content": '"delta":{"content":"x"} "choices":[{"index":0,"text":'}))
    assert charged(chunk('{"role":"assistant"}'), sly, stream=True).used(200) == 40 + 1


def test_what_stands_when_nothing_says() -> None:
    assert charged(forwarded=False).used(None) == 0  # never handed to the upstream
    assert charged(forwarded=False).used(None, gone=True) == 0  # its client left while it queued
    assert charged(b'{"error":{"message":"boom"}}').used(500) == 40  # an error: the input
    assert charged(b'{"id":"x"}').used(200) == 500  # an answer without usage: the reservation


def test_a_client_that_left_before_any_usage_pays_the_reservation() -> None:
    assert charged().used(None, gone=True) == 500  # before the answer's headers
    part_way = charged(chunk('{"role":"assistant"}'), chunk('{"content":"x"}'), stream=True)
    assert part_way.used(200, gone=True) == 500  # part way through a stream: vLLM ran on until it noticed
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":41,"completion_tokens":3}}\n\n'
    assert charged(usage, stream=True).used(200, gone=True) == 44  # after the usage: what it says


def test_a_request_that_reached_no_replica_is_not_handed() -> None:
    charge = charged(forwarded=False)
    charge.hand(True)
    charge.hand(False)  # connection refused: tried elsewhere,
    assert not charge.forwarded and charge.used(None, gone=True) == 0
    charge.hand(True)  # where it went
    assert charge.forwarded and charge.used(502) == 40


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
