"""What the Envoy tests run against: recorded simulators, a gated upstream, an upstream that keeps requests whole
(trailers too), an endpoint picker's stand-in, serve on a processor's own settings, and the rig of them all behind
one Envoy (tests/extproc/conftest.py builds it)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.counting.registry import ModelRegistry
from proxy.server.app import create_app
from proxy.server.running import ServerThread, uvicorn_options
from proxy.settings import Settings
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support.envoy import Envoy, ProcessorThread
from tests.support.raw_upstream import RawUpstream
from tests.support.servers import MODEL, wait_checked, wait_healthy

BUDGET = 100_000
MAX_BODY = 8 * 2**20
CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"
GATE_S = 20  # the gated upstream's longest hold: a client that got nothing by then was held by a buffer
KEYS = """
[server]
metrics_api_key = "sk-scrape"
admin_api_keys = ["sk-admin"]

[[keys]]
name = "alice"
key = "sk-alice"
tokens_per_minute = 1000000

[[keys]]
name = "small"
key = "sk-small"
tokens_per_minute = 1000

[[keys]]
name = "few"
key = "sk-few"
requests_per_minute = 5

[[keys]]
name = "bob"
key = "sk-bob"
"""
# the gateway processor's own: keys the guard checks, vLLM's key, a gateway prefix it takes off, a short body deadline
GATEWAY = {"server.api_keys": "sk-client", "server.admin_api_keys": "sk-admin", "upstream.api_key": "sk-upstream",
           "extproc.path_prefixes": "/llama", "server.read_timeout_s": 2}  # fmt: skip


class Recorder:
    """ASGI middleware keeping every request the upstream received: method, path, headers and body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []

    def since(self, before: int) -> list[tuple[str, str, dict[str, str], bytes]]:
        """What came after the first `before`, readiness probes aside (the guard's /health asks the upstream's)."""
        return [seen for seen in self.seen[before:] if seen[1] != "/health"]

    def last(self) -> tuple[str, str, dict[str, str], bytes]:
        return self.since(0)[-1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}

        async def kept() -> Message:  # kept once whole, before the answer goes out
            message = await receive()
            chunks.append(message.get("body", b""))
            if message["type"] == "http.request" and not message.get("more_body", False):
                self.seen.append((scope["method"], scope["path"], headers, b"".join(chunks)))
            return message

        if scope["method"] in ("GET", "HEAD", "OPTIONS"):  # whose body the app may leave unread
            self.seen.append((scope["method"], scope["path"], headers, b""))
        await self.app(scope, kept, send)


class Picker(ext_proc.ExternalProcessorServicer):  # type: ignore[misc]
    """The endpoint picker's stand-in: names the pod in x-gateway-destination-endpoint, as GIE's picker does, and
    like it reads the body (FULL_DUPLEX_STREAMED: the headers' answer held until the body has come, then the body
    sent back as it came). `bodies`: every request body it saw, whole."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.bodies: list[bytes] = []

    async def Process(self, requests: Any, context: Any) -> None:  # noqa: N802
        pieces: list[bytes] = []
        async for message in requests:
            if message.HasField("request_headers") and not message.request_headers.end_of_stream:
                continue  # answered with the body's end
            if message.HasField("request_body"):
                pieces.append(message.request_body.body)
                if not message.request_body.end_of_stream:
                    continue
                self.bodies.append(b"".join(pieces))
            elif not message.HasField("request_headers"):
                continue
            header = HeaderValue(key="x-gateway-destination-endpoint", raw_value=self.endpoint.encode())
            mutation = pb.HeaderMutation(set_headers=[HeaderValueOption(header=header)])
            common = pb.CommonResponse(header_mutation=mutation, clear_route_cache=True)
            await context.write(pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common)))
            if message.HasField("request_body"):
                body = pb.StreamedBodyResponse(body=b"".join(pieces), end_of_stream=True)
                mutated = pb.CommonResponse(body_mutation=pb.BodyMutation(streamed_response=body))
                await context.write(pb.ProcessingResponse(request_body=pb.BodyResponse(response=mutated)))


@contextmanager
def picker(endpoint: str) -> Iterator[tuple[int, Picker]]:
    """The picker's stand-in served in a thread of its own; yields its port and itself."""
    ready, stop = threading.Event(), threading.Event()
    found: list[int] = []
    stand_in = Picker(endpoint)

    async def main() -> None:
        server = grpc.aio.server()
        ext_proc.add_ExternalProcessorServicer_to_server(stand_in, server)
        found.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await server.stop(0)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    ready.wait(30)
    try:
        yield found[0], stand_in
    finally:
        stop.set()
        thread.join(10)


class Gate:
    """An upstream whose stream sends one event, then holds the rest until the test opens the gate (or GATE_S
    passes, when it sends an event saying so): a client sees the first event before the gate opens only when nothing
    between them buffers the stream."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.app = Starlette(routes=[Route(CHAT, self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> StreamingResponse:
        await request.body()

        async def events() -> Any:
            yield b'data: {"choices": [{"index": 0, "delta": {"content": "first"}}]}\n\n'
            opened = await asyncio.to_thread(self.open.wait, GATE_S)
            yield b"data: [DONE]\n\n" if opened else b'data: {"error": "the gate was never opened"}\n\n'

        return StreamingResponse(events(), media_type="text/event-stream")


@contextmanager
def served(settings: Settings) -> Iterator[ServerThread]:
    """token-guard serve on `settings`, as a processor beside it runs on them, once ready and checked."""
    app = create_app(settings, ModelRegistry.from_settings(settings.models, settings.counting))
    with ServerThread(app, **uvicorn_options(settings.server)) as server:
        wait_healthy(server.url)
        wait_checked(server, settings.upstream.urls[0])
        yield server


@contextmanager
def upstream(tokenizer: Path, **options: Any) -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder(create_simulator(SimulatorSettings(tokenizer=tokenizer, model=MODEL, **options)))
    with ServerThread(recorder) as server:
        yield server.url, recorder


@dataclass
class Rig:
    envoy: Envoy
    serve: str  # token-guard serve in front of the same simulator
    fast: Recorder
    slow: Recorder
    processor: ProcessorThread
    keyed: ProcessorThread  # with limited keys: alice, small (1,000 tokens a minute), few (5 requests a minute)
    keyed_serve: str  # serve on the keyed processor's settings
    tight: ProcessorThread  # room for one request at a time and no queue, in front of the slow simulator
    tight_serve: str  # serve on the tight processor's settings
    strict_serve: str  # serve with a chat template stricter than its upstream's, which cannot count either
    gate: Gate
    picker: Picker  # the endpoint picker's stand-in (listeners picker-first and guard-first)
    trusting: ProcessorThread  # after the picker (picker-first): it trusts the destination the picker names
    gateway: ProcessorThread  # on GATEWAY's settings (listeners gateway and gateway-buffered)
    gateway_serve: str  # serve on them
    raw: RawUpstream  # keeps requests whole, trailers too (listeners raw-duplex and raw-buffered)
    fast_url: str = ""  # the simulator behind most listeners, to ask directly

    def url(self, listener: str) -> str:
        return self.envoy.urls[listener]


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])
