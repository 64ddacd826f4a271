"""`token-guard doctor --redis-url`: whether the Redis the guards share budgets through answers, and how many guard
processes keep a heartbeat in it; an unreachable one fails the check."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.cli import main
from proxy.fleet.link import RedisLink
from proxy.fleet.presence import Presence
from tests.support.redis import RedisServer, fixture_redis  # noqa: F401
from tests.support.servers import MODEL, simulator


@pytest.fixture(scope="module")
def upstream(deepseek_dir: Path) -> Iterator[str]:
    with simulator(deepseek_dir) as (server, _, _):
        yield server.url


def beat(url: str, guards: int) -> None:
    async def run() -> None:
        link = RedisLink(url, 250)
        for _ in range(guards):
            await Presence(link, 30).beat()
        await link.aclose()

    asyncio.run(run())


def test_check_counts_the_guards_sharing_redis_and_fails_without_it(
    capsys: pytest.CaptureFixture[str], upstream: str, deepseek_dir: Path, redis: RedisServer
) -> None:
    args = ["doctor", "--log-level", "warning", "--upstream", upstream, "--model", MODEL, "--tokenizer",
            str(deepseek_dir), "--redis-url", redis.url.replace("//", "//:secret@")]  # fmt: skip
    beat(redis.url, 3)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"Redis redis://***@127.0.0.1:{redis.port}/0: reachable, shared by 3 guard process(es)" in out
    assert "secret" not in out
    redis.stop()
    assert main([*args, "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["redis"] == {"where": f"redis://***@127.0.0.1:{redis.port}/0", "reachable": False, "instances": None}
    assert report["ok"] is False
