"""Fixtures for the simulator's own tests. Each is defined under a `fixture_` function name with an explicit
fixture `name`, so a test module imports the function (`# noqa: F401`) and asks for the short name."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from proxy.assets import write_demo_tokenizer_dir
from proxy.server.running import ServerThread
from simulator import SimulatorSettings, SimulatorStats, create_app


@dataclass
class RunningSim:
    url: str
    app: Starlette
    client: httpx.Client

    @property
    def stats(self) -> SimulatorStats:
        stats: SimulatorStats = self.app.state.stats
        return stats


@contextlib.contextmanager
def running_simulator(settings: SimulatorSettings) -> Iterator[RunningSim]:
    app = create_app(settings)
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield RunningSim(url=server.url, app=app, client=client)


def sse_events(body: str) -> list[str]:
    """The payloads of an SSE body, asserting vLLM's framing: only `data: ...` events, each ended by a blank line."""
    assert body.endswith("\n\n"), "an SSE body ends with a blank line"
    blocks = body[:-2].split("\n\n")
    for block in blocks:
        assert block.startswith("data: ") and "\n" not in block, f"not a single data line: {block!r}"
    return [block[len("data: ") :] for block in blocks]


def sse_json(body: str) -> list[dict[str, Any]]:
    """Every event before [DONE], parsed; asserts [DONE] is the last event and appears once."""
    events = sse_events(body)
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    return [json.loads(event) for event in events[:-1]]


@pytest.fixture(scope="session", name="sim_tokenizer_dir")
def fixture_sim_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_tokenizer_dir(tmp_path_factory.mktemp("sim-tokenizer"))


@pytest.fixture(scope="session", name="hf_tokenizer")
def fixture_hf_tokenizer(sim_tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(sim_tokenizer_dir))


@pytest.fixture(scope="session", name="sim032")
def fixture_sim032(sim_tokenizer_dir: Path) -> Iterator[RunningSim]:
    with running_simulator(SimulatorSettings(tokenizer=sim_tokenizer_dir, profile="0.32")) as sim:
        yield sim


@pytest.fixture(scope="session", name="sim031")
def fixture_sim031(sim_tokenizer_dir: Path) -> Iterator[RunningSim]:
    with running_simulator(SimulatorSettings(tokenizer=sim_tokenizer_dir, profile="0.31")) as sim:
        yield sim


@pytest.fixture(scope="session", name="sim", params=["0.31", "0.32"])
def fixture_sim(request: pytest.FixtureRequest) -> RunningSim:
    """Both profiles, for behaviour they share."""
    sim: RunningSim = request.getfixturevalue("sim" + str(request.param).replace(".", ""))
    return sim
