"""Responses, Anthropic Messages, count_tokens and /invocations end to end: the real `openai` and `anthropic` SDKs ->
token-guard on loopback -> the vLLM simulator in memory (0.31 profile, which refuses what does not fit)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.support.polling import eventually
from tests.support.servers import MODEL, InMemorySim

WINDOW = 2048
TOOL = {"name": "get_weather", "description": "Weather for a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip


@pytest.fixture
def claude(proxy: str) -> anthropic.Anthropic:
    # an explicit timeout: the SDK refuses a non-streamed max_tokens this large without one
    return anthropic.Anthropic(base_url=proxy, api_key="unused", max_retries=0, timeout=30)


def half_room(prompt_tokens: int) -> int:
    """The output of a clamp on /v1/messages and Responses by default: half the room the prompt leaves, the other
    half kept for the next turn (policy.next_turn_share_*)."""
    room = WINDOW - prompt_tokens
    return room - room // 2


def essay(words: int) -> str:
    return " ".join(f"word{i % 50}" for i in range(words))


def test_responses_clamp_succeeds_where_vllm_alone_refuses(oai: openai.OpenAI, sim: InMemorySim) -> None:
    direct = openai.OpenAI(base_url=f"{sim.url}/v1", api_key="x", max_retries=0, http_client=sim.client)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        direct.responses.create(model=MODEL, input=essay(100), max_output_tokens=2000)
    raw = oai.responses.with_raw_response.create(model=MODEL, input=essay(100), max_output_tokens=2000)
    reply = raw.parse()
    kept = int(raw.headers["x-token-guard-next-turn-tokens"])  # policy.next_turn_share_responses: half the room
    assert reply.usage is not None and reply.usage.input_tokens + reply.usage.output_tokens + kept == WINDOW
    assert raw.headers["x-token-guard-action"] == "clamp"
    assert int(raw.headers["x-token-guard-prompt-tokens"]) == reply.usage.input_tokens
    assert sim.stats.requests[-1]["max_output_tokens"] == WINDOW - reply.usage.input_tokens - kept


def test_responses_stream_is_clamped(oai: openai.OpenAI) -> None:
    stream = oai.responses.create(
        model=MODEL, input=[{"role": "user", "content": "Hi"}], instructions="Be terse.", max_output_tokens=5000,
        stream=True,
    )  # fmt: skip
    events = list(stream)
    completed = events[-1]
    assert completed.type == "response.completed" and completed.response.usage is not None
    assert completed.response.usage.output_tokens == half_room(completed.response.usage.input_tokens)


def test_responses_stream_passes_through_byte_for_byte(proxy: str, sim: InMemorySim) -> None:
    body = {"model": MODEL, "input": "Hi", "max_output_tokens": 20, "stream": True}
    with httpx.stream("POST", f"{proxy}/v1/responses", json=body) as response:
        received = b"".join(response.iter_bytes())
        assert response.headers["x-token-guard-action"] == "pass"
    assert received.startswith(b"event: response.created\n")
    # the simulator's tap records a body when its app returns, which may come after the client read the last byte
    assert eventually(lambda: sim.tap.bodies[-1] == received)


def test_responses_too_long_is_refused_without_reaching_vllm(oai: openai.OpenAI, sim: InMemorySim) -> None:
    before = sim.stats.received
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model=MODEL, input=essay(3000), max_output_tokens=10)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "input"
    assert caught.value.body["code"] == "context_length_exceeded"
    assert sim.stats.received == before


def test_previous_response_id_is_partial_and_a_limit_within_its_room_is_forwarded_as_sent(
    proxy: str, sim: InMemorySim
) -> None:
    body = {"model": MODEL, "input": "next", "previous_response_id": "resp_x", "max_output_tokens": 999}
    response = httpx.post(f"{proxy}/v1/responses", json=body)
    assert response.headers["x-token-guard-action"] == "partial"
    assert sim.stats.requests[-1]["max_output_tokens"] == 999  # vLLM holds the history, which may or may not fit


def test_responses_truncate_drops_the_oldest_turns(proxy: str, sim: InMemorySim) -> None:
    items = [{"role": "user", "content": essay(900)}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": essay(900)}, {"role": "assistant", "content": "ok"},
             {"role": "user", "content": "Summarise."}]  # fmt: skip
    body = {"model": MODEL, "input": items, "max_output_tokens": 100}
    response = httpx.post(f"{proxy}/v1/responses", json=body, headers={"x-token-guard-overflow": "truncate"})
    assert response.status_code == 200, response.text
    assert response.headers["x-token-guard-action"] == "truncate"
    assert response.headers["x-token-guard-dropped-messages"] == "2"
    assert sim.stats.requests[-1]["input"] == items[2:]
    assert response.json()["usage"]["input_tokens"] == int(response.headers["x-token-guard-prompt-tokens"])


def test_claude_code_style_request_is_clamped(claude: anthropic.Anthropic, sim: InMemorySim) -> None:
    system: Any = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
                   {"type": "text", "text": "You are Claude Code. " + essay(300)}]  # fmt: skip
    tools: Any = [TOOL]
    raw = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=32000, system=system, tools=tools, tool_choice={"type": "none"},
        messages=[{"role": "user", "content": "List the files."}],
    )  # fmt: skip
    reply = raw.parse()
    assert raw.headers["x-token-guard-action"] == "clamp"
    assert int(raw.headers["x-token-guard-prompt-tokens"]) == reply.usage.input_tokens
    assert reply.usage.output_tokens == half_room(reply.usage.input_tokens)  # the rest kept for the next turn


def test_messages_stream_is_clamped(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=MODEL, max_tokens=32000, messages=[{"role": "user", "content": "Hi"}]) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == half_room(final.usage.input_tokens)


def test_messages_overflow_answers_in_anthropics_shape(claude: anthropic.Anthropic, sim: InMemorySim) -> None:
    before = sim.stats.received
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": essay(3000)}])
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "BadRequestError" and "maximum context length is 2048" in body["error"]["message"]
    assert caught.value.response.headers["x-token-guard-action"] == "reject"
    assert sim.stats.received == before


def test_count_tokens_is_answered_by_the_guard_as_vllm_would(claude: anthropic.Anthropic, sim: InMemorySim) -> None:
    request: Any = {"model": MODEL, "system": "Be brief.", "tools": [TOOL],
                               "messages": [{"role": "user", "content": "東京の天気は？"}]}  # fmt: skip
    before = sim.stats.received
    counted = claude.messages.count_tokens(**request)
    assert sim.stats.received == before  # never forwarded
    direct = sim.client.post("/v1/messages/count_tokens", json=request).json()
    assert counted.input_tokens == direct["input_tokens"]
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": essay(3000)}])


@pytest.mark.parametrize(
    "body,action",
    [
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}, "clamp"),
        ({"prompt": "Once upon a time", "max_tokens": 5000}, "clamp"),
        ({"prompt": essay(3000), "max_tokens": 5}, "reject"),
    ],
)
def test_invocations_are_guarded_like_the_endpoint_vllm_picks(proxy: str, body: dict[str, Any], action: str) -> None:
    response = httpx.post(f"{proxy}/invocations", json={"model": MODEL, **body})
    assert response.headers["x-token-guard-action"] == action
    if action == "clamp":
        usage = response.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == WINDOW


def test_metrics_and_log_label_each_endpoint(proxy: str, oai: openai.OpenAI) -> None:
    oai.responses.create(model=MODEL, input="hi", max_output_tokens=3)
    text = httpx.get(f"{proxy}/metrics").text
    assert 'endpoint="/v1/responses"' in text and 'endpoint="/v1/messages"' in text


def test_the_guards_own_errors_on_messages_are_anthropic_shaped(proxy: str) -> None:
    response = httpx.post(f"{proxy}/v1/messages", json={"model": "nope", "max_tokens": 5, "messages": []})
    assert response.status_code == 404
    assert json.loads(response.text)["error"]["type"] == "NotFoundError"


def test_a_wrong_method_on_messages_is_anthropic_shaped_too(proxy: str) -> None:
    response = httpx.get(f"{proxy}/v1/messages")
    assert response.status_code == 405 and response.json()["type"] == "error"
