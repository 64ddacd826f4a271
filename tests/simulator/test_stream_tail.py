"""Chat and completions stream events as vLLM 0.33 and 0.34 write them (read from real vLLM 0.34.0's answers and
`chat_completion/serving.py`, `completion/serving.py`): every token event ends with `"kv_transfer_params":null`, a
finish event's fingerprint before it; a finish event's choice (every completions choice) carries weight_versions. The
role event and the usage event are as in 0.32."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.servers import MODEL, InMemorySim, simulator_in_memory


@pytest.fixture(scope="module", params=["0.32", "0.33", "0.34"])
def sim(request: pytest.FixtureRequest, deepseek_dir: Path) -> Iterator[tuple[str, InMemorySim]]:
    with simulator_in_memory(deepseek_dir, profile=request.param, max_model_len=2048) as running:
        yield request.param, running


def events(sim: InMemorySim, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    text = sim.client.post(path, json={"model": MODEL, "stream": True, "max_tokens": 3, **body}).text
    return [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]


def test_chat_events(sim: tuple[str, InMemorySim]) -> None:
    release, running = sim
    role, *tokens = events(running, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})
    assert list(role)[-2:] == ["prompt_token_ids", "prompt_text"]
    later = release != "0.32"
    assert list(tokens[0])[-1] == ("kv_transfer_params" if later else "choices")
    assert list(tokens[0]["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
    assert list(tokens[-1])[-2:] == (["system_fingerprint", "kv_transfer_params"] if later else
                                     ["choices", "system_fingerprint"])  # fmt: skip
    assert list(tokens[-1]["choices"][0])[-2:] == (["token_ids", "weight_versions"] if later else
                                                   ["stop_reason", "token_ids"])  # fmt: skip
    usage = events(running, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                     "stream_options": {"include_usage": True}})  # fmt: skip
    assert list(usage[-1])[-3:] == ["choices", "usage", "system_fingerprint"]
    assert "system_fingerprint" not in usage[-2] and ("kv_transfer_params" in usage[-2]) is later


def test_completions_events(sim: tuple[str, InMemorySim]) -> None:
    release, running = sim
    tokens = events(running, "/v1/completions", {"prompt": "Once upon a time"})
    later = release != "0.32"
    assert list(tokens[0])[-1] == ("kv_transfer_params" if later else "choices")
    assert all((list(t["choices"][0])[-1] == "weight_versions") is later for t in tokens)
    assert list(tokens[-1])[-2:] == (["system_fingerprint", "kv_transfer_params"] if later else
                                     ["choices", "system_fingerprint"])  # fmt: skip
