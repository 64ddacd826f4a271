"""POST /v1/completions: the four prompt forms, one plan per prompt, choices ordered prompt by prompt."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simulator.context import (
    Context,
    check_stream_options,
    engine_error,
    raise_if,
    response_id,
    unwrap,
    usage_flags,
)
from simulator.embeds import embeds_rows
from simulator.endings import check_stops, read_stops, with_endings
from simulator.errors import ApiError, validation_error
from simulator.generation import Generation, PromptPlan
from simulator.limits import OutputRequest, PromptShape, budget, check_prompt, check_request, check_sampling
from simulator.wire import Fields

DEFAULT_MAX_TOKENS = 16
NO_PROMPT = "You must pass at least one prompt"


@dataclass(frozen=True)
class RawPrompt:
    text: str | None
    token_ids: list[int]


def read_prompts(fields: Fields) -> list[str | list[int]]:
    """str | list[str] | list[int] | list[list[int]], split into one entry per prompt like vLLM's prompt_to_seq."""
    prompt = fields.raw("prompt")
    if prompt is None:
        return []
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [fields.ints("prompt", prompt)]
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        if all(isinstance(p, list) for p in prompt):
            return [fields.ints(f"prompt.{i}", p) for i, p in enumerate(prompt)]
    fields.invalid("body.prompt", "union_type", "Input should be a string, a list of strings or token ids", prompt)
    return []


def check_prompt_given(body: Mapping[str, Any]) -> None:
    prompt, embeds = body.get("prompt"), body.get("prompt_embeds")
    if (prompt is None or prompt == "") and (embeds is None or embeds == []):
        raise validation_error("Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt")


def check_suffix(suffix: str | None, echo: bool, truncate: int | None, prompts: list[str | list[int]],
                 embeds: bool) -> None:  # fmt: skip
    """No model the simulator serves has FIM rendering, so every suffix is refused the way vLLM refuses it."""
    if suffix is None:
        return
    if echo:
        raise ApiError("Echo is unsupported with suffix.", param="suffix")
    if embeds:
        raise ApiError("suffix is not supported with prompt_embeds", param="suffix")
    if truncate is not None:
        raise ApiError("suffix is not supported with truncate_prompt_tokens", param="suffix")
    if all(isinstance(p, str) for p in prompts):
        raise ApiError("suffix is only supported for models with FIM completion rendering", param="suffix")
    raise ApiError("suffix requires text prompt input for FIM completion rendering", param="suffix")


def plan_completion(ctx: Context, body: Any, headers: Mapping[str, str]) -> Generation:
    if isinstance(body, dict):
        check_stream_options(body)
        check_prompt_given(body)
    fields = Fields(body)
    prompts = read_prompts(fields)
    model = fields.str_or_none("model")
    max_tokens = fields.int_or_none("max_tokens") if fields.raw("max_tokens") is not None else DEFAULT_MAX_TOKENS
    n = fields.integer("n", 1)
    stream = bool(fields.bool_or_none("stream", False))
    stream_options = fields.dict_or_none("stream_options")
    min_tokens = fields.integer("min_tokens", 0)
    rules = read_stops(fields, min_tokens)
    temperature = fields.float_or_none("temperature")
    echo = bool(fields.bool_or_none("echo", False))
    add_special_tokens = fields.boolean("add_special_tokens", True)
    return_token_ids = bool(fields.bool_or_none("return_token_ids", False))
    truncate = fields.int_or_none("truncate_prompt_tokens")
    suffix = fields.str_or_none("suffix")
    body_request_id = fields.str_or_none("request_id")
    prompt_logprobs = fields.raw("prompt_logprobs")
    fields.check()

    ctx.check_model(model)
    embeds = isinstance(body, dict) and body.get("prompt_embeds") is not None
    check_suffix(suffix, echo, truncate, prompts, embeds)
    if embeds and echo:
        raise ApiError("Echo is unsupported with prompt embeds.")
    if embeds and prompt_logprobs is not None:
        raise ApiError("prompt_logprobs is not compatible with prompt embeds.")
    rows = embeds_rows(body.get("prompt_embeds") if embeds else None, ctx.settings.enable_prompt_embeds,
                       ctx.settings.hidden_size)  # fmt: skip
    if not prompts and not rows:
        raise ApiError(NO_PROMPT)
    request = OutputRequest(ctx.settings.max_model_len, max_tokens, "max_tokens", min_tokens, truncate)
    raise_if(check_request(ctx.profile, request))
    # the embeds run first, each its own prompt; their rows stand in for token ids (the engine sees no ids)
    counted = [_counted(ctx, request, [0] * n, add_special_tokens) for n in rows]
    counted += [_counted(ctx, request, p, add_special_tokens) for p in prompts]
    echo_only = echo and max_tokens == 0
    plans = []
    for raw, ids in counted:
        # Echo with max_tokens 0 returns the prompt only; vLLM still runs the engine for one token.
        generate = 1 if echo_only else unwrap(budget(request, len(ids)))
        raise_if(check_sampling(generate, min_tokens, n, temperature))
        echo_text = (raw.text if raw.text is not None else ctx.tokenizer.decode(ids)) if echo else None
        plans.append(PromptPlan(token_ids=ids, max_tokens=generate, echo_text=echo_text, echo_only=echo_only))
    check_stops(rules)
    include_usage, continuous = usage_flags(stream, stream_options)
    generation = Generation(
        endpoint="completion",
        response_id=response_id("cmpl", headers, body_request_id),
        created=int(time.time()),
        model=ctx.settings.model,
        prompts=plans,
        n=n,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        return_token_ids=return_token_ids,
        engine_error=next((e for p in plans if (e := engine_error(ctx, p.token_ids)) is not None), None),
    )
    return with_endings(generation, ctx.tokenizer, rules)


def _counted(
    ctx: Context, request: OutputRequest, prompt: str | list[int], add_special_tokens: bool
) -> tuple[RawPrompt, list[int]]:
    """One prompt through the renderer's checks: its ids as the engine gets them (after any truncation)."""
    if isinstance(prompt, str):
        raw = RawPrompt(text=prompt, token_ids=ctx.tokenizer.encode(prompt, add_special_tokens))
        chars: int | None = len(prompt)
    else:
        raw, chars = RawPrompt(text=None, token_ids=prompt), None
    shape = PromptShape(len(raw.token_ids), chars, ctx.tokenizer.max_chars_per_token)
    kept = unwrap(check_prompt(ctx.profile, request, shape))
    return raw, raw.token_ids[len(raw.token_ids) - kept :]
