"""The chat completions request as the guard reads it: the fields that change the count or the clamp, type-checked;
every other field stays in `body` untouched, so unknown and future client fields pass through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.api.body import (
    MAX_DEPTH,
    check_min_tokens,
    choices,
    count_field,
    flag,
    model_name,
    optional,
    parse_json_object,
    token_ids,
)
from proxy.errors import InvalidRequest
from proxy.settings import ServerSettings

MAX_MESSAGES = ServerSettings.max_messages


@dataclass(frozen=True)
class ChatRequest:
    body: dict[str, Any]
    model: str | None
    messages: list[Any]
    tools: list[Any] | None
    add_generation_prompt: bool
    continue_final_message: bool
    add_special_tokens: bool
    chat_template: str | None
    chat_template_kwargs: dict[str, Any]
    max_tokens: int | None
    max_completion_tokens: int | None
    min_tokens: int | None
    n: int
    stream: bool
    harmony: list[dict[str, Any]] | None = None  # a gpt-oss Responses create: the harmony messages vLLM renders

    @property
    def requested_output(self) -> tuple[str, int] | None:
        """The field vLLM takes the output limit from, and its value (max_completion_tokens wins)."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        if self.max_tokens is not None:
            return "max_tokens", self.max_tokens
        return None


def transferred_prompt(body: dict[str, Any]) -> int | None:
    """How many token ids vLLM runs in place of the rendered messages, or None. Disaggregated serving forwards the
    prefill's ids in `kv_transfer_params.prompt_token_ids`, and vLLM 0.31 / 0.32's chat renderer (chat, batch chat,
    Responses, Messages) feeds them to the engine instead of the template's (`_reused_prompt_token_ids`), with or
    without a KV connector: 0.31 takes any value that is not empty, 0.32 a non-empty list of ids (and renders the
    messages under `echo` or media parts). The guard counts the longer of the two and never cuts either."""
    params = body.get("kv_transfer_params")
    ids = params.get("prompt_token_ids") if isinstance(params, dict) else None
    if ids is None:
        return None
    if not isinstance(ids, list) or not ids or not token_ids(ids):
        raise InvalidRequest("`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative "
                             "integers.", param="kv_transfer_params.prompt_token_ids")  # fmt: skip
    return len(ids)


def parse_chat(raw: bytes, max_messages: int = MAX_MESSAGES, max_depth: int = MAX_DEPTH) -> ChatRequest:
    return chat_request(parse_json_object(raw, max_depth), max_messages)


def chat_request(body: dict[str, Any], max_messages: int = MAX_MESSAGES) -> ChatRequest:
    """A chat request from a body already parsed (/invocations reads the body before it knows the endpoint)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array of message objects.", param="messages")
    if len(messages) > max_messages:
        raise InvalidRequest(
            f"'messages' has {len(messages)} messages; at most {max_messages} are accepted (server.max_messages).",
            param="messages",
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise InvalidRequest(f"messages[{i}] must be an object with a string 'role'.", param="messages")
    tools = optional(body, "tools", list, "an array")
    kwargs = optional(body, "chat_template_kwargs", dict, "an object") or {}
    add_generation_prompt = flag(body, "add_generation_prompt", True)
    continue_final_message = flag(body, "continue_final_message", False)
    if continue_final_message and add_generation_prompt and body.get("add_generation_prompt") is not None:
        # vLLM's request validator refuses both when both were sent; with add_generation_prompt left at its default,
        # it is the renderer that refuses (transformers and mistral_common do; harmony ignores both flags).
        raise InvalidRequest(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True "
            "(add_generation_prompt defaults to true: send false with continue_final_message).",
            param="continue_final_message",
        )
    req = ChatRequest(
        body=body,
        model=model_name(body),
        messages=messages,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        add_special_tokens=flag(body, "add_special_tokens", False),
        chat_template=optional(body, "chat_template", str, "a string"),
        chat_template_kwargs=kwargs,
        max_tokens=count_field(body, "max_tokens"),
        max_completion_tokens=count_field(body, "max_completion_tokens"),
        min_tokens=count_field(body, "min_tokens"),
        n=choices(body),
        stream=flag(body, "stream", False),
    )
    requested = req.requested_output
    check_min_tokens(req.min_tokens, requested[1] if requested else None)
    return req
