"""The in-memory upstream (tests/support/fakehttp.py) stands in for the real one: the same request, through a guard
whose upstream is the simulator on a loopback socket (aiohttp, upstream/http.py) and through a guard that reaches the
same simulator in memory, gets the same answer: status, body and the headers a client reads."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.server.running import ServerThread
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support.servers import MODEL, guard, in_memory

WINDOW = 2048
HI = [{"role": "user", "content": "Hello there, how are you?"}]
# What the simulator stamps with the clock or chance, whichever way it is reached; everything else must be equal.
STAMPS = re.compile(rb'"(created|created_at)": ?\d+|"(modelperm|chatcmpl-tool)-[0-9a-f]+"')
COMPARED = ("content-type", "content-length", "transfer-encoding", "x-request-id")


@dataclass
class Guards:
    socket: str  # the guard's URL whose upstream is the simulator on loopback
    memory: str  # the guard's URL whose upstream is the same simulator in memory


@pytest.fixture(scope="module")
def guards(deepseek_dir: Path) -> Iterator[Guards]:
    app = create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, profile="0.31", max_model_len=WINDOW))
    with (
        ServerThread(app) as served,
        in_memory(app) as sim,
        guard(served.url, deepseek_dir) as over_socket,
        guard(sim, deepseek_dir) as in_process,
    ):
        yield Guards(over_socket.url, in_process.url)


CASES: dict[str, tuple[str, str, dict[str, Any] | None]] = {
    "chat that fits": ("POST", "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 7}),
    "chat clamped": ("POST", "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 99999}),
    "chat streamed": ("POST", "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 9, "stream": True,
                                                      "stream_options": {"include_usage": True}}),
    "completion streamed": ("POST", "/v1/completions", {"model": MODEL, "prompt": "Once", "max_tokens": 5,
                                                        "stream": True}),
    "vLLM's own 400": ("POST", "/v1/chat/completions", {"model": MODEL, "messages": HI, "max_tokens": 5,
                                                       "min_tokens": 9}),
    "embeddings": ("POST", "/v1/embeddings", {"model": MODEL, "input": ["one", "two words"]}),
    "tokenize": ("POST", "/tokenize", {"model": MODEL, "prompt": "Hello"}),
    "model list": ("GET", "/v1/models", None),
    "messages streamed": ("POST", "/v1/messages", {"model": MODEL, "messages": HI, "max_tokens": 4, "stream": True}),
    "version": ("GET", "/version", None),
}  # fmt: skip


def answer(base: str, case: str) -> tuple[int, dict[str, str], bytes]:
    method, path, body = CASES[case]
    headers = {"x-request-id": f"same-{case.replace(' ', '-')}"}
    with httpx.stream(method, base + path, json=body, headers=headers, timeout=30) as response:
        raw = response.read()
    kept = {name: value for name, value in response.headers.items() if name in COMPARED or name.startswith("x-token")}
    return response.status_code, kept, STAMPS.sub(b"<stamp>", raw)


@pytest.mark.parametrize("case", CASES)
def test_the_guard_answers_the_same_through_the_fake_and_over_a_socket(guards: Guards, case: str) -> None:
    over_socket = answer(guards.socket, case)
    assert over_socket[0] != 502 and over_socket[2]  # an answer from the simulator, not about reaching it
    assert answer(guards.memory, case) == over_socket
