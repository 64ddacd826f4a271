"""A prompt refused from its size before it is rendered or encoded: the lower bound of its tokens that its verbatim
texts prove (counting/bound.py, TokenCounter.floor and at_least), against the window or the most the chunk policy
takes. Its answer costs what reading it costs."""

from __future__ import annotations

from typing import assert_never

from proxy.counting.registry import GuardedModel
from proxy.counting.source import CountSource
from proxy.policy.chunk import MAX_CHUNKS, CannotChunk, refuse_too_many_chunks
from proxy.policy.decide import Limits, reject_at_least
from proxy.policy.outcome import Findings, Outcome, outcome_of
from proxy.policy.overflow import refuse
from proxy.settings import Overflow, PolicySettings

FAR_OVER = 16  # characters a token: a prompt longer than this many times the window is counted only until proven over


async def refuse_by_size(
    model: GuardedModel, prompts: list[list[str]], limits: Limits, choice: Overflow, policy: PolicySettings, param: str,
    findings: Findings,
) -> Outcome | None:  # fmt: skip
    """A prompt whose size alone proves it cannot fit is refused before it is rendered or encoded (counting/bound.py):
    its answer costs what reading it costs. Truncation still counts it (in bounded slices) to cut it exactly; chunking
    is refused when the floor alone needs more chunks than it takes (policy/chunk.py)."""
    if model.tokenizer.native is not None or choice is Overflow.TRUNCATE:
        return None  # mistral_common and harmony count with vocabularies of their own
    ceiling = limits.max_model_len - limits.min_output_tokens
    floor = await proven_over(model, prompts, ceiling)
    if floor is None:
        return None
    findings.count_source = CountSource.SIZE_FLOOR
    match choice:
        case Overflow.REJECT:
            return outcome_of(reject_at_least(floor, limits, param), {}, b"", 0, CountSource.SIZE_FLOOR)
        case Overflow.CHUNK:
            return await _chunks_proven_too_many(model, prompts, floor, limits, policy, param)
        case unhandled:
            assert_never(unhandled)


async def _chunks_proven_too_many(
    model: GuardedModel, prompts: list[list[str]], floor: int, limits: Limits, policy: PolicySettings, param: str
) -> Outcome | None:
    most = MAX_CHUNKS * policy.chunk_tokens  # more than this many tokens are not chunked
    if floor <= most:
        floor = await proven_over(model, prompts, most) or floor
    try:
        refuse_too_many_chunks(floor, policy.chunk_tokens)
    except CannotChunk as exc:
        return refuse(reject_at_least(floor, limits, param), f"The chunk policy was not applied: {exc}.")
    return None


async def proven_over(model: GuardedModel, prompts: list[list[str]], ceiling: int) -> int | None:
    """The most tokens the prompts' verbatim texts prove one of them has, when above `ceiling`: from their size
    (TokenCounter.floor), else, for texts far longer than could fit, by counting them only until the count passes it
    (TokenCounter.at_least)."""
    if all(sum(len(t) for t in texts) <= ceiling for texts in prompts):
        return None  # the floor's own first check, and none is far over: no coroutine per prompt (most requests)
    counter = model.counter
    floors = [await counter.floor_off_loop(texts, ceiling) for texts in prompts]
    floors += [await counter.at_least(texts, ceiling) for texts, floor in zip(prompts, floors, strict=True)
               if floor is None and sum(len(t) for t in texts) > FAR_OVER * ceiling]  # fmt: skip
    return max((f for f in floors if f is not None), default=None)
