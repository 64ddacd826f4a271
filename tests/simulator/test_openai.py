"""The official OpenAI SDK talks to the simulator as it would to vLLM."""

from __future__ import annotations

import openai

from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_sim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
)


def sdk(sim: RunningSim) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.url + "/v1", api_key="x", max_retries=0)


def test_chat_completion(sim: RunningSim) -> None:
    completion = sdk(sim).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello"}], max_completion_tokens=5
    )
    assert completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 5


def test_streamed_chat_completion(sim032: RunningSim) -> None:
    stream = sdk(sim032).chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 4


def test_completion_and_models(sim032: RunningSim) -> None:
    client = sdk(sim032)
    completion = client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=2)
    assert [c.index for c in completion.choices] == [0, 1]
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_errors_surface_as_sdk_exceptions(sim032: RunningSim) -> None:
    client = sdk(sim032)
    try:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    except openai.NotFoundError as exc:
        assert exc.status_code == 404
    else:
        raise AssertionError("unknown model was accepted")
    try:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=10**6)
    except openai.BadRequestError as exc:
        assert "cannot be greater than max_model_len=2048" in str(exc)
    else:
        raise AssertionError("max_tokens above the window was accepted")


def test_transferred_prompt_ids_run_in_place_of_the_messages(sim: RunningSim) -> None:
    """vLLM's chat renderer feeds kv_transfer_params.prompt_token_ids to the engine instead of the rendered messages
    (disaggregated serving's decode-side reuse), without a KV connector too."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "kv_transfer_params": {"prompt_token_ids": list(range(5, 505))}}  # fmt: skip
    answer = sim.client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 200 and answer.json()["usage"]["prompt_tokens"] == 500
