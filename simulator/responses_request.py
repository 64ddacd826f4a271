"""The Responses request (`POST /v1/responses`) as vLLM 0.31 to 0.34's `ResponsesRequest` reads it
(entrypoints/openai/responses/protocol.py): its model validators (background, prompt, 0.32's custom tools' format,
the tool usage), the fields the simulator acts on with pydantic's lax types, and its input items
(responses_input.py). The simulator's own reading, apart from the guard's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.errors import validation_error
from simulator.responses_input import Item, read_items
from simulator.responses_tools import check_custom_formats, check_tool_usage
from simulator.wire import Fields

TRUNCATIONS = ("auto", "disabled")


@dataclass(frozen=True)
class ResponsesRequest:
    body: dict[str, Any]
    model: str | None
    input: str | list[Item]
    instructions: str | None
    tools: list[dict[str, Any]]
    tool_choice: Any  # after check_tool_usage: "none" without tools, a namespaced name resolved (0.32)
    max_output_tokens: int | None
    previous_response_id: str | None
    truncation_auto: bool  # build_tok_params: truncate_prompt_tokens -1 unless truncation is "disabled"
    stream: bool
    store: bool
    background: bool
    request_id: str | None
    chat_template_kwargs: dict[str, Any] | None
    effort: str | None  # reasoning.effort


def read_responses(body: Any, newer: bool, fills: bool = False) -> ResponsesRequest:
    """`newer`: vLLM 0.32 (custom tools, namespaced tool choices); `fills`: 0.34's input items (responses_input.py).
    Raises ApiError as vLLM answers."""
    fields = Fields(body)
    fields.check()
    body = dict(fields.body)
    _model_validators(body, newer)
    fields = Fields(body)
    raw_input = fields.require("input")
    if fields.has("input") and not isinstance(raw_input, str | list):
        fields.invalid("body.input", "string_type", "Input should be a valid string", raw_input)
    truncation = body.get("truncation", "disabled")
    if truncation is not None and truncation not in TRUNCATIONS:
        fields.invalid("body.truncation", "literal_error", "Input should be 'auto' or 'disabled'", truncation)
    reasoning = fields.dict_or_none("reasoning") or {}
    tools = fields.list_or_none("tools") or []
    req = ResponsesRequest(
        body=body, model=fields.str_or_none("model"), input=[], instructions=fields.str_or_none("instructions"),
        tools=[t for t in tools if isinstance(t, dict)], tool_choice=body.get("tool_choice", "auto"),
        max_output_tokens=fields.int_or_none("max_output_tokens"),
        previous_response_id=fields.str_or_none("previous_response_id"), truncation_auto=truncation != "disabled",
        stream=bool(fields.bool_or_none("stream", False)), store=bool(fields.bool_or_none("store", True)),
        background=bool(fields.bool_or_none("background", False)), request_id=fields.str_or_none("request_id"),
        chat_template_kwargs=fields.dict_or_none("chat_template_kwargs"),
        effort=effort if isinstance(effort := reasoning.get("effort"), str) else None,
    )  # fmt: skip
    fields.check()
    items = raw_input if isinstance(raw_input, str) else read_items(raw_input, newer, fills)
    return ResponsesRequest(**{**req.__dict__, "input": items})


def _model_validators(body: dict[str, Any], newer: bool) -> None:
    """The request model's `mode="before"` validators, on the raw body (they may rewrite `tool_choice`)."""
    check_tool_usage(body, newer)
    if newer:
        check_custom_formats(body.get("tools"))
    if body.get("prompt") is not None:  # validate_prompt
        raise validation_error("prompt template is not supported", parameter="prompt")
    if body.get("background") and not body.get("store", True):  # validate_background
        raise validation_error("background can only be used when `store` is true", parameter="background")
