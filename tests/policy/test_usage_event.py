"""The usage event the guard asks vLLM for and keeps from a client that did not ask for it: the client gets the bytes
vLLM would have sent it without the option (its fingerprint back on each finish event), wherever the pieces are cut."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.policy.usage_event import HOLD_BYTES, HiddenUsage, usage_options

FINGERPRINT = "vllm-0.32.0-3f2a9c1d"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def chunk(
    index: int, delta: dict[str, Any], finish: str | None = None, fingerprint: bool = False, trailing: Any = None
) -> bytes:
    """A chat chunk as vLLM serializes it (exclude_unset: the fingerprint after the choices, when set; 0.34 writes
    `trailing` keys after it on a finish event, such as `kv_transfer_params`)."""
    choice: dict[str, Any] = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    payload: dict[str, Any] = {"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1700000000,
                               "model": "tiny", "choices": [choice]}  # fmt: skip
    if fingerprint:
        payload["system_fingerprint"] = FINGERPRINT
    if finish is not None:
        payload.update(trailing or {})
    return event(payload)


def usage_chunk(completion: int) -> bytes:
    return event(
        {
            "id": "chatcmpl-7",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": "tiny",
            "choices": [],
            "usage": {"prompt_tokens": 9, "total_tokens": 9 + completion, "completion_tokens": completion},
            "system_fingerprint": FINGERPRINT,
        }
    )


def stream(n: int, asked: bool, trailing: Any = None) -> bytes:
    """What vLLM sends for `n` choices of three tokens, with the usage event (`asked`) or without."""
    out = [chunk(i, {"role": "assistant", "content": ""}) for i in range(n)]
    for step in range(3):
        for i in range(n):
            last = step == 2
            finish = "length" if last else None
            out.append(chunk(i, {"content": f"t{step} 東京"}, finish, last and not asked, trailing))
    if asked:
        out.append(usage_chunk(3 * n))
    return b"".join([*out, b"data: [DONE]\n\n"])


def through(data: bytes, cuts: list[int]) -> bytes:
    hidden = HiddenUsage()
    bounds = [0, *cuts, len(data)]
    out = b"".join(hidden.feed(data[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
    return out + hidden.end()


def test_the_client_gets_the_stream_vllm_sends_without_the_option() -> None:
    assert through(stream(1, asked=True), []) == stream(1, asked=False)


def test_wherever_the_pieces_are_cut() -> None:
    asked, expected = stream(1, asked=True), stream(1, asked=False)
    for at in range(1, len(asked)):
        assert through(asked, [at]) == expected, at
    assert through(asked, list(range(1, len(asked)))) == expected  # a byte at a time


def test_with_several_choices_each_finish_event_gets_its_fingerprint() -> None:
    """vLLM stamps every choice's finish event: they are held until the usage event says the fingerprint, so a
    choice that finished first reaches the client when the last one does."""
    out = through(stream(2, asked=True), [])
    expected = stream(2, asked=False)
    assert sorted(out.split(b"\n\n")) == sorted(expected.split(b"\n\n"))
    assert b'"usage"' not in out and out.count(FINGERPRINT.encode()) == 2 and out.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    "trailing",
    [
        {"kv_transfer_params": None},  # vLLM 0.34's finish event
        {"prompt_token_ids": None, "prompt_text": '}],"a"', "kv_transfer_params": {"remote": [1, "}]"]}},
        {"metrics": {"queued_s": 0.5}, "kv_transfer_params": None},
    ],
)
def test_the_fingerprint_goes_back_before_the_keys_vllm_writes_after_it(trailing: dict[str, Any]) -> None:
    asked, expected = stream(2, asked=True, trailing=trailing), stream(2, asked=False, trailing=trailing)
    assert sorted(through(asked, []).split(b"\n\n")) == sorted(expected.split(b"\n\n"))
    one = stream(1, asked=True, trailing=trailing)
    for at in range(1, len(one)):
        assert through(one, [at]) == stream(1, asked=False, trailing=trailing), at


def test_without_a_fingerprint_only_the_usage_event_goes() -> None:
    plain = stream(1, asked=True).replace(b',"system_fingerprint":"' + FINGERPRINT.encode() + b'"', b"")
    expected = stream(1, asked=False).replace(b',"system_fingerprint":"' + FINGERPRINT.encode() + b'"', b"")
    assert through(plain, []) == expected


def test_a_server_that_forces_usage_on_every_event_is_relayed_untouched() -> None:
    """--enable-force-include-usage: usage rides on every event, which the client gets without the guard too."""
    forced = chunk(0, {"role": "assistant", "content": ""})[:-3] + b',"usage":{"prompt_tokens":9}}\n\n'
    data = forced + chunk(0, {"content": "a"}, "length") + usage_chunk(1) + b"data: [DONE]\n\n"
    assert through(data, [len(forced) + 5]) == data


def test_a_stream_that_breaks_off_gives_back_what_it_held() -> None:
    data = stream(1, asked=True)
    broken = data[: data.index(b'"usage"')]  # the finish event (held), then part of the usage event
    assert through(broken, []) == broken


def test_an_overlong_event_is_relayed_as_it_comes() -> None:
    hidden = HiddenUsage()
    big = b"data: " + b"x" * (HOLD_BYTES + 10)
    out = hidden.feed(big) + hidden.feed(b"\n\n") + hidden.feed(usage_chunk(1)) + hidden.end()
    assert out == big + b"\n\n" + usage_chunk(1)


@pytest.mark.parametrize(
    ("body", "options"),
    [
        ({"stream": True}, {"include_usage": True, "continuous_usage_stats": False}),
        ({"stream": True, "stream_options": None}, {"include_usage": True, "continuous_usage_stats": False}),
        ({"stream": True, "stream_options": {"include_usage": False, "continuous_usage_stats": True}},
         {"include_usage": True, "continuous_usage_stats": False}),
        ({"stream": True, "stream_options": {"include_usage": True}}, None),  # asks already
        ({"stream": False}, None),
        ({}, None),
        ({"stream": True, "stream_options": "yes"}, None),  # vLLM's 400 to give
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, None),  # what vLLM makes of it: its own
        ({"stream": True, "stream_options": {"continuous_usage_stats": "x"}}, None),
    ],
)  # fmt: skip
def test_which_streams_ask(body: dict[str, Any], options: dict[str, Any] | None) -> None:
    assert usage_options(body) == options
