"""What a client sees on the wire: response shapes, streaming framing, usage arithmetic, errors, endpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simulator import SimulatorSettings
from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_hf_tokenizer,
    fixture_sim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
    running_simulator,
    sse_events,
    sse_json,
)

HELLO = [{"role": "user", "content": "Hello"}]


def chat_prompt_tokens(sim: RunningSim, messages: list[dict[str, Any]]) -> int:
    count: int = sim.client.post("/tokenize", json={"messages": messages}).json()["count"]
    return count


def long_messages(sim: RunningSim, target: int) -> list[dict[str, Any]]:
    """A one-message chat whose prompt is exactly `target` tokens (" x" is one token in this vocabulary)."""
    base = chat_prompt_tokens(sim, [{"role": "user", "content": ""}])
    messages = [{"role": "user", "content": " x" * (target - base)}]
    assert chat_prompt_tokens(sim, messages) == target
    return messages


def test_chat_response_shape(sim: RunningSim) -> None:
    response = sim.client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 5})
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert list(body) == [
        "id", "object", "created", "model", "choices", "service_tier", "system_fingerprint", "usage",
        "prompt_logprobs", "prompt_token_ids", "prompt_text", "kv_transfer_params", "ec_transfer_params", "metrics",
    ]  # fmt: skip
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) == len("chatcmpl-") + 16
    assert body["object"] == "chat.completion" and body["model"] == "tiny"
    (choice,) = body["choices"]
    assert list(choice["message"]) == [
        "role",
        "content",
        "refusal",
        "annotations",
        "audio",
        "function_call",
        "reasoning",
    ]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    assert list(body["usage"]) == [
        "prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details", "completion_tokens_details"
    ]  # fmt: skip
    # compact separators and raw UTF-8, like Starlette's JSONResponse
    assert b'"object":"chat.completion"' in response.content


def test_non_stream_usage_arithmetic(sim032: RunningSim) -> None:
    body = sim032.client.post("/v1/chat/completions", json={"messages": HELLO, "max_completion_tokens": 7}).json()
    usage = body["usage"]
    assert usage["prompt_tokens"] == chat_prompt_tokens(sim032, HELLO)
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7


def test_generated_text_is_deterministic_and_as_long_as_promised(sim032: RunningSim, hf_tokenizer: Any) -> None:
    request = {"messages": HELLO, "max_tokens": 9}
    first = sim032.client.post("/v1/chat/completions", json=request).json()["choices"][0]["message"]["content"]
    second = sim032.client.post("/v1/chat/completions", json={**request, "temperature": 1.3, "seed": 4}).json()
    assert second["choices"][0]["message"]["content"] == first
    assert len(hf_tokenizer(first, add_special_tokens=False).input_ids) == 9


def test_x_request_id_becomes_the_response_id(sim032: RunningSim) -> None:
    headers = {"X-Request-Id": "abc-123"}
    chat = sim032.client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 1}, headers=headers)
    assert chat.json()["id"] == "chatcmpl-abc-123"
    completion = sim032.client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}, headers=headers)
    assert completion.json()["id"] == "cmpl-abc-123"


def test_chat_without_max_tokens_fills_the_window(sim: RunningSim) -> None:
    body = sim.client.post("/v1/chat/completions", json={"messages": HELLO}).json()
    assert body["usage"]["total_tokens"] == 2048


def test_completions_default_to_16_tokens(sim032: RunningSim) -> None:
    for extra in ({}, {"max_tokens": None}):
        body = sim032.client.post("/v1/completions", json={"prompt": "Hello", **extra}).json()
        assert body["usage"]["completion_tokens"] == 16
        assert body["choices"][0]["finish_reason"] == "length"


def test_n_choices(sim032: RunningSim) -> None:
    body = sim032.client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 4, "n": 3}).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"]["completion_tokens"] == 12
    assert body["usage"]["prompt_tokens"] == chat_prompt_tokens(sim032, HELLO)


def test_batch_completion_prompts(sim032: RunningSim, hf_tokenizer: Any) -> None:
    prompts = ["Hello", "A longer second prompt", "日本語"]
    body = sim032.client.post("/v1/completions", json={"prompt": prompts, "max_tokens": 3, "n": 2}).json()
    assert [c["index"] for c in body["choices"]] == list(range(6))
    assert body["usage"]["prompt_tokens"] == sum(len(hf_tokenizer(p).input_ids) for p in prompts)
    assert body["usage"]["completion_tokens"] == 18
    ids = sim032.client.post("/v1/completions", json={"prompt": [[19923, 2058], [7]], "max_tokens": 2}).json()
    assert ids["usage"] == {**ids["usage"], "prompt_tokens": 3, "completion_tokens": 4}
    mixed = sim032.client.post("/v1/completions", json={"prompt": ["Hello", [19923]]})
    assert mixed.status_code == 400 and mixed.json()["error"]["type"] == "Bad Request"


def test_032_batch_prompts_are_clamped_one_by_one(sim032: RunningSim) -> None:
    short, long = [1] * 10, [1] * 2040
    body = sim032.client.post("/v1/completions", json={"prompt": [short, long], "max_tokens": 100}).json()
    assert body["usage"]["completion_tokens"] == 100 + 8
    assert body["usage"]["prompt_tokens"] == 2050


def test_032_clamps_chat_output_to_the_window(sim032: RunningSim) -> None:
    messages = long_messages(sim032, 2000)
    body = sim032.client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 500}).json()
    assert body["usage"] == {
        "prompt_tokens": 2000,
        "total_tokens": 2048,
        "completion_tokens": 48,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def test_031_rejects_the_same_overflow(sim031: RunningSim) -> None:
    messages = long_messages(sim031, 2000)
    response = sim031.client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 500})
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": "This model's maximum context length is 2048 tokens. However, you requested 500 output "
            "tokens and your prompt contains at least 1549 input tokens, for a total of at least 2049 tokens. "
            "Please reduce the length of the input prompt or the number of requested output tokens. "
            "(parameter=input_tokens, value=1549)",
            "type": "BadRequestError",
            "param": "input_tokens",
            "code": 400,
        }
    }


def test_errors_before_streaming_are_plain_json(sim: RunningSim) -> None:
    request = {"messages": HELLO, "max_tokens": 5000, "stream": True}
    response = sim.client.post("/v1/chat/completions", json=request)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["param"] == "max_tokens"


def test_stream_framing_and_usage_event(sim: RunningSim) -> None:
    request = {"messages": HELLO, "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}}
    response = sim.client.post("/v1/chat/completions", json=request)
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    chunks = sse_json(response.text)
    role_chunks = [c for c in chunks if c["choices"] and "role" in c["choices"][0]["delta"]]
    assert len(role_chunks) == 1 and role_chunks[0] is chunks[0]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks[1:] if c["choices"]]
    assert len(content) == 6 and all(c["choices"][0]["delta"]["content"] for c in content)
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 5 + ["length"]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 6
    assert usage_chunk["usage"]["prompt_tokens"] == chat_prompt_tokens(sim, HELLO)
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}


def test_stream_without_usage_has_no_usage_event(sim032: RunningSim) -> None:
    options: list[dict[str, Any]] = [{}, {"stream_options": {}}, {"stream_options": {"include_usage": False}}]
    for option in options:
        request = {"messages": HELLO, "max_tokens": 2, "stream": True, **option}
        chunks = sse_json(sim032.client.post("/v1/chat/completions", json=request).text)
        assert all(c["choices"] and "usage" not in c for c in chunks)
        assert "system_fingerprint" in chunks[-1]  # the terminal chunk carries it when no usage chunk follows


def test_032_streamed_tokens_equal_the_clamped_max_tokens(sim032: RunningSim) -> None:
    messages = long_messages(sim032, 2040)
    request = {"messages": messages, "max_tokens": 300, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse_json(sim032.client.post("/v1/chat/completions", json=request).text)
    tokens = [c for c in chunks[1:] if c["choices"]]
    assert len(tokens) == 8 and chunks[-1]["usage"]["completion_tokens"] == 8


def test_stream_n_choices_each_open_and_finish_once(sim032: RunningSim) -> None:
    request = {"messages": HELLO, "max_tokens": 3, "n": 2, "stream": True}
    chunks = sse_json(sim032.client.post("/v1/chat/completions", json=request).text)
    roles = [c["choices"][0]["index"] for c in chunks if "role" in c["choices"][0]["delta"]]
    finished = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(roles) == [0, 1] and sorted(finished) == [0, 1]


def test_completion_stream(sim032: RunningSim) -> None:
    request = {"prompt": ["a", "b"], "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    chunks = sse_json(sim032.client.post("/v1/completions", json=request).text)
    texts = [c for c in chunks if c["choices"]]
    assert len(texts) == 4 and {c["object"] for c in chunks} == {"text_completion"}
    assert list(texts[0]["choices"][0]) == [
        "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"
    ]  # fmt: skip
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


def test_continuous_usage_stats(sim032: RunningSim) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    request = {"messages": HELLO, "max_tokens": 3, "stream": True, "stream_options": options}
    chunks = sse_json(sim032.client.post("/v1/chat/completions", json=request).text)
    assert [c["usage"]["completion_tokens"] for c in chunks[:-1]] == [0, 1, 2, 3]


def test_empty_token_prompt_fails_inside_the_stream(sim032: RunningSim) -> None:
    # The engine checks this after the HTTP layer has said 200, so a stream reports it as an SSE event.
    stream = sim032.client.post("/v1/completions", json={"prompt": [[]], "stream": True})
    assert stream.status_code == 200
    events = sse_events(stream.text)
    assert events[-1] == "[DONE]" and len(events) == 2
    assert json.loads(events[0])["error"]["message"] == "The decoder prompt cannot be empty"
    assert ", " in events[0]  # json.dumps defaults, as vLLM writes mid-stream errors
    plain = sim032.client.post("/v1/completions", json={"prompt": [[]]})
    assert plain.status_code == 400 and plain.json()["error"]["message"] == "The decoder prompt cannot be empty"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"prompt": []}, "You must pass at least one prompt"),
        ({"prompt": ""}, "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"),
        ({"prompt": "x", "suffix": "y"}, "suffix is only supported for models with FIM completion rendering"),
        ({"prompt": [1, 10**9]}, "Token id 1000000000 is out of vocabulary"),
    ],
)
def test_completion_prompt_errors(sim032: RunningSim, body: dict[str, Any], message: str) -> None:
    response = sim032.client.post("/v1/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["message"] == message


def test_unknown_model(sim031: RunningSim, sim032: RunningSim) -> None:
    request = {"model": "nope", "messages": HELLO}
    old = sim031.client.post("/v1/chat/completions", json=request)
    new = sim032.client.post("/v1/chat/completions", json=request)
    assert old.status_code == new.status_code == 404
    assert old.json()["error"] == {
        "message": "The model `nope` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    assert new.json()["error"]["message"] == "The model `nope` does not exist. Valid aliases: tiny."
    named = sim032.client.post("/v1/chat/completions", json={"model": "tiny", "messages": HELLO, "max_tokens": 1})
    assert named.status_code == 200


def test_request_validation_errors(sim032: RunningSim) -> None:
    bad_json = sim032.client.post(
        "/v1/chat/completions", content=b"{oops", headers={"content-type": "application/json"}
    )
    wrong_type = sim032.client.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": "many"})
    missing = sim032.client.post("/v1/chat/completions", json={"max_tokens": 3})
    not_object = sim032.client.post("/v1/chat/completions", json=[1, 2])
    assert not_object.json()["error"]["message"].startswith("1 validation error:")
    not_json = sim032.client.post("/v1/completions", content=b"prompt=hi", headers={"content-type": "text/plain"})
    for response in (bad_json, wrong_type, missing, not_json):
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "Bad Request" and error["code"] == 400
    assert wrong_type.json()["error"]["param"] == "body.max_tokens"
    assert missing.json()["error"]["param"] == "body.messages"


def test_echo(sim032: RunningSim) -> None:
    plain = sim032.client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2}).json()
    echoed = sim032.client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 2, "echo": True}).json()
    assert echoed["choices"][0]["text"] == "Hello" + plain["choices"][0]["text"]
    prompt_only = {"prompt": [19923, 2058], "max_tokens": 0, "echo": True}
    assert sim032.client.post("/v1/completions", json=prompt_only).json()["choices"][0]["text"] == "Hello world"
    messages = [*HELLO, {"role": "assistant", "content": "Sure,"}]
    request = {"messages": messages, "add_generation_prompt": False, "continue_final_message": True, "echo": True}
    chat = sim032.client.post("/v1/chat/completions", json={**request, "max_tokens": 2}).json()
    assert chat["choices"][0]["message"]["content"].startswith("Sure, ")


def test_return_token_ids(sim032: RunningSim, hf_tokenizer: Any) -> None:
    request = {"messages": HELLO, "max_tokens": 3, "return_token_ids": True}
    body = sim032.client.post("/v1/chat/completions", json=request).json()
    assert body["prompt_token_ids"] == sim032.client.post("/tokenize", json={"messages": HELLO}).json()["tokens"]
    choice = body["choices"][0]
    assert hf_tokenizer.decode(choice["token_ids"]) == choice["message"]["content"]


def test_continue_final_message_needs_add_generation_prompt_off(sim032: RunningSim) -> None:
    messages = [*HELLO, {"role": "assistant", "content": "Hi"}]
    both = sim032.client.post(
        "/v1/chat/completions",
        json={"messages": messages, "continue_final_message": True, "add_generation_prompt": True},
    )
    assert both.json()["error"]["message"] == (
        "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
    )
    implicit = sim032.client.post("/v1/chat/completions", json={"messages": messages, "continue_final_message": True})
    assert implicit.status_code == 400
    assert implicit.json()["error"]["message"].startswith("continue_final_message and add_generation_prompt")
    ok = sim032.client.post(
        "/v1/chat/completions",
        json={"messages": messages, "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 2},
    )
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["role"] == "assistant"


def test_models_endpoint(sim: RunningSim, sim_tokenizer_dir: Path) -> None:
    body = sim.client.get("/v1/models").json()
    (card,) = body["data"]
    assert body["object"] == "list"
    assert list(card) == ["id", "object", "created", "owned_by", "root", "parent", "max_model_len", "permission"]
    assert (card["id"], card["root"], card["max_model_len"]) == ("tiny", str(sim_tokenizer_dir), 2048)


def test_small_endpoints(sim031: RunningSim, sim032: RunningSim) -> None:
    assert sim031.client.get("/version").json() == {"version": "0.31.0"}
    assert sim032.client.get("/version").json() == {"version": "0.32.0"}
    health = sim032.client.get("/health")
    assert health.status_code == 200 and health.content == b""
    unknown = sim032.client.post("/v1/images/generations", json={"prompt": "x"})
    assert unknown.status_code == 404 and unknown.json() == {"detail": "Not Found"}
    wrong_method = sim032.client.get("/v1/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.json() == {"detail": "Method Not Allowed"}
    detok = sim032.client.post("/detokenize", json={"tokens": [19923, 2058]})
    assert detok.json() == {"prompt": "Hello world"}


def test_settings_shape_what_the_server_reports(sim_tokenizer_dir: Path) -> None:
    settings = SimulatorSettings(
        tokenizer=sim_tokenizer_dir, model="m", max_model_len=64, root="org/m", version="0.32.9"
    )
    with running_simulator(settings) as sim:
        card = sim.client.get("/v1/models").json()["data"][0]
        assert (card["id"], card["root"], card["max_model_len"]) == ("m", "org/m", 64)
        assert sim.client.get("/version").json() == {"version": "0.32.9"}
        body = sim.client.post("/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 64}).json()
        assert body["usage"]["total_tokens"] == 64
        assert body["system_fingerprint"].startswith("vllm-0.32.9-")


def test_tokenize_errors(sim032: RunningSim) -> None:
    for path, body in [
        ("/tokenize", {"prompt": None}),
        ("/tokenize", {"messages": None}),
        ("/detokenize", {"tokens": "1 2"}),
        ("/detokenize", {"tokens": [-1]}),
    ]:
        response = sim032.client.post(path, json=body)
        assert response.status_code == 400 and response.json()["error"]["type"] == "Bad Request", (path, body)
    unknown = sim032.client.post("/tokenize", json={"model": "nope", "prompt": "x"})
    assert unknown.status_code == 404
    both = {"messages": HELLO, "continue_final_message": True, "add_generation_prompt": True}
    assert sim032.client.post("/tokenize", json=both).status_code == 400


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-16-le", "utf-32-be"])
def test_a_json_body_is_read_in_every_encoding_json_loads_reads_as_vllm_reads_it(
    sim032: RunningSim, encoding: str
) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "東京"}], "max_tokens": 3}
    raw = json.dumps(body, ensure_ascii=False).encode(encoding)
    response = sim032.client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
    assert sim032.stats.snapshot()["requests"][-1] == body


def test_bytes_json_loads_cannot_decode_are_fastapis_400(sim032: RunningSim) -> None:
    raw = b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff"}]}'
    response = sim032.client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["message"] == "There was an error parsing the body"
