"""The `sampling_params` of a render answer: what vLLM's `to_sampling_params` (chat, completions, Responses) builds,
as `msgspec.to_builtins` writes it under `omit_defaults` (vLLM 0.31-0.34 `sampling_params.py`).

msgspec leaves out a field whose value *is* its default object: the floats a request model hands over (penalties,
temperature, top_p, min_p) are written even at their defaults, small ints, booleans and None at theirs are not, and a
greedy request (temperature 0) resets top_p, top_k and min_p to the default objects, which are then left out.
A compact reading for what is rare: structured outputs only for `response_format` json_object and json_schema (chat,
completions), no watermarking, logprob_token_ids, repetition_detection or routed_experts_prompt_start, and no
server generation-config defaults (the simulator has none).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

Kind = Literal["chat", "completion", "responses"]
GREEDY = 1e-5  # _SAMPLING_EPS
KEPT = object()  # a value never the default object itself (a float the request model hands over): always written
LOGPROBS_ITEM = "message.output_text.logprobs"


def sampling_params(body: Mapping[str, Any], kind: Kind, max_tokens: int, hoists: bool) -> dict[str, Any]:
    """The dump; `hoists` (0.33+): kv/ec transfer params leave extra_args for the answer's top level."""
    temperature = _float(body, "temperature", 1.0)
    greedy = temperature < GREEDY
    logprobs, prompt_logprobs = _logprobs(body, kind)
    generic = kind != "responses"
    entries: list[tuple[str, Any, Any]] = [
        ("n", body.get("n") if generic else None, None),
        ("presence_penalty", _float(body, "presence_penalty", 0.0), KEPT),
        ("frequency_penalty", _float(body, "frequency_penalty", 0.0), KEPT),
        ("repetition_penalty", _float(body, "repetition_penalty", 1.0), KEPT),
        ("temperature", temperature, KEPT),
        ("top_p", None if greedy else _float(body, "top_p", 1.0), KEPT),
        ("top_k", None if greedy else body.get("top_k"), 0),
        ("min_p", None if greedy else _float(body, "min_p", 0.0), KEPT),
        ("seed", body.get("seed"), -1),
        ("stop", _stop(body.get("stop")), KEPT),
        ("stop_token_ids", list(dict.fromkeys(body.get("stop_token_ids") or [])), KEPT),
        ("ignore_eos", body.get("ignore_eos"), False),
        ("max_tokens", max_tokens, 16),
        ("min_tokens", body.get("min_tokens") if generic else None, 0),
        ("logprobs", logprobs, None),
        ("prompt_logprobs", prompt_logprobs, None),
        ("skip_special_tokens", body.get("skip_special_tokens"), True),
        ("spaces_between_special_tokens", body.get("spaces_between_special_tokens") if generic else None, True),
        ("include_stop_str_in_output", body.get("include_stop_str_in_output"), False),
        ("output_kind", 1 if body.get("stream") else 2, KEPT),  # RequestOutputKind DELTA or FINAL_ONLY
        ("stream_interval", body.get("stream_interval") if generic else None, None),
        ("skip_clone", True, KEPT),
        ("structured_outputs", structured_outputs(body.get("response_format")) if generic else None, None),
        ("logit_bias", _logit_bias(body.get("logit_bias")), None),
        ("allowed_token_ids", body.get("allowed_token_ids") if generic else None, None),
        ("extra_args", extra_args(body, kind, hoists)[0], None),
        ("bad_words", list(dict.fromkeys((body.get("bad_words") if generic else None) or [])), KEPT),
        ("skip_reading_prefix_cache", prompt_logprobs is not None, KEPT),
        ("thinking_token_budget", body.get("thinking_token_budget") if generic else None, None),
    ]
    return {name: value for name, value, default in entries if value is not None and (default is KEPT or
            value != default)}  # fmt: skip


def extra_args(body: Mapping[str, Any], kind: Kind, hoists: bool) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """SamplingParams.extra_args (vllm_xargs plus the kv/ec transfer params), and what 0.33+ hoists out of it."""
    extra = dict(body.get("vllm_xargs") or {})
    for key in ("kv_transfer_params", "ec_transfer_params"):
        if body.get(key):
            extra[key] = body[key]
    if not extra:  # chat and completions pass `extra_args or None`, Responses the dict itself
        return ({} if kind == "responses" else None), {}
    if not hoists:
        return extra, {}
    hoisted = {key: extra.pop(key) for key in ("kv_transfer_params", "ec_transfer_params") if key in extra}
    return extra or None, hoisted


def structured_outputs(response_format: Any) -> dict[str, Any] | None:
    """StructuredOutputsParams as msgspec writes the dataclass: every field, the private ones too."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    schema = (response_format.get("json_schema") or {}).get("schema") if kind == "json_schema" else None
    if kind != "json_object" and schema is None:
        return None
    return {"json": schema, "regex": None, "choice": None, "grammar": None,
            "json_object": True if kind == "json_object" else None, "disable_any_whitespace": False,
            "disable_additional_properties": False, "whitespace_pattern": None, "structural_tag": None,
            "_backend": None, "_backend_was_auto": False}  # fmt: skip


def _logprobs(body: Mapping[str, Any], kind: Kind) -> tuple[int | None, int | None]:
    """(logprobs, prompt_logprobs): chat's top_logprobs when logprobs is on, completions' logprobs, a Responses
    request's top_logprobs when its `include` asks for them; with echo the prompt's too."""
    if kind == "responses":
        wanted = LOGPROBS_ITEM in (body.get("include") or [])
        return (body.get("top_logprobs") or 0 if wanted else None), None
    if kind == "chat":
        top = body.get("top_logprobs", 0)
        logprobs = top if body.get("logprobs") else None
    else:
        logprobs = top = body.get("logprobs")
    prompt = body.get("prompt_logprobs")
    return logprobs, top if prompt is None and body.get("echo") else prompt


def _float(body: Mapping[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    return default if value is None else float(value)


def _stop(stop: Any) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def _logit_bias(bias: Any) -> dict[str, float] | None:
    return {str(token): float(value) for token, value in bias.items()} if isinstance(bias, dict) and bias else None
