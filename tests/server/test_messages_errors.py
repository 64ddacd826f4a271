"""The guard's own errors on the Messages API name their type as the upstream's release does: vLLM's exception names
(BadRequestError, ...) in front of 0.32, Anthropic's own (invalid_request_error, ...) in front of 0.33, which the
guard learns from the upstream's GET /version. The real `anthropic` SDK -> the guard with keys -> the simulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from proxy.server.running import ServerThread
from tests.support.servers import MODEL, InMemorySim, keyed_guard, simulator_in_memory, wait_checked, wait_healthy

KEYS = """
[server]
api_keys = ["sk-plain"]

[[keys]]
name = "once"
key = "sk-once"
requests_per_minute = 1

[[keys]]
name = "elsewhere"
key = "sk-elsewhere"
models = ["another-model"]
"""
# status -> (0.32's type, 0.33's type)
TYPES = {
    400: ("BadRequestError", "invalid_request_error"),
    401: ("AuthenticationError", "authentication_error"),
    404: ("NotFoundError", "not_found_error"),
    429: ("RateLimitError", "rate_limit_error"),
}
HI: Any = [{"role": "user", "content": "Hi"}]
LONG: Any = [{"role": "user", "content": "word " * 3000}]  # over the simulator's 2,048-token window


@pytest.fixture(scope="module", params=["0.32", "0.33"])
def release(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path, release: str) -> Iterator[InMemorySim]:
    with simulator_in_memory(deepseek_dir, profile=release, max_model_len=2048) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: InMemorySim, deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("keys") / "guard.toml"
    config.write_text(KEYS)
    server: ServerThread
    with keyed_guard(sim, deepseek_dir, config) as server:
        wait_healthy(server.url)
        wait_checked(server, sim)
        yield server.url


def expected(status: int, release: str) -> str:
    return TYPES[status][release != "0.32"]


def claude(proxy: str, key: str = "sk-plain") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy, api_key=key, max_retries=0, timeout=30)


def refused(error: pytest.ExceptionInfo[anthropic.APIStatusError]) -> dict[str, Any]:
    body = error.value.body
    assert isinstance(body, dict) and body["type"] == "error" and set(body["error"]) == {"type", "message"}
    told: dict[str, Any] = body["error"]
    return told


def test_a_prompt_over_the_window(proxy: str, release: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude(proxy).messages.create(model=MODEL, max_tokens=5, messages=LONG)
    assert refused(caught)["type"] == expected(400, release)


def test_a_key_the_guard_does_not_know(proxy: str, release: str) -> None:
    with pytest.raises(anthropic.AuthenticationError) as caught:
        claude(proxy, "sk-unknown").messages.create(model=MODEL, max_tokens=5, messages=HI)
    assert refused(caught)["type"] == expected(401, release)


def test_a_key_over_its_quota(proxy: str, release: str) -> None:
    once = claude(proxy, "sk-once")
    once.messages.create(model=MODEL, max_tokens=2, messages=HI)
    with pytest.raises(anthropic.RateLimitError) as caught:
        once.messages.create(model=MODEL, max_tokens=2, messages=HI)
    assert refused(caught)["type"] == expected(429, release)
    assert int(caught.value.response.headers["retry-after"]) >= 1


def test_an_unknown_model_as_the_upstream_names_it(proxy: str, sim: InMemorySim, release: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude(proxy).messages.create(model="no-such-model", max_tokens=5, messages=HI)
    assert refused(caught)["type"] == expected(404, release)
    direct = sim.client.post("/v1/messages", json={"model": "no-such-model", "max_tokens": 5, "messages": HI})
    assert direct.status_code == 404 and direct.json()["error"]["type"] == refused(caught)["type"]


def test_a_model_the_key_may_not_use(proxy: str, release: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude(proxy, "sk-elsewhere").messages.count_tokens(model=MODEL, messages=HI)
    assert refused(caught)["type"] == expected(404, release)
