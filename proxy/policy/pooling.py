"""The decision for pooling requests (embeddings, /pooling, /classify, score, rerank): no output, so a prompt fits
when it is at most the window (vLLM accepts exactly max_model_len tokens here), and each input is its own prompt.

    pass      every prompt fits: forwarded as sent; the prompt tokens are their total (vLLM's usage.prompt_tokens)
    reject    a prompt over the window: vLLM's own wording, answered by the guard, whatever the overflow policy. A
              pooling answer is about its input (an embedding, a class, a score, one result per token): the guard
              never cuts it, since the answer for a cut input is another input's. The client may ask vLLM to cut
              (`truncate_prompt_tokens`, Cohere's `truncate`): its own cut is counted (`_kept`)
    partial   score / rerank: the guard counts each text alone, exact for a bi-encoder and a lower bound of the pair
              a cross-encoder reads; it refuses only a text that alone overflows
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.api.pooling import Kind, PoolingRequest, pooling_request
from proxy.counting.pooling import pooling_tokens, scoring_tokens
from proxy.counting.source import CountSource
from proxy.errors import ContextLengthExceeded, RequestTooLarge
from proxy.policy.decide import Action, Limits
from proxy.policy.outcome import Decision, Findings, Forward, Outcome, Refuse
from proxy.policy.steps import Recipe, Steps, timed
from proxy.settings import Overflow

CUT_BY = {"embed": "truncate (END or START)"}  # the field a client asks vLLM's cut with, where it is not this one


@dataclass(frozen=True)
class Pooled:
    endpoint: str
    body: dict[str, Any]
    raw: bytes
    counts: list[int]  # each prompt's tokens as counted
    param: str  # what a rejection names
    truncate_prompt_tokens: int | None  # the client's own
    partial: bool = False  # score / rerank: the counts are lower bounds


def decide_pooling(p: Pooled, limits: Limits, choice: str, source: str | None) -> Outcome:
    outcome = _decided(p, limits, choice, source)
    if isinstance(outcome, Forward) and limits.max_cost is not None and (outcome.cost or 0) > limits.max_cost:
        error = RequestTooLarge(
            f"This request's inputs hold {outcome.cost} tokens, more than the upstream's whole admission budget of "
            f"{limits.max_cost} tokens (admission.max_inflight_tokens): it could never be admitted. Send fewer or "
            "shorter inputs.",
            param=p.param,
        )
        return Refuse(error, Decision(Action.REJECT, outcome.decision.prompt_tokens, count_source=source))
    return outcome


def _decided(p: Pooled, limits: Limits, choice: str, source: str | None) -> Outcome:
    window = limits.max_model_len
    counts = _kept(p.counts, p.truncate_prompt_tokens, window)
    total, longest = sum(counts), max(counts, default=0)
    if longest <= window:
        return Forward(p.raw, Decision(Action.PARTIAL if p.partial else Action.PASS, total, count_source=source), total)
    error = _too_long(p, counts, window)
    if choice != Overflow.REJECT:
        asked = CUT_BY.get(p.endpoint, "truncate_prompt_tokens")
        why = f"The {choice} policy was not applied: the answer of {p.endpoint} is about the whole input, and " \
              f"token-guard does not cut it into another input; send {asked} to have vLLM cut it."  # fmt: skip
        error = ContextLengthExceeded(f"{error.message} {why}", param=p.param)
    return Refuse(error, Decision(Action.REJECT, total, count_source=source))


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


def pooled(kind: Kind) -> Recipe:
    """The recipe of a pooling endpoint (embeddings, /pooling, /classify, score, rerank): input tokens only."""

    async def recipe(
        steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
    ) -> Outcome:
        req = pooling_request(body, kind)
        model, _, choice, limits = steps.target(req.model, headers, findings)
        if isinstance(req, PoolingRequest):
            counts = await timed(findings, pooling_tokens(model, req, steps.remote))
            p = Pooled(req.kind, req.body, raw, counts, req.param, req.truncate_prompt_tokens, req.uncounted)
        else:
            started = time.perf_counter()
            queries, documents = await scoring_tokens(model, req)
            findings.count_source, findings.count_s = CountSource.LOCAL, time.perf_counter() - started
            p = Pooled(req.kind, req.body, raw, queries + documents, "input", req.truncate_prompt_tokens, partial=True)
        return decide_pooling(p, limits, choice, findings.count_source)

    return recipe
