"""A core's lifetime is one block: `async with Core(...)` runs the background work a front end serves with, and
leaving it stops that work and closes what the core opened, the child processes included (a request's own chat
template renders in one, a body of many values is parsed in another). Until 6cc5eca the children were the process's
own, closed only by the command that started serve or extproc, or at the interpreter's exit: a guard stopped in a
running process (the demo, a test) left them running."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import openai
import pytest

from bench.envoy import cluster, processor
from proxy.counting.isolated import LOOP_VALUES
from proxy.counting.registry import ModelRegistry
from proxy.exchange.core import Core
from proxy.settings import Settings, load_settings
from tests.support.envoy import ProcessorThread, envoy
from tests.support.fakehttp import AsgiTransport
from tests.support.servers import MODEL, InMemorySim, guard, simulator, simulator_in_memory

ECHO = "{{ messages[0]['content'] }}"  # the prompt is the first message's text, as the template renders it
TRUSTING = {"model.max_model_len": 2048, "policy.trust_request_chat_template": True}


def ask(sdk: openai.OpenAI) -> Any:
    """A chat request that brings its own template, with a field of more values than the guard parses on its loop
    (passed on unread)."""
    return sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=3,
        extra_body={"chat_template": ECHO, "vendor_values": [0] * (LOOP_VALUES + 1)},
    )  # fmt: skip


def started_since(before: set[BaseProcess]) -> list[BaseProcess]:
    return [child for child in multiprocessing.active_children() if child not in before]


@pytest.fixture(scope="module")
def trusting_sim(deepseek_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(deepseek_dir, profile="0.31", max_model_len=2048, trust_request_chat_template=True) as sim:
        yield sim


def test_serve_ends_its_child_processes_when_it_stops(trusting_sim: InMemorySim, deepseek_dir: Path) -> None:
    before = set(multiprocessing.active_children())
    with guard(trusting_sim, deepseek_dir, **TRUSTING) as server:
        answer = ask(openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0))
        assert answer.usage is not None and answer.usage.prompt_tokens > 0
        children = started_since(before)
        assert len(children) == 2  # the template's renderer and the body's parser
    assert not [child for child in children if child.is_alive()]


def test_extproc_ends_its_child_processes_when_it_stops(deepseek_dir: Path, tmp_path: Path) -> None:
    with simulator(deepseek_dir, trust_request_chat_template=True) as (sim, _, _):
        flags = {"upstream.url": sim.url, "model.name": MODEL, "model.tokenizer": str(deepseek_dir), **TRUSTING}
        before = set(multiprocessing.active_children())
        with ProcessorThread(load_settings(flags, environ={})) as processor_thread:
            processor_thread.checked(sim.url)
            upstream = int(sim.url.rsplit(":", 1)[1])
            listeners = {"buffered": [processor("guard", "BUFFERED")]}
            clusters = [cluster("guard", processor_thread.port, grpc=True)]
            with envoy(tmp_path, upstream, listeners, clusters) as running:
                answer = ask(openai.OpenAI(base_url=f"{running.urls['buffered']}/v1", api_key="none", max_retries=0))
            assert answer.usage is not None and answer.usage.prompt_tokens > 0
            children = started_since(before)
            assert len(children) == 2
    assert not [child for child in children if child.is_alive()]


def test_the_background_work_runs_inside_the_block_and_stops_with_it(
    trusting_sim: InMemorySim, deepseek_dir: Path
) -> None:
    settings = load_settings({"upstream.url": trusting_sim.url}, environ={})  # zero-config: models from the upstream

    async def lifetime() -> tuple[int, int, list[str], int]:
        core = Core(settings, ModelRegistry.from_settings(settings.models), transport(trusting_sim, settings))
        before = (await core.readiness())[0]
        async with core:
            for _ in range(200):  # discovery and the health watch are the core's background work
                status, shown = await core.readiness(models=True)
                if status == 200:
                    break
                await asyncio.sleep(0.05)
        left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        return before, status, list(shown.get("models", [])), len(left)  # type: ignore[call-overload]

    before, during, models, left = asyncio.run(lifetime())
    assert before == 503  # nothing learned before the block
    assert (during, models) == (200, [MODEL])
    assert left == 0  # no job of the core outlives the block


def transport(sim: InMemorySim, settings: Settings) -> AsgiTransport:
    return AsgiTransport({sim.url: sim.tap}, settings.upstream)


def test_a_core_is_entered_once(trusting_sim: InMemorySim) -> None:
    settings = load_settings({"upstream.url": trusting_sim.url}, environ={})

    async def twice() -> None:
        async with Core(
            settings, ModelRegistry.from_settings(settings.models), transport(trusting_sim, settings)
        ) as core:
            with pytest.raises(RuntimeError, match="entered once"):
                await core.__aenter__()

    asyncio.run(twice())
