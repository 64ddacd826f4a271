"""The map-reduce step of a chunked request (`policy.chunk_merge = "reduce"`): one more request asking the model to
combine the partial answers, decided like any other request."""

from __future__ import annotations

from typing import Any

from proxy.api.body import with_changes
from proxy.api.chat import ChatRequest, parse_chat
from proxy.api.completions import parse_completion
from proxy.counting.local_count import count_chat, count_completion
from proxy.counting.registry import GuardedModel
from proxy.policy.decide import Action, Limits, decide_chat, decide_completion
from proxy.policy.merge import answer_text
from proxy.policy.outcome import Chunked


async def reduce_request(
    model: GuardedModel, chunked: Chunked, answers: list[dict[str, Any]], limits: Limits
) -> tuple[dict[str, Any], int] | None:
    """The combining request's body and KV cost, or None when even that request would not fit (the caller then joins
    the answers instead). It keeps the original's system and developer messages and its other fields."""
    joined = chunked.policy.chunk_separator.join(answer_text(chunked.kind, a) for a in answers)
    prompt = chunked.policy.reduce_prompt.format(answers=joined)
    original = chunked.original
    body = {k: v for k, v in original.body.items() if k != "stream_options"} | {"stream": False}
    if isinstance(original, ChatRequest):
        kept = [m for m in original.messages if m.get("role") in ("system", "developer")]
        body["messages"] = [*kept, {"role": "user", "content": prompt}]
        req = parse_chat(with_changes(body, {}))
        plan = decide_chat(req, await count_chat(model.tokenizer, req, model.counter), limits)
    else:
        body["prompt"] = prompt
        completion = parse_completion(with_changes(body, {}))
        counts = await count_completion(model.tokenizer, completion, model.counter)
        plan = decide_completion(completion, counts, limits)
    return None if plan.action is Action.REJECT else ({**body, **plan.changes}, plan.cost(limits, 1))
