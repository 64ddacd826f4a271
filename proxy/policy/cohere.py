"""The decision for Cohere's embed route (`/v2/embed`): a pooling request (policy/pooling.py) whose cuts are asked
for in its own fields.

    pass      every input fits once vLLM has cut what `truncate` (END by default, or START) tells it to: the prompt
              tokens are what it keeps, `max_tokens` of each input (the window when absent), as vLLM bills them
    reject    `truncate: NONE` and an input over the window (vLLM's 400, before it reaches the GPU); or NONE with
              `max_tokens` (at most the window) and an input over it, which vLLM refuses only after embedding it (its
              words; the client's cap decides, whatever the overflow policy)
    (the guard's truncate policy never sets `truncate`: NONE is the client's word that its inputs are not cut)
    partial   `input_type`: vLLM puts the model's instruction for it in front of each input, which the guard cannot
              see; its count is a lower bound
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.api.cohere import CohereEmbedRequest, cohere_embed_request
from proxy.counting.pooling import cohere_tokens
from proxy.errors import InvalidRequest
from proxy.policy.decide import Action, Limits
from proxy.policy.outcome import Decision, Findings, Outcome, Refuse
from proxy.policy.pooling import Pooled, decide_pooling
from proxy.policy.steps import Steps, timed


def decide_cohere(req: CohereEmbedRequest, counts: list[int], raw: bytes, limits: Limits, choice: str,
                  source: str | None) -> Outcome:  # fmt: skip
    window, most = limits.max_model_len, req.max_tokens
    if req.truncate == "NONE" and most is not None and most <= window:  # the client's own cap rules
        over = next((n for n in counts if n > most), None)
        if over is not None:  # vLLM's words; it says them once the GPU has embedded the inputs
            error = InvalidRequest(f"Input of {over} tokens exceeds max_tokens={most} with truncate=NONE. Set "
                                   "truncate to END or START to allow truncation.", param="max_tokens")  # fmt: skip
            return Refuse(error, Decision(Action.REJECT, sum(counts), count_source=source))
    pooled = Pooled("embed", req.body, raw, counts, req.param, req.keep, partial=req.input_type is not None)
    return decide_pooling(pooled, limits, choice, source)


async def cohere(
    steps: Steps, body: dict[str, Any], raw: bytes, headers: Mapping[str, str], findings: Findings
) -> Outcome:
    """Cohere's /v2/embed: a pooling request that says its cuts its own way."""
    req = cohere_embed_request(body)
    model, _, choice, limits = steps.target(req.model, headers, findings)
    counts = await timed(findings, cohere_tokens(model, req, steps.remote))
    return decide_cohere(req, counts, raw, limits, choice, findings.count_source)
