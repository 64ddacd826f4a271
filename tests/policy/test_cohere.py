"""The Cohere embed decision, without a socket: vLLM's own cuts counted, NONE refused as vLLM refuses it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.api.cohere import cohere_embed_request
from proxy.policy.cohere import decide_cohere
from proxy.policy.decide import Limits
from proxy.policy.outcome import Forward, Refuse

LIMITS = Limits(max_model_len=100)


def settle(counts: list[int], choice: str = "reject", **fields: Any) -> Forward | Refuse:
    body = {"texts": ["t"] * len(counts), **fields}
    outcome = decide_cohere(cohere_embed_request(body), counts, json.dumps(body).encode(), LIMITS, choice, "local")
    assert isinstance(outcome, Forward | Refuse)
    return outcome


@pytest.mark.parametrize(
    "fields,kept",
    [({}, 100 + 3), ({"truncate": "START"}, 100 + 3), ({"max_tokens": 10}, 10 + 3), ({"truncate": "NONE"}, None)],
)
def test_vllm_cuts_what_truncate_says_and_the_guard_counts_what_it_keeps(fields: dict[str, Any],
                                                                         kept: int | None) -> None:  # fmt: skip
    outcome = settle([150, 3], **fields)
    if kept is None:
        assert isinstance(outcome, Refuse) and outcome.error.param == "texts"
        assert "contains 150 input tokens" in outcome.error.message and "texts 1 of 2" in outcome.error.message
        return
    assert isinstance(outcome, Forward) and outcome.decision.action == "pass"
    assert outcome.decision.prompt_tokens == outcome.cost == kept and outcome.decision.max_tokens is None


def test_none_with_max_tokens_is_refused_before_vllm_embeds_it_in_its_words() -> None:
    outcome = settle([5, 12], truncate="NONE", max_tokens=10)
    assert isinstance(outcome, Refuse) and outcome.error.param == "max_tokens"
    assert outcome.error.message == ("Input of 12 tokens exceeds max_tokens=10 with truncate=NONE. Set truncate to "
                                     "END or START to allow truncation.")  # fmt: skip
    assert isinstance(settle([5, 10], truncate="NONE", max_tokens=10), Forward)


def test_the_truncate_policy_never_overrides_none() -> None:
    # NONE is the client's word that its inputs are not cut: an input over the window is refused, saying how to ask
    outcome = settle([150, 3], choice="truncate", truncate="NONE")
    assert isinstance(outcome, Refuse) and outcome.error.code == "context_length_exceeded"
    assert "The truncate policy was not applied" in outcome.error.message and "send truncate (END or START)" in \
        outcome.error.message  # fmt: skip
    kept = settle([150, 3], choice="truncate", truncate="END")  # the client's own cut: vLLM keeps the window
    assert isinstance(kept, Forward) and json.loads(kept.body)["truncate"] == "END"
    assert kept.decision.prompt_tokens == 103


def test_input_type_makes_it_partial_and_chunk_is_refused() -> None:
    partial = settle([5], input_type="search_query")
    assert isinstance(partial, Forward) and partial.decision.action == "partial"
    chunked = settle([150], choice="chunk", truncate="NONE")
    assert isinstance(chunked, Refuse) and "chunk policy was not applied" in chunked.error.message
