"""`token-guard extproc`: the guard served as Envoy's external processor (envoy.service.ext_proc.v3, gRPC on
grpc.aio), with the same core as serve (exchange/core.py) and its background work, and gRPC's health service for
probes (SERVING once the guard is ready: the upstream's models known and a replica healthy).

On SIGTERM or SIGINT it drains (exchange/drain.py): the health service says NOT_SERVING and new streams are refused
(UNAVAILABLE), so that Envoy's health checks move traffic to another processor; the streams in flight get
server.drain_timeout_s to end. Then each stream still open is cut: a request not yet sent on gets a 503 in the
route's envelope (Retry-After), an answer under way is let go (Envoy carries it on without the processor). What they
held is given back, the Redis link and the child processes are closed, one line says what was cut, and the process
exits 0.

gRPC's message limits are raised to what a body may be (server.max_body_bytes, plus room for headers): a BUFFERED
body comes whole in one message and a rewritten one goes back whole. Envoy's keepalive PINGs are welcome."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import uvloop
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc

from proxy.counting.registry import ModelRegistry
from proxy.exchange.core import Core
from proxy.exchange.drain import Drain
from proxy.extproc.gateway import Gateway
from proxy.extproc.stream import Stream
from proxy.extproc.wire import ProcessingRequest
from proxy.settings import Settings
from proxy.upstream.transport import Transport

log = logging.getLogger("token_guard.extproc")

HEADROOM_BYTES = 2**20  # a message's headers and framing, beyond its body
HEALTH = "grpc.health.v1.Health"
NEW_LOOP = uvloop.new_event_loop  # the processor's event loop: uvloop, as serve's
# Envoy's HTTP/2 keepalive (the shipped configurations' connection_keepalive) is how it finds a processor that stopped
# answering: grpc's default answers a PING more often than every 5 minutes without data with GOAWAY "too many pings",
# which resets every request on the connection, one held in admission's queue included
PINGS_WELCOME = [("grpc.http2.max_ping_strikes", 0), ("grpc.keepalive_permit_without_calls", 1)]
SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"  # grpc.health.v1.HealthCheckResponse{status: 1 or 2}, encoded
STOPPING = "token-guard is stopping: this processor takes no new stream"
LIVENESS = "liveness"  # the health service's name for "the process serves" (a Kubernetes liveness probe asks it)
CUT_S = 0.5  # how long the streams cut at the drain's end get to answer and give back what they held


class Processor(ext_proc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, core: Core) -> None:
        self.core = core
        self.gateway = Gateway(core)
        self.max_body_bytes = core.settings.server.max_body_bytes

    async def Process(self, requests: AsyncIterator[ProcessingRequest], context: grpc.aio.ServicerContext) -> None:  # noqa: N802 (gRPC's name)
        """One HTTP exchange: each message answered as it comes; what the request held is given back when the
        processor answers it itself, or Envoy closes the stream, or cancels it (its client left), or the drain cuts
        it."""
        drain = self.core.drain
        if drain.stopping:
            await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)
        task = asyncio.current_task()
        assert task is not None
        drain.enter(task)
        stream = Stream(self.core, self.gateway, self.max_body_bytes)
        decided = False  # Envoy has the answer that sends the request on, or answers it (Stream.decided)
        try:
            async for answers in stream.run(requests):
                for answer in answers:
                    await context.write(answer)
                decided = stream.decided  # only once written: until then Envoy may still wait for it
        except asyncio.CancelledError:
            if not drain.cutting:  # Envoy cancelled it: its client left
                raise
            task.uncancel()
            await _cut(stream, context, drain, decided)
        finally:
            try:
                await stream.close()
            finally:
                drain.leave(task)

    async def check(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """gRPC's health service. The server's own health (service "", as Envoy's health checks and Kubernetes'
        readiness probe ask it): SERVING once the guard is ready, NOT_SERVING from the stop. Service "liveness":
        SERVING while the process serves, whatever the upstream's state (serve's /livez)."""
        service = _service(request)
        if service == LIVENESS:
            return SERVING
        if service:
            await context.abort(grpc.StatusCode.NOT_FOUND, f'unknown service {service!r}: ask "" or "{LIVENESS}"')
        status, _ = await self.core.readiness()
        return SERVING if status == 200 else NOT_SERVING


def _service(request: bytes) -> str:
    """grpc.health.v1.HealthCheckRequest's `service` (field 1, a string): its tag, a varint length, its bytes."""
    if request[:1] != b"\n":
        return ""
    length, shift, at = 0, 0, 1
    while at < len(request):
        byte = request[at]
        length, shift, at = length | (byte & 0x7F) << shift, shift + 7, at + 1
        if byte < 0x80:
            break
    return request[at : at + length].decode("utf-8", "replace")


def grpc_server(core: Core) -> grpc.aio.Server:
    size = core.settings.server.max_body_bytes + HEADROOM_BYTES
    options = [("grpc.max_receive_message_length", size), ("grpc.max_send_message_length", size), *PINGS_WELCOME]
    server = grpc.aio.server(options=options)
    processor = Processor(core)
    ext_proc.add_ExternalProcessorServicer_to_server(processor, server)
    check = grpc.unary_unary_rpc_method_handler(processor.check)  # bytes in, bytes out: no generated module needed
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(HEALTH, {"Check": check})])
    return server


@dataclass(frozen=True)
class Served:
    port: int
    core: Core


async def _cut(stream: Stream, context: grpc.aio.ServicerContext, drain: Drain, decided: bool) -> None:
    """A stream still open at the drain's end. A request Envoy has not been told to send on is answered 503
    (Retry-After: another processor takes it), and its stream ends in an error, never cleanly: Envoy takes a clean end
    as "nothing more to process" and would send the request on unguarded. A request already sent on is let go: its
    stream ends cleanly, and its answer goes on through Envoy without the processor."""
    if decided:
        drain.was_cut("let go mid-answer")
        return
    drain.was_cut("answered 503")
    try:
        for answer in await stream.cut():
            await context.write(answer)
    finally:
        await context.abort(grpc.StatusCode.UNAVAILABLE, STOPPING)


@contextlib.asynccontextmanager
async def running(
    settings: Settings, registry: ModelRegistry, transport: Transport | None = None, port: int | None = None,
    grace_s: float | None = None,
) -> AsyncIterator[Served]:  # fmt: skip
    """The processor served on server.host and `port` (default extproc.port; 0: a free one), with the core's
    background work, until the block exits; yields its port and core. Then it drains: streams still open get
    `grace_s` to end (None: as long as they take), and are cut after it."""
    core = Core(settings, registry, transport, chunk_instead=settings.extproc.chunk_instead)
    server = grpc_server(core)
    host, port = settings.server.host, settings.extproc.port if port is None else port
    bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    async with core:
        await server.start()
        try:
            yield Served(int(bound), core)
        finally:
            await _drained(server, core.drain, grace_s)
    core.drain.report("token-guard extproc", grace_s)


async def _drained(server: grpc.aio.Server, drain: Drain, grace_s: float | None) -> None:
    """New streams refused, those in flight given `grace_s`, the rest cut; then the server stops."""
    drain.stop()
    if not await drain.all_ended(grace_s):
        drain.cut_all()
        await drain.all_ended(CUT_S)
    await server.stop(0)  # and what is left of a stream that did not end in time is cancelled by gRPC


def serve(settings: Settings, registry: ModelRegistry) -> None:
    """Run until SIGTERM or SIGINT, then drain: open streams end within server.drain_timeout_s, or are cut."""
    with asyncio.Runner(loop_factory=NEW_LOOP) as runner:
        runner.run(_serve(settings, registry))


async def _serve(settings: Settings, registry: ModelRegistry) -> None:
    grace_s = settings.server.drain_timeout_s
    async with running(settings, registry, grace_s=grace_s) as served:
        log.info("token-guard extproc: Envoy's external processor on %s:%d (gRPC), upstream %s",
                 settings.server.host, served.port, ", ".join(settings.upstream.urls))  # fmt: skip
        told: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        for signum in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(signum, _tell, told, signum)
        name = signal.Signals(await told).name
        drain = served.core.drain
        drain.stop()
        log.info("token-guard extproc: %s: no new streams (gRPC health NOT_SERVING); %d in flight get up to %g s "
                 "(server.drain_timeout_s)", name, drain.in_flight, grace_s)  # fmt: skip


def _tell(told: asyncio.Future[int], signum: int) -> None:
    if not told.done():
        told.set_result(signum)
