"""A key's quota shared through a real redis-server: two guard instances in front of one simulator, one key, its
requests spread over both; together they let through the key's tokens per minute within one request's tokens, where
two guards on their own would let through twice as much. Then Redis goes away: "closed" answers 503, and "open" has
each guard keep to its share of the key's limits. A chunked
request settles its parts' usage in the shared bucket, which another guard's pass-through answer tells."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_client

from proxy.server.running import ServerThread
from tests.support.documents import document
from tests.support.polling import eventually
from tests.support.redis import RedisServer, fixture_redis  # noqa: F401
from tests.support.servers import MODEL, Tap, keyed_guard, simulator, wait_healthy

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
    flags = {"redis.url": redis.url, "redis.failure": "closed"}
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


def test_redis_gone_each_guard_keeps_to_its_share_of_the_keys_limits(
    sim: tuple[ServerThread, Any, Tap], deepseek_dir: Path, tmp_path: Path, redis: RedisServer
) -> None:
    """redis.failure "open": two guards that saw each other alive in Redis each take half of the key's limits when
    Redis goes away, starting from half of what Redis last said was left: together they let through the key's tokens
    per minute, not one minute each (nor a fresh minute on top of the one the key spent)."""
    config = config_file(tmp_path)
    flags = {"redis.url": redis.url, "redis.failure": "open", "redis.lease_s": 1.5}
    with ExitStack() as stack:
        urls = [stack.enter_context(keyed_guard(sim[0].url, deepseek_dir, config, **flags)).url for _ in range(2)]
        for url in urls:
            wait_healthy(url)
        assert eventually(lambda: heartbeats(redis) == 2, timeout_s=10)
        time.sleep(1.5)  # a heartbeat each (every 0.5 s) since both were there: each has seen the other
        started = time.monotonic()
        statuses, spent = spend(urls, 4)  # through Redis: a part of the minute
        assert statuses == [200] * 4
        redis.stop(signal.SIGKILL)
        statuses, charged = spend(urls, 30)  # the rest of the minute, and more, without it
        refill = LIMIT * (time.monotonic() - started) / 60  # what the buckets regained while the test ran
        one_request = charged // statuses.count(200)
        assert statuses.count(429) > 0 and set(statuses) == {200, 429}
        assert spent + charged <= LIMIT + refill + one_request


def heartbeats(redis: RedisServer) -> int:
    """The guard processes with a heartbeat in Redis (fleet/presence.py)."""
    client = redis_client.Redis.from_url(redis.url)
    try:
        return int(client.zcard("token-guard:instances"))
    finally:
        client.close()


def test_without_redis_each_guard_has_its_own_buckets(
    sim: tuple[ServerThread, Any, Tap], deepseek_dir: Path, tmp_path: Path
) -> None:
    """The contrast: the same burst through two guards that share nothing lets twice the key's limit through."""
    for urls in guards(sim[0].url, deepseek_dir, config_file(tmp_path), 2):
        statuses, charged = spend(urls, 30)
        assert charged > 2 * LIMIT - 2 * (charged // statuses.count(200))


CHUNKY = 20000  # tokens per minute: above what the chunked request uses, refilling ~333 a second


def test_a_chunked_request_settles_in_redis_and_a_pass_through_answer_tells_it(
    sim: tuple[ServerThread, Any, Tap], deepseek_dir: Path, tmp_path: Path, redis: RedisServer
) -> None:
    """A chunked request through one guard pays its parts' usage in the shared bucket, not its reservation; another
    guard, which never charged the key, tells it on a GET /v1/models (its look goes to Redis)."""
    config = tmp_path / "guard.toml"
    config.write_text(f'[[keys]]\nname = "chunky"\nkey = "sk-chunky"\ntokens_per_minute = {CHUNKY}\n')
    flags = {"redis.url": redis.url, "redis.failure": "closed"}
    auth = {"Authorization": "Bearer sk-chunky"}
    hi = {"model": MODEL, "max_tokens": 30, "messages": [{"role": "user", "content": "Hi"}]}
    free = httpx.post(f"{sim[0].url}/v1/chat/completions", json=hi).json()["choices"][0]["message"]["content"]
    body = {"model": MODEL, "messages": [{"role": "user", "content": document(3000)}], "max_tokens": 1000,
            "stop": [free.split()[3]]}  # fmt: skip
    for first, second in guards(sim[0].url, deepseek_dir, config, 2, **flags):
        started = time.monotonic()
        reply = httpx.post(f"{first}/v1/chat/completions", json=body, timeout=120,
                           headers={**auth, "x-token-guard-overflow": "chunk"})  # fmt: skip
        parts, usage = int(reply.headers["x-token-guard-chunks"]), reply.json()["usage"]
        used = usage["prompt_tokens"] + usage["completion_tokens"]
        reserved = CHUNKY - int(reply.headers["x-ratelimit-remaining-tokens"])  # the key's first charge: a full bucket
        assert parts >= 2 and reserved == usage["prompt_tokens"] + 1000 > used  # the parts share the output cap
        told = httpx.get(f"{second}/v1/models", headers=auth)
        refill = CHUNKY * (time.monotonic() - started) / 60  # the most the bucket regained meanwhile
        assert told.status_code == 200 and told.headers["x-ratelimit-limit-tokens"] == str(CHUNKY)
        assert CHUNKY - used <= int(told.headers["x-ratelimit-remaining-tokens"]) <= CHUNKY - used + refill + 1
