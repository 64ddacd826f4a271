"""The Redis link against a real redis-server: calls bounded in time, one log line and a state flip each way when
Redis goes away and comes back, recovery without a restart, Lua scripts that survive Redis forgetting them."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import subprocess
import sys

import pytest

from proxy.errors import FleetStateUnavailable
from proxy.fleet.link import PROBE_INTERVAL_S, RedisLink
from proxy.fleet.presence import Presence, count_instances
from proxy.settings import SettingsError, load_settings
from tests.support.redis import RedisServer, fixture_redis  # noqa: F401

INCREMENT = "return redis.call('INCRBY', KEYS[1], ARGV[1])"


def test_calls_and_scripts(redis: RedisServer) -> None:
    async def run() -> None:
        link = RedisLink(redis.url, 250)
        add = link.script(INCREMENT)
        assert await link.call(lambda client: client.set("token-guard:test", 1))
        assert await add(["token-guard:test"], [2]) == 3
        await link.call(lambda client: client.script_flush())  # as after a Redis restart: loaded again on use
        assert await add(["token-guard:test"], [4]) == 7
        assert link.healthy and link.errors == 0
        await link.aclose()

    asyncio.run(run())


def test_down_and_back_flip_once_each_way(redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    async def run() -> None:
        link = RedisLink(redis.url, 250)
        assert await link.ping()
        redis.stop(signal.SIGKILL)
        for _ in range(5):
            with pytest.raises(FleetStateUnavailable):
                await link.call(lambda client: client.get("token-guard:x"))
        assert not link.healthy and link.errors == 1  # the others failed at once, without calling
        redis.start()
        await asyncio.sleep(PROBE_INTERVAL_S)
        assert await link.call(lambda client: client.ping())  # the next call after the probe interval recovers
        assert link.healthy
        await link.aclose()

    with caplog.at_level(logging.INFO, logger="token_guard.redis"):
        asyncio.run(run())
    lines = [r.getMessage() for r in caplog.records if r.name == "token_guard.redis"]
    assert len(lines) == 2 and "unreachable" in lines[0] and "answers again" in lines[1]


def test_a_redis_that_never_answers_costs_the_timeout_and_no_more() -> None:
    async def run(port: int) -> None:
        link = RedisLink(f"redis://127.0.0.1:{port}/0", 100)
        for healthy_after in (True, False):  # one late answer may be this process's own lag; two in a row are not
            task = asyncio.ensure_future(link.ping())
            done, _ = await asyncio.wait([task], timeout=5)
            assert done and task.result() is False and link.healthy is healthy_after
        assert link.errors == 2
        await link.aclose()

    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        asyncio.run(run(silent.getsockname()[1]))


def test_presence_counts_live_instances_and_forgets_dead_ones(redis: RedisServer) -> None:
    async def run() -> None:
        link = RedisLink(redis.url, 250)
        one, two = Presence(link, 30), Presence(link, 0.2)
        await one.beat()
        assert await two.beat() == 2
        await asyncio.sleep(0.3)  # two stopped beating: its entry expired
        assert await count_instances(link) == 1
        await one.leave()
        assert await count_instances(link) == 0
        await link.aclose()

    asyncio.run(run())


def test_settings() -> None:
    env = {"TOKEN_GUARD_REDIS_URL": "redis://r:6379/0", "TOKEN_GUARD_REDIS_FAILURE": "closed"}
    redis = load_settings({"redis.timeout_ms": "100"}, environ=env).redis
    assert (redis.url, redis.failure, redis.timeout_ms) == ("redis://r:6379/0", "closed", 100)
    assert redis.lease_s == 30.0 and load_settings({}, environ={}).redis.url is None
    bad = [
        ({"TOKEN_GUARD_REDIS_URL": "http://r"}, "redis.url: expected a redis://"),
        ({"TOKEN_GUARD_REDIS_FAILURE": "maybe"}, "redis.failure: expected one of 'open'"),
        ({"TOKEN_GUARD_REDIS_TIMEOUT_MS": "0"}, "redis.timeout_ms: expected an integer from 1"),
        ({"TOKEN_GUARD_REDIS_LEASE_S": "0.1"}, "redis.lease_s: expected a number of seconds"),
    ]
    for environ, message in bad:
        with pytest.raises(SettingsError, match=message):
            load_settings({}, environ=environ)


def test_without_a_redis_url_nothing_imports_redis() -> None:
    code = (
        "import sys\n"
        "from proxy.cli import main\n"
        "from proxy.counting.registry import ModelRegistry\n"
        "from proxy.server.app import create_app\n"
        "from proxy.settings import load_settings\n"
        "s = load_settings({}, environ={})\n"
        "create_app(s, ModelRegistry.from_settings(s.models, s.counting))\n"
        "print('redis' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip().splitlines()[-1] == "False", result.stderr
