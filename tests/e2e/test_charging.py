"""What a limited key pays, against real vLLM: a stream that did not ask for usage pays exactly what vLLM says it used,
and its client gets what vLLM sends such a stream (the guard asked for the usage event and took it out, the
fingerprint back where vLLM writes it: each choice's output, finish and finish event's fields the same); clients that
leave before their answers' headers pay at least their prompts and every token vLLM generated for them before the
abort (vLLM's own counters)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e import runtime
from tests.e2e.stack import PROXY_READY_TIMEOUT, Stack
from tests.e2e.wire import metric
from tests.support.leaving import leave_before_the_headers
from tests.support.polling import eventually

pytestmark = pytest.mark.e2e

KEYS = """
[server]
metrics_api_key = "sk-scrape"

[[keys]]
name = "team"
key = "sk-team"
tokens_per_minute = 10000000
"""
TEAM = {"authorization": "Bearer sk-team"}


@pytest.fixture(scope="module")
def keyed_guard(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp(f"keyed-{stack.version}")
    config = workdir / "keys.toml"
    config.write_text(KEYS)
    model_dir = Path(httpx.get(stack.vllm_url + "/v1/models").json()["data"][0]["root"])
    proxy = runtime.start_proxy(stack.vllm_url, model_dir, workdir, extra_args=["--config", str(config)])
    try:
        proxy.wait_ready("/health", PROXY_READY_TIMEOUT)
        yield proxy.url
    finally:
        proxy.stop()


def paid(guard: str) -> float:
    scraped = httpx.get(guard + "/metrics", headers={"authorization": "Bearer sk-scrape"}).text
    return metric(scraped, "token_guard_key_tokens_charged_total", key="team")


def outline(stream: bytes) -> dict[str, Any]:
    """What a stream says, choice by choice: its output (text, or token ids), how it finished, and its finish event's
    fields in their order (the fingerprint's place among them). Not its events one by one: vLLM coalesces a choice's
    tokens into fewer events when its API server lags behind the engine, differently from run to run."""
    choices: dict[int, dict[str, Any]] = {}
    rest: list[str] = []
    for event in stream.decode().split("\n\n"):
        if not event.startswith("data: {"):
            rest.append(event)
            continue
        payload = json.loads(event[6:])
        for choice in payload["choices"]:
            seen = choices.setdefault(choice["index"], {"output": [], "finish": None, "fields": None})
            delta = choice.get("delta", {})
            seen["output"].append(delta.get("content") or choice.get("text") or "")
            seen["output"].extend(choice.get("token_ids") or [])
            if choice.get("finish_reason") is not None:
                seen["finish"], seen["fields"] = choice["finish_reason"], list(payload)
                seen["fingerprint"] = payload.get("system_fingerprint")
        if not payload["choices"]:
            rest.append("usage")
    joined = {i: {**c, "output": "".join(map(str, c["output"]))} for i, c in choices.items()}
    return {"choices": joined, "rest": rest}


# n = 2 samples (vLLM refuses it greedy); the seed makes both requests draw the same tokens
SAMPLING = {"max_tokens": 12, "n": 2, "temperature": 1.0, "seed": 1234}
STREAMS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story."}], **SAMPLING}),
    ("/v1/completions", {"prompt": "Once upon a time", **SAMPLING}),
    # n = 1: 0.31 breaks a token-in stream off with n > 1 ("list index out of range") when a first output lacks a choice
    ("/inference/v1/generate", {"token_ids": [1, 2, 3, 4, 5], "sampling_params": {**SAMPLING, "n": 1}}),
]


@pytest.mark.parametrize(("path", "fields"), STREAMS, ids=["chat", "completions", "token-in"])
def test_a_stream_that_asks_no_usage_pays_exactly_and_gets_vllms_bytes(
    stack: Stack, keyed_guard: str, path: str, fields: dict[str, Any]
) -> None:
    body = {"model": "tiny", "stream": True, **fields}
    headers = {"x-request-id": f"charging-{stack.version}-{path.strip('/').replace('/', '-')}"}  # vLLM: the id
    before = paid(keyed_guard)
    guarded = httpx.post(keyed_guard + path, json=body, headers={**headers, **TEAM}, timeout=120)
    direct = httpx.post(stack.vllm_url + path, json=body, headers=headers, timeout=120)
    assert guarded.status_code == direct.status_code == 200, guarded.text
    assert b'"system_fingerprint"' in direct.content or "generate" in path  # the field the guard has to put back
    assert outline(guarded.content) == outline(direct.content)
    assert guarded.content.endswith(b"data: [DONE]\n\n") and b'"usage":{' not in guarded.content
    prompt = int(guarded.headers["x-token-guard-prompt-tokens"])
    sampling = fields.get("sampling_params", fields)
    completion = sampling["n"] * sampling["max_tokens"]  # random weights: every choice runs to max_tokens
    assert eventually(lambda: paid(keyed_guard) - before == prompt + completion, timeout_s=10)


def counters(stack: Stack) -> tuple[float, float, float]:
    """vLLM's (requests it holds, running or waiting; prompt tokens read; tokens generated)."""
    text = stack.metrics()
    held = metric(text, "vllm:num_requests_running") + metric(text, "vllm:num_requests_waiting")
    return held, metric(text, "vllm:prompt_tokens_total"), metric(text, "vllm:generation_tokens_total")


LEAVERS = 4
LONG = 1500  # tokens each: some 8 s on this CPU


def test_clients_that_leave_before_the_headers_pay_at_least_what_vllm_ran(stack: Stack, keyed_guard: str) -> None:
    """Four non-streamed requests of 1,500 tokens each, their clients gone once vLLM has read all four prompts. The
    key pays its four reservations, never less than the prompts vLLM read and the tokens it generated, whether vLLM
    aborts them at once or, on a busy machine whose vLLM API server catches up late, only after generating them whole
    (that the guard makes vLLM abort is test_disconnect's)."""
    assert eventually(lambda: counters(stack)[0] == 0, timeout_s=60)
    _, prompts, generated = counters(stack)
    before = paid(keyed_guard)
    messages = [{"role": "user", "content": "Write a long essay."}]
    body = {"model": "tiny", "messages": messages, "max_tokens": LONG, "temperature": 0}
    prompt = httpx.post(stack.vllm_url + "/tokenize", json={"model": "tiny", "messages": messages}).json()["count"]

    def read() -> int:  # monotonic, unlike the running gauge, which a late poll can miss whole (seen under load)
        return int((counters(stack)[1] - prompts) // prompt)

    leave_before_the_headers(keyed_guard, "/v1/chat/completions", body, "sk-team", LEAVERS, read)
    assert eventually(lambda: counters(stack)[0] == 0, timeout_s=60), "vLLM still generating after the clients left"
    time.sleep(0.5)  # the counters are published a moment after the gauge
    _, prompts_after, generated_after = counters(stack)
    ran = (prompts_after - prompts) + (generated_after - generated)
    assert prompts_after - prompts == LEAVERS * prompt and generated_after - generated >= LEAVERS
    assert eventually(lambda: paid(keyed_guard) - before == LEAVERS * (prompt + LONG), timeout_s=10)
    assert paid(keyed_guard) - before >= ran
