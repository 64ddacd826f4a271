"""The batch chat wire model: conversations as the chat requests vLLM renders, and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.api.batch import batch_chat_request
from proxy.errors import InvalidRequest

HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def test_each_conversation_is_a_chat_request_of_the_batchs_fields_without_tools() -> None:
    body = {"model": "m", "messages": [HI, [*HI, {"role": "assistant", "content": "yo"}]], "tools": [TOOL],
            "max_completion_tokens": 9, "add_generation_prompt": False, "stream": True}  # fmt: skip
    req = batch_chat_request(body)
    assert req.model == "m" and len(req.chats) == 2
    assert [c.messages for c in req.chats] == body["messages"]
    assert all(c.tools is None and "tools" not in c.body for c in req.chats)  # vLLM's batch renders no tools
    assert all(c.add_generation_prompt is False and c.body["max_completion_tokens"] == 9 for c in req.chats)
    assert req.requested_output == ("max_completion_tokens", 9)
    assert req.body is body  # forwarded as sent


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"messages": []}, "non-empty array of conversations"),
        ({"messages": HI}, "messages[0] must be a non-empty array"),  # one conversation, not a batch of them
        ({"messages": [HI, []]}, "messages[1] must be a non-empty array"),
        ({"messages": [HI, [{"content": "no role"}]]}, "Conversation 1 (messages[1]): messages[0] must be an object"),
        ({"messages": [HI], "n": 2}, "do not support `n > 1`"),
        ({"messages": [HI], "max_tokens": -1}, "'max_tokens' must be at least 0"),
        ({"messages": [HI], "max_tokens": 2, "min_tokens": 5}, "min_tokens must be less than or equal"),
    ],
)
def test_malformed_batches_are_400s_that_say_where(body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        batch_chat_request(body)
    assert fragment in caught.value.message


def test_the_message_ceiling_counts_every_conversation() -> None:
    with pytest.raises(InvalidRequest, match="holds 4 messages in all; at most 3"):
        batch_chat_request({"messages": [HI * 2, HI * 2]}, max_messages=3)
    assert len(batch_chat_request({"messages": [HI, HI * 2]}, max_messages=3).chats) == 2
