"""The `sampling_params` of a render answer: what vLLM's `to_sampling_params` builds from a request, written as its
`SamplingParams` serializes (msgspec `omit_defaults`, in the struct's field order).

msgspec omits a field only when its value *is* the default object: small ints, bools and None compare so, while every
float that `to_sampling_params` passes (penalties, temperature, top_p, min_p) is a fresh object and always written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.errors import InvalidRequest

Release = tuple[int, int]
Body = Mapping[str, Any]

FIELDS = tuple(
    "n presence_penalty frequency_penalty repetition_penalty temperature watermarking top_p top_k min_p seed stop "
    "stop_token_ids ignore_eos max_tokens min_tokens logprobs prompt_logprobs prompt_logprob_token_ids "
    "prompt_logprob_start logprob_token_ids flat_logprobs detokenize skip_special_tokens "
    "spaces_between_special_tokens include_stop_str_in_output output_kind stream_interval skip_clone "
    "output_text_buffer_length structured_outputs logit_bias allowed_token_ids extra_args bad_words "
    "skip_reading_prefix_cache thinking_token_budget repetition_detection routed_experts_prompt_start "
    "trace_decode_token_ids".split()
)
# Defaults msgspec recognises by identity (small ints, bools); None is every other field's default.
IDENTITY_DEFAULTS: dict[str, object] = {
    "n": 1,
    "top_k": 0,
    "ignore_eos": False,
    "max_tokens": 16,
    "min_tokens": 0,
    "flat_logprobs": False,
    "detokenize": True,
    "skip_special_tokens": True,
    "spaces_between_special_tokens": True,
    "include_stop_str_in_output": False,
    "skip_clone": False,
    "output_text_buffer_length": 0,
    "routed_experts_prompt_start": 0,
}
FLOATS = (
    ("presence_penalty", 0.0),
    ("frequency_penalty", 0.0),
    ("repetition_penalty", 1.0),
    ("temperature", 1.0),
    ("top_p", 1.0),
)
STRUCTURED = (
    "json",
    "regex",
    "choice",
    "grammar",
    "json_object",
    "disable_any_whitespace",
    "disable_additional_properties",
    "whitespace_pattern",
    "structural_tag",
)
STRUCTURED_DEFAULTS = {"disable_any_whitespace": False, "disable_additional_properties": False}
# Copied from the request by the chat and completions routes alike.
SHARED = tuple(
    "stop_token_ids ignore_eos min_tokens skip_special_tokens spaces_between_special_tokens "
    "include_stop_str_in_output stream_interval allowed_token_ids bad_words thinking_token_budget "
    "routed_experts_prompt_start".split()
)
MAX_TEMP, SAMPLING_EPS = 1e-2, 1e-5


def at_least(release: Release | None, wanted: Release) -> bool:
    return release is None or release >= wanted


def chat_params(body: Body, max_tokens: int, release: Release | None) -> dict[str, Any]:
    values = _floats(body) | {name: body.get(name) for name in (*SHARED, "n", "seed", "stop", "logit_bias")}
    values["top_k"] = _int_or(body.get("top_k"), 0)
    logprobs = body.get("top_logprobs", 0) if body.get("logprobs") and not body.get("logprob_token_ids") else None
    prompt_logprobs = body.get("prompt_logprobs")
    if prompt_logprobs is None and body.get("echo"):
        prompt_logprobs = body.get("top_logprobs", 0)
    values |= {
        "logprobs": logprobs,
        "prompt_logprobs": prompt_logprobs,
        "max_tokens": max_tokens,
        "logprob_token_ids": body.get("logprob_token_ids") or None,
        "structured_outputs": _from_response_format(body),
    }
    return _finish(values, body, release)


def completion_params(body: Body, max_tokens: int, release: Release | None) -> dict[str, Any]:
    values = _floats(body) | {name: body.get(name) for name in (*SHARED, "n", "seed", "stop", "logit_bias")}
    values["top_k"] = _int_or(body.get("top_k"), 0)
    logprobs = body.get("logprobs")
    prompt_logprobs = body.get("prompt_logprobs")
    if prompt_logprobs is None and body.get("echo"):
        prompt_logprobs = logprobs
    echo_only = body.get("echo") and body.get("max_tokens") == 0
    values |= {
        "logprobs": None if body.get("logprob_token_ids") else logprobs,
        "prompt_logprobs": prompt_logprobs,
        "max_tokens": 1 if echo_only else max_tokens,
        "logprob_token_ids": body.get("logprob_token_ids") or None,
        "structured_outputs": _from_response_format(body),
    }
    return _finish(values, body, release)


def responses_params(body: Body, max_tokens: int, release: Release | None) -> dict[str, Any]:
    values = _floats(body) | {
        name: body.get(name)
        for name in (
            "seed",
            "stop",
            "stop_token_ids",
            "ignore_eos",
            "logit_bias",
            "skip_special_tokens",
            "include_stop_str_in_output",
        )
    }
    if not at_least(release, (0, 32)):
        values["min_p"] = 0.0  # 0.31's Responses request has no min_p
    if at_least(release, (0, 33)):
        values["spaces_between_special_tokens"] = body.get("spaces_between_special_tokens")
    if at_least(release, (0, 34)):
        values["thinking_token_budget"] = body.get("thinking_token_budget")
    values["top_k"] = _int_or(body.get("top_k"), 0)
    include = body.get("include")
    wants_logprobs = isinstance(include, list) and "message.output_text.logprobs" in include
    values |= {
        "logprobs": body.get("top_logprobs", 0) if wants_logprobs else None,
        "max_tokens": max_tokens,
        "structured_outputs": _from_text_format(body),
    }
    return _finish(values, body, release, extra_args_always=True)


def _floats(body: Body) -> dict[str, Any]:
    values = {name: float(default if body.get(name) is None else body[name]) for name, default in FLOATS}
    values["min_p"] = float(body.get("min_p") or 0.0)
    return values


def _int_or(value: Any, default: int) -> int:
    return default if value is None else int(value)


def _finish(
    values: dict[str, Any], body: Body, release: Release | None, *, extra_args_always: bool = False
) -> dict[str, Any]:
    """What SamplingParams.from_optional and __post_init__ make of the values, then msgspec's omission (Responses
    passes `extra_args` even when empty; the other routes pass None then)."""
    values |= {
        "output_kind": 1 if body.get("stream") else 2,
        "skip_clone": True,
        "extra_args": _extra_args(body) or ({} if extra_args_always else None),
    }
    if at_least(release, (0, 32)):
        values["watermarking"] = body.get("watermarking")
    _sample(values)
    _check_limits(values["max_tokens"], values.get("min_tokens") or 0)
    values["stop"] = _stops(values.get("stop"))
    values["stop_token_ids"] = list(dict.fromkeys(values.get("stop_token_ids") or []))
    values["bad_words"] = list(dict.fromkeys(values.get("bad_words") or []))
    if values["stop"] and not values.get("include_stop_str_in_output"):
        values["output_text_buffer_length"] = max(len(s) for s in values["stop"]) - 1
    if values.get("logit_bias") is not None:
        values["logit_bias"] = {str(int(k)): min(100.0, max(-100.0, float(v))) for k, v in values["logit_bias"].items()}
    if values.get("thinking_token_budget") == -1:
        values["thinking_token_budget"] = None
    values["skip_reading_prefix_cache"] = values.get("prompt_logprobs") is not None
    return {name: values[name] for name in FIELDS if _written(name, values.get(name))}


def _check_limits(max_tokens: int, min_tokens: int) -> None:
    """SamplingParams' own refusals of the output limit (a prompt that fills the window leaves a limit of 0)."""
    if max_tokens < 1:
        message = f"max_tokens must be at least 1, got {max_tokens}."
        raise InvalidRequest(f"{message} (parameter=max_tokens, value={max_tokens})", param="max_tokens")
    if min_tokens > max_tokens:
        raise InvalidRequest(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")


def _sample(values: dict[str, Any]) -> None:
    if 0 < values["temperature"] < MAX_TEMP:
        values["temperature"] = MAX_TEMP
    if values.get("seed") == -1:
        values["seed"] = None
    if values["temperature"] < SAMPLING_EPS:  # greedy: SamplingParams resets these to its own defaults
        for name in ("top_p", "top_k", "min_p"):
            values.pop(name)


def _written(name: str, value: Any) -> bool:
    if value is None:
        return False
    default = IDENTITY_DEFAULTS.get(name, None)
    return default is None or type(value) is not type(default) or value != default


def _stops(stop: Any) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _extra_args(body: Body) -> dict[str, Any]:
    extra = dict(body.get("vllm_xargs") or {})
    for name in ("kv_transfer_params", "ec_transfer_params"):
        if body.get(name):
            extra[name] = body[name]
    return extra


def _structured(given: Mapping[str, Any] | None, **overrides: Any) -> dict[str, Any]:
    """StructuredOutputsParams as msgspec writes a dataclass: every field, its private ones included."""
    fields = {name: STRUCTURED_DEFAULTS.get(name) for name in STRUCTURED} | dict(given or {}) | overrides
    return {name: fields.get(name) for name in STRUCTURED} | {"_backend": None, "_backend_was_auto": False}


def _from_response_format(body: Body) -> dict[str, Any] | None:
    given = body.get("structured_outputs")
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_object":
        return _structured(given, json_object=True)
    if fmt.get("type") == "json_schema":
        return _structured(given, json=(fmt.get("json_schema") or {}).get("schema"))
    return None if given is None else _structured(given)


def _from_text_format(body: Body) -> dict[str, Any] | None:
    given = body.get("structured_outputs")
    fmt = (body.get("text") or {}).get("format")
    if fmt is None:
        return None if given is None else _structured(given)
    if fmt.get("type") == "json_object":
        return _structured(None, json_object=True)
    if fmt.get("type") == "json_schema" and fmt.get("schema") is not None:
        return _structured(None, json=fmt["schema"])
    return None


def hoist(params: dict[str, Any]) -> tuple[Any, Any]:
    """0.33+: render moves the transfer params out of `extra_args` into the answer's own fields; an empty
    `extra_args` (Responses passes `{}`) is left as it is (`_hoist_transfer_params` returns early)."""
    if not params.get("extra_args"):
        return None, None
    extra = dict(params["extra_args"])
    kv, ec = extra.pop("kv_transfer_params", None), extra.pop("ec_transfer_params", None)
    if extra:
        params["extra_args"] = extra
    else:
        params.pop("extra_args", None)
    return kv, ec
