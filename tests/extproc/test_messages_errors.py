"""The external processor answers its own errors on the Messages API in the upstream's vocabulary, as serve does:
behind a real Envoy in front of the simulator's 0.33 profile, Anthropic's own types (not_found_error,
invalid_request_error), read by the real `anthropic` SDK."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from bench.envoy import cluster, processor
from proxy.settings import load_settings
from tests.support.envoy import ProcessorThread, envoy
from tests.support.servers import MODEL, simulator

HI: Any = [{"role": "user", "content": "Hi"}]
LONG: Any = [{"role": "user", "content": "word " * 3000}]  # over the simulator's 2,048-token window


@pytest.fixture(scope="module")
def url(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with simulator(deepseek_dir, profile="0.33", max_model_len=2048) as (sim, _, _):
        flags = {"upstream.url": sim.url, "model.name": MODEL, "model.tokenizer": str(deepseek_dir)}
        with ProcessorThread(load_settings(flags, environ={})) as guard:
            guard.checked(sim.url)
            listeners = {"buffered": [processor("guard", "BUFFERED")]}
            upstream = int(sim.url.rsplit(":", 1)[1])
            clusters = [cluster("guard", guard.port, grpc=True)]
            with envoy(tmp_path_factory.mktemp("envoy"), upstream, listeners, clusters) as running:
                yield running.urls["buffered"]


def claude(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=30)


def test_an_unknown_model(url: str) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        claude(url).messages.create(model="no-such-model", max_tokens=5, messages=HI)
    body: Any = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "not_found_error"


def test_a_prompt_over_the_window(url: str) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude(url).messages.create(model=MODEL, max_tokens=5, messages=LONG)
    body: Any = caught.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "maximum context length" in body["error"]["message"]
