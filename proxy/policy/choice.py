"""Which overflow policy applies to a request, and how much room a cut or split prompt keeps for the answer.

A request whose answer is about its own prompt is never cut, whatever the policy or the client's header: the logprobs
of a prompt's tokens (completions' `echo` with `logprobs`, `prompt_logprobs`) answered for a cut prompt are the
logprobs of another text, and a harness that scores with them (lm-evaluation-harness's loglikelihood, perplexity)
reports a wrong number and no error. Nor is a prompt the guard cannot cut: `prompt_embeds` tensors, which only vLLM
reads, and the ids of `kv_transfer_params.prompt_token_ids`, which vLLM runs in place of the messages. Such a request
gets the overflow 400, saying why the policy was not applied.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.errors import InvalidRequest
from proxy.policy.decide import Limits
from proxy.settings import OVERFLOW_POLICIES, Overflow, PolicySettings

OVERFLOW_HEADER = "x-token-guard-overflow"
UNSAID_SHARE = 4  # a request that names no output limit keeps 1/4 of the window for its answer when cut
# by value, looked up rather than called: Overflow(value) costs ~1 us a request on Python 3.11
OVERFLOWS: dict[str, Overflow] = {policy.value: policy for policy in Overflow}


def choose_policy(policy: PolicySettings, headers: Mapping[str, str]) -> Overflow:
    asked = headers.get(OVERFLOW_HEADER)
    if asked is None:
        return OVERFLOWS[policy.on_overflow]
    value = asked.strip().lower()
    if value not in OVERFLOW_POLICIES:
        raise InvalidRequest(
            f"The {OVERFLOW_HEADER} header must be one of {', '.join(OVERFLOW_POLICIES)}; got {asked!r}.",
            param=OVERFLOW_HEADER,
        )
    if not policy.allow_client_override and value != policy.on_overflow:
        raise InvalidRequest(
            f"This gateway does not let clients choose the overflow policy ({OVERFLOW_HEADER}: {value}); "
            f"its policy is {policy.on_overflow!r}.",
            param=OVERFLOW_HEADER,
        )
    return OVERFLOWS[value]


def whole_prompt(body: Mapping[str, Any]) -> str | None:
    """Why a request's prompt must reach vLLM whole (as the reason an overflow policy was not applied), or None."""
    if body.get("prompt_logprobs") is not None:
        return "the request asks for its prompt's logprobs (prompt_logprobs), which a cut prompt would change"
    if body.get("echo") is True and body.get("logprobs") is not None:
        return "the request asks for its prompt's logprobs (echo with logprobs), which a cut prompt would change"
    if body.get("prompt_embeds") not in (None, []):
        return "the request sends prompt_embeds, which only vLLM reads: token-guard cannot cut them"
    if body.get("truncate_prompt_tokens") is not None:
        return "the request sets truncate_prompt_tokens, and vLLM cuts its prompt as asked"
    transfer = body.get("kv_transfer_params")
    if isinstance(transfer, dict) and transfer.get("prompt_token_ids") is not None:
        return "the request sends its prompt's ids in kv_transfer_params, which vLLM runs in place of the messages"
    return None


def output_reserve(requested: int | None, limits: Limits) -> int:
    """Room kept for the answer when a prompt is cut or split: what the request asks for, else the configured
    default_max_tokens, else a quarter of the window (a cut prompt that leaves 1 token of room answers nothing); at
    most half the window, so that the prompt keeps at least the other half."""
    if requested is not None:
        wanted = requested
    else:
        wanted = limits.default_output() or limits.max_model_len // UNSAID_SHARE
    return max(limits.min_output_tokens, min(wanted, limits.max_model_len // 2))
