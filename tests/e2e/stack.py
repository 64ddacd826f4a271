"""The system under test: one real vLLM per version with token-guard in front, started lazily and in parallel."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from tests.e2e import runtime
from tests.e2e.recorder import Recorder

VLLM_READY_TIMEOUT = 240
SCALE_OUT = ["--enable-scale-out"]  # serves /inference/v1/generate (0.31: a 404 without it, 0.32: a 403)
PROXY_READY_TIMEOUT = 60


@dataclass
class Stack:
    """One vLLM version with its guard; `direct` talks to vLLM, `guarded` to the proxy.

    The guard reaches vLLM through `recorder`, which keeps every byte of that leg for comparison.
    """

    version: str
    vllm_url: str
    proxy_url: str
    direct: openai.OpenAI
    guarded: openai.OpenAI
    http: httpx.Client
    recorder: Recorder

    def tokenize(self, **body: object) -> int:
        response = self.http.post(self.vllm_url + "/tokenize", json=body)
        response.raise_for_status()
        count: int = response.json()["count"]
        return count

    def metrics(self) -> str:
        return self.http.get(self.vllm_url + "/metrics").text


@dataclass
class Stacks:
    """Starts every wanted vLLM at once on first use (start-up is mostly waiting), then one guard per vLLM."""

    wanted: list[str]
    workdir: Path
    vllms: dict[str, runtime.Process] = field(default_factory=dict)
    proxies: dict[str, runtime.Process] = field(default_factory=dict)
    recorders: dict[str, Recorder] = field(default_factory=dict)
    stacks: dict[str, Stack] = field(default_factory=dict)
    failures: dict[str, BaseException] = field(default_factory=dict)

    def get(self, version: str) -> Stack:
        if version in self.failures:  # fail every test of a version fast, not one start-up timeout each
            raise RuntimeError(f"the vLLM {version} stack failed to start earlier") from self.failures[version]
        if version not in self.stacks:
            try:
                self.stacks[version] = self.build(version)
            except BaseException as exc:
                self.failures[version] = exc
                raise
        return self.stacks[version]

    def build(self, version: str) -> Stack:
        model_dir = self.model_dir()
        for wanted in [version, *self.wanted]:
            if wanted not in self.vllms:
                venv = runtime.vllm_venv(wanted)
                self.vllms[wanted] = runtime.start_vllm(venv, model_dir, self.workdir / wanted, SCALE_OUT)
        # Wait for every vLLM, not just this one: one still loading takes CPU from the tests of the other.
        for other in self.vllms.values():
            with contextlib.suppress(RuntimeError, TimeoutError):  # its own tests will report it
                other.wait_ready("/v1/models", VLLM_READY_TIMEOUT)
        vllm = self.vllms[version]
        vllm.wait_ready("/v1/models", VLLM_READY_TIMEOUT)
        warm_up(vllm.url)
        recorder = self.recorders[version] = Recorder(int(vllm.url.rsplit(":", 1)[1]))
        proxy = self.proxies[version] = runtime.start_proxy(recorder.url, model_dir, self.workdir / f"{version}-guard",
                                                            settings={"TOKEN_GUARD_RENDER_LOCAL": "true"})  # fmt: skip
        proxy.wait_ready("/health", PROXY_READY_TIMEOUT)
        # vLLM's uvicorn closes a connection idle for 5 s: a client keeping one as long reuses it as it closes
        http = httpx.Client(timeout=120, limits=httpx.Limits(keepalive_expiry=2))
        return Stack(version, vllm.url, proxy.url, client(vllm.url), client(proxy.url), http, recorder)

    def model_dir(self) -> Path:
        # Built with the oldest vLLM's transformers, so every version can read the saved config.
        return runtime.tiny_model(runtime.vllm_venv(min(self.wanted or runtime.VERSIONS)) / "bin" / "python")

    def processes(self) -> Iterator[runtime.Process]:
        yield from self.proxies.values()
        yield from self.vllms.values()

    def close(self) -> None:
        for stack in self.stacks.values():
            stack.direct.close()
            stack.guarded.close()
            stack.http.close()
        for process in self.processes():
            process.stop()
        for recorder in self.recorders.values():
            recorder.close()


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)


def warm_up(url: str) -> None:
    """The first requests of a fresh vLLM pay one-off costs; keep them out of the tests' timings."""
    with httpx.Client(base_url=url, timeout=120) as http:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
        http.post("/v1/chat/completions", json=chat).raise_for_status()
        http.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}).raise_for_status()
