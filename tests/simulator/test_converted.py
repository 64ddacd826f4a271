"""The simulator's /invocations behind model_hosting_container_standards' inject_adapter_id, as vLLM 0.31 / 0.32
serve it: the body's model is replaced by the X-Amzn-SageMaker-Adapter-Identifier header's (the first of a repeated
one, any case), and by null without the header, so the served default answers whatever the body names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from simulator import SimulatorSettings
from tests.support.sim_fixtures import RunningSim, fixture_sim_tokenizer_dir, running_simulator  # noqa: F401

ADAPTER = "X-Amzn-SageMaker-Adapter-Identifier"


@pytest.fixture(scope="module")
def sim(sim_tokenizer_dir: Path) -> Iterator[RunningSim]:
    with running_simulator(SimulatorSettings(tokenizer=sim_tokenizer_dir, aliases=("other",))) as running:
        yield running


def invoke(sim: RunningSim, body: dict[str, object], headers: list[tuple[str, str]]) -> int:
    response = sim.client.post("/invocations", json={"max_tokens": 2, **body}, headers=headers)
    return response.status_code


def test_the_header_names_the_model(sim: RunningSim) -> None:
    assert invoke(sim, {"model": "tiny", "prompt": "x"}, [(ADAPTER, "other")]) == 200
    assert sim.stats.requests[-1]["model"] == "other"
    assert invoke(sim, {"model": "tiny", "prompt": "x"}, [(ADAPTER.lower(), "nope")]) == 404


def test_without_the_header_the_body_model_is_dropped(sim: RunningSim) -> None:
    assert invoke(sim, {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, []) == 200
    assert sim.stats.requests[-1]["model"] is None


def test_a_repeated_header_counts_its_first_value(sim: RunningSim) -> None:
    assert invoke(sim, {"prompt": "x"}, [(ADAPTER, "nope"), (ADAPTER, "other")]) == 404
    assert invoke(sim, {"prompt": "x"}, [(ADAPTER, "other"), (ADAPTER, "nope")]) == 200


def test_every_served_name_is_listed(sim: RunningSim) -> None:
    assert [card["id"] for card in sim.client.get("/v1/models").json()["data"]] == ["tiny", "other"]
