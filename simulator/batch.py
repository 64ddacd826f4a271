"""POST /v1/chat/completions/batch, as vLLM 0.31 / 0.32 answer it: each conversation planned as a chat request of
the batch's fields (rendered without tools, never streamed), in order, the first failing one failing the batch; one
`chat.completion` body whose choices are the conversations, indexed 0..N-1, and whose usage sums them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from simulator.chat import plan_chat
from simulator.context import Context
from simulator.errors import request_validation_error, validation_error
from simulator.generation import Generation, sequences

# Not handed to any conversation: its own messages replace the batch's, the batch path renders no tools, and the
# answer is one JSON body whatever `stream` says.
NOT_PER_CONVERSATION = ("messages", "tools", "tool_choice", "stream", "stream_options")


def plan_batch(ctx: Context, body: Any, headers: Mapping[str, str]) -> Generation:
    conversations = _conversations(body)
    if body.get("use_beam_search"):
        raise validation_error("Batch chat completions do not support beam search. Please set `use_beam_search` to "
                               "False.", parameter="use_beam_search")  # fmt: skip
    n = body.get("n", 1)
    if n is not None and n != 1:
        raise validation_error("Batch chat completions do not support `n > 1`. Please set `n` to 1.", parameter="n",
                               value=n)  # fmt: skip
    shared = {key: value for key, value in body.items() if key not in NOT_PER_CONVERSATION}
    plans = [plan_chat(ctx, {**shared, "messages": messages}, headers) for messages in conversations]
    first = plans[0]
    scripted = tuple(
        replace(sequences(plan)[0], index=i, prompt=i) for i, plan in enumerate(plans)
    ) if any(plan.scripted is not None for plan in plans) else None  # fmt: skip
    return replace(
        first, prompts=[plan.prompts[0] for plan in plans], roles=tuple(plan.role for plan in plans),
        stream=False, include_usage=False, continuous_usage=False, chat_echo=None, scripted=scripted,
        engine_error=next((plan.engine_error for plan in plans if plan.engine_error is not None), None),
    )  # fmt: skip


def _conversations(body: Any) -> list[list[Any]]:
    """`messages` as pydantic reads it: a non-empty list of non-empty lists."""
    if not isinstance(body, dict):
        raise request_validation_error([_error("body", "dict_type", "Input should be a valid dictionary")], "body")
    messages = body.get("messages")
    if not isinstance(messages, list):
        kind, msg = ("missing", "Field required") if messages is None else ("list_type", "Input should be a valid list")
        raise request_validation_error([_error("body.messages", kind, msg)], "body.messages")
    if not messages:
        raise request_validation_error([_too_short("body.messages")], "body.messages")
    for i, conversation in enumerate(messages):
        if not isinstance(conversation, list):
            loc = f"body.messages.{i}"
            raise request_validation_error([_error(loc, "list_type", "Input should be a valid list")], loc)
        if not conversation:
            raise request_validation_error([_too_short(f"body.messages.{i}")], f"body.messages.{i}")
    return messages


def _error(loc: str, kind: str, msg: str) -> str:
    return str({"type": kind, "loc": loc, "msg": msg})


def _too_short(loc: str) -> str:
    return str(
        {
            "type": "too_short",
            "loc": loc,
            "msg": "List should have at least 1 item after validation, not 0",
            "input": "<list of 0 items>",
            "ctx": {"field_type": "List", "min_length": 1, "actual_length": 0},
        }
    )
