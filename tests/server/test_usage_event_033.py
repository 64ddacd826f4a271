"""The usage event a limited key's stream did not ask for, in front of vLLM 0.33 and 0.34, whose chat and completions
token events end with `"kv_transfer_params":null`, after the fingerprint of a finish event: the guard takes the usage
event out and puts the fingerprint back where vLLM writes it, so the client gets vLLM's bytes (the simulator's 0.34
profile; the 0.32 profile, whose events end with the fingerprint, beside it)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.servers import MODEL, InMemorySim, keyed_guard, simulator_in_memory, wait_healthy

KEYS = """
[[keys]]
name = "team"
key = "sk-team"
tokens_per_minute = 1000000
"""
STREAMS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi 東京"}], "n": 2, "max_tokens": 6}),
    ("/v1/completions", {"prompt": "Once upon a time", "n": 2, "max_tokens": 5}),
]  # fmt: skip


@pytest.fixture(scope="module", params=["0.32", "0.34"])
def stack(
    request: pytest.FixtureRequest, deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, InMemorySim, str]]:
    config = tmp_path_factory.mktemp("keys") / "guard.toml"
    config.write_text(KEYS)
    with (
        simulator_in_memory(deepseek_dir, profile=request.param, max_model_len=2048) as sim,
        keyed_guard(sim, deepseek_dir, config) as served,
    ):
        wait_healthy(served.url)
        yield request.param, sim, served.url


def unstamped(stream: bytes) -> bytes:
    return re.sub(rb'"created":\d+', b'"created":0', stream)


@pytest.mark.parametrize(("path", "fields"), STREAMS, ids=["chat", "completions"])
def test_the_client_gets_vllms_bytes_with_the_fingerprint_where_vllm_writes_it(
    stack: tuple[str, InMemorySim, str], path: str, fields: dict[str, Any]
) -> None:
    release, sim, proxy = stack
    body = {"model": MODEL, "stream": True, **fields}
    headers = {"x-request-id": f"hidden-{path.strip('/').replace('/', '-')}"}  # vLLM makes it the answer's id
    guarded = httpx.post(proxy + path, json=body, headers={**headers, "authorization": "Bearer sk-team"})
    assert sim.stats.requests[-1]["stream_options"]["include_usage"] is True  # what the guard sent
    direct = sim.client.post(path, json=body, headers=headers)
    assert guarded.status_code == direct.status_code == 200
    assert unstamped(guarded.content) == unstamped(direct.content) and b'"usage":{' not in guarded.content
    finishes = [event for event in direct.content.split(b"\n\n") if b'"finish_reason":"length"' in event]
    assert len(finishes) == 2 and all(b'"system_fingerprint":"vllm-' in event for event in finishes)
    if release != "0.32":  # 0.33 on: the fingerprint is not last
        assert all(event.endswith(b',"kv_transfer_params":null}') for event in finishes)
