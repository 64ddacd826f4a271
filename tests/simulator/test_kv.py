"""The simulator's KV cache: the running cost of what it generates (prompt + max_tokens per sequence), its peak, how
often it went over capacity, and the slowdown (emulated preemption) while it is over."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from simulator import SimulatorSettings
from simulator.command import build_parser
from simulator.generation import Engine, Generation, PromptPlan, Sequence, steps
from simulator.kv import KvCache
from tests.support.polling import eventually
from tests.support.sim_fixtures import RunningSim, fixture_sim_tokenizer_dir, running_simulator  # noqa: F401

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1000, "stream": True}


def test_the_cache_tracks_running_cost_peak_and_crossings() -> None:
    kv = KvCache(capacity=100)
    kv.occupy(60)
    assert (kv.running, kv.peak, kv.preemptions, kv.slowdown()) == (60, 60, 0, 1.0)
    kv.occupy(90)  # over capacity: every running sequence now goes 150 / 100 times slower
    assert (kv.running, kv.peak, kv.preemptions, kv.slowdown()) == (150, 150, 1, 1.5)
    kv.occupy(50)  # still over: the same preemption episode
    assert (kv.running, kv.preemptions, kv.slowdown()) == (200, 1, 2.0)
    kv.release(150)
    assert (kv.running, kv.peak, kv.slowdown()) == (50, 200, 1.0)
    kv.occupy(60)  # over again: a second crossing
    assert kv.preemptions == 2
    kv.reset()
    assert (kv.running, kv.peak, kv.preemptions) == (110, 110, 0)


def test_without_a_capacity_the_cost_is_recorded_and_nothing_slows() -> None:
    kv = KvCache()
    kv.occupy(10**9)
    assert (kv.peak, kv.preemptions, kv.slowdown()) == (10**9, 0, 1.0)


def test_a_request_costs_prompt_plus_max_tokens_for_each_sequence() -> None:
    prompts = [PromptPlan(token_ids=[1, 2, 3], max_tokens=10), PromptPlan(token_ids=[4], max_tokens=5)]
    generation = Generation(endpoint="completion", response_id="x", created=0, model="m", prompts=prompts, n=2)
    assert generation.kv_tokens == 2 * (3 + 10) + 2 * (1 + 5)


def test_every_step_slows_by_the_oversubscription(monkeypatch: pytest.MonkeyPatch) -> None:
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    monkeypatch.setattr(anyio, "sleep", record)
    kv = KvCache(capacity=100)
    engine = Engine(pieces=[(1, "a")], ttft_s=0.5, itl_s=0.1, kv=kv)
    seqs = [Sequence(index=0, prompt=0, max_tokens=4)]

    async def run() -> None:
        async for step in steps(seqs, engine):
            if step[0].position == 1:
                kv.occupy(300)  # other requests arrive mid-generation: the rest of this one runs 3x slower
            if step[0].position == 2:
                kv.release(300)

    asyncio.run(run())
    assert delays == pytest.approx([0.5, 0.1, 0.3, 0.1])


@pytest.fixture(scope="module", name="kv_sim")
def fixture_kv_sim(sim_tokenizer_dir: Path) -> Iterator[RunningSim]:
    # 1000 tokens at 20 ms each: the streams below run until the test closes them.
    settings = SimulatorSettings(tokenizer=sim_tokenizer_dir, itl_s=0.02, kv_capacity_tokens=1500)
    with running_simulator(settings) as sim:
        yield sim


@pytest.fixture(name="sim")
def fixture_sim(kv_sim: RunningSim) -> RunningSim:
    assert eventually(lambda: kv_sim.stats.active == 0)
    kv_sim.stats.reset()
    return kv_sim


@contextlib.contextmanager
def running_stream(client: httpx.Client, body: dict[str, Any]) -> Iterator[None]:
    """A stream that has produced its first token (so it is running) and is closed when the block ends."""
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        yield


def prompt_tokens(sim: RunningSim) -> int:
    response = sim.client.post("/tokenize", json={"messages": CHAT["messages"]})
    count: int = response.json()["count"]
    return count


def test_concurrent_streams_cross_the_capacity_and_release_it(sim: RunningSim) -> None:
    cost = prompt_tokens(sim) + 1000
    with httpx.Client(base_url=sim.url, timeout=30) as client:
        with running_stream(client, CHAT):
            assert sim.stats.kv.running == cost and sim.stats.kv.preemptions == 0
            with running_stream(client, CHAT):
                assert sim.stats.kv.running == 2 * cost
                assert sim.stats.kv.slowdown() == pytest.approx(2 * cost / 1500)
    assert eventually(lambda: sim.stats.kv.running == 0)  # both aborted by the client: their cost is freed
    stats = sim.client.get("/sim/stats").json()
    assert {k: stats[k] for k in ("kv_capacity_tokens", "running_tokens", "peak_running_tokens", "preemptions")} == {
        "kv_capacity_tokens": 1500,
        "running_tokens": 0,
        "peak_running_tokens": 2 * cost,
        "preemptions": 1,
    }
    assert sim.client.post("/sim/reset").json()["peak_running_tokens"] == 0


def test_finished_and_refused_requests_hold_nothing(sim: RunningSim) -> None:
    done = sim.client.post("/v1/chat/completions", json={**CHAT, "stream": False, "max_tokens": 3}).json()
    assert done["usage"]["completion_tokens"] == 3
    streamed = sim.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    assert streamed.text.endswith("data: [DONE]\n\n")
    refused = sim.client.post("/v1/completions", json={"model": "another", "prompt": "x", "max_tokens": 3})
    assert refused.status_code == 404
    assert eventually(lambda: sim.stats.active == 0)
    assert sim.stats.kv.running == 0
    assert sim.stats.kv.peak == prompt_tokens(sim) + 3  # the refused one never ran


def test_capacity_must_be_positive_and_has_a_flag(sim_tokenizer_dir: Path) -> None:
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        SimulatorSettings(tokenizer=sim_tokenizer_dir, kv_capacity_tokens=0)
    assert build_parser().parse_args(["--kv-capacity", "4096"]).kv_capacity == 4096
    assert build_parser().parse_args([]).kv_capacity is None
