"""A replica vLLM 0.33+ paused (POST /pause: every new request a 503 "Generation is paused", a stream a 200 opening
with that error) is skipped as a full queue is: two simulators of the 0.33 profile behind one guard, the real
`openai` and `anthropic` SDKs as clients. One paused: every request is served by the other; both: a 503 with
Retry-After in the route's envelope, which the SDKs retry; resumed: served again. /pause and /resume themselves stay
behind the admin key."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.server.running import ServerThread
from tests.server.test_resilience import RawServer
from tests.support.polling import eventually
from tests.support.servers import MODEL, guard, keyed_guard, simulator, wait_checked, wait_healthy

CONFIG = '[server]\napi_keys = ["sk-client"]\nadmin_api_keys = ["sk-admin"]\n'
HI: Any = [{"role": "user", "content": "Hi"}]


@dataclass
class Replica:
    url: str
    stats: Any

    def pause(self) -> None:
        assert httpx.post(f"{self.url}/pause", params={"mode": "wait"}, timeout=10).json() == {"status": "paused"}

    def resume(self) -> None:
        assert httpx.post(f"{self.url}/resume", timeout=10).json() == {"status": "resumed"}


@dataclass
class Rig:
    guard: str
    first: Replica
    second: Replica


@pytest.fixture(scope="module")
def rig(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    config = tmp_path_factory.mktemp("keys") / "guard.toml"
    config.write_text(CONFIG)
    with (
        simulator(deepseek_dir, profile="0.33", max_model_len=2048) as (first, one, _),
        simulator(deepseek_dir, profile="0.33", max_model_len=2048) as (second, two, _),
    ):
        urls = f"{first.url},{second.url}"
        server: ServerThread
        with keyed_guard(first.url, deepseek_dir, config, **{"upstream.urls": urls}) as server:
            wait_healthy(server.url)
            wait_checked(server, urls)
            wait_checked(server, second.url)
            yield Rig(server.url, Replica(first.url, one), Replica(second.url, two))


@pytest.fixture
def fresh(rig: Rig) -> Iterator[Rig]:
    yield rig
    rig.first.resume()
    rig.second.resume()


def oai(rig: Rig, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{rig.guard}/v1", api_key="sk-client", max_retries=retries, timeout=30)


def claude(rig: Rig) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=rig.guard, api_key="sk-client", max_retries=0, timeout=30)


def chat(rig: Rig, stream: bool) -> str:
    """One chat answer's text through the guard, whole or streamed."""
    client = oai(rig)
    if not stream:
        return client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3).choices[0].message.content or ""
    chunks = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, stream=True)
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("stream", [False, True])
def test_one_paused_replica_leaves_every_request_to_the_other(fresh: Rig, stream: bool) -> None:
    fresh.first.pause()
    before = fresh.first.stats.completed, fresh.second.stats.completed, fresh.first.stats.rejected
    answers = [chat(fresh, stream) for _ in range(6)]
    reply = claude(fresh).messages.create(model=MODEL, max_tokens=3, messages=HI)
    assert all(answers) and reply.stop_reason == "max_tokens"
    assert fresh.first.stats.completed == before[0] and fresh.second.stats.completed - before[1] == 7
    assert fresh.first.stats.rejected > before[2]  # requests did reach it, and it refused them


@pytest.mark.parametrize("stream", [False, True])
def test_both_paused_is_a_503_with_retry_after(fresh: Rig, stream: bool) -> None:
    fresh.first.pause()
    fresh.second.pause()
    with pytest.raises(openai.InternalServerError) as caught:
        chat(fresh, stream)
    assert caught.value.status_code == 503 and int(caught.value.response.headers["retry-after"]) >= 1
    error: Any = caught.value.body
    assert error["code"] == "engine_paused" and "Generation is paused" in error["message"]
    assert error["type"] == "ServiceUnavailableError"


@pytest.mark.parametrize("stream", [False, True])
def test_both_paused_on_the_messages_api_is_anthropics_overloaded_error(fresh: Rig, stream: bool) -> None:
    """A Messages stream meeting a paused 0.33 engine is its 200 and an `event: error`: read, and skipped, too."""
    fresh.first.pause()
    fresh.second.pause()
    with pytest.raises(anthropic.ServiceUnavailableError) as caught:
        claude(fresh).messages.create(model=MODEL, max_tokens=3, messages=HI, stream=stream)
    assert caught.value.status_code == 503 and "retry-after" in caught.value.response.headers
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "No upstream replica can take the request now: Generation "
                                                         "is paused. Please retry after it resumes."},
    }  # fmt: skip


def test_resumed_replicas_serve_again(fresh: Rig) -> None:
    fresh.first.pause()
    fresh.second.pause()
    with pytest.raises(openai.InternalServerError):
        chat(fresh, False)
    fresh.first.resume()
    assert chat(fresh, False)
    fresh.second.resume()
    before = fresh.first.stats.completed + fresh.second.stats.completed
    assert all(chat(fresh, True) for _ in range(4))

    # a stream is counted completed once the simulator has sent its last byte, which may be after the client read it
    def completed() -> int:
        return int(fresh.first.stats.completed + fresh.second.stats.completed - before)

    assert eventually(lambda: completed() == 4, timeout_s=10), completed()


def test_pause_and_resume_stay_behind_the_admin_key(fresh: Rig) -> None:
    for path in ("/pause", "/resume", "/is_paused"):
        method = "GET" if path == "/is_paused" else "POST"
        for key in (None, "sk-client"):
            headers = {} if key is None else {"Authorization": f"Bearer {key}"}
            refused = httpx.request(method, f"{fresh.guard}{path}", headers=headers, timeout=10)
            assert refused.status_code in (401, 403), (path, key, refused.status_code)
    assert httpx.get(f"{fresh.first.url}/is_paused").json() == {"is_paused": False}  # nothing reached a replica
    assert httpx.get(f"{fresh.second.url}/is_paused").json() == {"is_paused": False}
    admin = {"Authorization": "Bearer sk-admin"}
    assert httpx.get(f"{fresh.guard}/is_paused", headers=admin, timeout=10).json() == {"is_paused": False}


def answer_503(body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
    return head % len(payload) + payload


# what a replica answers that another could serve, as vLLM's source writes it: the engine's own error (0.34,
# EngineFaultedError, a GracefulHTTPError) and the elastic-EP middleware's bare one (0.33, a retired rank)
REFUSED = {
    "engine_faulted": answer_503({"error": {"message": "The engine has faulted and cannot accept new requests. Please "
                                            "try again later or on a different instance.",
                                            "type": "Service Unavailable", "param": None, "code": 503}}),
    "rank_retired": answer_503({"error": "This data-parallel rank has been retired and is awaiting shutdown."}),
}  # fmt: skip
# 0.33's Messages stream meeting a paused engine: its 200, then Anthropic's error event first (serving.py ~1235)
PAUSED_EVENT = (b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Generation is '
                b'paused. Please retry after it resumes."}}\n\n')  # fmt: skip
PAUSED_STREAM = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ncontent-length: %d\r\n\r\n"
                 % len(PAUSED_EVENT) + PAUSED_EVENT)  # fmt: skip


@pytest.mark.parametrize("code", list(REFUSED))
def test_a_faulted_or_retired_replica_is_skipped(deepseek_dir: Path, code: str) -> None:
    raw = RawServer(REFUSED[code])
    try:
        with simulator(deepseek_dir, max_model_len=2048) as (sim, stats, _):
            flags = {"upstream.urls": f"{raw.url},{sim.url}", "upstream.retries": 1}
            with guard(raw.url, deepseek_dir, **flags) as served:
                client = openai.OpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0, timeout=30)
                before = stats.completed
                for _ in range(4):
                    client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2)
                assert stats.completed - before == 4
        with guard(raw.url, deepseek_dir) as alone:
            refused = httpx.post(f"{alone.url}/v1/chat/completions", json={"model": MODEL, "messages": HI}, timeout=30)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == code
    finally:
        raw.close()


def test_a_messages_stream_opening_with_the_paused_event_is_skipped(deepseek_dir: Path) -> None:
    raw = RawServer(PAUSED_STREAM)
    body = {"model": MODEL, "max_tokens": 2, "messages": HI, "stream": True}
    try:
        with simulator(deepseek_dir, max_model_len=2048) as (sim, stats, _):
            with guard(raw.url, deepseek_dir, **{"upstream.urls": f"{raw.url},{sim.url}"}) as served:
                claude = anthropic.Anthropic(base_url=served.url, api_key="x", max_retries=0, timeout=30)
                events = [event.type for event in claude.messages.create(**body)]
                assert events[0] == "message_start" and events[-1] == "message_stop"
        with guard(raw.url, deepseek_dir) as alone:
            refused = httpx.post(f"{alone.url}/v1/messages", json=body, timeout=30)
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert refused.json()["type"] == "error" and "Generation is paused" in refused.json()["error"]["message"]
    finally:
        raw.close()


def test_the_openai_sdk_retries_the_503_and_is_served_once_a_replica_resumes(fresh: Rig) -> None:
    """What the 503 with Retry-After is for: the SDK's own retries (2 by default) wait what it says, then try again."""
    fresh.first.pause()
    fresh.second.pause()
    refused = fresh.first.stats.rejected + fresh.second.stats.rejected

    def resume_after_the_first_refusal() -> None:
        if eventually(lambda: fresh.first.stats.rejected + fresh.second.stats.rejected >= refused + 2, timeout_s=20):
            fresh.second.resume()

    waiter = threading.Thread(target=resume_after_the_first_refusal, daemon=True)
    waiter.start()
    served = oai(fresh, retries=2).chat.completions.with_raw_response.create(model=MODEL, messages=HI, max_tokens=3)
    waiter.join(30)
    assert served.http_response.status_code == 200 and served.retries_taken >= 1
