"""The batch chat request (`POST /v1/chat/completions/batch`) as the guard reads it: `messages` is a list of
conversations, each rendered and generated as a chat request of its own with the batch's other fields.

vLLM 0.31 / 0.32 (`openai/chat_completion/protocol.py` `BatchChatCompletionRequest`, `batch_serving.py`): every
conversation is a non-empty list of messages; `n` must be 1; each conversation becomes a `ChatCompletionRequest` of
the batch's fields (unknown ones included) and is rendered with no tools (the batch path hands the template none,
whatever `tools` says); the answer is one JSON body, never a stream, whose usage sums the conversations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.api.body import choices, model_name
from proxy.api.chat import MAX_MESSAGES, ChatRequest, chat_request
from proxy.errors import InvalidRequest

UNRENDERED = ("messages", "tools")  # fields of the batch that no conversation's prompt is rendered with


@dataclass(frozen=True)
class BatchChatRequest:
    body: dict[str, Any]
    model: str | None
    chats: list[ChatRequest]  # one per conversation, as vLLM renders it

    @property
    def requested_output(self) -> tuple[str, int] | None:
        return self.chats[0].requested_output


def batch_chat_request(body: dict[str, Any], max_messages: int = MAX_MESSAGES) -> BatchChatRequest:
    conversations = body.get("messages")
    if not isinstance(conversations, list) or not conversations:
        raise InvalidRequest("'messages' must be a non-empty array of conversations (arrays of message objects).",
                             param="messages")  # fmt: skip
    for i, conversation in enumerate(conversations):
        if not isinstance(conversation, list) or not conversation:
            raise InvalidRequest(f"messages[{i}] must be a non-empty array of message objects (a conversation).",
                                 param="messages")  # fmt: skip
    total = sum(len(c) for c in conversations)
    if total > max_messages:
        raise InvalidRequest(f"'messages' holds {total} messages in all; at most {max_messages} are accepted "
                             "(server.max_messages).", param="messages")  # fmt: skip
    n = choices(body)
    if n != 1:  # vLLM's words (its request validator)
        raise InvalidRequest("Batch chat completions do not support `n > 1`. Please set `n` to 1.", param="n")
    shared = {key: value for key, value in body.items() if key not in UNRENDERED}
    return BatchChatRequest(body, model_name(body), [_conversation(shared, c, i) for i, c in enumerate(conversations)])


def _conversation(shared: dict[str, Any], messages: list[Any], index: int) -> ChatRequest:
    try:
        return chat_request({**shared, "messages": messages})
    except InvalidRequest as exc:
        raise InvalidRequest(f"Conversation {index} (messages[{index}]): {exc.message}", param=exc.param) from None
