"""/invocations as vLLM's SageMaker route reads it: the model from X-Amzn-SageMaker-Adapter-Identifier (null without
it, whatever the body says), then the endpoint the body validates as."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.api.invocations import invocation_kind, invoked_body


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
