"""The cut a chat or completions request asks vLLM for (`truncate_prompt_tokens`, `truncation_side`): vLLM keeps that
many of the rendered prompt's tokens and runs, bills and reports only those, so the guard counts what it keeps. The
request goes to vLLM unchanged: vLLM cuts it (docs/vllm-wire-contract.md, section 3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from proxy.counting.registry import ModelRegistry
from proxy.errors import InvalidRequest

SIDES = ("left", "right")


class Rules(StrEnum):
    """How vLLM's -1 holds tokens back for the output (TokenizeParams.max_truncation_tokens), by release."""

    RESERVES = "0.31"  # the whole output limit (max_model_len - max_tokens)
    ONE_IF_LIMITED = "0.32"  # one token, for an output limit other than 0 (`max_output_tokens or 0`)
    ONE_UNLESS_ZERO = "0.33"  # one token, unless the limit is 0 (chat and Responses pass None for no limit)


def rules_of(registry: ModelRegistry) -> Rules:
    """The upstream's rules; 0.32's while its version is not known."""
    if registry.upstream_at_least((0, 33)):
        return Rules.ONE_UNLESS_ZERO
    if registry.upstream_version is not None and not registry.upstream_newer():
        return Rules.RESERVES
    return Rules.ONE_IF_LIMITED


@dataclass(frozen=True)
class ClientCut:
    keep: int  # the tokens vLLM keeps; -1: up to the window
    side: str | None  # which end vLLM drops (None: the tokenizer's, left for generative models); the count is the same

    def limit(self, window: int, held: int) -> int:
        """The most tokens vLLM keeps: -1 is the window less the `held` tokens it holds back for the output
        (held_back)."""
        return self.keep if self.keep >= 0 else max(0, window - held)

    def kept(self, tokens: int, window: int, held: int) -> int:
        """The prompt tokens vLLM runs of `tokens`."""
        return min(tokens, self.limit(window, held))

    def check(self, window: int) -> None:
        """vLLM 0.32's refusal of a cut longer than the window (TokenizeParams.__post_init__), as a 400."""
        if self.keep > window:
            raise InvalidRequest(f"truncate_prompt_tokens={self.keep} cannot be greater than max_model_len = "
                                 f"{window}. Please request a smaller truncation size.",
                                 param="truncate_prompt_tokens")  # fmt: skip


def client_cut(body: dict[str, Any]) -> ClientCut | None:
    """The cut a request asks for, or None; a value vLLM's request model refuses is a 400 here too."""
    if "truncate_prompt_tokens" not in body and "truncation_side" not in body:
        return None  # the common case, told apart without a lookup
    side = body.get("truncation_side")
    if side is not None and side not in SIDES:
        raise InvalidRequest(f"'truncation_side' must be 'left' or 'right', got {side!r}.", param="truncation_side")
    value = body.get("truncate_prompt_tokens")
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():  # pydantic's lax int, as count_field reads counts
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidRequest(f"'truncate_prompt_tokens' must be an integer of at least -1, got {value!r}.",
                             param="truncate_prompt_tokens")  # fmt: skip
    return ClientCut(value, side)


def held_back(requested: int | None, rules: Rules) -> int:
    """The tokens vLLM's -1 holds back for the output of a request whose output limit is `requested` (None: unset).
    0.31 holds the whole limit; 0.32 one token for a limit other than 0, none for no limit (it cuts to the whole
    window and refuses the 0 tokens left); 0.33 one token for no limit too."""
    if rules is Rules.RESERVES:
        return requested or 0
    if rules is Rules.ONE_IF_LIMITED:
        return 1 if requested else 0
    return 0 if requested == 0 else 1
