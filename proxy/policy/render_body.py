"""The body vLLM's render routes answer (its `GenerateRequest`, one per completions prompt), written by the guard from
the prompt's token ids in the shape of the upstream's release, so a scheduler reading it cannot tell who answered."""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import orjson

from proxy.errors import InvalidRequest
from proxy.policy import render_sampling as sampling
from proxy.policy.render_context import as_chat, parse_context, server_defaults
from proxy.policy.render_sampling import Body, Release, at_least

RenderKind = Literal["chat", "completion", "messages", "responses"]

NOT_REPRODUCED: tuple[tuple[str, str], ...] = (
    (
        "generation_config",
        "the model's generation_config defaults (vLLM's get_diff_sampling_param: temperature, "
        "top_p, max_tokens, stop_token_ids ...) are not known to the guard: the answer holds vLLM's own defaults",
    ),
    ("features", "multimodal hashes and placeholders need vLLM's processor: always null here"),
    ("token_offsets", "return_token_offsets asks for character offsets the guard's ids do not carry: always null"),
    (
        "reasoning_ended",
        "with a reasoning parser vLLM reads it from the prompt; here true only for "
        "include_reasoning false, null otherwise",
    ),
    (
        "reasoning_parser_kwargs",
        "set by servers with a reasoning parser (vLLM gives gpt-oss its own by default): always null here",
    ),
    ("parse_context.tools", "written as the client sent them; vLLM writes its parsed tool models with every default"),
    (
        "parse_context.chat_template_kwargs",
        "0.34's --reasoning-effort-map and a Messages request's disabled thinking (resolved per model from 0.33) are "
        "not read into them",
    ),
    ("sampling_params.repetition_detection", "not copied"),
    ("sampling_params.prompt_logprob_token_ids", "not copied"),
    (
        "sampling_params.validation",
        "values SamplingParams refuses (temperature over 2, top_p 0 ...) are not refused here: the answer carries them",
    ),
    ("structured_outputs", "response_format structural_tag and a text.format with structured_outputs are not read"),
)
ENVELOPE_0_31 = tuple(
    "request_id token_ids token_offsets features content_parts sampling_params model return_token_ids stream "
    "stream_options cache_salt priority kv_transfer_params ec_transfer_params".split()
)
REASONING = ("reasoning_ended", "reasoning_parser_kwargs")


def render_answer(
    kind: RenderKind,
    body: dict[str, Any],
    headers: Mapping[str, str],
    prompts: Sequence[Sequence[int]],
    max_model_len: int,
    release: tuple[int, int] | None,
    template_defaults: Mapping[str, Any] | None = None,
    harmony: bool = False,
) -> bytes:
    """The JSON body vLLM's render route answers for this request whose prompt(s) render to `prompts` (chat,
    messages, responses: exactly one; completions: one per prompt, answered as a list). `release`: the upstream's
    (major, minor), None when unknown (answer as the newest supported). `template_defaults`: the server's
    --default-chat-template-kwargs; `harmony`: a gpt-oss model, whose output vLLM parses without template kwargs."""
    answer: object
    if kind == "completion":
        answer = _completions(body, headers, prompts, max_model_len, release)
    elif kind == "responses":
        (prompt,) = prompts
        answer = _responses(body, prompt, max_model_len, release)
    else:
        (prompt,) = prompts
        messages = body if kind == "messages" else None
        answer = _chat(
            body if messages is None else as_chat(body, release),
            headers,
            prompt,
            max_model_len,
            release,
            messages=messages,
            defaults=None if harmony else server_defaults(template_defaults or {}),
        )
    return _dump(answer) if not at_least(release, (0, 33)) else _orjson(answer)


def _chat(
    body: Body,
    headers: Mapping[str, str],
    prompt: Sequence[int],
    max_model_len: int,
    release: Release | None,
    *,
    messages: Body | None,
    defaults: Mapping[str, Any] | None,
) -> dict[str, Any]:
    if body.get("use_beam_search"):
        raise InvalidRequest("Beam search is not supported by the render endpoint")
    limit_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _max_tokens(body.get(limit_name), limit_name, prompt, max_model_len)
    params = sampling.chat_params(body, max_tokens, release)
    fields = _common(body, prompt, params, release)
    fields["request_id"] = "chatcmpl-" + _base_id(body if messages is None else {}, headers, release)
    fields["reasoning_ended"] = True if body.get("include_reasoning") is False else None
    fields["return_token_ids"] = body.get("return_token_ids") if at_least(release, (0, 33)) else None
    fields["parse_context"] = parse_context(body, messages, release, defaults) if at_least(release, (0, 33)) else None
    return _envelope(fields, release)


def _completions(
    body: Body,
    headers: Mapping[str, str],
    prompts: Sequence[Sequence[int]],
    max_model_len: int,
    release: Release | None,
) -> list[dict[str, Any]]:
    if body.get("use_beam_search") and at_least(release, (0, 32)):
        raise InvalidRequest("Beam search is not supported by the render endpoint")
    base = "cmpl-" + _base_id(body, headers, release)
    answers = []
    for i, prompt in enumerate(prompts):
        limit = 16 if body.get("max_tokens") is None else body["max_tokens"]
        params = sampling.completion_params(body, _max_tokens(limit, "max_tokens", prompt, max_model_len), release)
        fields = _common(body, prompt, params, release)
        if not at_least(release, (0, 32)):
            fields["request_id"] = f"cmpl-{_random_id()}"
        else:
            fields["request_id"] = base if len(prompts) == 1 else f"{base}-{i}"
        fields["return_token_ids"] = body.get("return_token_ids") if at_least(release, (0, 33)) else None
        answers.append(_envelope(fields, release))
    return answers


def _responses(body: Body, prompt: Sequence[int], max_model_len: int, release: Release | None) -> dict[str, Any]:
    if body.get("previous_response_id") is not None:
        raise InvalidRequest(
            "previous_response_id is not supported by the stateless render endpoint.", param="previous_response_id"
        )
    max_tokens = _max_tokens(body.get("max_output_tokens"), "max_output_tokens", prompt, max_model_len)
    params = sampling.responses_params(body, max_tokens, release)
    fields = _common(body, prompt, params, release)
    fields["request_id"] = body.get("request_id") or f"resp_{_random_id()}"
    fields["stream_options"] = None
    if not at_least(release, (0, 33)):  # later releases take them from extra_args, as _common does
        fields["kv_transfer_params"] = body.get("kv_transfer_params")
        fields["ec_transfer_params"] = body.get("ec_transfer_params")
    return _envelope(fields, release)


def _common(body: Body, prompt: Sequence[int], params: dict[str, Any], release: Release | None) -> dict[str, Any]:
    kv = ec = None
    if at_least(release, (0, 33)):
        kv, ec = sampling.hoist(params)
    stream = bool(body.get("stream"))
    return {
        "token_ids": list(prompt),
        "token_offsets": None,
        "features": None,
        "content_parts": None,
        "sampling_params": params,
        "model": body.get("model"),
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": None,
        "output_mode": "tokens",
        "parse_context": None,
        "stream": stream,
        "stream_options": _stream_options(body) if stream else None,
        "cache_salt": body.get("cache_salt"),
        "priority": body.get("priority", 0),
        "kv_transfer_params": kv,
        "ec_transfer_params": ec,
    }


def _envelope(fields: dict[str, Any], release: Release | None) -> dict[str, Any]:
    names = list(ENVELOPE_0_31)
    if at_least(release, (0, 32)):
        names[7:7] = REASONING
        names.insert(names.index("return_token_ids") + 1, "output_mode")
    if at_least(release, (0, 33)):
        names.insert(names.index("output_mode") + 1, "parse_context")
    return {name: fields[name] for name in names}


def _max_tokens(limit: int | None, name: str, prompt: Sequence[int], max_model_len: int) -> int:
    """vLLM refuses a limit over the whole window (TokenizeParams) and clamps one over the room (get_max_tokens)."""
    if limit is not None and limit > max_model_len:
        message = (
            f"{name}={limit} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens."
        )
        raise InvalidRequest(f"{message} (parameter={name}, value={limit})", param=name)
    room = max_model_len - len(prompt)
    if room < 0:  # the renderer refuses such a prompt first; get_max_tokens' own words, should one get here
        raise InvalidRequest(f"Input length ({len(prompt)}) exceeds model's maximum context length ({max_model_len}).")
    return room if limit is None else min(room, limit)


def _stream_options(body: Body) -> dict[str, Any] | None:
    given = body.get("stream_options")
    if given is None:
        return None
    return {
        "include_usage": given.get("include_usage", False),
        "continuous_usage_stats": given.get("continuous_usage_stats", False),
    }


def _base_id(body: Body, headers: Mapping[str, str], release: Release | None) -> str:
    """0.32+ honours X-Request-Id, then the body's request_id; 0.31 always draws a new one."""
    if not at_least(release, (0, 32)):
        return _random_id()
    header = next((value for key, value in headers.items() if key.lower() == "x-request-id"), None)
    return header if header is not None else body.get("request_id") or _random_id()


def _random_id() -> str:
    return secrets.token_hex(8)  # vLLM's random_uuid: 64 random bits as 16 hex digits


def _dump(answer: object) -> bytes:
    """As starlette's JSONResponse writes it (0.31, 0.32), the token ids written by orjson (the same digits, a
    tenth of the time for 100K ids) in the place of an unguessable marker."""
    marker = f"tg-ids-{secrets.token_hex(16)}"
    lists: list[bytes] = []
    for item in answer if isinstance(answer, list) else [answer]:
        if isinstance(item, dict) and isinstance(item.get("token_ids"), list):
            lists.append(orjson.dumps(item["token_ids"]))
            item["token_ids"] = f"{marker}-{len(lists) - 1}"
    text = json.dumps(answer, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
    for i, ids in enumerate(lists):
        text = text.replace(f'"{marker}-{i}"'.encode(), ids, 1)
    return text


def _orjson(answer: object) -> bytes:
    """As vLLM 0.33+ writes it (create_json_response): orjson, or JSONResponse for ints past 64 bits."""
    try:
        return orjson.dumps(answer, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(answer, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")).encode()
