"""The Cohere embed wire model: texts, or images and inputs as the conversations vLLM renders; how vLLM cuts them."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.api.cohere import cohere_embed_request
from proxy.errors import InvalidRequest


def test_texts_and_vllms_default_truncation() -> None:
    req = cohere_embed_request({"model": "m", "texts": ["a", "b c"]})
    assert (req.model, req.param, req.texts, req.conversations) == ("m", "texts", ["a", "b c"], [])
    assert (req.truncate, req.max_tokens, req.keep) == ("END", None, -1)  # END by default: cut to the window


@pytest.mark.parametrize(
    "extra,keep", [({"truncate": "NONE"}, None), ({"truncate": "NONE", "max_tokens": 5}, None),
                   ({"truncate": "START", "max_tokens": 5}, 5), ({"max_tokens": 7}, 7), ({"truncate": "START"}, -1)],
)  # fmt: skip
def test_what_vllm_keeps_of_each_input(extra: dict[str, Any], keep: int | None) -> None:
    assert cohere_embed_request({"texts": ["a"], **extra}).keep == keep


def test_images_and_inputs_are_one_user_message_each() -> None:
    images = cohere_embed_request({"images": ["data:image/png;base64,AAAA"]})
    assert images.param == "images" and images.conversations == [
        [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    ]
    parts = [{"type": "text", "text": "a cat"}, {"type": "image_url", "image_url": {"url": "https://x/c.png"}}]
    inputs = cohere_embed_request({"inputs": [{"content": parts}], "input_type": "search_document"})
    assert inputs.conversations == [[{"role": "user", "content": parts}]] and inputs.texts == []
    assert inputs.input_type == "search_document"


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({}, "Exactly one of texts, images, or inputs"),
        ({"texts": []}, "Exactly one of texts, images, or inputs"),
        ({"texts": ["a"], "images": ["x"]}, "Exactly one of texts, images, or inputs"),
        ({"texts": "a"}, "Exactly one of texts, images, or inputs"),
        ({"texts": ["a", 3]}, "'texts' must be an array of strings"),
        ({"texts": ["a"], "truncate": "end"}, "'truncate' must be one of NONE, START or END"),
        ({"texts": ["a"], "max_tokens": -1}, "'max_tokens' must be at least 0"),
        ({"inputs": [{"content": [{"type": "text"}]}]}, "neither {type: text, text}"),
        ({"inputs": ["a"]}, "inputs[0] must be an object with a 'content' array"),
        ({"texts": ["a"], "input_type": 1}, "'input_type' must be a string"),
    ],
)
def test_malformed_requests_are_400s(body: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        cohere_embed_request(body)
    assert fragment in caught.value.message
