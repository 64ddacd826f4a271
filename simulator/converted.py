"""POST /v1/responses, /v1/messages, /v1/messages/count_tokens and /invocations, as vLLM serves them: each request is
converted to the chat messages vLLM renders (Responses with the simulator's own readers, responses_*.py; Messages
still with the guard's conversion), then rendered, limited and planned like chat, with the endpoint's own limit field
in the error texts."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from proxy.api.anthropic import MessagesRequest, parse_messages
from proxy.api.chat import ChatRequest
from proxy.counting.anthropic import to_chat
from proxy.counting.anthropic_probes import EFFORTS, fails_inline_system
from proxy.errors import GuardError
from simulator.chat import plan_chat, template_inputs
from simulator.chat_prompt import UNTRUSTED_TEMPLATE, ChatOptions, RenderedChat, render_chat, template_kwargs
from simulator.completions import plan_completion
from simulator.context import Context, engine_error, raise_if, response_id, unwrap
from simulator.conversation import read_messages, read_tools
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
    newer = not ctx.profile.reserves_output
    req = read_responses(body, newer)
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
    messages = input_messages(req.instructions, req.input, newer, history)
    # truncation "auto": vLLM's TokenizeParams gets truncate_prompt_tokens -1, so the input keeps its last tokens,
    # as many as the window less max_output_tokens (0.31), or all but one (0.32)
    truncate = -1 if req.truncation_auto else None
    request = OutputRequest(ctx.settings.max_model_len, req.max_output_tokens, "max_output_tokens",
                            truncate_prompt_tokens=truncate)  # fmt: skip
    # the body's request_id, else a new one (X-Request-Id is not read: the Responses API takes no header's id)
    rid = req.request_id or f"resp_{uuid.uuid4().hex}"
    if ctx.harmony is not None:
        harmony_messages = _harmony_messages(ctx, ctx.harmony, req.body)
        ids = ctx.harmony.render(harmony_messages)
        planned = _planned(ctx, "responses", rid, ids, len(ctx.tokenizer.decode(ids)), request, req.body, req.stream)
    else:
        rendered = render_chat(
            ctx.tokenizer, _responses_options(req, messages, newer), ctx.profile.strips_billing_header
        )
        planned = _planned(ctx, "responses", rid, rendered.token_ids, len(rendered.text), request, req.body,
                           req.stream)  # fmt: skip
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


def _responses_options(req: ResponsesRequest, messages: list[dict[str, Any]], newer: bool) -> ChatOptions:
    """build_chat_params: the prompt flags from the input's last item, the effort (and enable_thinking, unless
    the client set it) over the client's chat_template_kwargs; build_tok_params leaves add_special_tokens on."""
    cont = continues(req.input)
    user = req.chat_template_kwargs or {}
    extra: dict[str, Any] = {"reasoning_effort": req.effort}
    if req.effort is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = req.effort != "none"
    tools = tool_dicts(req.tools, newer)
    return ChatOptions(
        messages=messages, add_generation_prompt=not cont, continue_final_message=cont, add_special_tokens=True,
        tools=None if tools is None else read_tools(tools), template_kwargs=template_kwargs(user, extra),
        chat_template=own if isinstance(own := user.get("chat_template"), str) else None,
    )  # fmt: skip


def _harmony_messages(ctx: Context, harmony: SimHarmony, body: dict[str, Any]) -> list[Any]:
    """A gpt-oss model's Responses prompt (simulator/harmony.py): the messages stored for the response it continues,
    with that response's answer, as they are; then the new input."""
    previous = body.get("previous_response_id")
    if not isinstance(previous, str) or ctx.store is None:
        return harmony.prompt(body, None, [])
    outputs: list[dict[str, Any]] = ctx.store.retrieve(previous).get("output") or []
    answer = [o for o in outputs if o.get("type") == "message"]
    return harmony.prompt(body, harmony.answered(ctx.store.harmony.get(previous, []), answer), outputs)


def plan_messages(ctx: Context, body: Any, headers: Mapping[str, str]) -> Generation:
    req = _read(lambda raw: parse_messages(raw), body)
    chat = _anthropic_chat(ctx, req)
    # vLLM hands the limit to chat as max_completion_tokens too, so that is the name its errors use
    request = OutputRequest(ctx.settings.max_model_len, req.max_tokens, "max_completion_tokens")
    planned = _generation(ctx, "messages", response_id("chatcmpl", headers, None), chat, request, req.body, req.stream)
    thinking = req.body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled" and ctx.settings.reasoning_parser is None:
        raise validation_error(NO_REASONING)  # the engine's check on thinking_token_budget, after the length rules
    return planned


def count_tokens(ctx: Context, body: Any) -> dict[str, Any]:
    req = _read(lambda raw: parse_messages(raw, count_only=True), body)
    rendered = render_chat(ctx.tokenizer, _options(_anthropic_chat(ctx, req)), ctx.profile.strips_billing_header)
    request = OutputRequest(ctx.settings.max_model_len, None)
    shape = PromptShape(len(rendered.token_ids), len(rendered.text), ctx.tokenizer.max_chars_per_token)
    tokens = unwrap(check_prompt(ctx.profile, request, shape))
    return {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}


def plan_invocation(ctx: Context, body: Any, headers: Mapping[str, str]) -> Generation:
    """vLLM's SageMaker route: the body goes to chat when it validates as chat, else to completions."""
    if not isinstance(body, dict):
        raise ApiError(f"'{type(body).__name__}' object does not support item assignment")
    kind = dispatched(body)
    return plan_chat(ctx, body, headers) if kind == "chat" else plan_completion(ctx, body, headers)


def _read(convert: Any, body: Any) -> Any:
    """The guard's readers and conversions, with their 400s as vLLM's."""
    try:
        return convert(json.dumps(body).encode())
    except GuardError as exc:
        raise ApiError(exc.message, param=exc.param) from None


def _anthropic_chat(ctx: Context, req: MessagesRequest) -> ChatRequest:
    ctx.check_model(req.model)
    tok = ctx.tokenizer
    no_tools: list[list[Any] | None] = [None, []]
    merge = any(fails_inline_system(tok.template_for(tools)) for tools in no_tools)
    newer = not ctx.profile.reserves_output
    chat: ChatRequest = _read(lambda _: to_chat(req, newer, merge, lambda: _disabled_effort(ctx)), req.body)
    return chat


def _disabled_effort(ctx: Context) -> str:
    """vLLM's probe: "none" unless it fails to render or renders like a real effort."""

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


def _options(chat: ChatRequest) -> ChatOptions:
    return ChatOptions(
        messages=chat.messages, add_generation_prompt=chat.add_generation_prompt,
        continue_final_message=chat.continue_final_message, add_special_tokens=chat.add_special_tokens,
        tools=None if chat.tools is None else read_tools(chat.tools),
        template_kwargs=template_kwargs(chat.chat_template_kwargs, template_inputs(Fields(chat.body))),
    )  # fmt: skip


def _generation(
    ctx: Context, endpoint: str, rid: str, chat: ChatRequest, request: OutputRequest, body: dict[str, Any],
    stream: bool,
) -> Generation:  # fmt: skip
    rendered: RenderedChat = render_chat(ctx.tokenizer, _options(chat), ctx.profile.strips_billing_header)
    return _planned(ctx, endpoint, rid, rendered.token_ids, len(rendered.text), request, body, stream)


def _planned(
    ctx: Context, endpoint: str, rid: str, ids: list[int], chars: int, request: OutputRequest, body: dict[str, Any],
    stream: bool,
) -> Generation:  # fmt: skip
    raise_if(check_request(ctx.profile, request))
    shape = PromptShape(len(ids), chars, ctx.tokenizer.max_chars_per_token)
    counted = unwrap(check_prompt(ctx.profile, request, shape))
    generate = unwrap(budget(request, counted))
    temperature = body.get("temperature")
    raise_if(check_sampling(generate, 0, 1, temperature if isinstance(temperature, int | float) else None))
    token_ids = ids[len(ids) - counted :]
    return Generation(
        endpoint="responses" if endpoint == "responses" else "messages", response_id=rid, created=int(time.time()),
        model=ctx.settings.model, prompts=[PromptPlan(token_ids=token_ids, max_tokens=generate)], stream=stream,
        engine_error=engine_error(ctx, token_ids), request=body,
    )  # fmt: skip
