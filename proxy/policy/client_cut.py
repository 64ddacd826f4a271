"""The cut a chat or completions request asks vLLM for (`truncate_prompt_tokens`, `truncation_side`): vLLM keeps that
many of the rendered prompt's tokens and runs, bills and reports only those, so the guard counts what it keeps. The
request goes to vLLM unchanged: vLLM cuts it (docs/vllm-wire-contract.md, section 3.4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy.errors import InvalidRequest

SIDES = ("left", "right")


@dataclass(frozen=True)
class ClientCut:
    keep: int  # the tokens vLLM keeps; -1: up to the window
    side: str | None  # which end vLLM drops (None: the tokenizer's, left for generative models); the count is the same

    def kept(self, tokens: int, window: int, holds_one: bool) -> int:
        """The prompt tokens vLLM runs of `tokens`: -1 keeps the window, less the one token vLLM holds back for the
        output when `holds_one` (TokenizeParams.max_truncation_tokens)."""
        keep = self.keep if self.keep >= 0 else max(0, window - 1) if holds_one else window
        return min(tokens, keep)

    def check(self, window: int) -> None:
        """vLLM 0.32's refusal of a cut longer than the window (TokenizeParams.__post_init__), as a 400."""
        if self.keep > window:
            raise InvalidRequest(f"truncate_prompt_tokens={self.keep} cannot be greater than max_model_len = "
                                 f"{window}. Please request a smaller truncation size.",
                                 param="truncate_prompt_tokens")  # fmt: skip


def client_cut(body: dict[str, Any]) -> ClientCut | None:
    """The cut a request asks for, or None; a value vLLM's request model refuses is a 400 here too."""
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


def holds_one(requested: int | None, unlimited_holds_one: bool) -> bool:
    """Whether vLLM's -1 holds a token back for the output: it does for an output limit other than 0; for a request
    that sets none, 0.33 does (chat and Responses pass max_output_tokens None) where 0.32 does not (it passes 0, cuts
    to the whole window and refuses the 0 tokens left)."""
    return requested != 0 if requested is not None else unlimited_holds_one
