"""The stack most server tests talk to, one per test module: the simulator in its vLLM 0.31 profile (a 2,048-token
window; it refuses every overflow, so anything the guard forwards wrongly fails the test) and the guard zero-config in
front of it (the window discovered from the upstream), plus the OpenAI SDK pointed at the guard. A module that needs
other settings defines its own fixture of the same name."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.server.running import ServerThread
from tests.support.servers import Tap, guard, simulator

WINDOW = 2048


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[tuple[ServerThread, Any, Tap]]:
    with simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: tuple[ServerThread, Any, Tap], deepseek_dir: Path) -> Iterator[str]:
    with guard(sim[0].url, deepseek_dir) as server:  # max_model_len is discovered from the upstream
        yield server.url


@pytest.fixture
def oai(proxy: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy}/v1", api_key="unused", max_retries=0, timeout=30)
