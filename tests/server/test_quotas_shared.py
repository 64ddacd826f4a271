"""A key's quota shared through a real redis-server: two guard instances in front of one simulator, one key, its
requests spread over both; together they let through the key's tokens per minute within one request's tokens, where
two guards on their own would let through twice as much. Then Redis goes away: "closed" answers 503."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.server.running import ServerThread
from tests.server.test_quotas import keyed_guard
from tests.support.redis import RedisServer, fixture_redis  # noqa: F401
from tests.support.servers import MODEL, Tap, simulator, wait_healthy

LIMIT = 2000
MAX_TOKENS = 150


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[tuple[ServerThread, Any, Tap]]:
    with simulator(deepseek_dir, max_model_len=2048) as running:
        yield running


def guards(sim: str, tokenizer: Path, config: Path, count: int, **flags: Any) -> Iterator[list[str]]:
    with ExitStack() as stack:
        urls = [stack.enter_context(keyed_guard(sim, tokenizer, config, **flags)).url for _ in range(count)]
        for url in urls:
            wait_healthy(url)
        yield urls


def spend(urls: list[str], requests: int) -> tuple[list[int], int]:
    """`requests` chat requests with the key, alternating over the guards: the statuses, and the tokens charged."""
    statuses, charged = [], 0
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": MAX_TOKENS}
    for i in range(requests):
        reply = httpx.post(f"{urls[i % len(urls)]}/v1/chat/completions", json=body,
                           headers={"Authorization": "Bearer sk-team"}, timeout=30)  # fmt: skip
        statuses.append(reply.status_code)
        if reply.status_code == 200:
            charged += reply.json()["usage"]["total_tokens"]  # what the key pays: the simulator runs to max_tokens
    return statuses, charged


def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "guard.toml"
    path.write_text(f'[[keys]]\nname = "team"\nkey = "sk-team"\ntokens_per_minute = {LIMIT}\n')
    return path


def test_a_keys_tokens_per_minute_holds_across_guards(
    sim: tuple[ServerThread, Any, Tap], deepseek_dir: Path, tmp_path: Path, redis: RedisServer
) -> None:
    config = config_file(tmp_path)
    flags = {"admission.redis_url": redis.url, "admission.redis_failure": "closed"}
    for urls in guards(sim[0].url, deepseek_dir, config, 2, **flags):
        started = time.monotonic()
        statuses, charged = spend(urls, 30)
        refill = LIMIT * (time.monotonic() - started) / 60  # what the bucket regained while the test ran
        one_request = charged // statuses.count(200)
        assert statuses.count(429) > 0 and set(statuses) == {200, 429}
        assert LIMIT - one_request < charged <= LIMIT + refill + one_request
        redis.stop(signal.SIGKILL)
        gone = httpx.post(
            f"{urls[0]}/v1/chat/completions",
            headers={"Authorization": "Bearer sk-team"},
            json={"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5},
        )
        assert gone.status_code == 503 and gone.json()["error"]["type"] == "ServiceUnavailableError"


def test_without_redis_each_guard_has_its_own_buckets(
    sim: tuple[ServerThread, Any, Tap], deepseek_dir: Path, tmp_path: Path
) -> None:
    """The contrast: the same burst through two guards that share nothing lets twice the key's limit through."""
    for urls in guards(sim[0].url, deepseek_dir, config_file(tmp_path), 2):
        statuses, charged = spend(urls, 30)
        assert charged > 2 * LIMIT - 2 * (charged // statuses.count(200))
