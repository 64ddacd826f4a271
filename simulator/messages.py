"""POST /v1/messages and /v1/messages/count_tokens as vLLM 0.31 / 0.32 serve them: the body read by the request
model (messages_request.py), converted to chat (messages_chat.py) after vLLM's two probes of the template (inline
system messages, what `thinking: disabled` maps to), then rendered, limited and planned like chat; count_tokens
answers the rendered prompt's length."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simulator.chat import template_inputs
from simulator.chat_prompt import ChatOptions, check_template_trust, render_chat, template_kwargs
from simulator.context import Context, response_id, unwrap
from simulator.conversation import read_messages, read_tools
from simulator.converted import NO_REASONING, planned_prompt
from simulator.errors import ApiError, validation_error
from simulator.generation import Generation
from simulator.limits import OutputRequest, PromptShape, check_prompt
from simulator.messages_chat import MessagesChat, messages_chat, needs_system_first
from simulator.messages_request import MessagesRequest, read_messages_request
from simulator.wire import Fields

EFFORTS = ("low", "medium", "high", "xhigh", "max")  # AnthropicEffort
NO_TOOLS: tuple[list[dict[str, Any]] | None, ...] = (None, [])  # both templates the inline-system probe renders


def plan_messages(ctx: Context, body: Any, headers: Mapping[str, str]) -> Generation:
    req = read_messages_request(body, _newer(ctx), between_tools=ctx.profile.thinks_between_tools)
    options = _options(ctx, req)
    # vLLM hands the limit to chat as max_completion_tokens too, so that is the name its errors use
    request = OutputRequest(ctx.settings.max_model_len, req.max_tokens, "max_completion_tokens")
    rendered = render_chat(ctx.tokenizer, options, ctx.profile.strips_billing_header)
    rid = response_id("chatcmpl", headers, None)
    least = _min_tokens(req.body) if ctx.profile.takes_min_tokens else 0
    planned = planned_prompt(ctx, "messages", rid, rendered.token_ids, len(rendered.text), request, req.body,
                             req.stream, least)  # fmt: skip
    thinking = req.thinking or {}
    if thinking.get("type") == "enabled" and ctx.settings.reasoning_parser is None:
        raise validation_error(NO_REASONING)  # the engine's check on thinking_token_budget, after the length rules
    return planned


def count_tokens(ctx: Context, body: Any) -> dict[str, Any]:
    req = read_messages_request(body, _newer(ctx), count_only=True, between_tools=ctx.profile.thinks_between_tools)
    rendered = render_chat(ctx.tokenizer, _options(ctx, req), ctx.profile.strips_billing_header)
    if ctx.profile.counts_past_window:  # 0.34: counted like /tokenize, whatever the window
        count = len(rendered.token_ids)
        return {"input_tokens": count, "context_management": {"original_input_tokens": count}}
    request = OutputRequest(ctx.settings.max_model_len, None)
    shape = PromptShape(len(rendered.token_ids), len(rendered.text), ctx.tokenizer.max_chars_per_token)
    tokens = unwrap(check_prompt(ctx.profile, request, shape))
    return {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}


def _min_tokens(body: dict[str, Any]) -> int:
    """0.34's `min_tokens: int = 0`, with pydantic's error for one that is not an integer."""
    fields = Fields(body)
    least = fields.integer("min_tokens", 0)
    fields.check()
    return least


def _newer(ctx: Context) -> bool:
    return not ctx.profile.reserves_output


def _options(ctx: Context, req: MessagesRequest) -> ChatOptions:
    """The chat request vLLM builds (to_chat_completion_request), as the chat path renders it."""
    ctx.check_model(req.model)
    merge = merges_inline_system(ctx)
    disabled = "none"
    if (req.thinking or {}).get("type") in ("disabled", "between_tools"):
        disabled = _disabled_effort(ctx)
    chat: MessagesChat = messages_chat(req, _newer(ctx), merge, disabled, ctx.profile.joins_tool_references)
    user = req.chat_template_kwargs or {}
    effort_map = ctx.settings.reasoning_effort_map
    inputs = template_inputs(
        Fields({"reasoning_effort": chat.reasoning_effort, "chat_template_kwargs": user}), effort_map
    )
    options = ChatOptions(
        messages=chat.messages, tools=None if chat.tools is None else read_tools(chat.tools),
        template_kwargs=template_kwargs(user, inputs), untrusted_template=user.get("chat_template") is not None,
    )  # fmt: skip
    check_template_trust(options, ctx.settings.trust_request_chat_template)
    return options


def merges_inline_system(ctx: Context) -> bool:
    """The Messages API's start-up probe (AnthropicServingMessages.__init__); an error it lets out (0.31-0.33, a
    template raising anything but a template error) stops the server from starting."""
    catches_any = ctx.profile.probe_catches_any
    return any(needs_system_first(ctx.tokenizer.template_for(tools), catches_any) for tools in NO_TOOLS)


def _disabled_effort(ctx: Context) -> str:
    """_probe_disabled_thinking_effort: "none" unless it fails to render or renders like a real effort."""

    def rendered(effort: str) -> str | None:
        try:
            inputs = template_kwargs({}, template_inputs(Fields({"reasoning_effort": effort})))
            return _render(ctx, ChatOptions([{"role": "user", "content": "Hi"}], template_kwargs=inputs))
        except ApiError:
            return None

    none = rendered("none")
    return "low" if none is None or any(rendered(e) == none for e in EFFORTS) else "none"


def _render(ctx: Context, options: ChatOptions) -> str:
    template = ctx.tokenizer.template_for(options.tools)
    strips = ctx.profile.strips_billing_header
    conversation = read_messages(options.messages, ctx.tokenizer.content_format(template), strips)
    kwargs = {**options.template_kwargs, "add_generation_prompt": True}
    return ctx.tokenizer.render_chat(conversation, template, options.tools, kwargs)
