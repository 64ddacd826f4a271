"""The Responses request (`POST /v1/responses`) as the guard reads it: the fields that change the count or the output
limit, type-checked; every other field stays in `body` untouched and passes through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.api.body import MAX_DEPTH, count_field, flag, kind_of, model_name, optional, parse_json_object
from proxy.errors import InvalidRequest
from proxy.settings import ServerSettings

MAX_ITEMS = ServerSettings.max_messages
LIMIT_FIELD = "max_output_tokens"


@dataclass(frozen=True)
class ResponsesRequest:
    body: dict[str, Any]
    model: str | None
    input: str | list[dict[str, Any]]
    instructions: str | None
    tools: list[Any] | None
    max_output_tokens: int | None
    previous_response_id: str | None
    truncation_auto: bool  # `truncation: "auto"`: vLLM cuts an overlong prompt itself instead of refusing it
    stream: bool
    store: bool = False  # vLLM stores the response (when started with VLLM_ENABLE_RESPONSES_API_STORE=1)
    background: bool = False  # vLLM runs it after answering `queued` (policy/background.py)
    # the id vLLM stores the response under (vLLM's own extra field; its own random one when absent)
    request_id: str | None = None

    @property
    def requested_output(self) -> tuple[str, int] | None:
        return None if self.max_output_tokens is None else (LIMIT_FIELD, self.max_output_tokens)


def parse_responses(raw: bytes, max_items: int = MAX_ITEMS, max_depth: int = MAX_DEPTH) -> ResponsesRequest:
    return responses_request(parse_json_object(raw, max_depth), max_items)


def responses_request(body: dict[str, Any], max_items: int = MAX_ITEMS) -> ResponsesRequest:
    """A Responses API request from a body already parsed."""
    items = body.get("input")
    if isinstance(items, list):
        if len(items) > max_items:
            raise InvalidRequest(
                f"'input' has {len(items)} items; at most {max_items} are accepted (server.max_messages).",
                param="input",
            )
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                raise InvalidRequest(f"input[{i}] must be an object, got {kind_of(item)}.", param="input")
    elif not isinstance(items, str):
        raise InvalidRequest("'input' must be a string or an array of input items.", param="input")
    truncation = optional(body, "truncation", str, "a string")
    return ResponsesRequest(
        body=body,
        model=model_name(body),
        input=items,
        instructions=optional(body, "instructions", str, "a string"),
        tools=optional(body, "tools", list, "an array"),
        max_output_tokens=count_field(body, LIMIT_FIELD),
        previous_response_id=optional(body, "previous_response_id", str, "a string"),
        truncation_auto=truncation not in (None, "disabled"),
        stream=flag(body, "stream", False),
        store=flag(body, "store", True),
        background=flag(body, "background", False),
        request_id=optional(body, "request_id", str, "a string"),
    )
