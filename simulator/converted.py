"""POST /v1/responses and /invocations, as vLLM serves them: a Responses request is read and converted to the chat
messages vLLM renders by the simulator's own readers (responses_*.py), then rendered, limited and planned like chat,
with the endpoint's own limit field in the error texts (messages.py plans the Anthropic Messages requests so)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from simulator.chat import mapped_effort, plan_chat
from simulator.chat_prompt import UNTRUSTED_TEMPLATE, ChatOptions, render_chat, template_kwargs
from simulator.completions import plan_completion
from simulator.context import Context, engine_error, raise_if, unwrap
from simulator.conversation import read_tools
from simulator.endings import check_stops, read_stops, with_endings
from simulator.errors import ApiError, validation_error
from simulator.generation import Generation, PromptPlan
from simulator.harmony import SimHarmony
from simulator.invocations import dispatched
from simulator.limits import OutputRequest, PromptShape, budget, check_prompt, check_request, check_sampling
from simulator.responses_input import continues, input_messages
from simulator.responses_request import ResponsesRequest, read_responses
from simulator.responses_tools import tool_dicts
from simulator.stored import NO_STORE, not_found
from simulator.wire import Fields

NO_REASONING = (
    "thinking_token_budget is set but reasoning_config is not configured. Please set --reasoning-parser and/or "
    "--reasoning-config to use thinking_token_budget."
)


def plan_responses(ctx: Context, body: Any, headers: Mapping[str, str]) -> Generation:
    newer, fills = not ctx.profile.reserves_output, ctx.profile.fills_response_items
    req = read_responses(body, newer, fills)
    ctx.check_model(req.model)
    if req.background and ctx.store is None:
        raise ApiError(NO_STORE, type="invalid_request_error", param="background")
    history = None
    if req.previous_response_id is not None:  # looked up whether the store is on or not: off, it is empty
        if ctx.store is None:
            raise not_found(req.previous_response_id)
        history = ctx.store.history(req.previous_response_id)
    own_template = (req.chat_template_kwargs or {}).get("chat_template")
    if own_template is not None and not ctx.settings.trust_request_chat_template:
        raise ApiError(UNTRUSTED_TEMPLATE)
    messages = input_messages(req.instructions, req.input, newer, history, fills)
    # truncation "auto": vLLM's TokenizeParams gets truncate_prompt_tokens -1, so the input keeps its last tokens,
    # as many as the window less max_output_tokens (0.31), or all but one (0.32 with an output limit, 0.33 always)
    truncate = -1 if req.truncation_auto else None
    request = OutputRequest(ctx.settings.max_model_len, req.max_output_tokens, "max_output_tokens",
                            truncate_prompt_tokens=truncate, generative=True)  # fmt: skip
    # the body's request_id, else a new one (X-Request-Id is not read: the Responses API takes no header's id)
    rid = req.request_id or f"resp_{uuid.uuid4().hex}"
    if ctx.harmony is not None:
        harmony_messages = _harmony_messages(ctx, ctx.harmony, req.body)
        ids = ctx.harmony.render(harmony_messages)
        chars = len(ctx.tokenizer.decode(ids))
    else:
        options = _responses_options(req, messages, newer, ctx.settings.reasoning_effort_map)
        rendered = render_chat(ctx.tokenizer, options, ctx.profile.strips_billing_header)
        ids, chars = rendered.token_ids, len(rendered.text)
    budget = thinking_budget(req.body) if ctx.profile.budgets_responses_thinking else None
    planned = planned_prompt(ctx, "responses", rid, ids, chars, request, req.body, req.stream)
    if budget is not None and ctx.settings.reasoning_parser is None:
        raise validation_error(NO_REASONING)  # the engine's check, after the length rules
    rules = read_stops(Fields(req.body), 0)  # ResponsesRequest's stop and stop_token_ids (to_sampling_params)
    check_stops(rules)
    planned = with_endings(planned, ctx.tokenizer, rules)
    if ctx.store is None or not req.store:
        return planned
    if ctx.harmony is not None:
        ctx.store.harmony[rid] = harmony_messages
    else:
        ctx.store.rendered(rid, messages)
    return replace(planned, keep=ctx.store.keep)


def thinking_budget(body: dict[str, Any]) -> int | None:
    """0.34's ThinkingTokenBudget: an integer of at least 0, or -1 (unlimited: None); anything else a 400."""
    value = body.get("thinking_token_budget")
    if value is None or (value == -1 and isinstance(value, int) and not isinstance(value, bool)):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise validation_error("`thinking_token_budget` must be a non-negative integer or -1 for unlimited.",
                               parameter="thinking_token_budget", value=value)  # fmt: skip
    return value


def _responses_options(
    req: ResponsesRequest, messages: list[dict[str, Any]], newer: bool, effort_map: Mapping[str, str] | None
) -> ChatOptions:
    """build_chat_params: the prompt flags from the input's last item, the effort (and enable_thinking, unless
    the client set it) over the client's chat_template_kwargs; build_tok_params leaves add_special_tokens on."""
    cont = continues(req.input)
    user = req.chat_template_kwargs or {}
    effort = mapped_effort(req.effort, effort_map)
    extra: dict[str, Any] = {"reasoning_effort": effort}
    if effort is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = effort != "none"
    tools = tool_dicts(req.tools, newer)
    return ChatOptions(
        messages=messages, add_generation_prompt=not cont, continue_final_message=cont, add_special_tokens=True,
        tools=None if tools is None else read_tools(tools), template_kwargs=template_kwargs(user, extra),
        chat_template=own if isinstance(own := user.get("chat_template"), str) else None,
    )  # fmt: skip


def _harmony_messages(ctx: Context, harmony: SimHarmony, body: dict[str, Any]) -> list[Any]:
    """A gpt-oss model's Responses prompt (simulator/harmony.py): the messages stored for the response it continues,
    with that response's answer, as they are; then the new input. The effort as --reasoning-effort-map rewrites it."""
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(effort := reasoning.get("effort"), str):
        body = {**body, "reasoning": {**reasoning, "effort": mapped_effort(effort, ctx.settings.reasoning_effort_map)}}
    previous = body.get("previous_response_id")
    if not isinstance(previous, str) or ctx.store is None:
        return harmony.prompt(body, None, [])
    outputs: list[dict[str, Any]] = ctx.store.retrieve(previous).get("output") or []
    answer = [o for o in outputs if o.get("type") == "message"]
    return harmony.prompt(body, harmony.answered(ctx.store.harmony.get(previous, []), answer), outputs)


def plan_invocation(ctx: Context, body: Any, headers: Mapping[str, str]) -> Generation:
    """vLLM's SageMaker route: the body goes to chat when it validates as chat, else to completions."""
    if not isinstance(body, dict):
        raise ApiError(f"'{type(body).__name__}' object does not support item assignment")
    kind = dispatched(body)
    return plan_chat(ctx, body, headers) if kind == "chat" else plan_completion(ctx, body, headers)


def planned_prompt(
    ctx: Context, endpoint: str, rid: str, ids: list[int], chars: int, request: OutputRequest, body: dict[str, Any],
    stream: bool, min_tokens: int = 0,
) -> Generation:  # fmt: skip
    raise_if(check_request(ctx.profile, request))
    shape = PromptShape(len(ids), chars, ctx.tokenizer.max_chars_per_token)
    counted = unwrap(check_prompt(ctx.profile, request, shape))
    generate = unwrap(budget(request, counted))
    temperature = body.get("temperature")
    raise_if(check_sampling(generate, min_tokens, 1, temperature if isinstance(temperature, int | float) else None))
    token_ids = ids[len(ids) - counted :]
    return Generation(
        endpoint="responses" if endpoint == "responses" else "messages", response_id=rid, created=int(time.time()),
        model=ctx.settings.model, prompts=[PromptPlan(token_ids=token_ids, max_tokens=generate)], stream=stream,
        engine_error=engine_error(ctx, token_ids), request=body, ends_incomplete=ctx.profile.ends_incomplete_streams,
        echoes_prompt_cache=ctx.profile.echoes_prompt_cache,
    )  # fmt: skip
