"""Chat messages to prompt token ids, as vLLM's renderer does it (docs/vllm-wire-contract.md, section 12).

Shared by /v1/chat/completions and the chat form of /tokenize: messages become the conversation, tools are
normalised the way vLLM's request model re-serialises them, the template is rendered to text and the text is
tokenized with add_special_tokens (default false).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.conversation import for_template, read_messages, read_tools
from simulator.errors import ApiError
from simulator.processor import UNHASHABLE
from simulator.tokenizer import SimTokenizer
from simulator.wire import Fields

UNTRUSTED_TEMPLATE = (
    "Chat template is passed with request, but --trust-request-chat-template is not set. "
    "Refused request with untrusted chat template."
)
BOTH_PROMPT_FLAGS = "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
# Arguments the simulator passes itself; a request cannot smuggle them in through chat_template_kwargs.
_RESERVED_KWARGS = {"conversation", "chat_template", "tokenize", "return_dict", "tools"}


@dataclass(frozen=True)
class ChatOptions:
    messages: list[Any]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    tools: list[dict[str, Any]] | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    untrusted_template: bool = False
    chat_template: str | None = None  # the request's own, rendered only when trusted


@dataclass(frozen=True)
class RenderedChat:
    conversation: list[dict[str, Any]]
    text: str
    token_ids: list[int]


def check_prompt_flags(body: dict[str, Any]) -> None:
    """vLLM's model validator: it looks only at values the client sent explicitly."""
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise ApiError(BOTH_PROMPT_FLAGS)


def read_chat_options(fields: Fields, extra_kwargs: dict[str, Any] | None = None) -> ChatOptions:
    """The template-related fields of a chat or chat-tokenize request; type errors are left in `fields`."""
    messages = fields.require("messages")
    if fields.has("messages") and not isinstance(messages, list):
        fields.invalid("body.messages", "list_type", "Input should be a valid list", messages)
    kwargs = fields.dict_or_none("chat_template_kwargs") or {}
    return ChatOptions(
        messages=messages if isinstance(messages, list) else [],
        add_generation_prompt=fields.boolean("add_generation_prompt", True),
        continue_final_message=fields.boolean("continue_final_message", False),
        add_special_tokens=fields.boolean("add_special_tokens", False),
        tools=normalize_tools(fields),
        template_kwargs=template_kwargs(kwargs, extra_kwargs or {}),
        untrusted_template=fields.raw("chat_template") is not None or kwargs.get("chat_template") is not None,
        chat_template=own if isinstance(own := fields.raw("chat_template"), str) else None,
    )


def check_template_trust(options: ChatOptions, trusted: bool = False) -> None:
    """Like a vLLM started without --trust-request-chat-template: request-supplied templates are refused."""
    if options.untrusted_template and not trusted:
        raise ApiError(UNTRUSTED_TEMPLATE)


def template_kwargs(user: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """The client's chat_template_kwargs (less the arguments the simulator passes itself) under the request's own
    template inputs, those set (`build_chat_params`, `merge_kwargs`)."""
    merged = {k: v for k, v in user.items() if k not in _RESERVED_KWARGS}
    merged.update({k: v for k, v in extra.items() if v is not None})
    return merged


def normalize_tools(fields: Fields) -> list[dict[str, Any]] | None:
    """`tool.model_dump()` of vLLM's tool model (`read_tools`); a tool without a function name is a 400, reported
    as pydantic reports it."""
    tools = fields.list_or_none("tools")
    if tools is None:
        return None
    valid = True
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            name = function.get("name") if isinstance(function, dict) else function
            fields.invalid(f"body.tools.{i}.function.name", "string_type", "Input should be a valid string", name)
            valid = False
    return read_tools(tools) if valid else None


def render_chat(tokenizer: SimTokenizer, options: ChatOptions, strips_billing: bool) -> RenderedChat:
    """`strips_billing`: the release drops Claude Code's billing header line off system text (0.32+)."""
    tools = options.tools
    template = options.chat_template or tokenizer.template_for(tools)
    conversation = read_messages(options.messages, tokenizer.content_format(template), strips_billing)
    if isinstance(template, dict):  # a processor's dict (0.31-0.33): the renderer's first lookup hashes it
        raise ApiError(UNHASHABLE)
    conversation = for_template(conversation, template)  # the developer role, for templates that never name it
    kwargs = {
        **options.template_kwargs,
        "add_generation_prompt": options.add_generation_prompt,
        "continue_final_message": options.continue_final_message,
    }
    text = tokenizer.render_chat(conversation, template, tools, kwargs)
    ids = tokenizer.encode(text, add_special_tokens=options.add_special_tokens)
    return RenderedChat(conversation=conversation, text=text, token_ids=ids)
