"""The token-in generate request (`POST /inference/v1/generate`) as the guard reads it: its token ids are the prompt,
its output limit lives in `sampling_params`. Every other field stays in `body` untouched.

vLLM 0.31 / 0.32 (`scale_out/token_in_token_out/protocol.py` `GenerateRequest`, `serving.py`): `token_ids` is a
non-empty list of non-negative ints, used as given; `sampling_params` (required) is vLLM's SamplingParams: a
`max_tokens` left out gets the room the prompt leaves (get_max_tokens), as chat does, and an explicit null the same
from the engine; a `max_tokens` over that room is not refused: the engine stops at the window. With `features`, the
multimodal placeholders already lie inside `token_ids` (vLLM checks so): the count is exact. With `content_parts`,
vLLM fetches the media and expands its placeholders into the prompt: the guard's count is a lower bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from proxy.api.body import check_min_tokens, choices, count_field, kind_of, model_name, optional
from proxy.api.body import token_ids as all_token_ids
from proxy.errors import InvalidRequest

SAMPLING = "sampling_params"
T = TypeVar("T")


@dataclass(frozen=True)
class GenerateRequest:
    body: dict[str, Any]
    model: str | None
    prompt_tokens: int
    sampling: dict[str, Any]
    max_tokens: int | None
    min_tokens: int | None
    n: int
    media: bool  # content_parts: vLLM adds the media's placeholder tokens to the prompt


def generate_request(body: dict[str, Any]) -> GenerateRequest:
    token_ids = body.get("token_ids")
    if not isinstance(token_ids, list) or not token_ids:
        raise InvalidRequest("'token_ids' must be a non-empty array of token ids.", param="token_ids")
    if not all_token_ids(token_ids):
        raise InvalidRequest("'token_ids' must hold non-negative integers only.", param="token_ids")
    sampling = body.get(SAMPLING)
    if not isinstance(sampling, dict):
        raise InvalidRequest(f"'{SAMPLING}' is required: an object (vLLM's SamplingParams), got {kind_of(sampling)}.",
                             param=SAMPLING)  # fmt: skip
    max_tokens, min_tokens = _count(sampling, "max_tokens"), _count(sampling, "min_tokens")
    check_min_tokens(min_tokens, max_tokens)
    optional(body, "features", dict, "an object")
    parts = optional(body, "content_parts", list, "an array")
    return GenerateRequest(
        body=body, model=model_name(body), prompt_tokens=len(token_ids), sampling=sampling, max_tokens=max_tokens,
        min_tokens=min_tokens, n=_nested(sampling, "n", choices), media=bool(parts),
    )  # fmt: skip


def _count(sampling: dict[str, Any], key: str) -> int | None:
    return _nested(sampling, key, lambda fields: count_field(fields, key))


def _nested(sampling: dict[str, Any], key: str, read: Callable[[dict[str, Any]], T]) -> T:
    """A sampling_params field read as the top-level one is; its errors name it in full."""
    try:
        return read(sampling)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message.replace(f"'{key}'", f"'{SAMPLING}.{key}'", 1),
                             param=f"{SAMPLING}.{key}") from None  # fmt: skip
