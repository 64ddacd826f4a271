"""/invocations as vLLM's SageMaker route reads it: the model from X-Amzn-SageMaker-Adapter-Identifier (null without
it, whatever the body says), then the endpoint the body validates as."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.api.invocations import invocation_kind, invoked_body
from proxy.errors import InvalidRequest


@pytest.mark.parametrize(
    "body,headers,model",
    [({"model": "tiny", "prompt": "x"}, {"x-amzn-sagemaker-adapter-identifier": "other"}, "other"),
     ({"prompt": "x"}, {"x-amzn-sagemaker-adapter-identifier": "other"}, "other"),
     ({"model": "other", "prompt": "x"}, {}, None),
     ({"model": "tiny", "prompt": "x"}, {"x-amzn-sagemaker-adapter-identifier": ""}, "")],
)  # fmt: skip
def test_the_header_names_the_model_and_its_absence_the_default(body: dict[str, Any], headers: dict[str, str],
                                                                  model: str | None) -> None:  # fmt: skip
    sent = dict(body)
    seen = invoked_body(body, headers)
    assert seen["model"] == model and seen["prompt"] == "x" and body == sent  # the client's body is not changed


def test_a_body_already_so_is_kept_as_it_came() -> None:
    body = {"model": "other", "messages": [{"role": "user", "content": "hi"}]}
    assert invoked_body(body, {"x-amzn-sagemaker-adapter-identifier": "other"}) is body
    bare = {"prompt": "x"}
    assert invoked_body(bare, {}) is bare and invocation_kind(bare) == "completion"


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "body,named",
    [({"messages": HI, "prompt": "a long prompt", "logprobs": 5}, "messages and prompt"),  # chat fails: completions
     ({"prompt": "p", "input": "a long input"}, "prompt and input"),  # an embedding model embeds the input
     ({"input": "i", "query": "q", "documents": ["a long document"], "dimensions": "x"}, "input and query"),
     ({"messages": HI, "input": "a long input", "add_generation_prompt": "x"}, "messages and input"),
     ({"messages": [{"role": "user", "content": 5}], "prompt": "p"}, "messages and prompt"),
     ({"messages": "hello", "prompt": "p"}, "messages and prompt"),
     ({"query": "q", "queries": "q", "documents": ["d"]}, "query and queries")],
)  # fmt: skip
def test_a_body_with_the_prompts_of_two_endpoints_is_refused(body: dict[str, Any], named: str) -> None:
    """vLLM hands a body to the first endpoint whose request model validates it whole: the differential test saw
    0.31 and 0.32 run the prompt, the input or the documents of each of these where the guard counted the other."""
    with pytest.raises(InvalidRequest) as refused:
        invocation_kind(body)
    assert f"({named})" in refused.value.message and refused.value.status == 400


@pytest.mark.parametrize(
    "body,kind",
    [({"prompt_embeds": "x", "prompt": ""}, "completion"), ({"input": "x", "prompt": None}, "embeddings"),
     ({"messages": HI, "model": "m", "max_tokens": 5}, "chat"), ({"queries": "q", "documents": ["d"]}, "score")],
)  # fmt: skip
def test_the_fields_of_one_endpoint_dispatch_as_before(body: dict[str, Any], kind: str) -> None:
    assert invocation_kind(body) == kind
