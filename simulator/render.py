"""vLLM's render routes (served with --enable-scale-out; `scale_out/render/serving.py` of 0.31-0.34): a request
rendered and tokenized as its generation route would, answered as the GenerateRequest a caller then posts to
/inference/v1/generate. The ids and the output limit are the simulator's own planners' (chat, completions, Messages,
Responses), so the ids are what the generation route charges; the sampling parameters are render_sampling.py's.

Compact where vLLM is rare: no multimodal `features` or `token_offsets` (null), `reasoning_ended` null, the
effective chat template kwargs taken as the request's own, and `parse_context` (0.33+) with the tools as sent (a
Messages request's converted by name, description and input schema; its tool_choice not converted).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Literal

from simulator.chat import plan_chat
from simulator.completions import plan_completion
from simulator.context import Context
from simulator.converted import plan_responses
from simulator.errors import ApiError
from simulator.generation import Generation
from simulator.messages import plan_messages
from simulator.render_sampling import Kind, extra_args, sampling_params
from simulator.responses_request import read_responses

RenderRoute = Literal["chat", "completion", "messages", "responses"]
PATHS: dict[str, RenderRoute] = {
    "/v1/chat/completions/render": "chat",
    "/v1/completions/render": "completion",
    "/v1/messages/render": "messages",
    "/v1/responses/render": "responses",
}
DISABLED = "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out to enable them."
BEAM = "Beam search is not supported by the render endpoint"
STATELESS = "previous_response_id is not supported by the stateless render endpoint."


def render(
    ctx: Context, route: RenderRoute, body: Any, headers: Mapping[str, str]
) -> dict[str, Any] | list[dict[str, Any]]:
    """The answer (completions: one per prompt), or ApiError as vLLM answers it."""
    if route == "responses":
        return _responses(ctx, body)
    if isinstance(body, dict):
        _precheck(ctx, route, body)
    if route == "completion":
        plan = plan_completion(ctx, body, headers)
        return [_answer(ctx, "completion", body, plan, i) for i in range(len(plan.prompts))]
    if route == "chat":
        return _answer(ctx, "chat", body, plan_chat(ctx, body, headers))
    plan = plan_messages(ctx, body, headers)
    return _answer(ctx, "chat", messages_as_chat(body, ctx.profile.takes_min_tokens), plan)


def _precheck(ctx: Context, route: RenderRoute, body: dict[str, Any]) -> None:
    """What the render handler checks before it renders: the served model, then beam search (completions: 0.32+)."""
    model = body.get("model")
    ctx.check_model(model if isinstance(model, str) else None)
    beam_refused = route == "chat" or (route == "completion" and ctx.profile.render_reads_request_ids)
    if beam_refused and body.get("use_beam_search") is True:
        raise ApiError(BEAM)


def _responses(ctx: Context, body: Any) -> dict[str, Any]:
    req = read_responses(body, not ctx.profile.reserves_output, ctx.profile.fills_response_items)
    ctx.check_model(req.model)
    if req.previous_response_id is not None:
        raise ApiError(STATELESS, type="invalid_request_error", param="previous_response_id")
    # the render stores nothing and runs nothing: neither store nor background plays a part
    plan = plan_responses(ctx, {**req.body, "store": False, "background": False}, {})
    rid = req.request_id or f"resp_{_random_id()}"
    return _answer(ctx, "responses", req.body, plan, request_id=rid)


def messages_as_chat(body: dict[str, Any], takes_min_tokens: bool) -> dict[str, Any]:
    """The sampling fields of the chat request vLLM converts a Messages request to (_build_base_request; 0.34 hands
    min_tokens on)."""
    chat = {key: body.get(key) for key in ("model", "temperature", "top_p", "top_k", "cache_salt",
                                           "kv_transfer_params", "ec_transfer_params", "vllm_xargs")}  # fmt: skip
    chat |= {"stop": body.get("stop_sequences"), "stream": bool(body.get("stream"))}
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    chat["chat_template_kwargs"] = body.get("chat_template_kwargs")
    if takes_min_tokens:
        chat["min_tokens"] = body.get("min_tokens")
    chat["tool_choice"], parallel = _tool_choice(body.get("tool_choice"))
    if parallel is not None:
        chat["parallel_tool_calls"] = parallel
    tools = body.get("tools")
    if isinstance(tools, list):  # _convert_tools: a function tool per tool
        chat["tools"] = [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                          "parameters": t.get("input_schema")}} for t in tools if isinstance(t, dict)]  # fmt: skip
    return chat


def _tool_choice(choice: Any) -> tuple[Any, bool | None]:
    """_convert_tool_choice: Anthropic's choice in OpenAI's words, set after validation (none stays None), and
    parallel_tool_calls from disable_parallel_tool_use."""
    if not isinstance(choice, dict):
        return None, None
    kind = choice.get("type")
    named = {"type": "function", "function": {"name": choice.get("name")}}
    converted = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind), named if kind == "tool" else None)
    return converted, not choice.get("disable_parallel_tool_use", False)


def _answer(
    ctx: Context, kind: Kind, body: dict[str, Any], plan: Generation, index: int = 0, request_id: str | None = None
) -> dict[str, Any]:
    prompt = plan.prompts[index]
    if not prompt.token_ids:
        raise ApiError("No token_ids rendered")
    hoists = ctx.profile.render_hoists_transfer
    stream = bool(body.get("stream"))
    hoisted = extra_args(body, kind, hoists)[1]
    transfer = {key: hoisted.get(key) if hoists or kind != "responses" else body.get(key)
                for key in ("kv_transfer_params", "ec_transfer_params")}  # fmt: skip
    values = {
        "request_id": request_id or _request_id(ctx, plan, index),
        "token_ids": prompt.token_ids,
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": sampling_params(body, kind, prompt.max_tokens, hoists),
        "model": body.get("model"),
        "reasoning_ended": None,
        "reasoning_parser_kwargs": _parser_kwargs(ctx, body) if kind != "completion" else None,
        "return_token_ids": body.get("return_token_ids") if hoists and kind != "responses" else None,
        "output_mode": "tokens",
        "parse_context": _parse_context(body) if kind == "chat" else None,
        "stream": stream,
        "stream_options": _stream_options(body.get("stream_options")) if stream and kind != "responses" else None,
        "cache_salt": body.get("cache_salt"),
        "priority": body.get("priority") or 0,
        **transfer,
    }
    return {key: values[key] for key in ctx.profile.render_keys}


def _request_id(ctx: Context, plan: Generation, index: int) -> str:
    """The planner's id (the header's, the body's or a random one); completions number theirs when there are two.
    0.31: a random one after the prefix, for each prompt."""
    if not ctx.profile.render_reads_request_ids:
        return f"{plan.response_id.split('-', 1)[0]}-{_random_id()}"
    return plan.response_id if len(plan.prompts) == 1 else f"{plan.response_id}-{index}"


def _random_id() -> str:
    return f"{uuid.uuid4().int & (2**64 - 1):016x}"


def _parser_kwargs(ctx: Context, body: dict[str, Any]) -> dict[str, Any] | None:
    """ReasoningParserKwargs, given a reasoning parser: the kwargs the template was rendered with."""
    if ctx.settings.reasoning_parser is None:
        return None
    return {"chat_template_kwargs": dict(body.get("chat_template_kwargs") or {})}


def _stream_options(options: Any) -> dict[str, Any] | None:
    """StreamOptions as pydantic writes it, when sent: both fields, false unless set."""
    if not isinstance(options, dict):
        return None
    return {"include_usage": options.get("include_usage", False),
            "continuous_usage_stats": options.get("continuous_usage_stats", False)}  # fmt: skip


def _parse_context(body: dict[str, Any]) -> dict[str, Any]:
    """0.33's ParseContext of a chat request, after its validators (tool_choice "auto" when tools come without one)."""
    tools = body.get("tools")
    choice = body["tool_choice"] if "tool_choice" in body else ("auto" if tools else "none")
    history = sum(len(m.get("tool_calls") or []) for m in body.get("messages") or [] if isinstance(m, dict))
    return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "include_reasoning": body.get("include_reasoning", True),
            "chat_template_kwargs": _effective_kwargs(body),
            "history_tool_call_cnt": history}  # fmt: skip


def _effective_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    """The kwargs the template was rendered with (`build_chat_params`, then `with_defaults`): the request's,
    overridden by the request's own switches, all over the server's defaults (`resolve_default_chat_template_kwargs`:
    the simulator takes none but `--cohere-format`'s "cmd4"); `merge_kwargs` drops None and "auto" each time."""
    effort = body.get("reasoning_effort")
    switches = {"add_generation_prompt": body.get("add_generation_prompt", True),
                "continue_final_message": body.get("continue_final_message", False),
                "documents": body.get("documents"), "reasoning_effort": effort}  # fmt: skip
    user = dict(body.get("chat_template_kwargs") or {})
    if effort is not None and "enable_thinking" not in user:
        switches["enable_thinking"] = effort != "none"
    merged = user | {k: v for k, v in switches.items() if v is not None and v != "auto"}
    return {"cohere_format": "cmd4"} | {k: v for k, v in merged.items() if v is not None and v != "auto"}
