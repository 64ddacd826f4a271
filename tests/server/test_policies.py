"""The truncate and chunk policies end to end: the OpenAI SDK -> token-guard -> the simulator (0.31 profile, which
rejects every overflow, so any sub-request that did not fit would fail the test)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.server.running import ServerThread
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support.documents import document
from tests.support.polling import eventually
from tests.support.prometheus import metric
from tests.support.request_log import as_headers, changes_told, logged
from tests.support.servers import MODEL, InMemorySim, guard, simulator, simulator_in_memory

WINDOW = 2048


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(deepseek_dir, profile="0.31", max_model_len=WINDOW) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: InMemorySim, deepseek_dir: Path) -> Iterator[str]:
    with guard(sim, deepseek_dir, **{"model.max_model_len": WINDOW}) as server:
        yield server.url


def sdk(proxy: str, policy: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0, timeout=120,
                         default_headers={"x-token-guard-overflow": policy})  # fmt: skip


def test_default_policy_still_rejects(proxy: str) -> None:
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        openai.OpenAI(base_url=f"{proxy}/v1", api_key="x", max_retries=0).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": document(3000)}], max_tokens=10
        )


def test_unknown_policy_is_a_400_listing_the_valid_ones(proxy: str) -> None:
    with pytest.raises(openai.BadRequestError, match="reject, truncate, chunk"):
        sdk(proxy, "summarise").chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])


def test_truncate_chat_keeps_system_and_last_user_message_verbatim(proxy: str, sim: InMemorySim) -> None:
    system: Any = {"role": "system", "content": "You answer tersely."}
    history: list[Any] = []
    for i in range(12):
        history += [{"role": "user", "content": f"Question {i}: " + document(200)},
                    {"role": "assistant", "content": f"Answer {i}: " + document(100)}]  # fmt: skip
    last: Any = {"role": "user", "content": "So what is the summary?"}
    raw = sdk(proxy, "truncate").chat.completions.with_raw_response.create(
        model=MODEL, messages=[system, *history, last], max_tokens=200
    )
    usage = raw.parse().usage
    assert usage is not None and usage.completion_tokens == 200 and usage.prompt_tokens <= WINDOW - 200
    assert raw.headers["x-token-guard-action"] == "truncate"
    forwarded = sim.stats.requests[-1]["messages"]
    assert forwarded[0] == system and forwarded[-1] == last
    dropped = int(raw.headers["x-token-guard-dropped-messages"])
    assert dropped > 0 and len(forwarded) == 2 + len(history) - dropped
    assert forwarded[1:-1] == history[len(history) - len(forwarded) + 2 :]  # the newest turns survive, in order
    assert int(raw.headers["x-token-guard-truncated-tokens"]) > 0


@pytest.mark.parametrize("policy", ["truncate", "chunk"])
def test_the_log_line_and_metrics_say_every_change_the_headers_tell(
    proxy: str, caplog: pytest.LogCaptureFixture, policy: str
) -> None:
    """Messages dropped and tokens cut, the chunks' sizes: the request's log line says each as its answer's
    x-token-guard-* headers do, and a metric counts them."""
    caplog.set_level(logging.INFO, logger="token_guard.requests")
    history: Any = [{"role": "user" if i % 2 == 0 else "assistant", "content": document(300)} for i in range(11)]
    messages: Any = history if policy == "truncate" else [{"role": "user", "content": document(5000)}]
    before = httpx.get(f"{proxy}/metrics").text
    raw = sdk(proxy, policy).chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=50, extra_headers={"x-request-id": f"changes-{policy}"}
    )
    headers = changes_told(raw.headers)
    assert headers["x-token-guard-action"] == policy and as_headers(logged(caplog, f"changes-{policy}")) == headers
    after, labels = httpx.get(f"{proxy}/metrics").text, {"model": MODEL, "endpoint": "/v1/chat/completions"}
    if policy == "truncate":
        dropped = metric(after, "token_guard_dropped_messages_total", **labels)
        assert dropped - metric(before, "token_guard_dropped_messages_total", **labels) == int(
            headers["x-token-guard-dropped-messages"]
        ) > 0  # fmt: skip
    else:
        assert (
            metric(after, "token_guard_chunks_count", **labels) - metric(before, "token_guard_chunks_count", **labels)
            == 1
        )


def test_truncate_shortens_a_single_long_message_in_the_middle(proxy: str, sim: InMemorySim) -> None:
    text = "HEAD-OF-DOC " + document(6000) + " TAIL-OF-DOC"
    reply = sdk(proxy, "truncate").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=64
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 64
    sent = sim.stats.requests[-1]["messages"][0]["content"]
    assert sent.startswith("HEAD-OF-DOC ") and sent.endswith(" TAIL-OF-DOC")
    assert "tokens cut by token-guard" in sent and len(sent) < len(text)


def test_truncate_gives_the_400_when_the_kept_messages_cannot_fit(proxy: str) -> None:
    with pytest.raises(openai.BadRequestError, match="Truncation could not make it fit"):
        sdk(proxy, "truncate").chat.completions.create(
            model=MODEL, messages=[{"role": "system", "content": document(3000)}, {"role": "user", "content": "hi"}],
            max_tokens=10,
        )  # fmt: skip


@pytest.mark.parametrize("side", ["left", "right", "middle"])
def test_truncate_completion_sends_the_kept_token_ids(deepseek_dir: Path, sim: InMemorySim, side: str) -> None:
    flags = {"model.max_model_len": WINDOW, "policy.truncate_side": side, "policy.on_overflow": "truncate"}
    with guard(sim, deepseek_dir, **flags) as proxy_server:
        prompt = document(4000)
        ids = sim.client.post("/tokenize", json={"prompt": prompt}).json()["tokens"]
        reply = openai.OpenAI(base_url=f"{proxy_server.url}/v1", api_key="x", max_retries=0).completions.create(
            model=MODEL, prompt=prompt, max_tokens=48
        )
        kept = WINDOW - 48
        expected = {"left": ids[-kept:], "right": ids[:kept], "middle": ids[: kept // 2] + ids[-(kept // 2) :]}[side]
        assert sim.stats.requests[-1]["prompt"] == expected
        assert reply.usage is not None and reply.usage.prompt_tokens == kept and reply.usage.completion_tokens == 48


def test_chunk_chat_answers_a_10000_token_document(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    messages: Any = [{"role": "system", "content": "Summarise."}, {"role": "user", "content": document(10000)}]
    raw = sdk(proxy, "chunk").chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=32)
    reply = raw.parse()
    parts = int(raw.headers["x-token-guard-chunks"])
    assert raw.headers["x-token-guard-action"] == "chunk" and parts >= 5
    assert sim.stats.received - before == parts
    bodies = list(sim.stats.requests)[-parts:]
    assert all(b["messages"][0]["content"] == "Summarise." for b in bodies)
    usage = reply.usage  # the parts share the client's max_tokens: the merged answer stays within it
    assert usage is not None and usage.completion_tokens == 32
    assert [b["max_tokens"] for b in bodies] == [32 // parts + (i < 32 % parts) for i in range(parts)]
    part_tokens = [int(n) for n in raw.headers["x-token-guard-chunk-tokens"].split(",")]
    assert usage.prompt_tokens == sum(part_tokens) and all(n + 32 <= WINDOW for n in part_tokens)
    assert reply.choices[0].finish_reason == "length" and reply.id.startswith("chatcmpl-tg")
    assert reply.choices[0].message.content is not None and reply.choices[0].message.content.count("\n\n") == parts - 1


def test_streamed_chunked_answer_equals_the_non_streamed_one(proxy: str) -> None:
    messages: Any = [{"role": "user", "content": document(7000)}]
    client = sdk(proxy, "chunk")
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, stream=True,
                                            stream_options={"include_usage": True})  # fmt: skip
    text, roles, finishes, usages, ids = "", 0, [], [], set()
    for chunk in stream:
        ids.add(chunk.id)
        for choice in chunk.choices:
            roles += choice.delta.role is not None
            text += choice.delta.content or ""
            finishes += [choice.finish_reason] if choice.finish_reason else []
        usages += [chunk.usage] if chunk.usage else []
    assert text == whole.choices[0].message.content
    assert (roles, finishes, len(usages), len(ids)) == (1, ["length"], 1, 1)
    assert whole.usage is not None and usages[0].model_dump() == whole.usage.model_dump()


def test_chunked_completions_stream_and_not(proxy: str) -> None:
    client = sdk(proxy, "chunk")
    prompt = document(9000)
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=16)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=16, stream=True) if c.choices)  # fmt: skip
    assert streamed == whole.choices[0].text and whole.usage is not None
    assert whole.usage.completion_tokens == 16  # vLLM's default max_tokens, shared by the chunks


def test_reduce_merge_returns_the_combining_answer(
    deepseek_dir: Path, sim: InMemorySim, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="token_guard.requests")
    with guard(sim, deepseek_dir, **{"model.max_model_len": WINDOW, "policy.chunk_merge": "reduce"}) as server:
        raw = sdk(server.url, "chunk").chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": document(5000)}], max_tokens=24,
            extra_headers={"x-request-id": "reduce-1"},
        )  # fmt: skip
        assert as_headers(logged(caplog, "reduce-1")) == changes_told(raw.headers)  # the merge among them
        merges = metric(httpx.get(f"{server.url}/metrics").text, "token_guard_chunk_merges_total", merge="reduce")
        assert merges == 1
        reply = raw.parse()
        parts = int(raw.headers["x-token-guard-chunks"])
        assert raw.headers["x-token-guard-merge"] == "reduce"
        last = sim.stats.requests[-1]["messages"][-1]["content"]
        assert last.startswith("Below are answers to consecutive parts")
        # the parts keep the client's limit each (notes for the combining request, whose answer it bounds)
        assert reply.usage is not None and reply.usage.completion_tokens == 24 * (parts + 1)


def test_concatenated_parts_share_a_max_tokens_smaller_than_their_count_only_if_each_gets_one(proxy: str) -> None:
    messages: Any = [{"role": "user", "content": document(10000)}]
    with pytest.raises(openai.BadRequestError, match="max_tokens of 3 cannot be shared by"):
        sdk(proxy, "chunk").chat.completions.create(model=MODEL, messages=messages, max_tokens=3)
    client = sdk(proxy, "chunk")
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=64, stream=True,
                                           stream_options={"include_usage": True})  # fmt: skip
    usages = [chunk.usage for chunk in reply if chunk.usage]
    assert usages[-1] is not None and usages[-1].completion_tokens == 64


UNSOUND = [
    ({"n": 2}, "n > 1"),
    ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "JSON response_format"),
]


@pytest.mark.parametrize("extra,why", UNSOUND)
def test_chunking_without_sound_meaning_falls_back_to_reject_saying_why(proxy: str, extra: Any, why: str) -> None:
    with pytest.raises(openai.BadRequestError, match=f"chunk policy was not applied.*{why}") as info:
        sdk(proxy, "chunk").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": document(4000)}], max_tokens=8, **extra
        )
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "context_length_exceeded"


def test_a_prompt_needing_more_than_64_parts_is_not_chunked(deepseek_dir: Path, sim: InMemorySim) -> None:
    with guard(sim, deepseek_dir, **{"model.max_model_len": WINDOW, "policy.chunk_tokens": 16}) as server:
        before = sim.stats.received
        with pytest.raises(openai.BadRequestError, match="chunk policy was not applied: the prompt would take more "
                                                          "than 64 chunks of 16 tokens"):  # fmt: skip
            sdk(server.url, "chunk").chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": document(3000)}], max_tokens=8
            )
    assert sim.stats.received == before


def test_client_disconnect_during_a_chunked_stream_aborts_every_part(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW, itl_s=0.02) as (sim, stats, _):
        with guard(sim.url, deepseek_dir, **{"model.max_model_len": WINDOW}) as proxy:
            body = {"model": MODEL, "messages": [{"role": "user", "content": document(11000)}], "max_tokens": 300,
                    "stream": True}  # fmt: skip
            with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body,
                              headers={"x-token-guard-overflow": "chunk"}, timeout=60) as response:  # fmt: skip
                assert int(response.headers["x-token-guard-chunks"]) >= 6
                lines = response.iter_lines()
                for _ in range(5):
                    next(lines)
            assert eventually(lambda: stats.active == 0 and stats.aborted >= 1)
            assert stats.completed == 0 and stats.aborted == stats.received <= 4  # max_fanout: at most 4 started


class FailSecondChat:
    """Lets the first chat request through and answers the second with a 500, like a crashed engine."""

    def __init__(self, app: ASGIApp) -> None:
        self.app, self.seen = app, 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            self.seen += 1
            if self.seen == 2:
                await asyncio.sleep(0.2)
                error = {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}
                body = json.dumps({"error": error}).encode()
                await send({"type": "http.response.start", "status": 500,
                            "headers": [(b"content-type", b"application/json")]})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_part_cancels_the_others(deepseek_dir: Path, stream: bool) -> None:
    app = create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, max_model_len=WINDOW, itl_s=0.01))
    stats, failing = app.state.stats, FailSecondChat(app)
    with (
        ServerThread(failing) as sim,
        # the start-up check's own requests come first: counted locally whatever it makes of the one that fails
        guard(sim.url, deepseek_dir, **{"model.max_model_len": WINDOW, "counting.source": "local"}) as proxy,
    ):
        failing.seen = 0
        body = {"model": MODEL, "messages": [{"role": "user", "content": document(8000)}], "max_tokens": 400,
                "stream": stream}  # fmt: skip
        response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=60,
                              headers={"x-token-guard-overflow": "chunk"})  # fmt: skip
        if stream:
            events = [line for line in response.text.split("\n\n") if line]
            assert json.loads(events[-2][6:])["error"]["code"] == 500 and events[-1] == "data: [DONE]"
        else:
            assert response.status_code == 500 and response.json()["error"]["type"] == "InternalServerError"
        # every part that reached the simulator was cancelled, none finished (the failing one never reached it)
        assert eventually(lambda: stats.active == 0 and stats.aborted == stats.received)
        assert stats.completed == 0


def test_a_prompt_scored_by_its_own_logprobs_is_never_cut(sim: InMemorySim, deepseek_dir: Path) -> None:
    """lm-evaluation-harness's loglikelihood request: echo, logprobs, max_tokens 1. Cut, its logprobs would be
    another text's and the harness's perplexity wrong with no error: the overflow 400 instead, whatever the
    configured policy or the client's header; the same prompt without logprobs is still cut."""
    text = document(3000)
    with guard(sim, deepseek_dir, **{"model.max_model_len": WINDOW, "policy.on_overflow": "truncate"}) as server:
        for policy in ("truncate", "chunk"):
            client = sdk(server.url, policy)
            before = sim.stats.received
            with pytest.raises(openai.BadRequestError) as caught:
                client.completions.create(model=MODEL, prompt=text, echo=True, logprobs=1, max_tokens=1)
            body = caught.value.body
            assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
            assert f"The {policy} policy was not applied" in body["message"] and "echo with logprobs" in body["message"]
            assert caught.value.response.headers["x-token-guard-action"] == "reject" and sim.stats.received == before
        configured = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=120)
        with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
            configured.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}],
                                               max_tokens=8, extra_body={"prompt_logprobs": 1})  # fmt: skip
        cut = configured.completions.with_raw_response.create(model=MODEL, prompt=text, max_tokens=1)
        assert cut.headers["x-token-guard-action"] == "truncate"


def test_prompt_ids_sent_for_vllm_to_run_are_counted_and_never_cut(proxy: str, sim: InMemorySim) -> None:
    """kv_transfer_params.prompt_token_ids: vLLM's chat renderer runs them in place of the messages. Counted as the
    messages alone (2 tokens), a 1,900-id prompt went to vLLM with room for 1,000 tokens of answer."""
    ids = list(range(1000, 2900))
    raw = sdk(proxy, "reject").chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=1000,
        extra_body={"kv_transfer_params": {"prompt_token_ids": ids}},
    )  # fmt: skip
    usage = raw.parse().usage
    assert raw.headers["x-token-guard-prompt-tokens"] == "1900" and raw.headers["x-token-guard-max-tokens"] == "148"
    assert usage is not None and usage.prompt_tokens == 1900
    before = sim.stats.received
    with pytest.raises(openai.BadRequestError, match="kv_transfer_params, which vLLM runs in place of the messages"):
        sdk(proxy, "truncate").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=10,
            extra_body={"kv_transfer_params": {"prompt_token_ids": list(range(1000, 3100))}},
        )  # fmt: skip
    assert sim.stats.received == before
