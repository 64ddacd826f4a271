"""The chat request behind a render answer, as vLLM builds it: what its Anthropic conversion makes of a Messages body,
and the `parse_context` (0.33+) it writes for the generate server to parse the output with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.policy.render_sampling import Body, Release, at_least

COPIED = "temperature top_p top_k watermarking cache_salt kv_transfer_params ec_transfer_params vllm_xargs".split()


def as_chat(body: Body, release: Release | None) -> dict[str, Any]:
    """The chat request vLLM's Anthropic conversion makes of a Messages body, as far as the answer reads it."""
    limit = body.get("max_tokens")
    chat = {"model": body.get("model"), "max_tokens": limit, "max_completion_tokens": limit}
    chat |= {name: body.get(name) for name in COPIED} | {"stop": body.get("stop_sequences")}
    chat["chat_template_kwargs"] = body.get("chat_template_kwargs")
    if at_least(release, (0, 34)):
        chat["min_tokens"] = body.get("min_tokens")
    if body.get("stream"):
        chat |= {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    output = body.get("output_config") or {}
    schema = (output.get("format") or {}).get("schema")
    if schema:
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "json_schema", "schema": schema}}
    if output.get("effort") is not None:
        chat["reasoning_effort"] = output["effort"]
    thinking = body.get("thinking") or {}
    if thinking.get("type") == "enabled":
        chat["thinking_token_budget"] = thinking.get("budget_tokens")
    return chat


def parse_context(
    chat: Body, messages: Body | None, release: Release | None, defaults: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`defaults`: the server's default template kwargs (`resolve_default_chat_template_kwargs`); None for a
    harmony model, whose output vLLM parses without template kwargs."""
    if messages is None:
        tools, choice = chat.get("tools"), chat.get("tool_choice", "auto" if chat.get("tools") else "none")
        parallel, calls = chat.get("parallel_tool_calls", True), _chat_tool_calls(chat.get("messages") or [])
    else:
        tools, (choice, parallel) = messages.get("tools"), _anthropic_choice(messages.get("tool_choice"))
        calls = _anthropic_tool_calls(messages.get("messages") or [])
    context = {
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
        "include_reasoning": chat.get("include_reasoning", True),
    }
    if at_least(release, (0, 34)) and chat.get("return_tokens_as_token_ids") is not None:
        context["return_tokens_as_token_ids"] = chat["return_tokens_as_token_ids"]
    kwargs = _template_kwargs(chat, defaults) if defaults is not None else {}
    return context | {"chat_template_kwargs": kwargs, "history_tool_call_cnt": calls}


def server_defaults(configured: Mapping[str, Any]) -> dict[str, Any]:
    """The template kwargs a vLLM server (0.31+) starts with: --default-chat-template-kwargs, then its own
    --cohere-format (default "cmd4") unless those name it."""
    return {**configured, "cohere_format": configured.get("cohere_format", "cmd4")}


def _template_kwargs(chat: Body, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """ChatParams' kwargs (`build_chat_params`, then `with_defaults`): the client's, then the request's own, then
    both over the server's defaults; unset ones (None, "auto") left out at each merge."""
    own = {
        "add_generation_prompt": chat.get("add_generation_prompt", True),
        "continue_final_message": chat.get("continue_final_message", False),
        "documents": chat.get("documents"),
        "reasoning_effort": chat.get("reasoning_effort"),
    }
    user = chat.get("chat_template_kwargs") or {}
    if own["reasoning_effort"] is not None and "enable_thinking" not in user:
        own["enable_thinking"] = own["reasoning_effort"] != "none"
    merged = dict(user) | _set(own)
    return dict(defaults) | _set(merged) if defaults else merged


def _set(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in kwargs.items() if value is not None and value != "auto"}


def _chat_tool_calls(messages: Sequence[Any]) -> int:
    calls = [m.get("tool_calls") for m in messages if isinstance(m, dict) and m.get("role") == "assistant"]
    return sum(1 if isinstance(c, (str, dict)) else len(c) for c in calls if c is not None)


def _anthropic_tool_calls(messages: Sequence[Any]) -> int:
    blocks = [
        b
        for m in messages
        if isinstance(m, dict) and m.get("role") == "assistant" and isinstance(m.get("content"), list)
        for b in m["content"]
    ]
    return sum(1 for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use")


def _anthropic_choice(choice: Mapping[str, Any] | None) -> tuple[Any, bool]:
    if choice is None:
        return None, True
    parallel = not choice.get("disable_parallel_tool_use", False)
    kind = choice.get("type")
    if kind == "tool":
        return {"function": {"name": choice.get("name")}, "type": "function"}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind)), parallel
