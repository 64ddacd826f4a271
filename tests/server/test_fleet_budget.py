"""Many guards, one budget: two `token-guard serve --workers 2` processes in front of one simulator share its KV
budget through a real redis-server. Under a burst through both, the simulator never runs more than the budget; with
Redis killed mid-way the guards fall back on their own shares ("open") or answer 503 ("closed"), and recover when it
comes back; a guard killed with reservations held frees them within its lease. With a budget large enough for blocks
of credit, requests are admitted on credit, the budget still holds, and the credit goes back once they stop."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.drift.samples import BUILTIN_SAMPLES
from proxy.fleet.budget import FleetBudget
from proxy.fleet.link import RedisLink
from proxy.fleet.presence import count_instances
from proxy.upstream.fleet_credit import CHECK_S
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.processes import healthy
from tests.support.redis import RedisServer, fixture_redis, redis_server  # noqa: F401
from tests.support.servers import MODEL, guard, simulator

pytestmark = pytest.mark.serial  # its memory peaks and lease timings hold on a machine it does not share

ROOT = Path(__file__).resolve().parents[2]
WINDOW = 2048
LEASE_S = 5.0  # long enough that a process slowed by a shared host renews its leases in time (it renews every third)
SHORT_LEASE_S = 1.0  # for the guard that is killed: its reservations are freed within this
HUGE = 10**9  # a KV capacity that never slows the simulator down: it only records what runs at once
GROUPS: dict[str, int] = {}  # a guard's URL -> its process group


@contextmanager
def serve(upstream: str, tokenizer: Path, logs: Path, redis_url: str, budget: int, guards: int = 1,
          env: dict[str, str] | None = None, lease_s: float = LEASE_S) -> Iterator[list[str]]:  # fmt: skip
    """`guards` processes of `token-guard serve --workers 2` sharing `budget` through `redis_url`, started at once,
    each in a process group of its own (GROUPS: a guard's URL -> its group, for kill())."""
    environ = {**os.environ, "TOKEN_GUARD_ADMISSION_MAX_INFLIGHT_TOKENS": str(budget),
               "TOKEN_GUARD_REDIS_LEASE_S": str(lease_s),
               # generous: a late answer on a loaded machine would admit one request on its own share (or refuse it),
               # while a killed Redis refuses connections at once whatever the timeout
               "TOKEN_GUARD_REDIS_TIMEOUT_MS": "2000", **(env or {})}  # fmt: skip
    started: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    try:
        for _ in range(guards):
            port = free_port()
            command = [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--model", MODEL,
                       "--tokenizer", str(tokenizer), "--max-model-len", str(WINDOW), "--port", str(port),
                       "--workers", "2", "--redis-url", redis_url, "--log-level", "warning"]  # fmt: skip
            log = logs / f"guard-{port}.log"
            process = subprocess.Popen(command, cwd=ROOT, env=environ, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                       start_new_session=True)  # fmt: skip
            started.append((f"http://127.0.0.1:{port}", process, log))
        for url, process, log in started:
            up = eventually(lambda p=process, u=url: p.poll() is not None or healthy(u), timeout_s=90)  # type: ignore[misc]
            assert up and process.poll() is None, log.read_text()
            GROUPS[url] = process.pid
        yield [url for url, _, _ in started]
    finally:
        for _, process, _ in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


def checked(stats: Any, processes: int) -> bool:
    """Every guard process has run its start-up check, whose 1-token generations of the built-in samples (a tools
    sample of 118 tokens among them) reach the simulator beside no admission, and none runs any more: from here on
    the simulator's KV peak is the test's own requests'. Without this wait, CI at 4efdaf6 and a run at 33efb84 saw
    402: the burst at its budget (4 x 67) beside two processes' check samples still running (118 + 16)."""
    snapshot = stats.snapshot()
    return bool(snapshot["received"] >= processes * len(BUILTIN_SAMPLES) and snapshot["active"] == 0)


def kill(url: str) -> None:
    """SIGKILL the guard serving `url` and its workers, as a node that dies."""
    os.killpg(GROUPS[url], signal.SIGKILL)


def body(max_tokens: int, stream: bool = False) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Tell me a story about a river."}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": stream}


def cost_of(sim_url: str, max_tokens: int) -> int:
    prompt = httpx.post(f"{sim_url}/tokenize", json={"model": MODEL, "messages": body(0)["messages"]}).json()
    return int(prompt["count"]) + max_tokens


async def burst(urls: list[str], requests: int, max_tokens: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=None)) as client:
        calls = [client.post(f"{urls[i % len(urls)]}/v1/chat/completions", json=body(max_tokens))
                 for i in range(requests)]  # fmt: skip
        return await asyncio.gather(*calls)


def counted(urls: list[str], name: str) -> float:
    """A counter summed over one scrape of each guard (a scrape reaches one worker)."""
    texts = [httpx.get(f"{url}/metrics").text for url in urls]
    return sum(float(line.rsplit(" ", 1)[1]) for text in texts for line in text.splitlines() if line.startswith(name))


def fallbacks(urls: list[str]) -> float:
    """Requests admitted on a local share."""
    return counted(urls, "token_guard_admission_local_fallbacks_total ")


def instances(redis_url: str) -> int:
    async def count() -> int:
        link = RedisLink(redis_url, 250)
        try:
            return await count_instances(link)
        except Exception:
            return -1
        finally:
            await link.aclose()

    return asyncio.run(count())


def reserved(redis_url: str, replica: str) -> tuple[int, int]:
    async def read() -> tuple[int, int]:
        link = RedisLink(redis_url, 250)
        try:
            return await FleetBudget(link, LEASE_S).in_flight(replica)
        finally:
            await link.aclose()

    return asyncio.run(read())


def test_two_guards_of_two_workers_share_one_budget_and_fall_back_open(
    deepseek_dir: Path, redis: RedisServer, tmp_path: Path
) -> None:
    with simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.003, kv_capacity_tokens=HUGE) as (sim, stats, _):
        cost = cost_of(sim.url, 60)
        budget = 4 * cost  # each worker's share without Redis would be 2 requests: 8 at once over the four
        with serve(sim.url, deepseek_dir, tmp_path, redis.url, budget, guards=2) as urls:
            assert eventually(lambda: instances(redis.url) == 4, timeout_s=10)  # four processes share it
            assert eventually(lambda: checked(stats, 4), timeout_s=60)
            stats.kv.reset()

            responses = asyncio.run(burst(urls, 32, 60))
            assert [r.status_code for r in responses] == [200] * 32
            assert stats.kv.peak <= budget, f"{fallbacks(urls)} admitted on a local share"  # not each process's
            assert stats.kv.peak > budget // 2  # and used by more than one process at a time

            stats.kv.reset()
            with ThreadPoolExecutor(1) as pool:  # Redis killed mid-burst: open, each process goes on on its own share
                running = pool.submit(lambda: asyncio.run(burst(urls, 32, 60)))
                assert eventually(lambda: stats.kv.running > 0 or running.done(), timeout_s=30)
                redis.stop(signal.SIGKILL)
                responses = running.result(timeout=120)
            assert [r.status_code for r in responses] == [200] * 32
            assert stats.kv.peak <= budget + 4 * (budget // 2)  # what Redis had admitted, and each process's share
            assert eventually(lambda: fallbacks(urls) > 0, timeout_s=10)
            assert "token_guard_redis_up 0.0" in httpx.get(f"{urls[0]}/metrics").text

            redis.start()  # empty, as after a restart: the guards come back to it without one
            assert eventually(lambda: instances(redis.url) == 4, timeout_s=10)
            stats.kv.reset()
            responses = asyncio.run(burst(urls, 32, 60))
            assert [r.status_code for r in responses] == [200] * 32
            assert stats.kv.peak <= budget
            assert eventually(lambda: reserved(redis.url, sim.url) == (0, 0), timeout_s=10)  # every release landed


def test_credit_admits_without_a_round_trip_within_the_budget_and_goes_back(
    deepseek_dir: Path, redis: RedisServer, tmp_path: Path
) -> None:
    with simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.003, kv_capacity_tokens=HUGE) as (sim, stats, _):
        budget = 16 * cost_of(sim.url, 60)  # each of the four processes' blocks: two requests' worth
        with serve(sim.url, deepseek_dir, tmp_path, redis.url, budget, guards=2) as urls:
            assert eventually(lambda: instances(redis.url) == 4, timeout_s=10)
            assert eventually(lambda: checked(stats, 4), timeout_s=60)
            with httpx.Client(timeout=60) as client:
                for url in urls * 8:  # one at a time: after its first, a process has credit for the next
                    assert client.post(f"{url}/v1/chat/completions", json=body(60)).status_code == 200
            assert eventually(lambda: counted(urls, "token_guard_admission_credit_total ") > 0, timeout_s=10)

            stats.kv.reset()
            responses = asyncio.run(burst(urls, 64, 60))  # four times what the budget holds at once
            assert [r.status_code for r in responses] == [200] * 64
            assert budget // 2 < stats.kv.peak <= budget  # blocks and reservations together never exceed it
            assert eventually(lambda: reserved(redis.url, sim.url) == (0, 0), timeout_s=10)  # idle: credit goes back


@dataclass
class ClosedStack:
    redis: RedisServer
    sim_url: str
    budget: int  # four 20-token answers' worth
    guards: list[str]


@pytest.fixture(scope="module")
def closed(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClosedStack]:
    """Two guards (redis.failure "closed") started once for the two tests below; the second kills one of them."""
    env = {"TOKEN_GUARD_REDIS_FAILURE": "closed"}
    logs = tmp_path_factory.mktemp("closed")
    with redis_server() as redis, simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.02,
                                            kv_capacity_tokens=HUGE) as (sim, _, _):  # fmt: skip
        budget = 4 * cost_of(sim.url, 20)
        with serve(sim.url, deepseek_dir, logs, redis.url, budget, guards=2, env=env, lease_s=SHORT_LEASE_S) as guards:
            yield ClosedStack(redis, sim.url, budget, guards)


def test_closed_answers_503_while_redis_is_away(closed: ClosedStack) -> None:
    client = openai.OpenAI(base_url=f"{closed.guards[0]}/v1", api_key="unused", max_retries=0)
    messages: Any = body(20)["messages"]
    assert client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20).choices
    closed.redis.stop(signal.SIGKILL)
    try:
        # A process may still admit on credit Redis reserved for it before it died, until it notices: at its next
        # call, at most CHECK_S later while it holds credit. From then on, every request is refused.
        assert eventually(lambda: refused(client, messages))
        time.sleep(2 * CHECK_S)  # every process that held credit has tended it, and failed, by now
        for _ in range(4):  # whichever worker answers
            with pytest.raises(openai.InternalServerError) as refusal:
                client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20)
            assert refusal.value.status_code == 503
            assert refusal.value.body["type"] == "ServiceUnavailableError"  # type: ignore[index]
            assert "redis" not in refusal.value.message.lower()  # nothing about the guard's insides
    finally:
        closed.redis.start()  # also for the next test, whatever happened here
    assert eventually(lambda: instances(closed.redis.url) == 4, timeout_s=10)
    assert client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20).choices


def refused(client: openai.OpenAI, messages: Any) -> bool:
    try:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20)
    except openai.InternalServerError as exc:
        return exc.status_code == 503
    return False


def test_a_guard_killed_with_reservations_held_frees_them_within_its_lease(closed: ClosedStack) -> None:
    doomed, survivor = closed.guards
    redis_url, sim_url = closed.redis.url, closed.sim_url
    hold = closed.budget - cost_of(sim_url, 0)  # one stream as costly as the whole budget: 2 s, twice its lease
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", f"{doomed}/v1/chat/completions", json=body(hold, stream=True)) as held:
            lines = held.iter_lines()  # kept: a dropped generator would close the stream
            next(lines)  # admitted and streaming: the whole budget is its
            assert reserved(redis_url, sim_url) == (closed.budget, 1)
            kill(doomed)
            answer = client.post(f"{survivor}/v1/chat/completions", json=body(20))
    assert answer.status_code == 200 and "x-token-guard-queue-ms" in answer.headers  # it waited for the lease
    assert eventually(lambda: reserved(redis_url, sim_url) == (0, 0), timeout_s=3 * SHORT_LEASE_S)


def test_a_guard_with_redis_and_no_budget_counts_itself_and_reserves_nothing(
    deepseek_dir: Path, redis: RedisServer
) -> None:
    with simulator(deepseek_dir, max_model_len=WINDOW) as (sim, _, _):
        with guard(sim.url, deepseek_dir, **{"redis.url": redis.url}) as proxy:
            assert eventually(lambda: instances(redis.url) == 1, timeout_s=10)  # its heartbeat, for `check`
            assert httpx.post(f"{proxy.url}/v1/chat/completions", json=body(5)).status_code == 200
            assert reserved(redis.url, sim.url) == (0, 0)  # no budget: the local gate only counts and routes
            assert "token_guard_redis_up 1.0" in httpx.get(f"{proxy.url}/metrics").text
