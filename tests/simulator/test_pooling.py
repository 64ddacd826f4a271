"""The simulator's pooling routes: vLLM's shapes, its length rules with no output, its right-side truncation."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
)

WINDOW = 2048


def test_an_embedding_answer_is_shaped_like_vllms(sim032: RunningSim) -> None:
    body = sim032.client.post("/v1/embeddings", json={"input": ["a b", "c"]}, headers={"x-request-id": "r1"}).json()
    assert list(body) == ["id", "object", "created", "model", "data", "usage"] and body["id"] == "embd-r1"
    assert [d["index"] for d in body["data"]] == [0, 1] and body["data"][0]["object"] == "embedding"
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"]


@pytest.mark.parametrize(
    "fixture,wording",
    [("sim031", "you requested 0 output tokens and your prompt contains at least 2049 input tokens"),
     ("sim032", "your prompt contains at least 2049 input tokens, which exceeds this limit even without any output")],
)  # fmt: skip
def test_too_long_gets_each_versions_400(fixture: str, wording: str, request: pytest.FixtureRequest) -> None:
    sim: RunningSim = request.getfixturevalue(fixture)
    before = sim.stats.rejected
    response = sim.client.post("/v1/embeddings", json={"input": "hello " * 3000})
    assert response.status_code == 400 and wording in response.json()["error"]["message"]
    assert sim.stats.rejected == before + 1


def test_the_whole_window_fits_and_truncation_keeps_the_first_tokens(sim032: RunningSim) -> None:
    ids = list(range(1, WINDOW + 2))
    assert sim032.client.post("/v1/embeddings", json={"input": ids[:WINDOW]}).status_code == 200
    cut = sim032.client.post("/v1/embeddings", json={"input": ids, "truncate_prompt_tokens": -1, "encoding_format":
                                                      "float"}).json()  # fmt: skip
    first = sim032.client.post("/v1/embeddings", json={"input": ids[:WINDOW], "encoding_format": "float"}).json()
    assert cut["usage"]["prompt_tokens"] == WINDOW and cut["data"] == first["data"]


@pytest.mark.parametrize(
    "path,body,key",
    [
        ("/classify", {"input": "x"}, "data"),
        ("/pooling", {"input": "x"}, "data"),
        ("/score", {"text_1": "q", "text_2": ["a", "b"]}, "data"),
        ("/rerank", {"query": "q", "documents": ["a", "b"], "top_n": 1}, "results"),
        ("/invocations", {"input": "x"}, "data"),
    ],
)
def test_the_other_routes(sim032: RunningSim, path: str, body: dict[str, Any], key: str) -> None:
    answer = sim032.client.post(path, json=body).json()
    assert key in answer and answer["usage"]["prompt_tokens"] > 0
    if path == "/rerank":
        assert len(answer["results"]) == 1


def test_invocations_without_a_pooling_body_stay_on_generation(sim032: RunningSim) -> None:
    response = sim032.client.post("/invocations", json={})
    assert response.status_code == 400 and "prompt" in response.json()["error"]["message"]


def test_fields_are_read_with_pydantics_lax_types(sim032: RunningSim) -> None:
    """`truncate_prompt_tokens: Annotated[int, Field(ge=-1)]` and `add_special_tokens: bool` take numeric and boolean
    strings, as vLLM's request model does."""
    body = {"model": "tiny", "input": "one two three four five six", "truncate_prompt_tokens": "3"}
    answer = sim032.client.post("/v1/embeddings", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == 3


def test_an_input_of_mixed_strings_and_ids_gets_pydantics_400(sim032: RunningSim) -> None:
    answer = sim032.client.post("/v1/embeddings", json={"model": "tiny", "input": ["a", 1]})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "Bad Request" and "validation error" in error["message"] and error["param"] == "body.input"
