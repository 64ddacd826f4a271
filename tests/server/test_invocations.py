"""/invocations checks and counts the model vLLM runs: the one X-Amzn-SageMaker-Adapter-Identifier names, or the
server's default without it, never the body's (vLLM's SageMaker decorator replaces the body's model either way).
The simulator serves `tiny` and `other` (vLLM's --served-model-name tiny other); each key may use one of them.
Also: a client does not choose the data-parallel engine its request runs on (X-data-parallel-rank)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.server.running import ServerThread, uvicorn_options
from proxy.settings import load_settings
from tests.support.servers import InMemorySim, guard_app, simulator_in_memory, wait_checked, wait_healthy

ADAPTER = "X-Amzn-SageMaker-Adapter-Identifier"
PROMPT = {"prompt": "Say something.", "max_tokens": 2}


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(deepseek_dir, profile="0.31", aliases=("other",)) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: InMemorySim, deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("invocations") / "guard.toml"
    config.write_text("".join(f'[[models]]\nname = "{name}"\ntokenizer = "{deepseek_dir}"\n\n' for name in
                              ("tiny", "other")) + KEYS)  # fmt: skip
    settings = load_settings({"upstream.url": sim.url}, environ={}, config_file=config)
    with ServerThread(guard_app(sim, settings), **uvicorn_options(settings.server)) as server:
        wait_healthy(server.url)
        wait_checked(server, sim)
        yield server.url


KEYS = """
[[keys]]
name = "tiny-only"
key = "sk-tiny"
tokens_per_minute = 1000000
models = ["tiny"]

[[keys]]
name = "other-only"
key = "sk-other"
tokens_per_minute = 1000000
models = ["other"]
"""


def invoke(proxy: str, key: str, body: dict[str, Any], **headers: str) -> httpx.Response:
    return httpx.post(f"{proxy}/invocations", json=body, headers={"authorization": f"Bearer {key}", **headers},
                      timeout=30)  # fmt: skip


def test_the_model_the_header_names_is_the_model_checked(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    refused = invoke(proxy, "sk-tiny", {"model": "tiny", **PROMPT}, **{ADAPTER: "other"})
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
    assert sim.stats.received == before  # vLLM would have run `other` for a key held to `tiny`
    allowed = invoke(proxy, "sk-other", {"model": "tiny", **PROMPT}, **{ADAPTER: "other"})
    assert allowed.status_code == 200 and sim.stats.requests[-1]["model"] == "other"


def test_without_the_header_the_default_model_runs_whatever_the_body_says(proxy: str, sim: InMemorySim) -> None:
    refused = invoke(proxy, "sk-other", {"model": "other", **PROMPT})  # vLLM runs `tiny`, its default
    message = refused.json()["error"]["message"]  # naming no model the key may not use (`tiny`)
    assert refused.status_code == 404 and "names no model" in message and "tiny" not in message
    chat = {"model": "other", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert invoke(proxy, "sk-tiny", chat).status_code == 200 and sim.stats.requests[-1]["model"] is None


def test_the_header_means_nothing_on_other_routes(proxy: str) -> None:
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key="sk-tiny", max_retries=0, timeout=30)
    reply = client.completions.create(model="tiny", prompt="Say something.", max_tokens=2,
                                      extra_headers={ADAPTER: "other"})  # fmt: skip
    assert reply.usage is not None  # vLLM reads the header on /invocations only, and so does the guard


def test_the_client_does_not_choose_the_data_parallel_engine(proxy: str, sim: InMemorySim) -> None:
    client = openai.OpenAI(base_url=f"{proxy}/v1", api_key="sk-tiny", max_retries=0, timeout=30)
    client.completions.create(model="tiny", prompt="Say something.", max_tokens=2,
                              extra_headers={"X-data-parallel-rank": "1"})  # fmt: skip
    assert b"x-data-parallel-rank" not in dict(sim.tap.headers[-1])
