"""Issue 3 against a real vLLM: a 10,000-token document on the 2048-token tiny model gets an answer with the chunk
and the truncate policies, streamed and not; every sub-request fits (vLLM 0.31 would reject any that did not)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.corpus import LONG_TEXT
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

DOCUMENT = (LONG_TEXT + "\n\n") * 10  # about 10,000 tokens of prose, code, CJK and emoji


def policy(stack: Stack, name: str) -> Any:
    return stack.guarded.with_options(default_headers={"x-token-guard-overflow": name})


def messages() -> list[Any]:
    return [{"role": "system", "content": "Summarise the document."}, {"role": "user", "content": DOCUMENT}]


def test_the_document_is_too_long_without_a_policy(stack: Stack) -> None:
    assert stack.tokenize(messages=messages()) > 9_000


def test_chunk_answers_the_document(stack: Stack) -> None:
    raw = policy(stack, "chunk").chat.completions.with_raw_response.create(
        model="tiny", messages=messages(), max_tokens=8, temperature=0
    )
    answer = raw.parse()
    parts = int(raw.headers["x-token-guard-chunks"])
    assert raw.headers["x-token-guard-action"] == "chunk" and parts >= 5
    assert answer.usage is not None and answer.usage.completion_tokens == 8  # the parts share the client's max_tokens
    part_tokens = [int(n) for n in raw.headers["x-token-guard-chunk-tokens"].split(",")]
    assert answer.usage.prompt_tokens == sum(part_tokens) and max(part_tokens) + 8 <= 2048


def test_chunk_streams_one_well_formed_answer_equal_to_the_non_streamed_one(stack: Stack) -> None:
    client = policy(stack, "chunk")
    whole = client.chat.completions.create(model="tiny", messages=messages(), max_tokens=8, temperature=0)
    stream = client.chat.completions.create(
        model="tiny", messages=messages(), max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    text, finishes, usages = "", [], []
    for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finishes += [choice.finish_reason] if choice.finish_reason else []
        usages += [chunk.usage] if chunk.usage else []
    assert text == whole.choices[0].message.content  # greedy decoding: the same parts, the same merge
    assert finishes == ["length"] and len(usages) == 1
    assert whole.usage is not None and usages[0].completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_truncate_answers_the_document(stack: Stack, stream: bool) -> None:
    client = policy(stack, "truncate")
    if not stream:
        raw = client.chat.completions.with_raw_response.create(
            model="tiny", messages=messages(), max_tokens=16, temperature=0
        )
        answer = raw.parse()
        assert raw.headers["x-token-guard-action"] == "truncate"
        assert answer.usage is not None and answer.usage.completion_tokens == 16
        assert answer.usage.prompt_tokens <= 2048 - 16 and int(raw.headers["x-token-guard-truncated-tokens"]) > 7_000
        return
    chunks = list(client.chat.completions.create(model="tiny", messages=messages(), max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))  # fmt: skip
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 16 and usage.prompt_tokens <= 2048 - 16


def test_truncate_completion_sends_kept_token_ids(stack: Stack) -> None:
    answer = policy(stack, "truncate").completions.create(model="tiny", prompt=DOCUMENT, max_tokens=16, temperature=0)
    assert answer.usage is not None and answer.usage.prompt_tokens == 2048 - 16 and answer.usage.completion_tokens == 16
