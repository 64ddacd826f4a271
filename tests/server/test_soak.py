"""Soak (marked slow, run by make test and CI): 1,000 concurrent streams through the guard, then two bursts of 1,000
clients that go away at random points (queued for admission, while their prompt is counted, before the first byte,
mid-stream, mid-fan-out). The guard answers no 5xx, every upstream request ends (vLLM aborts what nobody reads), the
admission budget and the parts in flight go back to zero, and nothing is leaked (what Python's allocator holds does
not grow). It prints how long after each client left its upstream request was aborted, and the guard's RSS.

The guard (`token-guard serve`) and the simulator (`token-guard simulate`) run in processes of their own, as vLLM and
the guard do in production: in the test's process they would share one interpreter lock with 1,000 clients, and
their own event loops would be what lags."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from tests.support.polling import eventually
from tests.support.processes import guard_and_simulator, rss_mb
from tests.support.servers import MODEL

pytestmark = pytest.mark.slow

CLIENTS = 1000
# Python's allocated blocks after two bursts against before them: the caches' churn moves them by up to ~50,000 either
# way (measured over six bursts: 475K to 561K, no trend); a leak of 50 blocks a request (one kept body, dict or task is
# hundreds) adds 100,000 over the 2,000 requests.
LEAK_BLOCKS = 100_000
WINDOW = 2048
SENTENCE = "The river bends east past the old mill, and the quiet town sleeps. "


def metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")
               or line.startswith(name + "{"))  # fmt: skip


def cancel_buckets(url: str) -> dict[str, float]:
    """The guard's token_guard_cancel_seconds histogram: upper bound -> clients whose work it gave up within it."""
    found: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("token_guard_cancel_seconds_bucket{"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            found[bound] = found.get(bound, 0) + float(line.rsplit(" ", 1)[1])
    return found


class Stats:
    """The simulator's counters, read from its /sim/stats."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __getattr__(self, name: str) -> Any:
        return httpx.get(self.url + "/sim/stats", timeout=30).json()[name]


@pytest.fixture(scope="module")
def stack(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Stats, int]]:
    env = {
        "TOKEN_GUARD_ADMISSION_MAX_INFLIGHT_REQUESTS": "400",
        "TOKEN_GUARD_ADMISSION_MAX_QUEUE": "5000",
        "TOKEN_GUARD_ADMISSION_QUEUE_TIMEOUT_S": "120",
        # the caches are bounded by configuration (64 + 16 MB by default); small here, so that what the test
        # measures is what is left behind beyond them
        "TOKEN_GUARD_COUNTING_CACHE_MB": "4",
        "TOKEN_GUARD_COUNTING_WORD_CACHE_MB": "2",
    }
    sim_flags = ("--ttft", "0.05", "--itl", "0.005")
    with guard_and_simulator(deepseek_dir, tmp_path_factory.mktemp("soak"), WINDOW, sim_flags, env) as running:
        yield running.url, Stats(running.sim_url), running.guard_pid


def body(i: int, stream: bool, words: int = 20) -> dict[str, Any]:
    content = f"{i} " + SENTENCE * (words // 14 + 1)
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 16, "stream": stream}


async def full_stream(session: aiohttp.ClientSession, url: str, i: int) -> tuple[int, bool]:
    async with session.post(url + "/v1/chat/completions", json=body(i, True)) as response:
        text = await response.read()
    return response.status, text.endswith(b"data: [DONE]\n\n")


def test_a_thousand_concurrent_streams_all_complete(stack: tuple[str, Stats, int]) -> None:
    url, stats, _ = stack

    async def run() -> list[tuple[int, bool]]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            return await asyncio.gather(*(full_stream(session, url, i) for i in range(CLIENTS)))

    results = asyncio.run(run())
    assert [status for status, _ in results if status != 200] == []
    assert all(done for _, done in results)
    assert eventually(lambda: stats.active == 0)


async def leave_at_random(
    session: aiohttp.ClientSession, url: str, i: int, rng: random.Random, left: dict[str, float], seed: int
) -> int | None:
    """One client that goes away at a random point; the status if it saw one. The kinds: a stream left after a
    while (before its first byte or mid-stream), a long prompt left while counted or waiting, a stream left after a
    few chunks, a chunked request left mid-fan-out; with 400 requests admitted at a time, many leave while queued."""
    kind = i % 4
    request_id = f"soak-{seed}-{i}"  # the guard forwards it: the simulator notes it with the time of each abort
    headers = {"x-request-id": request_id, **({"x-token-guard-overflow": "chunk"} if kind == 3 else {})}
    request = body(i, stream=kind != 1, words=1500 if kind == 1 else 3000 if kind == 3 else 20)
    request["max_tokens"] = 64 if kind == 3 else 400  # about 2 s of tokens: clients leave mid-way
    chunks_read = rng.randint(1, 30)
    status: int | None = None

    async def go() -> None:
        nonlocal status
        async with session.post(url + "/v1/chat/completions", json=request, headers=headers) as response:
            status = response.status
            read = 0
            async for _ in response.content.iter_any():
                read += 1
                if kind >= 2 and read >= chunks_read:
                    return  # mid-stream, or mid-fan-out: stop reading and close

    try:
        await asyncio.wait_for(go(), timeout=rng.uniform(0.001, 3.0))
    except TimeoutError:
        pass  # went away while queued, while counted, before the first byte, or mid-stream
    left[request_id] = time.monotonic()  # the connection is closed by now (the connector keeps none open)
    return status


def leaving_burst(url: str, stats: Stats, seed: int) -> None:
    """1,000 clients leaving at random points; then nothing may be left: no 5xx, every upstream request ended,
    the admission budget and the parts in flight back to zero."""
    received, aborted, cancels = stats.received, stats.aborted, cancel_buckets(url)
    rng = random.Random(seed)
    left_at: dict[str, float] = {}

    async def run() -> list[int | None]:
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            return await asyncio.gather(*(leave_at_random(session, url, i, rng, left_at, seed) for i in range(CLIENTS)))

    statuses = asyncio.run(run())
    left = time.monotonic()
    assert [s for s in statuses if s is not None and s >= 500] == []
    assert eventually(lambda: stats.active == 0, timeout_s=60)
    print(f"\nsoak: every upstream request ended {time.monotonic() - left:.2f} s after the last client left; of "
          f"{stats.received - received} it received, the simulator aborted {stats.aborted - aborted}")  # fmt: skip

    def drained() -> bool:  # the guard may still be noticing clients that left while queued
        text = httpx.get(url + "/metrics", timeout=30).text
        names = (
            "token_guard_admission_queue_depth",
            "token_guard_inflight_tokens",
            "token_guard_fanout_parts_in_flight",
        )
        return all(metric(text, name) == 0 for name in names)

    assert eventually(drained, timeout_s=60)
    assert stats.active == 0  # and nothing was sent upstream after that
    # many left after their request reached vLLM, and vLLM was told: how many depends on how far the simulator got
    # before each client's random moment, which the machine's load moves (100 of 1,000 seen beside another worker)
    assert stats.aborted - aborted > CLIENTS // 20
    # How long after each client left its upstream request was aborted (the simulator's clock and ours are the
    # machine's monotonic clock); the guard, the simulator and 1,000 clients share two cores here.
    delays = sorted(max(0.0, at - left_at[rid]) for rid, at in stats.aborts if rid in left_at)
    assert delays
    print(f"soak: {len(delays)} upstream aborts after their client left, as the simulator saw them: p50 "
          f"{delays[len(delays) // 2]:.2f} s, p99 {delays[int(len(delays) * 0.99)]:.2f} s, max {delays[-1]:.2f} s, "
          f"{sum(d > 1 for d in delays)} over 1 s")  # fmt: skip
    # The guard's own part: from each client's connection closing to its upstream request closed (its histogram)
    now = cancel_buckets(url)
    within = {bound: now[bound] - cancels.get(bound, 0) for bound in now}
    assert within["+Inf"] > 0
    shares = [f"{within[b] / within['+Inf']:.1%} within {float(b) * 1000:g} ms" for b in ("0.001", "0.01", "0.1")]
    print(f"soak: the guard gave up the work of {within['+Inf']:.0f} clients that left: {', '.join(shares)}, "
          f"{within['1.0'] / within['+Inf']:.1%} within 1 s")  # fmt: skip


def settled_memory(url: str, pid: int) -> tuple[float, float]:
    """The guard's RSS (MB) and the blocks its Python allocator holds, once it has finished with the work of the
    clients that left: its loop answers /livez within 0.2 s three times in a row (a bound that leaves room for the
    tests another worker runs on the same two cores)."""

    def idle() -> bool:
        started = time.monotonic()
        httpx.get(url + "/livez", timeout=60)
        return time.monotonic() - started < 0.2

    assert eventually(lambda: idle() and idle() and idle(), timeout_s=120)
    blocks = metric(httpx.get(url + "/metrics", timeout=30).text, "token_guard_python_allocated_blocks")
    return rss_mb(pid), blocks


def test_a_thousand_clients_leaving_at_random_points_leave_nothing_behind(stack: tuple[str, Stats, int]) -> None:
    url, stats, pid = stack
    before = settled_memory(url, pid)
    leaving_burst(url, stats, seed=7)
    first = settled_memory(url, pid)
    leaving_burst(url, stats, seed=8)
    second = settled_memory(url, pid)
    # What a leak grows is what the allocator holds (the caches are bounded apart: 4 + 2 MB here). RSS would also
    # stay up if the guard worked on many requests at once (the allocator keeps freed pages): before large prompts
    # took turns (server/turnstile.py) it rose 193 -> 258 -> 294 -> ... -> 334 MB over six bursts; now the requests
    # of clients that left are dropped before their work, and it stays within a few MB.
    print(f"soak: the guard's RSS {before[0]:.0f} MB before, {first[0]:.0f} MB after one burst, {second[0]:.0f} MB "
          f"after two; Python's allocated blocks {before[1]:.0f}, {first[1]:.0f}, {second[1]:.0f}")  # fmt: skip
    assert second[1] - before[1] < LEAK_BLOCKS
    assert second[0] - before[0] < 50
