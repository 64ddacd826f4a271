"""The stack most server tests talk to, one per test module: the simulator in its vLLM 0.31 profile (a 2,048-token
window; it refuses every overflow, so anything the guard forwards wrongly fails the test), in memory (the guard
reaches it without a socket: tests/support/fakehttp.py), and the guard zero-config in front of it on loopback (the
window discovered from the upstream), plus the OpenAI SDK pointed at the guard. A module that needs other settings,
or a simulator on a real socket, defines its own fixture of the same name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.support.servers import InMemorySim, guard, simulator_in_memory

WINDOW = 2048


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(deepseek_dir, profile="0.31", max_model_len=WINDOW) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: InMemorySim, deepseek_dir: Path) -> Iterator[str]:
    with guard(sim, deepseek_dir) as server:  # max_model_len is discovered from the upstream
        yield server.url


@pytest.fixture
def oai(proxy: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=30)
