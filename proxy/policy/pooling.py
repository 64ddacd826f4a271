"""The decision for pooling requests (embeddings, /pooling, /classify, score, rerank): no output, so a prompt fits
when it is at most the window (vLLM accepts exactly max_model_len tokens here), and each input is its own prompt.

    pass      every prompt fits: forwarded as sent; the prompt tokens are their total (vLLM's usage.prompt_tokens)
    reject    a prompt over the window: vLLM's own wording, answered by the guard
    truncate  `truncate_prompt_tokens: -1` set: vLLM cuts each over-long prompt to its maximum input (the first
              tokens: pooling tokenizers truncate on the right), prompts that fit untouched; exact without a re-count
    chunk     refused with the reason: the embedding (or class, or score) of chunks is not the one of the whole
    partial   score / rerank: the guard counts each text alone, exact for a bi-encoder and a lower bound of the pair
              a cross-encoder reads; it refuses only a text that alone overflows, and under truncate sets
              `truncate_prompt_tokens: -1` whenever a query and a document together might not fit
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.api.body import with_changes
from proxy.errors import ContextLengthExceeded, RequestTooLarge
from proxy.policy.decide import Limits
from proxy.policy.outcome import Decision, Forward, Outcome, Refuse

TRUNCATE = {"truncate_prompt_tokens": -1}  # vLLM's own maximum input: also right where a pooler caps it lower


@dataclass(frozen=True)
class Pooled:
    endpoint: str
    body: dict[str, Any]
    raw: bytes
    counts: list[int]  # each prompt's tokens as counted
    param: str  # what a rejection names
    truncate_prompt_tokens: int | None  # the client's own
    partial: bool = False  # score / rerank: the counts are lower bounds
    paired: int = 0  # score / rerank: the longest query and the longest document together
    cut: dict[str, Any] = field(default_factory=lambda: TRUNCATE)  # what has vLLM cut each prompt to the window


def settle_pooling(p: Pooled, limits: Limits, choice: str, source: str | None) -> Outcome:
    outcome = _settled(p, limits, choice, source)
    if isinstance(outcome, Forward) and limits.max_cost is not None and (outcome.cost or 0) > limits.max_cost:
        error = RequestTooLarge(
            f"This request's inputs hold {outcome.cost} tokens, more than the upstream's whole admission budget of "
            f"{limits.max_cost} tokens (admission.max_inflight_tokens): it could never be admitted. Send fewer or "
            "shorter inputs.",
            param=p.param,
        )
        return Refuse(error, Decision("reject", outcome.decision.prompt_tokens, count_source=source))
    return outcome


def _settled(p: Pooled, limits: Limits, choice: str, source: str | None) -> Outcome:
    window = limits.max_model_len
    counts = _kept(p.counts, p.truncate_prompt_tokens, window)
    total, longest = sum(counts), max(counts, default=0)
    if longest <= window:
        if p.partial and choice == "truncate" and p.truncate_prompt_tokens is None and p.paired > window:
            return Forward(with_changes(p.body, p.cut), Decision("partial", total, count_source=source), total)
        return Forward(p.raw, Decision("partial" if p.partial else "pass", total, count_source=source), total)
    if choice == "truncate":
        cut = [min(n, window) for n in counts]
        decision = Decision("truncate", sum(cut), truncated_tokens=total - sum(cut), count_source=source)
        return Forward(with_changes(p.body, p.cut), decision, sum(cut))
    error = _too_long(p, counts, window)
    if choice == "chunk":
        why = f"The chunk policy was not applied: the result of {p.endpoint} for chunks of an input is not the one " \
              "for the whole input."  # fmt: skip
        error = ContextLengthExceeded(f"{error.message} {why}", param=p.param)
    return Refuse(error, Decision("reject", total, count_source=source))


def _kept(counts: list[int], truncate: int | None, window: int) -> list[int]:
    """What vLLM keeps of each prompt when the client set truncate_prompt_tokens itself (-1: up to the window)."""
    if truncate is None:
        return counts
    keep = window if truncate == -1 else truncate
    return [min(n, keep) for n in counts]


def _too_long(p: Pooled, counts: list[int], window: int) -> ContextLengthExceeded:
    index, longest = max(enumerate(counts), key=lambda item: item[1])
    which = f" That is {p.param} {index + 1} of {len(counts)}." if len(counts) > 1 else ""
    return ContextLengthExceeded(
        f"This model's maximum context length is {window} tokens. However, your prompt contains {longest} input "
        f"tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
        f"prompt.{which}",
        param=p.param,
    )
