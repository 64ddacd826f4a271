"""The pooling wire models: which inputs are prompts, which are conversations, what they refuse."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.api.invocations import invocation_kind
from proxy.api.pooling import PoolingRequest, ScoringRequest, pooling_request
from proxy.errors import InvalidRequest

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "body,prompts,conversations",
    [
        ({"input": "a"}, ["a"], []),
        ({"input": ["a", "b"]}, ["a", "b"], []),
        ({"input": [1, 2]}, [[1, 2]], []),
        ({"input": [[1], [2, 3]]}, [[1], [2, 3]], []),
        ({"input": HI}, [], [HI]),
        ({"input": [HI, HI]}, [], [HI, HI]),
        ({"messages": HI}, [], [HI]),
        ({"messages": [HI, HI]}, [], [HI, HI]),
    ],
)
def test_embeddings_inputs_as_vllm_reads_them(body: dict[str, Any], prompts: list[Any], conversations: Any) -> None:
    req = pooling_request(body, "embeddings")
    assert isinstance(req, PoolingRequest)
    assert (req.prompts, req.conversations) == (prompts, conversations)
    assert req.add_special_tokens is not bool(conversations)  # true for inputs, false for chat


def test_only_embeddings_read_a_conversation_in_input_or_a_batch_of_them() -> None:
    with pytest.raises(InvalidRequest):
        pooling_request({"input": HI}, "classify")
    with pytest.raises(InvalidRequest, match="'messages'"):
        pooling_request({"messages": [HI, HI]}, "classify")


def test_a_conversation_renders_with_the_pooling_defaults() -> None:
    req = pooling_request({"messages": HI, "chat_template_kwargs": {"x": 1}, "dimensions": 8}, "embeddings")
    assert isinstance(req, PoolingRequest)
    assert req.chat_body(HI) == {"chat_template_kwargs": {"x": 1}, "messages": HI, "add_generation_prompt": False}


@pytest.mark.parametrize(
    "body", [{"input": ["a", [1]]}, {"input": 3}, {}, {"input": "a", "truncate_prompt_tokens": -2},
             {"input": "a", "truncate_prompt_tokens": "5"}],
)  # fmt: skip
def test_malformed_inputs_are_400s(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest):
        pooling_request(body, "embeddings")


@pytest.mark.parametrize(
    "kind,body",
    [
        ("rerank", {"query": "q", "documents": ["a", {"content": []}, "b"]}),
        ("score", {"text_1": "q", "text_2": ["a", "b"]}),
        ("score", {"queries": ["q"], "items": ["a", "b"]}),
        ("score", {"data_1": "q", "data_2": ["a", "b"]}),
    ],
)
def test_score_and_rerank_texts(kind: Any, body: dict[str, Any]) -> None:
    req = pooling_request(body, kind)
    assert isinstance(req, ScoringRequest) and (req.queries, req.documents) == (["q"], ["a", "b"])


def test_a_rerank_without_documents_is_a_400() -> None:
    with pytest.raises(InvalidRequest, match="'query' and 'documents'"):
        pooling_request({"query": "q"}, "rerank")


@pytest.mark.parametrize(
    "body,kind",
    [
        ({"input": "x"}, "embeddings"),
        ({"query": "q", "documents": ["d"]}, "rerank"),
        ({"text_1": "a", "text_2": "b"}, "score"),
    ],
)
def test_invocations_dispatch_pooling_bodies(body: dict[str, Any], kind: str) -> None:
    assert invocation_kind(body) == kind
