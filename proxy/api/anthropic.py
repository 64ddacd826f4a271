"""The Anthropic Messages request (`POST /v1/messages`, and `/v1/messages/count_tokens` without `max_tokens`) as the
guard reads it: the fields that change the count or the output limit, type-checked; every other field stays in
`body` untouched and passes through."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.api.body import MAX_DEPTH, count_field, flag, kind_of, model_name, optional, parse_json_object
from proxy.errors import InvalidRequest
from proxy.settings import ServerSettings

MAX_MESSAGES = ServerSettings.max_messages
MIN_THINKING_BUDGET = 1024  # vLLM's AnthropicThinkingConfigEnabled: budget_tokens Field(ge=1024)
ROLES = ("user", "assistant", "system")  # vLLM also takes inline system messages (Claude Code's reminders)


@dataclass(frozen=True)
class MessagesRequest:
    body: dict[str, Any]
    model: str | None
    system: str | list[dict[str, Any]] | None
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    max_tokens: int | None  # required by /v1/messages, absent from count_tokens
    stream: bool

    @property
    def requested_output(self) -> tuple[str, int] | None:
        return None if self.max_tokens is None else ("max_tokens", self.max_tokens)


def parse_messages(
    raw: bytes, count_only: bool = False, max_messages: int = MAX_MESSAGES, max_depth: int = MAX_DEPTH
) -> MessagesRequest:
    return messages_request(parse_json_object(raw, max_depth), count_only, max_messages)


def messages_request(
    body: dict[str, Any], count_only: bool = False, max_messages: int = MAX_MESSAGES
) -> MessagesRequest:
    """A Messages API request from a body already parsed."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' must be an array of message objects.", param="messages")
    if len(messages) > max_messages:
        raise InvalidRequest(
            f"'messages' has {len(messages)} messages; at most {max_messages} are accepted (server.max_messages).",
            param="messages",
        )
    for i, message in enumerate(messages):
        _check_message(i, message)
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        _check_blocks("system", system)
    tools = optional(body, "tools", list, "an array")
    for i, tool in enumerate(tools or []):
        if not (isinstance(tool, dict) and isinstance(tool.get("name"), str) and isinstance(tool.get("input_schema"),
                                                                                              dict)):  # fmt: skip
            raise InvalidRequest(f"tools[{i}] must be an object with a string 'name' and an 'input_schema' object.",
                                 param="tools")  # fmt: skip
    max_tokens = None if count_only else count_field(body, "max_tokens")
    if not count_only and not max_tokens:
        raise InvalidRequest("'max_tokens' is required and must be at least 1.", param="max_tokens")
    _check_thinking_budget(body, max_tokens)
    return MessagesRequest(
        body=body, model=model_name(body), system=system, messages=messages, tools=tools, max_tokens=max_tokens,
        stream=flag(body, "stream", False),
    )  # fmt: skip


def _check_message(index: int, message: Any) -> None:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise InvalidRequest(f"messages[{index}] must be an object with a role user, assistant or system.",
                             param="messages")  # fmt: skip
    content = message.get("content")
    if not isinstance(content, str):
        _check_blocks(f"messages[{index}].content", content)


def _check_blocks(where: str, blocks: Any) -> None:
    if not isinstance(blocks, list):
        raise InvalidRequest(f"{where} must be a string or an array of content blocks, got {kind_of(blocks)}.",
                             param="messages")  # fmt: skip
    for j, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest(f"{where}[{j}] must be a content block object with a 'type'.", param="messages")


def _check_thinking_budget(body: dict[str, Any], max_tokens: int | None) -> None:
    """vLLM's request model: an enabled thinking budget is an integer of at least 1024 (also for count_tokens), and
    must leave room for the answer (unless decoding remotely)."""
    thinking, transfer = body.get("thinking"), body.get("kv_transfer_params")
    if not isinstance(thinking, dict) or thinking.get("type") != "enabled":
        return
    budget = thinking_budget(thinking)
    if budget is None or budget < MIN_THINKING_BUDGET:
        raise InvalidRequest(f"thinking.budget_tokens must be an integer of at least {MIN_THINKING_BUDGET}, got "
                             f"{thinking.get('budget_tokens')!r}.", param="thinking.budget_tokens")  # fmt: skip
    if max_tokens is None or (isinstance(transfer, dict) and transfer.get("do_remote_decode")):
        return
    if budget >= max_tokens:
        raise InvalidRequest("thinking.budget_tokens must be less than max_tokens.", param="thinking.budget_tokens")


def thinking_budget(thinking: dict[str, Any]) -> int | None:
    """budget_tokens as vLLM's pydantic model reads it: an integer, or a number with no fractional part."""
    budget = thinking.get("budget_tokens")
    if isinstance(budget, float) and budget.is_integer():
        return int(budget)
    return budget if isinstance(budget, int) and not isinstance(budget, bool) else None
