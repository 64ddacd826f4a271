"""Ready means ready: the guard counts nothing before it knows how its upstream counts. While the start-up check is
still learning (here: the upstream's POST /tokenize held back), /health says 503 "starting", a chat request waits
(and reaches the upstream only once the guard has learned, counted then), and one that waits longer than
server.ready_wait_s gets a 503 with Retry-After. A vLLM restarted under a running guard with another
--max-model-len is learned again: the guard clamps to the new window."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.server.running import ServerThread
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.servers import MODEL, guard, guard_unchecked

PROMPT = [{"role": "user", "content": "Tell me about rivers."}]


class HeldTokenize:
    """The simulator, its POST /tokenize held until `release` is set (the start-up check's way of learning)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app, self.release = app, threading.Event()
        self.generations: list[float] = []  # when each chat request reached the upstream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] == "/tokenize":
            while not self.release.is_set():
                await _sleep(0.01)
        if scope["type"] == "http" and scope["path"] == "/v1/chat/completions":
            self.generations.append(time.monotonic())
        await self.app(scope, receive, send)


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


@pytest.fixture
def held(deepseek_dir: Path) -> Iterator[tuple[HeldTokenize, ServerThread]]:
    upstream = HeldTokenize(
        create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, max_model_len=2048))
    )
    with ServerThread(upstream) as server:
        yield upstream, server


def test_nothing_is_counted_before_the_start_up_check_has_learned(
    held: tuple[HeldTokenize, ServerThread], deepseek_dir: Path
) -> None:
    upstream, sim = held
    with guard_unchecked(sim.url, deepseek_dir) as proxy:
        assert eventually(lambda: _health(proxy.url)["detail"] == "learning how the upstream counts")
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        with ThreadPoolExecutor(1) as pool:
            create = client.chat.completions.with_raw_response.create
            asked = pool.submit(lambda: create(model=MODEL, messages=PROMPT, max_tokens=5))  # type: ignore[arg-type]
            time.sleep(0.5)  # it would have been counted and forwarded by now
            assert not upstream.generations and not asked.done()
            released = time.monotonic()
            upstream.release.set()
            answer = asked.result(timeout=30)
        assert answer.http_response.status_code == 200
        assert upstream.generations and upstream.generations[0] >= released  # counted once the guard knew how
        counted = int(answer.headers["x-token-guard-prompt-tokens"])
        assert counted == answer.parse().usage.prompt_tokens  # type: ignore[union-attr]
        assert eventually(lambda: httpx.get(f"{proxy.url}/health").status_code == 200)


def test_a_request_that_waits_longer_than_ready_wait_s_gets_503_with_retry_after(
    held: tuple[HeldTokenize, ServerThread], deepseek_dir: Path
) -> None:
    upstream, sim = held
    with guard_unchecked(sim.url, deepseek_dir, **{"server.ready_wait_s": 0.3}) as proxy:
        assert eventually(lambda: _health(proxy.url)["status"] == "starting")
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as refused:
            client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=5)  # type: ignore[arg-type]
        assert refused.value.status_code == 503 and refused.value.response.headers["retry-after"] == "2"
        assert refused.value.body["code"] == "not_ready"  # type: ignore[index]
        assert httpx.get(f"{proxy.url}/v1/models").status_code == 200  # what counts nothing does not wait
        assert not upstream.generations
        upstream.release.set()


def test_a_vllm_restarted_with_another_window_is_learned_again(deepseek_dir: Path) -> None:
    port = free_port()
    first = create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, max_model_len=2048))
    second = create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, max_model_len=1024))
    with (
        ServerThread(first, port=port) as sim,
        guard(sim.url, deepseek_dir, **{"upstream.health_interval_s": 0.2}) as proxy,
    ):
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        assert room(client) == 2048
        sim.stop()  # vLLM goes away: the guard's next request finds its replica gone, and takes it out
        with pytest.raises(openai.APIStatusError):
            client.chat.completions.create(model=MODEL, messages=PROMPT, max_tokens=5)  # type: ignore[arg-type]
        with ServerThread(second, port=port):  # and comes back on its port with --max-model-len 1024
            assert eventually(lambda: httpx.get(f"{proxy.url}/health").status_code == 200, timeout_s=30)
            assert room(client) == 1024


def room(client: openai.OpenAI) -> int:
    """The window the guard clamps a limit far over it to: the prompt plus the room it leaves."""
    answer = client.chat.completions.with_raw_response.create(model=MODEL, messages=PROMPT, max_tokens=100_000)  # type: ignore[arg-type]
    return int(answer.headers["x-token-guard-prompt-tokens"]) + int(answer.headers["x-token-guard-max-tokens"])


def _health(url: str) -> dict[str, object]:
    try:
        answer: dict[str, object] = httpx.get(f"{url}/health").json()
        return answer
    except (httpx.HTTPError, ValueError):
        return {"status": None, "detail": None}
