"""The simulator reads a Responses input history as vLLM 0.33 and 0.34 do (its own readers, simulator/
responses_input.py, held to tests/support/responses_history.py): 0.34 fills in what an OpenResponses item leaves out
and converts an output message without content and the reasoning and assistant items that stay dicts; 0.33 fails
on the first with a 500 and refuses a reasoning dict with its own text."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from simulator import SimulatorSettings
from simulator.errors import ApiError
from simulator.responses_input import input_messages, read_items
from tests.support.responses_history import FAILS, HISTORIES, REFUSED, USER, History
from tests.support.sim_fixtures import RunningSim, fixture_sim_tokenizer_dir, running_simulator  # noqa: F401

CASES = [(h, fills) for h in HISTORIES for fills in (False, True)]


def _messages(items: list[dict[str, Any]], fills: bool) -> list[dict[str, Any]]:
    return input_messages(None, read_items(items, True, fills), True, None, fills)


@pytest.mark.parametrize("history,fills", CASES, ids=[f"{h.name} ({'0.34' if f else '0.33'})" for h, f in CASES])
def test_history_becomes_vllms_messages(history: History, fills: bool) -> None:
    expected = history.since if fills else history.before
    if expected in (REFUSED, FAILS):
        with pytest.raises(ApiError) as failed:
            _messages(history.items, fills)
        assert failed.value.status == (500 if expected == FAILS else 400)
    else:
        assert _messages(history.items, fills) == expected


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def sim(request: pytest.FixtureRequest, sim_tokenizer_dir: Path) -> Iterator[tuple[str, RunningSim]]:
    with running_simulator(SimulatorSettings(tokenizer=sim_tokenizer_dir, profile=request.param)) as running:
        yield request.param, running


def test_an_output_message_without_content(sim: tuple[str, RunningSim]) -> None:
    profile, running = sim
    body = {"input": [USER, {"type": "message", "role": "assistant", "content": []}], "max_output_tokens": 2}
    answer = running.client.post("/v1/responses", json=body)
    if profile == "0.33":
        assert answer.status_code == 500
        assert answer.json()["error"] == {"message": "list index out of range", "type": "InternalServerError",
                                          "param": None, "code": 500}  # fmt: skip
    else:
        assert answer.status_code == 200, answer.text


def test_a_reasoning_dict(sim: tuple[str, RunningSim]) -> None:
    profile, running = sim
    item = {"type": "reasoning", "summary": [{"text": "s"}], "content": [{"type": "reasoning_text", "text": "Hm."}]}
    answer = running.client.post("/v1/responses", json={"input": [USER, item], "max_output_tokens": 2})
    if profile == "0.33":
        assert answer.status_code == 400
        assert answer.json()["error"]["message"] == "Unsupported input item type: reasoning (parameter=input)"
    else:
        assert answer.status_code == 200, answer.text
