"""POST /inference/v1/generate (vLLM 0.31 / 0.32 with --enable-scale-out): the prompt is the token ids as given, the
sampling parameters nested in `sampling_params`. No renderer checks the length: the engine refuses a prompt of the
window or more, fills the window when max_tokens is left out (or null), and stops at the window when it is larger."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from simulator.context import Context, engine_error, raise_if, response_id, usage_flags
from simulator.errors import ApiError, request_validation_error
from simulator.generation import Generation, PromptPlan
from simulator.limits import check_sampling
from simulator.wire import Fields

DECODER = "The decoder prompt (length {n})"


def plan_generate(ctx: Context, body: Any, headers: Mapping[str, str]) -> Generation:
    fields = Fields(body)
    token_ids = _token_ids(fields)
    sampling = fields.require("sampling_params")
    if fields.has("sampling_params") and not isinstance(sampling, dict):
        fields.invalid("body.sampling_params", "dict_type", "Input should be a valid dictionary", sampling)
    model = fields.str_or_none("model")
    stream = bool(fields.bool_or_none("stream", False))
    stream_options = fields.dict_or_none("stream_options")
    output_mode = fields.str_or_none("output_mode") or "tokens"
    body_request_id = fields.str_or_none("request_id")
    fields.check()
    params = Fields(sampling)
    max_tokens = params.int_or_none("max_tokens")
    n, min_tokens = params.integer("n", 1), params.integer("min_tokens", 0)
    temperature = params.float_or_none("temperature")
    params.check()

    ctx.check_model(model)
    generate = _budget(ctx.settings.max_model_len, len(token_ids), max_tokens)
    # SamplingParams checks the limit asked for (or, when none is, the room); the engine then stops at the window
    raise_if(check_sampling(generate if max_tokens is None else max_tokens, min_tokens, n, temperature))
    include_usage, continuous = usage_flags(stream, stream_options)
    return Generation(
        endpoint="generate", response_id=response_id("generate-tokens", headers, body_request_id),
        created=int(time.time()), model=ctx.settings.model, prompts=[PromptPlan(token_ids, generate)], n=n,
        stream=stream, include_usage=include_usage, continuous_usage=continuous,
        engine_error=engine_error(ctx, token_ids),
        request={"output_mode": output_mode} if ctx.profile.generate_output_mode else None,
    )  # fmt: skip


def _token_ids(fields: Fields) -> list[int]:
    values = fields.require("token_ids")
    if not fields.has("token_ids"):
        return []
    if not isinstance(values, list):
        fields.invalid("body.token_ids", "list_type", "Input should be a valid list", values)
        return []
    if not values:
        error = {"type": "too_short", "loc": "body.token_ids", "msg": "List should have at least 1 item after "
                 "validation, not 0", "input": "<list of 0 items>", "ctx": {"field_type": "List", "min_length": 1,
                 "actual_length": 0}}  # fmt: skip
        raise request_validation_error([str(error)], param="body.token_ids")
    ids = fields.ints("token_ids", values, minimum=-(2**63))
    if any(t < 0 for t in ids):
        msg = "Value error, token_ids must not contain negative values"
        error = {"type": "value_error", "loc": "body.token_ids", "msg": msg, "input": f"<list of {len(values)} items>"}
        raise request_validation_error([str(error)], param="body.token_ids")
    return ids


def _budget(window: int, prompt: int, max_tokens: int | None) -> int:
    """The engine's input checks, then what it generates: max_tokens, never past the window."""
    if prompt > window:
        raise ApiError(f"{DECODER.format(n=prompt)} is longer than the maximum model length of {window}. Make sure "
                       "that `max_model_len` is no smaller than the number of text tokens.")  # fmt: skip
    if prompt == window:
        raise ApiError(f"{DECODER.format(n=prompt)} plus the number of requested output tokens (at least 1) is longer "
                       f"than the maximum model length of {window}. Make sure that `max_model_len` is no smaller than "
                       "the number of text tokens (prompt + requested output tokens).")  # fmt: skip
    room = window - prompt
    return room if max_tokens is None else min(max_tokens, room)
