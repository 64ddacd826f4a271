"""Stop strings and stop token ids, as vLLM applies them: the text ends at the stop string (or after it with
include_stop_str_in_output), finish_reason "stop" with the stop_reason, completion_tokens counts the tokens generated
up to the stop, streamed text is held back so the stop string never leaks, and streamed and whole answers agree."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_sim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
    sse_json,
)

HELLO = [{"role": "user", "content": "Hello"}]


def chat(sim: RunningSim, **fields: Any) -> dict[str, Any]:
    response = sim.client.post("/v1/chat/completions", json={"messages": HELLO, **fields})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def streamed(sim: RunningSim, path: str, **fields: Any) -> tuple[str, list[dict[str, Any]]]:
    """The text a stream carries, and its choices' last chunk (finish_reason set)."""
    response = sim.client.post(path, json={"stream": True, "stream_options": {"include_usage": True}, **fields})
    chunks = sse_json(response.text)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    text = "".join(c.get("delta", {}).get("content") or c.get("text") or "" for c in choices)
    return text, [c for c in choices if c["finish_reason"] is not None] + [chunks[-1]]


def plain_text(sim: RunningSim, max_tokens: int) -> str:
    content: str = chat(sim, max_tokens=max_tokens)["choices"][0]["message"]["content"]
    return content


def test_the_answer_ends_before_the_stop_string(sim: RunningSim) -> None:
    free = plain_text(sim, 30)
    stop = free.split()[3]  # a word the model is bound to write, after a few others
    body = chat(sim, max_tokens=30, stop=["never written", stop])
    (choice,) = body["choices"]
    expected = free[: free.index(stop)]
    assert choice["message"]["content"] == expected
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)
    # The tokens generated up to and including the one that completed the stop string.
    generated = len(
        sim.client.post("/tokenize", json={"prompt": expected + stop, "add_special_tokens": False}).json()["tokens"]
    )
    assert body["usage"]["completion_tokens"] == generated < 30


def test_include_stop_str_in_output_keeps_it(sim032: RunningSim) -> None:
    free = plain_text(sim032, 30)
    stop = free.split()[2]
    choice = chat(sim032, max_tokens=30, stop=stop, include_stop_str_in_output=True)["choices"][0]
    assert choice["message"]["content"] == free[: free.index(stop) + len(stop)]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)


def test_a_stop_string_never_written_runs_to_length(sim032: RunningSim) -> None:
    choice = chat(sim032, max_tokens=12, stop=["\n\n"])["choices"][0]
    assert choice["message"]["content"] == plain_text(sim032, 12)
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)


def test_stop_token_ids_stop_with_the_token_id(sim032: RunningSim) -> None:
    ids = chat(sim032, max_tokens=10, return_token_ids=True)["choices"][0]["token_ids"]
    body = chat(sim032, max_tokens=10, stop_token_ids=[ids[4]], return_token_ids=True)
    (choice,) = body["choices"]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", ids[4])
    assert choice["token_ids"] == ids[:5] and body["usage"]["completion_tokens"] == 5


def test_no_stop_before_min_tokens(sim032: RunningSim) -> None:
    free = plain_text(sim032, 30)
    first = free.split()[0]
    early = chat(sim032, max_tokens=30, stop=first)["choices"][0]
    assert early["message"]["content"] == free[: free.index(first)]
    later = chat(sim032, max_tokens=30, stop=first, min_tokens=5)["choices"][0]
    assert len(later["message"]["content"]) > len(early["message"]["content"])
    assert later["stop_reason"] == first


@pytest.mark.parametrize("include", [False, True])
def test_a_stream_says_the_same_and_never_shows_the_cut_text(sim: RunningSim, include: bool) -> None:
    free = plain_text(sim, 30)
    stop = free.split()[4]
    fields = {"messages": HELLO, "max_tokens": 30, "stop": [stop], "include_stop_str_in_output": include}
    whole = chat(sim, **{k: v for k, v in fields.items() if k != "messages"})
    text, (finish, usage_chunk) = streamed(sim, "/v1/chat/completions", **fields)
    assert text == whole["choices"][0]["message"]["content"]
    assert (finish["finish_reason"], finish["stop_reason"]) == ("stop", stop)
    assert usage_chunk["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_completions_stop_too(sim032: RunningSim) -> None:
    body = {"prompt": "Hello", "max_tokens": 30}
    free = sim032.client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    stop = free.split()[3]
    choice = sim032.client.post("/v1/completions", json={**body, "stop": stop}).json()["choices"][0]
    assert choice["text"] == free[: free.index(stop)]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)
    text, (finish, _) = streamed(sim032, "/v1/completions", **body, stop=stop)
    assert text == choice["text"] and finish["stop_reason"] == stop


@pytest.mark.parametrize(
    ("stop", "message"),
    [([""], "stop cannot contain an empty string."), ([1], "validation error")],
)
def test_bad_stops_are_refused(sim032: RunningSim, stop: Any, message: str) -> None:
    response = sim032.client.post("/v1/chat/completions", json={"messages": HELLO, "stop": stop})
    assert response.status_code == 400 and message in response.json()["error"]["message"]
