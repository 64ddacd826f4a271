"""The completions request as the guard reads it: its prompts (strings or token ids, one or a batch, and tensors of
`prompt_embeds`) and output limit; every other field stays in `body` untouched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.api.body import (
    MAX_DEPTH,
    check_min_tokens,
    choices,
    count_field,
    flag,
    model_name,
    parse_json_object,
    token_ids,
)
from proxy.api.embeds import embeds_lengths
from proxy.errors import InvalidRequest


@dataclass(frozen=True)
class CompletionRequest:
    body: dict[str, Any]
    model: str | None
    prompts: list[str | list[int]]  # the text and token-id prompts
    add_special_tokens: bool
    max_tokens: int | None
    min_tokens: int | None
    n: int
    stream: bool
    embeds: tuple[int, ...] = ()  # each prompt_embeds tensor's num_tokens: vLLM runs them first, each its own prompt

    @property
    def sequences(self) -> int:
        """The sequences vLLM runs: n for each prompt, embeds and text alike."""
        return self.n * (len(self.embeds) + len(self.prompts))

    @property
    def requested_output(self) -> tuple[str, int]:
        return "max_tokens", 16 if self.max_tokens is None else self.max_tokens


def parse_completion(raw: bytes, max_depth: int = MAX_DEPTH) -> CompletionRequest:
    return completion_request(parse_json_object(raw, max_depth))


def completion_request(body: dict[str, Any]) -> CompletionRequest:
    embeds = tuple(embeds_lengths(body.get("prompt_embeds")))
    req = CompletionRequest(
        body=body,
        model=model_name(body),
        prompts=_prompts(body.get("prompt"), bool(embeds)),
        add_special_tokens=flag(body, "add_special_tokens", True),
        max_tokens=count_field(body, "max_tokens"),
        min_tokens=count_field(body, "min_tokens"),
        n=choices(body),
        stream=flag(body, "stream", False),
        embeds=embeds,
    )
    check_min_tokens(req.min_tokens, req.requested_output[1])  # vLLM's default of 16 counts when absent
    return req


def _prompts(prompt: Any, embeds: bool) -> list[str | list[int]]:
    """The text and token-id prompts; none beside prompt_embeds when `prompt` is absent or an empty array, as vLLM
    reads them (an empty string is a prompt of its own there)."""
    expected = "'prompt' must be a string, an array of strings, an array of token ids, or an array of those."
    if isinstance(prompt, str):
        return [prompt]
    if embeds and (prompt is None or prompt == []):
        return []
    if not isinstance(prompt, list):
        raise InvalidRequest(expected, param="prompt")
    if not prompt or prompt == [[]]:
        raise InvalidRequest("please provide at least one prompt", param="prompt")
    if token_ids(prompt):
        return [prompt]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) and p and token_ids(p) for p in prompt):
        return list(prompt)
    raise InvalidRequest(expected + " Strings and token ids cannot be mixed.", param="prompt")
