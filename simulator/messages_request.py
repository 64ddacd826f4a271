"""The Anthropic Messages body (`POST /v1/messages`, `/v1/messages/count_tokens`) as vLLM 0.31 / 0.32's request
models read it (entrypoints/anthropic/protocol.py: AnthropicMessagesRequest, AnthropicCountTokensRequest and their
blocks, tools, tool choice and thinking), with pydantic's errors. 0.32 adds tool_addition / tool_removal blocks. The
simulator's own reading, apart from the guard's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.wire import Fields

ROLES = ("user", "assistant", "system")
BLOCKS = ("text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking")
TOOL_CHANGES = ("tool_addition", "tool_removal")  # 0.32
CHOICES = ("auto", "any", "tool", "none")
THINKING = ("enabled", "disabled", "adaptive")
MIN_BUDGET = 1024  # AnthropicThinkingConfigEnabled: budget_tokens Field(ge=1024)


@dataclass(frozen=True)
class MessagesRequest:
    body: dict[str, Any]
    model: str
    system: str | list[dict[str, Any]] | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: dict[str, Any] | None
    thinking: dict[str, Any] | None
    effort: str | None  # output_config.effort
    max_tokens: int | None  # required by /v1/messages, no field of count_tokens
    stream: bool
    chat_template_kwargs: dict[str, Any] | None


def read_messages_request(
    body: Any, newer: bool, count_only: bool = False, between_tools: bool = False
) -> MessagesRequest:
    """Raises ApiError (400 "Bad Request", pydantic's errors) where vLLM's request model refuses the body;
    `between_tools`: the release takes thinking type "between_tools" (0.34)."""
    fields = Fields(body)
    fields.check()
    model = fields.require("model")
    if fields.has("model") and (not isinstance(model, str) or not model):
        fields.invalid("body.model", "value_error", "Value error, Model is required", model)
    blocks = BLOCKS + TOOL_CHANGES if newer else BLOCKS
    messages = _messages(fields, blocks, newer)
    system = fields.raw("system")
    if system is not None and not isinstance(system, str):
        _blocks(fields, "body.system", system, blocks, changes_allowed=False)  # validate_system
    max_tokens = None
    if not count_only:
        fields.require("max_tokens")
        max_tokens = fields.int_or_none("max_tokens")
        if max_tokens is not None and max_tokens <= 0:
            fields.invalid("body.max_tokens", "value_error", "Value error, max_tokens must be positive", max_tokens)
    thinking = _thinking(fields, max_tokens, THINKING + ("between_tools",) if between_tools else THINKING)
    output = fields.dict_or_none("output_config") or {}
    req = MessagesRequest(
        body=fields.body, model=model if isinstance(model, str) else "", system=system, messages=messages,
        tools=_tools(fields), tool_choice=_choice(fields), thinking=thinking,
        effort=effort if isinstance(effort := output.get("effort"), str) else None, max_tokens=max_tokens,
        stream=False if count_only else bool(fields.bool_or_none("stream", False)),
        chat_template_kwargs=fields.dict_or_none("chat_template_kwargs"),
    )  # fmt: skip
    fields.check()
    return req


def _messages(fields: Fields, blocks: tuple[str, ...], newer: bool) -> list[dict[str, Any]]:
    messages = fields.require("messages")
    if not isinstance(messages, list):
        if fields.has("messages"):
            fields.invalid("body.messages", "list_type", "Input should be a valid list", messages)
        return []
    for i, message in enumerate(messages):
        where = f"body.messages.{i}"
        if not isinstance(message, dict):
            fields.invalid(where, "model_type", "Input should be a valid dictionary or instance of AnthropicMessage",
                           message)  # fmt: skip
            continue
        if message.get("role") not in ROLES:
            fields.invalid(f"{where}.role", "literal_error", "Input should be 'user', 'assistant' or 'system'",
                           message.get("role"))  # fmt: skip
        content = message.get("content")
        if not isinstance(content, str):
            allowed = not newer or message.get("role") == "system"  # validate_tool_change_role
            _blocks(fields, f"{where}.content", content, blocks, changes_allowed=allowed)
    return [m for m in messages if isinstance(m, dict)]


def _blocks(fields: Fields, where: str, content: Any, kinds: tuple[str, ...], changes_allowed: bool) -> None:
    """`str | list[AnthropicContentBlock]`: a list of blocks of a known type with the fields' types."""
    if not isinstance(content, list):
        fields.invalid(f"{where}.str", "string_type", "Input should be a valid string", content)
        return
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind not in kinds:
            fields.invalid(f"{where}.str", "string_type", "Input should be a valid string", content)
            fields.invalid(f"{where}.list[AnthropicContentBlock].{j}.type", "literal_error",
                           f"Input should be {', '.join(repr(k) for k in kinds)}", kind)  # fmt: skip
            continue
        assert isinstance(block, dict)
        if kind in TOOL_CHANGES:
            _tool_change(fields, f"{where}.{j}", block, changes_allowed)
        for key, types in (("text", str), ("input", dict), ("thinking", str), ("source", dict)):
            if block.get(key) is not None and not isinstance(block[key], types):
                fields.invalid(f"{where}.{j}.{key}", "type_error", f"Input should be a valid {key}", block[key])
        if block.get("content") is not None and not isinstance(block["content"], str | list):
            fields.invalid(f"{where}.{j}.content", "string_type", "Input should be a valid string", block["content"])


def _tool_change(fields: Fields, where: str, block: dict[str, Any], allowed: bool) -> None:
    tool = block.get("tool")
    if not allowed:
        fields.invalid(where, "value_error", f"Value error, {block['type']} blocks are only allowed in messages with "
                       'role "system"', block)  # fmt: skip
    elif not isinstance(tool, dict):
        fields.invalid(where, "value_error", f"Value error, tool is required for {block['type']} blocks", block)
    elif tool.get("type") == "tool_reference" and isinstance(tool.get("name"), str):
        return
    elif block["type"] == "tool_removal":
        fields.invalid(where, "value_error", "Value error, tool_removal only accepts a tool_reference", block)
    elif tool.get("type") != "tool_definition" or not _tool_ok(tool.get("definition")):
        fields.invalid(f"{where}.tool", "union_tag_invalid", "Input should be a tool_reference or tool_definition",
                       tool)  # fmt: skip


def _tool_ok(tool: Any) -> bool:
    return isinstance(tool, dict) and isinstance(tool.get("name"), str) and isinstance(tool.get("input_schema"), dict)


def _tools(fields: Fields) -> list[dict[str, Any]] | None:
    tools = fields.list_or_none("tools")
    for i, tool in enumerate(tools or []):
        if not _tool_ok(tool):
            fields.invalid(f"body.tools.{i}", "model_type", "Input should be an AnthropicTool", tool)
    return tools


def _choice(fields: Fields) -> dict[str, Any] | None:
    choice = fields.dict_or_none("tool_choice")
    if choice is None:
        return None
    if choice.get("type") not in CHOICES:
        fields.invalid("body.tool_choice.type", "literal_error", "Input should be 'auto', 'any', 'tool' or 'none'",
                       choice.get("type"))  # fmt: skip
    elif choice["type"] == "tool" and not choice.get("name"):
        fields.invalid("body.tool_choice", "value_error",
                       "Value error, tool_choice.name is required when type is 'tool'", choice)  # fmt: skip
    return choice


def _thinking(fields: Fields, max_tokens: int | None, kinds: tuple[str, ...]) -> dict[str, Any] | None:
    thinking = fields.dict_or_none("thinking")
    if thinking is None:
        return None
    kind = thinking.get("type")
    if kind not in kinds:
        tags = ", ".join(f"'{k}'" for k in kinds)
        fields.invalid("body.thinking", "union_tag_invalid", f"Input tag does not match {tags}", kind)
        return None
    if kind != "enabled":
        return thinking
    budget = thinking.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < MIN_BUDGET:
        fields.invalid("body.thinking.enabled.budget_tokens", "greater_than_equal",
                       f"Input should be greater than or equal to {MIN_BUDGET}", budget)  # fmt: skip
        return thinking
    transfer = fields.raw("kv_transfer_params")
    remote_decode = isinstance(transfer, dict) and transfer.get("do_remote_decode")
    if max_tokens is not None and budget >= max_tokens and not remote_decode:  # validate_thinking_budget
        fields.invalid("body", "value_error", "Value error, thinking.budget_tokens must be less than max_tokens",
                       fields.body)  # fmt: skip
    return thinking
