"""What reaches the simulator and how it ends: a client that goes away mid-generation makes it stop, and the
stats say so exactly once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from simulator import SimulatorSettings
from tests.support.polling import eventually
from tests.support.sim_fixtures import RunningSim, fixture_sim_tokenizer_dir, running_simulator  # noqa: F401

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1000}


@pytest.fixture(scope="module", name="slow_server")
def fixture_slow_server(sim_tokenizer_dir: Path) -> Iterator[RunningSim]:
    # 1000 tokens at 20 ms each take 20 s: long enough that only a disconnect can end a request in time.
    with running_simulator(SimulatorSettings(tokenizer=sim_tokenizer_dir, itl_s=0.02)) as sim:
        yield sim


@pytest.fixture(name="slow_sim")
def fixture_slow_sim(slow_server: RunningSim) -> RunningSim:
    assert eventually(lambda: slow_server.stats.active == 0)
    slow_server.stats.reset()
    return slow_server


def outcome(sim: RunningSim) -> dict[str, int]:
    s = sim.stats
    return {"received": s.received, "completed": s.completed, "aborted": s.aborted, "active": s.active}


def test_stream_disconnect_aborts_and_stops_generating(slow_sim: RunningSim) -> None:
    with httpx.Client(base_url=slow_sim.url, timeout=10) as client:
        with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
            events = 0
            for line in response.iter_lines():
                events += line.startswith("data: ")
                if events == 4:
                    break
    assert eventually(lambda: slow_sim.stats.aborted == 1 and slow_sim.stats.active == 0)
    assert outcome(slow_sim) == {"received": 1, "completed": 0, "aborted": 1, "active": 0}
    generated = slow_sim.stats.tokens_generated
    assert 3 <= generated < 100
    assert not eventually(lambda: slow_sim.stats.tokens_generated > generated, timeout_s=0.2)


def test_non_stream_disconnect_aborts(slow_sim: RunningSim) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(slow_sim.url + "/v1/chat/completions", json=CHAT, timeout=0.3)
    assert eventually(lambda: slow_sim.stats.aborted == 1 and slow_sim.stats.active == 0)
    assert outcome(slow_sim) == {"received": 1, "completed": 0, "aborted": 1, "active": 0}
    assert 3 <= slow_sim.stats.tokens_generated < 100  # what it generated until the abort (0.3 s at 20 ms a token)


def test_finished_stream_counts_as_completed(slow_sim: RunningSim) -> None:
    response = slow_sim.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3, "stream": True})
    assert response.text.endswith("data: [DONE]\n\n")
    assert eventually(lambda: slow_sim.stats.completed == 1)
    assert outcome(slow_sim) == {"received": 1, "completed": 1, "aborted": 0, "active": 0}
    assert slow_sim.stats.tokens_generated == 3


def test_stats_record_forwarded_bodies(slow_sim: RunningSim) -> None:
    slow_sim.client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2, "user": "u1"})
    slow_sim.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 5000})
    stats = slow_sim.client.get("/sim/stats").json()
    assert {k: stats[k] for k in ("received", "completed", "rejected", "aborted", "active")} == {
        "received": 2,
        "completed": 1,
        "rejected": 1,
        "aborted": 0,
        "active": 0,
    }
    assert stats["requests"][0]["user"] == "u1" and stats["requests"][1]["max_tokens"] == 5000
    assert list(slow_sim.stats.requests) == stats["requests"]
