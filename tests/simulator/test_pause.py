"""vLLM 0.33's POST /pause and /resume as the simulator's 0.33 profile serves them: while paused every new request is
the engine's retryable refusal (a 503, a stream's first event), and the Messages API's in Anthropic's vocabulary; the
0.32 profile has no such routes (its pause queues requests, which the simulator does not imitate)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from simulator import SimulatorSettings
from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
    running_simulator,
    sse_events,
)

PAUSED = "Generation is paused. Please retry after it resumes."
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


@pytest.fixture
def sim033(sim_tokenizer_dir: Path) -> Iterator[RunningSim]:
    with running_simulator(SimulatorSettings(tokenizer=sim_tokenizer_dir, profile="0.33")) as sim:
        yield sim


def test_paused_refuses_new_requests_until_resumed(sim033: RunningSim) -> None:
    client = sim033.client
    assert client.post("/pause").json() == {"status": "paused"}
    assert client.get("/is_paused").json() == {"is_paused": True}
    refused = client.post("/v1/chat/completions", json=CHAT)
    assert refused.status_code == 503
    assert refused.json() == {"error": {"message": PAUSED, "type": "ServiceUnavailableError", "param": None,
                                        "code": 503}}  # fmt: skip
    streamed = client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    events = sse_events(streamed.text)
    assert streamed.status_code == 200 and json.loads(events[0])["error"]["message"] == PAUSED
    messages = client.post(
        "/v1/messages", json={"model": sim033.app.state.settings.model, "max_tokens": 3, "messages": CHAT["messages"]}
    )
    assert messages.status_code == 503
    assert messages.json() == {"type": "error", "error": {"type": "overloaded_error", "message": PAUSED}}
    streamed = client.post("/v1/messages", json={"model": sim033.app.state.settings.model, "max_tokens": 3,
                                                 "messages": CHAT["messages"], "stream": True})  # fmt: skip
    assert streamed.status_code == 200 and streamed.text == (
        'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"' + PAUSED + '"}}\n\n'
    )
    assert client.get("/health").status_code == 200  # a paused engine is healthy
    assert client.post("/resume").json() == {"status": "resumed"}
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_pause_modes(sim033: RunningSim) -> None:
    assert sim033.client.post("/pause", params={"mode": "sideways"}).status_code == 422
    assert sim033.client.post("/pause", params={"mode": "wait"}).json() == {"status": "paused"}
    sim033.client.post("/resume")


def test_032_has_no_pause_route(sim032: RunningSim) -> None:
    assert sim032.client.post("/pause").status_code == 404
    assert sim032.client.post("/v1/chat/completions", json=CHAT).status_code == 200
