"""A `chat_template` sent in a request is the client's code. The guard refuses it as vLLM does without
--trust-request-chat-template, before any work; when the operator trusts request templates, it renders them in a child
process with a time and memory limit, so a hostile one is a 400 and the guard keeps serving meanwhile."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.counting.isolated import TIME_LIMIT_S
from tests.support.servers import MODEL, InMemorySim, guard, simulator_in_memory

CHAT = "/v1/chat/completions"
ECHO = "{{ messages[0]['content'] }}"
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}"
HUGE = "{{ 'x' * 4000000000 }}"  # 4 GB of text


@pytest.fixture(scope="module")
def strict(sim: InMemorySim, deepseek_dir: Path) -> Iterator[str]:
    with guard(sim, deepseek_dir, **{"model.max_model_len": 2048}) as server:
        yield server.url


@pytest.fixture(scope="module")
def trusting(deepseek_dir: Path) -> Iterator[str]:
    """Guard and simulator both trusting request templates (vLLM --trust-request-chat-template)."""
    flags = {"model.max_model_len": 2048, "policy.trust_request_chat_template": True}
    with (
        simulator_in_memory(deepseek_dir, profile="0.31", max_model_len=2048, trust_request_chat_template=True) as sim,
        guard(sim, deepseek_dir, **flags) as server,
    ):
        yield server.url


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5, **fields}


@pytest.mark.parametrize(
    "fields", [{"chat_template": ECHO}, {"chat_template_kwargs": {"chat_template": ECHO}}], ids=["field", "kwargs"]
)
def test_a_request_template_is_refused_as_vllm_refuses_it(
    strict: str, sim: InMemorySim, fields: dict[str, Any]
) -> None:
    before = sim.stats.received
    response = httpx.post(strict + CHAT, json=chat(**fields), timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith("Chat template is passed with request, but --trust-request-chat-template")
    assert "policy.trust_request_chat_template" in error["message"]
    assert error["param"] == "chat_template"
    assert sim.stats.received == before  # refused at the door


def test_a_trusted_request_template_is_what_gets_counted_and_clamped(trusting: str) -> None:
    response = httpx.post(trusting + CHAT, json=chat(chat_template=ECHO, max_tokens=10_000), timeout=60)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert int(response.headers["x-token-guard-prompt-tokens"]) == usage["prompt_tokens"] == 2  # "hello there"
    assert usage["prompt_tokens"] + usage["completion_tokens"] == 2048


@pytest.mark.parametrize("template", [LOOPS, HUGE], ids=["endless-loops", "4-GB-of-text"])
def test_a_hostile_trusted_template_is_a_400_and_the_guard_serves_meanwhile(trusting: str, template: str) -> None:
    answers: list[httpx.Response] = []
    worker = threading.Thread(
        target=lambda: answers.append(httpx.post(trusting + CHAT, json=chat(chat_template=template), timeout=60))
    )
    worker.start()
    health: list[int] = []
    while worker.is_alive() and len(health) < 200:  # the loop is free while the child renders
        health.append(httpx.get(trusting + "/livez", timeout=TIME_LIMIT_S * 5).status_code)
    worker.join(60)
    assert set(health) <= {200}
    (response,) = answers
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert message.startswith("The chat template could not render these messages:")
    # and the next request template renders in a fresh child
    again = httpx.post(trusting + CHAT, json=chat(chat_template=ECHO), timeout=60)
    assert again.status_code == 200, again.text
