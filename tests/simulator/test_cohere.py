"""The simulator's /v2/embed: Cohere's answer shape and vLLM's truncation rules for it (captured from a real vLLM
0.32 embedding model)."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
)

PATH = "/v2/embed"
LONG = "word " * 3000


def embed(sim: RunningSim, **body: Any) -> dict[str, Any]:
    response = sim.client.post(PATH, json=body, headers={"x-request-id": "r1"})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def billed(sim: RunningSim, **body: Any) -> int:
    tokens: int = embed(sim, **body)["meta"]["billed_units"]["input_tokens"]
    return tokens


def count(sim: RunningSim, text: str) -> int:
    tokens: int = sim.client.post("/tokenize", json={"prompt": text}).json()["count"]
    return tokens


def test_the_answer_is_shaped_like_vllms(sim032: RunningSim) -> None:
    body = embed(sim032, texts=["Hello world", "short"], embedding_types=["base64", "float", "ubinary"])
    assert list(body) == ["id", "embeddings", "texts", "meta", "response_type"] and body["id"] == "embd-r1"
    assert list(body["embeddings"]) == ["float", "ubinary", "base64"] and body["texts"] == ["Hello world", "short"]
    assert body["meta"] == {
        "api_version": {"version": "2"},
        "billed_units": {"input_tokens": count(sim032, "Hello world") + count(sim032, "short"), "image_tokens": 0},
    }
    floats, packed = body["embeddings"]["float"][0], base64.b64decode(body["embeddings"]["base64"][0])
    assert struct.unpack(f"<{len(floats)}f", packed) == pytest.approx(floats, rel=1e-6)
    assert len(body["embeddings"]["ubinary"][0]) == len(floats) // 8
    inputs = embed(sim032, inputs=[{"content": [{"type": "text", "text": "Hello there"}]}])
    assert "texts" not in inputs and inputs["response_type"] == "embeddings_by_type"


def test_end_and_start_cut_to_max_tokens_or_the_window_and_none_refuses(sim032: RunningSim) -> None:
    assert billed(sim032, texts=[LONG]) == billed(sim032, texts=[LONG], truncate="START") == 2048
    assert billed(sim032, texts=[LONG], max_tokens=10) == 10
    start = embed(sim032, texts=[LONG + "end"], truncate="START", max_tokens=3)["embeddings"]["float"]
    assert start != embed(sim032, texts=[LONG + "end"], max_tokens=3)["embeddings"]["float"]
    refused = sim032.client.post(PATH, json={"texts": [LONG], "truncate": "NONE"})
    assert refused.status_code == 400 and "your prompt contains at least 2049 input tokens" in refused.text


@pytest.mark.parametrize(
    "body,status,fragment",
    [
        ({"texts": ["word " * 50], "truncate": "NONE", "max_tokens": 10}, 400,
         "Input of 51 tokens exceeds max_tokens=10 with truncate=NONE. Set truncate to END or START to allow "
         "truncation."),
        ({"texts": ["a"], "max_tokens": 3000}, 400, "truncate_prompt_tokens=3000 cannot be greater than "
                                                    "max_model_len = 2048."),
        ({"texts": ["a"], "input_type": "search_query"}, 400, "Unsupported input_type 'search_query'. This model "
                                                              "does not define any input_type task instructions."),
        ({"texts": []}, 400, "Exactly one of texts, images, or inputs must be provided"),
        ({"texts": ["a"], "model": "nope"}, 404, "The model `nope` does not exist."),
        ({"images": ["data:image/png;base64,AAAA"]}, 400, "is not a multimodal model"),
    ],
)  # fmt: skip
def test_vllms_refusals(sim032: RunningSim, body: dict[str, Any], status: int, fragment: str) -> None:
    response = sim032.client.post(PATH, json=body)
    assert response.status_code == status and fragment in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "body,fragments",
    [
        ({"texts": ["a", 1]}, ["'type': 'string_type'", "'loc': 'body.texts.1'", "Input should be a valid string"]),
        ({"texts": ["a"], "truncate": "MIDDLE"}, ["'loc': 'body.truncate'",
                                                  "Input should be 'NONE', 'START' or 'END'"]),
        ({"inputs": [{"content": [{"type": "text"}]}]}, ["'loc': 'body.inputs.0.content.0'",
                                                         "CohereEmbedContent with type='text' requires text"]),
        ({"inputs": [{"content": [{"type": "audio"}]}]}, ["'loc': 'body.inputs.0.content.0.type'",
                                                          "Input should be 'text' or 'image_url'"]),
        ({"texts": ["a"], "images": ["b"]}, ["'type': 'value_error'", "Exactly one of texts, images, or inputs"]),
    ],
)  # fmt: skip
def test_the_request_model_refuses_as_pydantic_does(
    sim032: RunningSim, body: dict[str, Any], fragments: list[str]
) -> None:
    response = sim032.client.post(PATH, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "Bad Request" and error["message"].startswith("1 validation error:")
    assert all(fragment in error["message"] for fragment in fragments), error["message"]


def test_inputs_render_their_text_parts_as_one_user_message_each(sim032: RunningSim) -> None:
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    rendered = sim032.client.post("/tokenize", json={"messages": [{"role": "user", "content": parts}],
                                                     "add_generation_prompt": False}).json()["count"]  # fmt: skip
    assert billed(sim032, inputs=[{"content": parts}, {"content": parts[:1]}]) > rendered
    assert billed(sim032, inputs=[{"content": parts}]) == rendered
