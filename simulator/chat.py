"""POST /v1/chat/completions: validate like vLLM's request model, count, apply the length rules, plan."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from simulator.chat_prompt import check_prompt_flags, check_template_trust, read_chat_options, render_chat
from simulator.context import (
    Context,
    check_stream_options,
    engine_error,
    raise_if,
    response_id,
    unwrap,
    usage_flags,
)
from simulator.endings import check_stops, read_stops, with_endings
from simulator.errors import validation_error
from simulator.forced import check_tool_choice, forced_content, forced_tool
from simulator.generation import ForcedTool, Generation, PromptPlan
from simulator.limits import OutputRequest, PromptShape, budget, check_prompt, check_request, check_sampling
from simulator.wire import Fields


def check_tool_fields(body: Mapping[str, Any], empty_tools_as_none: bool) -> Mapping[str, Any]:
    """vLLM's check_tool_usage on `tools` and `tool_choice`: the body as it reads on (0.34: `tools: []` is none)."""
    if body.get("tools") == [] and empty_tools_as_none:
        if isinstance(body.get("tool_choice"), dict):  # kept: the named tool is not found among none
            return body
        body = {**body, "tools": None}
        if body.get("tool_choice") in ("auto", "required"):  # nothing to call
            body["tool_choice"] = "none"
    if body.get("tools") == []:
        raise validation_error(
            "`tools` must not be an empty array. Either provide at least one tool or omit the field entirely.",
            parameter="tools",
        )
    choice = body.get("tool_choice")
    if choice is not None and choice != "none" and body.get("tools") is None:
        raise validation_error("When using `tool_choice`, `tools` must be set.", parameter="tool_choice")
    return body


def plan_chat(ctx: Context, body: Any, headers: Mapping[str, str]) -> Generation:
    if isinstance(body, dict):
        check_prompt_flags(body)
        body = dict(check_tool_fields(body, ctx.profile.empty_tools_as_none))
        check_tool_choice(body)
        check_stream_options(body)
    fields = Fields(body)
    options = read_chat_options(fields, template_inputs(fields, ctx.settings.reasoning_effort_map))
    model = fields.str_or_none("model")
    max_completion_tokens = fields.int_or_none("max_completion_tokens")
    max_tokens = fields.int_or_none("max_tokens")
    n = fields.int_or_none("n", 1)
    stream = bool(fields.bool_or_none("stream", False))
    stream_options = fields.dict_or_none("stream_options")
    min_tokens = fields.integer("min_tokens", 0)
    rules = read_stops(fields, min_tokens)
    temperature = fields.float_or_none("temperature")
    echo = fields.boolean("echo", False)
    return_token_ids = bool(fields.bool_or_none("return_token_ids", False))
    truncate = _truncate_prompt_tokens(fields)
    body_request_id = fields.str_or_none("request_id")
    fields.check()

    ctx.check_model(model)
    check_template_trust(options, ctx.settings.trust_request_chat_template)
    given_completion = max_completion_tokens is not None
    param = "max_completion_tokens" if given_completion else "max_tokens"
    requested = max_completion_tokens if given_completion else max_tokens
    request = OutputRequest(ctx.settings.max_model_len, requested, param, min_tokens, truncate, generative=True)
    raise_if(check_request(ctx.profile, request))

    rendered = render_chat(ctx.tokenizer, options, ctx.profile.strips_billing_header)
    run = transferred_ids(ctx, fields.body, echo)
    if run is None:
        run = rendered.token_ids
        shape = PromptShape(len(run), len(rendered.text), ctx.tokenizer.max_chars_per_token)
    else:
        shape = PromptShape(len(run), None, ctx.tokenizer.max_chars_per_token)
    counted = unwrap(check_prompt(ctx.profile, request, shape))
    token_ids = run[len(run) - counted :]
    generate = unwrap(budget(request, counted))
    raise_if(check_sampling(generate, min_tokens, 1 if n is None else n, temperature))
    check_stops(rules)
    tool = forced_tool(fields.body)
    rules = replace(rules, forced=tool[1] if tool else forced_content(fields.body))
    choices = 1 if n is None else n

    role = _response_role(options.add_generation_prompt, rendered.conversation)
    include_usage, continuous = usage_flags(stream, stream_options)
    generation = Generation(
        endpoint="chat",
        response_id=response_id("chatcmpl", headers, body_request_id),
        created=int(time.time()),
        model=ctx.settings.model,
        prompts=[PromptPlan(token_ids=token_ids, max_tokens=generate)],
        n=choices,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        return_token_ids=return_token_ids,
        role=role,
        chat_echo=_echo_text(rendered.conversation, role) if echo else None,
        engine_error=engine_error(ctx, token_ids),
        tool_call=ForcedTool(tool[0], tuple(_tool_call_id() for _ in range(choices))) if tool else None,
    )
    return with_endings(generation, ctx.tokenizer, rules)


def transferred_ids(ctx: Context, body: Any, echo: bool) -> list[int] | None:
    """vLLM's decode-side reuse (`_reused_prompt_token_ids`): the ids of kv_transfer_params.prompt_token_ids run in
    place of the rendered messages, connector or not."""
    params = body.get("kv_transfer_params") if isinstance(body, dict) else None
    ids = params.get("prompt_token_ids") if isinstance(params, dict) else None
    if not ctx.profile.checks_transferred_ids:
        return ids if ids and isinstance(ids, list) and all(type(i) is int for i in ids) else None
    if ids is None or echo:
        return None
    if not isinstance(ids, list) or not ids or any(type(i) is not int or i < 0 for i in ids):
        raise validation_error("`kv_transfer_params['prompt_token_ids']` must be a non-empty list of non-negative "
                               "integers.", parameter="kv_transfer_params.prompt_token_ids")  # fmt: skip
    return list(ids)


def _tool_call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().int & (2**64 - 1):016x}"


def template_inputs(fields: Fields, effort_map: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Chat-only request fields vLLM hands the template next to chat_template_kwargs; the effort as the server's
    --reasoning-effort-map rewrites it (0.33+ build_chat_params)."""
    effort = mapped_effort(fields.str_or_none("reasoning_effort"), effort_map)
    inputs: dict[str, Any] = {"documents": fields.list_or_none("documents"), "reasoning_effort": effort}
    user_kwargs = fields.raw("chat_template_kwargs")
    if effort is not None and not (isinstance(user_kwargs, dict) and "enable_thinking" in user_kwargs):
        inputs["enable_thinking"] = effort != "none"  # templates that need explicit opt-in to reasoning
    return inputs


def mapped_effort(effort: str | None, effort_map: Mapping[str, str] | None) -> str | None:
    """renderers/params.py map_reasoning_effort."""
    return effort if effort is None or not effort_map else effort_map.get(effort, effort)


def _truncate_prompt_tokens(fields: Fields) -> int | None:
    value = fields.int_or_none("truncate_prompt_tokens")
    if value is not None and value < -1:
        fields.invalid(
            "body.truncate_prompt_tokens", "greater_than_equal", "Input should be greater than or equal to -1", value
        )
    return value


def _response_role(add_generation_prompt: bool, conversation: list[dict[str, Any]]) -> str:
    if add_generation_prompt or not conversation:
        return "assistant"
    return str(conversation[-1]["role"])


def _echo_text(conversation: list[dict[str, Any]], role: str) -> str | None:
    """vLLM's chat echo: the last message's content, when that message has the response's role."""
    if not conversation or conversation[-1].get("role") != role:
        return None
    content = conversation[-1].get("content") or ""
    if isinstance(content, list):
        content = "\n".join(str(part.get("text", "")) for part in content)
    return str(content) or None
