"""Keeping vLLM out of overload, and surviving a bad upstream: admission by KV cost, replicas, timeouts, garbage.

Fault injection with the simulator and small raw servers on loopback."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.server.running import ServerThread, bind_socket
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support.polling import eventually
from tests.support.redis import RedisServer, fixture_redis  # noqa: F401
from tests.support.servers import MODEL, guard, keyed_guard, simulator

WINDOW = 2048
HUGE = 10**9  # a KV capacity that never slows the simulator down, so that it only records its running cost


def body(content: str = "Tell me a story.", max_tokens: int = 100, stream: bool = False) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "stream": stream}  # fmt: skip


def cost_of(url: str, content: str, max_tokens: int) -> int:
    prompt = httpx.post(f"{url}/tokenize", json={"model": MODEL, "messages": body(content)["messages"]}).json()
    return int(prompt["count"]) + max_tokens


def test_forty_concurrent_requests_within_a_budget_of_four(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.004, kv_capacity_tokens=HUGE) as (sim, stats, _):
        budget = 4 * cost_of(sim.url, "Tell me a story.", 100)
        flags = {"model.max_model_len": WINDOW, "admission.max_inflight_tokens": budget}
        with guard(sim.url, deepseek_dir, **flags) as proxy:

            async def run() -> list[httpx.Response]:
                async with httpx.AsyncClient(timeout=120) as client:
                    calls = [client.post(f"{proxy.url}/v1/chat/completions", json=body()) for _ in range(40)]
                    return await asyncio.gather(*calls)

            responses = asyncio.run(run())
            scraped = httpx.get(f"{proxy.url}/metrics").text
    assert [r.status_code for r in responses] == [200] * 40
    waits = [line for line in scraped.splitlines() if line.startswith("token_guard_admission_wait_seconds_count")]
    assert waits and float(waits[0].rsplit(" ", 1)[1]) >= 30
    assert 'token_guard_inflight_tokens{replica="0"} 0.0' in scraped  # all released
    assert "token_guard_admission_queue_depth 0.0" in scraped
    assert all(r.json()["usage"]["completion_tokens"] == 100 for r in responses)
    assert stats.kv.peak <= budget  # what the simulator itself saw running at once
    assert stats.kv.peak >= budget // 2  # and the budget was used, not serialized to one at a time
    assert sum("x-token-guard-queue-ms" in r.headers for r in responses) >= 30  # the excess waited


def test_queue_timeout_gives_429_with_retry_after(deepseek_dir: Path) -> None:
    # the admitted request runs for 5 s, far longer than the 0.2 s the others may wait
    with simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.05) as (sim, _, _):
        one = cost_of(sim.url, "Tell me a story.", 100)
        flags = {"model.max_model_len": WINDOW, "admission.max_inflight_tokens": one,
                 "admission.queue_timeout_s": 0.2}  # fmt: skip
        with guard(sim.url, deepseek_dir, **flags) as proxy:
            client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)

            async def one_call() -> Any:
                return await client.chat.completions.create(model=MODEL, messages=body()["messages"], max_tokens=100)

            async def run() -> list[Any]:
                results = await asyncio.gather(*(one_call() for _ in range(4)), return_exceptions=True)
                await client.close()
                return results

            results = asyncio.run(run())
    limited = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert len(limited) == 3 and sum(not isinstance(r, Exception) for r in results) == 1
    for error in limited:
        assert int(error.response.headers["retry-after"]) >= 1
        assert isinstance(error.body, dict) and error.body["code"] == "rate_limit_exceeded"


def test_disconnect_while_queued_releases_nothing_twice_and_leaks_nothing(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, max_model_len=WINDOW, itl_s=0.01) as (sim, stats, _):
        flags = {"model.max_model_len": WINDOW, "admission.max_inflight_tokens": cost_of(sim.url, "x", 150)}
        with guard(sim.url, deepseek_dir, **flags) as proxy:
            admission = proxy.app.upstream.admission  # the gate's own counters
            with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body("x", 150, stream=True)) as first:
                lines = first.iter_lines()
                next(lines)
                for _ in range(3):  # three clients give up while waiting behind the first
                    with pytest.raises(httpx.ReadTimeout):
                        httpx.post(f"{proxy.url}/v1/chat/completions", json=body("x", 150), timeout=0.3)
                assert eventually(lambda: admission.queued == 0)
                rest = [line for line in lines if line]
            assert rest[-1] == "data: [DONE]"
            assert eventually(lambda: admission.budgets[0].tokens == 0 and admission.budgets[0].requests == 0)
            assert stats.received == 1  # the ones that left the queue never reached the upstream
            after = httpx.post(f"{proxy.url}/v1/chat/completions", json=body("x", 150), timeout=30)
            assert after.status_code == 200 and "x-token-guard-queue-ms" not in after.headers


@pytest.fixture
def two_replicas(deepseek_dir: Path) -> Iterator[tuple[list[ServerThread], list[Any], list[int]]]:
    apps = [create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, max_model_len=WINDOW))
            for _ in range(2)]  # fmt: skip
    servers = [ServerThread(app).start() for app in apps]
    ports = [int(s.url.rsplit(":", 1)[1]) for s in servers]
    try:
        yield servers, [a.state.stats for a in apps], ports
    finally:
        for server in servers:
            server.stop()


def test_a_dead_replica_is_routed_around_and_comes_back(
    deepseek_dir: Path, two_replicas: tuple[list[ServerThread], list[Any], list[int]]
) -> None:
    servers, stats, ports = two_replicas
    urls = ",".join(s.url for s in servers)
    flags = {"upstream.urls": urls, "model.max_model_len": WINDOW, "upstream.health_interval_s": 0.1}
    with guard(servers[0].url, deepseek_dir, **flags) as proxy:
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
        for _ in range(6):
            client.chat.completions.create(model=MODEL, messages=body()["messages"], max_tokens=5)
        assert stats[0].received > 0 and stats[1].received > 0  # both take traffic
        servers[1].stop()
        served_before = stats[0].received
        for _ in range(10):  # no client-visible error for requests started after the replica died
            reply = client.chat.completions.create(model=MODEL, messages=body()["messages"], max_tokens=5)
            assert reply.usage is not None and reply.usage.completion_tokens == 5
        assert stats[0].received == served_before + 10
        revived = create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, max_model_len=WINDOW))
        with ServerThread(revived, port=ports[1]):

            def back() -> bool:
                client.chat.completions.create(model=MODEL, messages=body()["messages"], max_tokens=1)
                return bool(revived.state.stats.received > 0)

            assert eventually(back, timeout_s=10)


def test_idle_stream_times_out_into_an_error_event_then_done(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, max_model_len=WINDOW, itl_s=2.0) as (sim, stats, _):
        with guard(sim.url, deepseek_dir, **{"model.max_model_len": WINDOW, "upstream.read_timeout_s": 0.3}) as proxy:
            response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body(max_tokens=5, stream=True), timeout=30)
            events = [e for e in response.text.split("\n\n") if e]
            assert response.status_code == 200 and events[-1] == "data: [DONE]"
            assert json.loads(events[-2][6:])["error"]["type"] == "GatewayTimeoutError"
            assert eventually(lambda: stats.aborted == 1)  # the upstream connection was closed


def test_slow_first_byte_is_504(deepseek_dir: Path) -> None:
    with simulator(deepseek_dir, max_model_len=WINDOW, ttft_s=3.0) as (sim, _, _):
        flags = {"model.max_model_len": WINDOW, "upstream.first_byte_timeout_s": 0.3}
        with guard(sim.url, deepseek_dir, **flags) as proxy:
            response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body(max_tokens=5), timeout=30)
            assert response.status_code == 504 and response.json()["error"]["type"] == "GatewayTimeoutError"


class RawServer:
    """A TCP server on loopback that answers every generation with fixed bytes, then closes the connection; what the
    guard learns before it counts (its models, its health) it answers as vLLM would, so that the guard gets ready."""

    def __init__(self, reply: bytes, pause_s: float = 0.0, version: str | None = None) -> None:
        self.reply, self.pause_s, self.version = reply, pause_s, version
        self.sock = bind_socket()
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                asked = conn.recv(65536)
                if not asked.startswith(b"POST /v1/"):  # discovery, health, /tokenize, /version
                    conn.sendall(learned(asked, self.version))
                    continue
                conn.sendall(self.reply)
                if self.pause_s:
                    threading.Event().wait(self.pause_s)
                conn.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.sock.close()


def learned(asked: bytes, version: str | None = None) -> bytes:
    """vLLM's answer to what the guard asks before it counts: its model list and health, and its `version` when one
    is given; 404 for anything else (the start-up check then says it could not compare, and the guard counts
    locally)."""
    status, payload = b"404 Not Found", b'{"error":{"message":"Not Found","type":"NotFoundError","code":404}}'
    if asked.startswith(b"GET /v1/models"):
        card = {"id": MODEL, "object": "model", "max_model_len": WINDOW, "root": None, "parent": None}
        status, payload = b"200 OK", json.dumps({"object": "list", "data": [card]}).encode()
    elif asked.startswith(b"GET /health"):
        status, payload = b"200 OK", b""
    elif asked.startswith(b"GET /version") and version is not None:
        status, payload = b"200 OK", json.dumps({"version": version}).encode()
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
    return head % (status, len(payload)) + payload


def guard_in_front_of(raw: RawServer, deepseek_dir: Path) -> Any:
    return guard(raw.url, deepseek_dir, **{"model.max_model_len": WINDOW})


def test_reset_mid_stream_is_an_error_event_then_done(deepseek_dir: Path) -> None:
    chunk = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
    raw = RawServer(head + b"%x\r\n" % len(chunk) + chunk + b"\r\n", pause_s=0.1)
    try:
        with guard_in_front_of(raw, deepseek_dir) as proxy:
            response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body(stream=True), timeout=30)
            events = [e for e in response.text.split("\n\n") if e]
            assert events[0] == chunk.decode().strip()
            assert json.loads(events[-2][6:])["error"]["type"] == "BadGatewayError"
            assert events[-1] == "data: [DONE]"
    finally:
        raw.close()


def messages_stream_that_breaks(version: str | None = None) -> RawServer:
    """A /v1/messages stream (as vLLM's Anthropic endpoint writes it) whose connection closes after its first event;
    `version`: what the upstream's GET /version says (None: it has no such route)."""
    usage = {"input_tokens": 5, "output_tokens": 0}
    message: dict[str, Any] = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": MODEL,
               "stop_reason": None, "stop_sequence": None, "usage": usage}  # fmt: skip
    event = b"event: message_start\ndata: " + json.dumps({"type": "message_start", "message": message}).encode()
    event += b"\n\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
    return RawServer(head + b"%x\r\n" % len(event) + event + b"\r\n", pause_s=0.1, version=version)


MESSAGES_BODY = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "Tell me a story."}]}


# the upstream's release -> the type of the guard's own 502 on the Messages API (0.33: Anthropic's own names)
BROKEN_TYPE = {None: "BadGatewayError", "0.32.0": "BadGatewayError", "0.33.0": "api_error", "0.34.0": "api_error"}


@pytest.mark.parametrize("version", list(BROKEN_TYPE))
def test_reset_mid_stream_on_the_messages_api_is_anthropics_error_event(
    deepseek_dir: Path, version: str | None
) -> None:
    raw = messages_stream_that_breaks(version)
    try:
        with guard_in_front_of(raw, deepseek_dir) as proxy:
            body = {**MESSAGES_BODY, "stream": True}
            response = httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=30)
            events = [e for e in response.text.split("\n\n") if e]
            assert response.status_code == 200 and events[0].startswith("event: message_start\n")
            name, data = events[-1].split("\n")
            assert name == "event: error" and "[DONE]" not in response.text
            error = json.loads(data.removeprefix("data: "))
            assert error["type"] == "error" and error["error"]["type"] == BROKEN_TYPE[version]
            assert set(error["error"]) == {"type", "message"}
    finally:
        raw.close()


@pytest.mark.parametrize("version", [None, "0.33.0"])
def test_the_anthropic_sdk_raises_a_messages_stream_broken_mid_way(deepseek_dir: Path, version: str | None) -> None:
    """An error event without Anthropic's `event: error` is skipped by the SDK: the stream would just end, as if the
    answer were whole."""
    raw = messages_stream_that_breaks(version)
    try:
        with guard_in_front_of(raw, deepseek_dir) as proxy:
            claude = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0, timeout=30)
            seen = []
            with pytest.raises(anthropic.APIStatusError) as failed:
                for event in claude.messages.create(**MESSAGES_BODY, stream=True):  # type: ignore[call-overload]
                    seen.append(event.type)
            assert seen == ["message_start"]
            assert isinstance(failed.value.body, dict) and failed.value.body["type"] == "error"
            assert failed.value.body["error"]["type"] == BROKEN_TYPE[version]
    finally:
        raw.close()


def test_garbage_from_the_upstream_is_502(deepseek_dir: Path) -> None:
    raw = RawServer(b"this is not HTTP at all\r\n\r\n")
    try:
        with guard_in_front_of(raw, deepseek_dir) as proxy:
            response = httpx.post(f"{proxy.url}/v1/chat/completions", json=body(), timeout=30)
            assert response.status_code == 502 and response.json()["error"]["type"] == "BadGatewayError"
            assert "Traceback" not in response.text
    finally:
        raw.close()


class HugeServer:
    """A loopback upstream that answers every request with `status` and a 100 MB body (sent 64 KB at a time);
    `finished` counts the answers it got out whole, `cut` those whose reader hung up first."""

    SIZE = 100 * 2**20

    def __init__(self, status: int) -> None:
        self.status, self.finished, self.cut = status, 0, 0
        self.sock = bind_socket()
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        chunk = b'{"error": "' + b"x" * (65536 - 11)
        with conn:
            try:
                asked = b""
                while b"\r\n\r\n" not in asked:
                    asked += conn.recv(65536)
                if self.status != 200 and not asked.startswith(b"POST /v1/"):  # what the guard learns first
                    conn.sendall(learned(asked))
                    return
                conn.sendall(b"HTTP/1.1 %d Oops\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                             % (self.status, self.SIZE))  # fmt: skip
                for _ in range(self.SIZE // len(chunk)):
                    conn.sendall(chunk)
                self.finished += 1
            except OSError:
                self.cut += 1

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize(
    ("status", "method", "path", "answered"),
    [(500, "POST", "/v1/chat/completions", 500), (200, "GET", "/v1/models", 502)],
    ids=["a 5xx error's body", "a model list filtered for a key"],
)
def test_an_upstream_answer_read_whole_is_read_only_so_far(
    deepseek_dir: Path, tmp_path: Path, status: int, method: str, path: str, answered: int
) -> None:
    """An upstream answering with 100 MB where the guard reads the answer whole: the guard reads 64 KB (1 MiB for a
    list), answers in the envelope and hangs up on the upstream, instead of holding it all in memory."""
    config = tmp_path / "guard.toml"
    config.write_text(f'[[keys]]\nname = "listed"\nkey = "sk-listed"\nrequests_per_minute = 99\nmodels = ["{MODEL}"]\n')
    huge = HugeServer(status)
    try:
        with keyed_guard(huge.url, deepseek_dir, config, **{"model.max_model_len": WINDOW}) as proxy:
            sent = body() if method == "POST" else None
            response = httpx.request(method, proxy.url + path, json=sent, timeout=30,
                                     headers={"authorization": "Bearer sk-listed"})  # fmt: skip
            assert response.status_code == answered and len(response.content) < 4096
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
            assert huge.url.removeprefix("http://") not in response.text
            assert eventually(lambda: huge.cut >= 1) and huge.finished == 0
            assert httpx.get(proxy.url + "/livez", timeout=10).status_code == 200
    finally:
        huge.close()


def test_nothing_a_client_sees_names_the_upstream_while_it_is_down(deepseek_dir: Path, redis: RedisServer) -> None:
    """/health, a request's 502 (streamed or not) and /metrics with every replica gone: none tells where the
    upstream listens (the replicas are numbered in the metrics, by their place in upstream.urls)."""
    replicas = [ServerThread(create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL))).start()
                for _ in range(2)]  # fmt: skip
    addresses = [replica.url.removeprefix("http://") for replica in replicas]
    flags = {"upstream.urls": ",".join(replica.url for replica in replicas), "model.max_model_len": WINDOW,
             "admission.max_inflight_tokens": 100_000, "redis.url": redis.url}  # fmt: skip
    with guard(replicas[0].url, deepseek_dir, **flags) as proxy:
        for replica in replicas:  # ready, then every replica goes away
            replica.stop()
        answers = [httpx.get(f"{proxy.url}/health")]
        for stream in (False, True):
            answers.append(httpx.post(f"{proxy.url}/v1/chat/completions", json=body(stream=stream), timeout=30))
        assert [a.status_code for a in answers] == [503, 502, 502]
        assert answers[0].json()["status"] == "unhealthy"
        assert all(a.json()["error"]["type"] == "BadGatewayError" for a in answers[1:])
        scraped = httpx.get(f"{proxy.url}/metrics").text
    assert 'token_guard_inflight_tokens{replica="0"} 0.0' in scraped
    assert 'token_guard_inflight_tokens{replica="1"} 0.0' in scraped
    assert 'token_guard_shared_inflight_tokens{replica="' in scraped
    for text in [*(a.text for a in answers), scraped]:
        assert not any(address in text for address in addresses), text
