"""The four GPU routes with [[keys]], end to end (the simulator in memory): the key's model list, its output cap and its
token quota apply to batch chat, token-in generate, audio and Cohere embed as they do to chat; each is charged its
cost."""

from __future__ import annotations

import io
import time
import wave
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.servers import MODEL, InMemorySim, keyed_guard, simulator_in_memory, wait_checked, wait_healthy

KEYS = f"""
[[keys]]
name = "elsewhere"
key = "sk-elsewhere"
models = ["another-model"]

[[keys]]
name = "capped"
key = "sk-capped"
max_output_tokens = 5
models = ["{MODEL}"]
""" + "".join(f'\n[[keys]]\nname = "{r}"\nkey = "sk-{r}"\ntokens_per_minute = 100000\n'
              for r in ("batch", "generate", "audio", "embed"))  # fmt: skip
HI = [{"role": "user", "content": "Hello there"}]


def wav() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as audio:
        audio.setnchannels(1)
        audio.setsampwidth(2)
        audio.setframerate(16000)
        audio.writeframes(b"\x00\x00" * 8000)
    return out.getvalue()


Send = Callable[[str, str, int], httpx.Response]


def batch(proxy: str, key: str, limit: int) -> httpx.Response:
    body = {"model": MODEL, "messages": [HI, HI], "max_tokens": limit}
    return httpx.post(f"{proxy}/v1/chat/completions/batch", json=body, headers=auth(key))


def generate(proxy: str, key: str, limit: int) -> httpx.Response:
    body = {"model": MODEL, "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": limit, "n": 2}}
    return httpx.post(f"{proxy}/inference/v1/generate", json=body, headers=auth(key))


def audio(proxy: str, key: str, limit: int) -> httpx.Response:
    data = {"model": MODEL, "max_completion_tokens": str(limit)}
    files = {"file": ("a.wav", wav(), "audio/wav")}
    return httpx.post(f"{proxy}/v1/audio/transcriptions", data=data, files=files, headers=auth(key))


def embed(proxy: str, key: str, limit: int) -> httpx.Response:
    return httpx.post(f"{proxy}/v2/embed", json={"model": MODEL, "texts": ["Hello there"]}, headers=auth(key))


ROUTES: dict[str, Send] = {"batch": batch, "generate": generate, "audio": audio, "embed": embed}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(deepseek_dir, max_model_len=2048) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: InMemorySim, deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("keys") / "guard.toml"
    config.write_text(KEYS)
    with keyed_guard(sim, deepseek_dir, config) as server:
        wait_healthy(server.url)
        wait_checked(server, sim)  # the start-up check's generations are not counted as a test's
        yield server.url


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    now = time.monotonic() * 1000
    monkeypatch.setattr("proxy.exchange.quotas._now_ms", lambda: now)


@pytest.mark.parametrize("route", ROUTES)
def test_a_model_the_key_may_not_use_is_a_404_that_never_reaches_vllm(proxy: str, sim: InMemorySim, route: str) -> None:
    before = sim.stats.received
    response = ROUTES[route](proxy, "sk-elsewhere", 5)
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert sim.stats.received == before


@pytest.mark.parametrize("route", ["batch", "generate", "audio"])
def test_the_keys_output_cap_clamps_each_route(proxy: str, sim: InMemorySim, route: str) -> None:
    response = ROUTES[route](proxy, "sk-capped", 100)
    assert response.status_code == 200 and response.headers["x-token-guard-max-tokens"] == "5"
    forwarded = sim.stats.requests[-1]
    if route == "batch":
        assert forwarded["max_tokens"] == 5
    elif route == "generate":
        assert forwarded["sampling_params"]["max_tokens"] == 5
    else:
        assert forwarded["form"]["max_completion_tokens"] == "5"


@pytest.mark.parametrize("route", ROUTES)
def test_each_route_is_charged_its_cost(proxy: str, route: str, frozen: None) -> None:
    response = ROUTES[route](proxy, f"sk-{route}", 4)
    assert response.status_code == 200, response.text
    prompt = int(response.headers["x-token-guard-prompt-tokens"])
    cost = {"batch": prompt + 2 * 4, "generate": (3 + 4) * 2, "audio": 4, "embed": prompt}[route]
    assert response.headers["x-ratelimit-limit-tokens"] == "100000"
    assert int(response.headers["x-ratelimit-remaining-tokens"]) == 100000 - cost
