"""The token-in generate wire model: the token ids are the prompt, the limits live in sampling_params."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.api.tokens import generate_request
from proxy.errors import InvalidRequest


def test_the_prompt_is_the_token_ids_and_the_limits_are_nested() -> None:
    body = {"model": "m", "token_ids": [5, 0, 7], "sampling_params": {"max_tokens": 4.0, "min_tokens": 2, "n": 3},
            "stream": True, "request_id": "r"}  # fmt: skip
    req = generate_request(body)
    assert (req.model, req.prompt_tokens, req.max_tokens, req.min_tokens, req.n, req.media) == ("m", 3, 4, 2, 3, False)
    assert req.body is body and req.sampling is body["sampling_params"]


def test_no_limit_and_no_model_are_fine() -> None:
    req = generate_request({"token_ids": [1], "sampling_params": {}})
    assert (req.model, req.max_tokens, req.n) == (None, None, 1)
    assert generate_request({"token_ids": [1], "sampling_params": {"max_tokens": None}}).max_tokens is None


def test_media_parts_make_the_count_a_lower_bound_and_features_do_not() -> None:
    assert generate_request({"token_ids": [1], "sampling_params": {}, "content_parts": [{"type": "image_url"}]}).media
    features: dict[str, dict[str, list[str]]] = {"mm_hashes": {}, "mm_placeholders": {}}
    assert not generate_request({"token_ids": [1], "sampling_params": {}, "features": features}).media


@pytest.mark.parametrize(
    "body,param",
    [
        ({"sampling_params": {}}, "token_ids"),
        ({"token_ids": [], "sampling_params": {}}, "token_ids"),
        ({"token_ids": [1, -2], "sampling_params": {}}, "token_ids"),
        ({"token_ids": [1, True], "sampling_params": {}}, "token_ids"),
        ({"token_ids": ["1"], "sampling_params": {}}, "token_ids"),
        ({"token_ids": [1]}, "sampling_params"),
        ({"token_ids": [1], "sampling_params": None}, "sampling_params"),
        ({"token_ids": [1], "sampling_params": {"max_tokens": 1.5}}, "sampling_params.max_tokens"),
        ({"token_ids": [1], "sampling_params": {"max_tokens": -1}}, "sampling_params.max_tokens"),
        ({"token_ids": [1], "sampling_params": {"n": 0}}, "sampling_params.n"),
        ({"token_ids": [1], "sampling_params": {"max_tokens": 2, "min_tokens": 3}}, "min_tokens"),
        ({"token_ids": [1], "sampling_params": {}, "content_parts": "x"}, "content_parts"),
        ({"token_ids": [1], "sampling_params": {}, "model": 3}, "model"),
    ],
)
def test_malformed_requests_are_400s_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        generate_request(body)
    assert caught.value.param == param
    if param.startswith("sampling_params."):
        assert f"'{param}'" in caught.value.message
