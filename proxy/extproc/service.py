"""`token-guard extproc`: the guard served as Envoy's external processor (envoy.service.ext_proc.v3, gRPC on
grpc.aio), with the same core as serve (exchange/core.py) and its background work, and gRPC's health service for
probes (SERVING once the guard is ready: the upstream's models known and a replica healthy).

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


class Processor(ext_proc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, core: Core) -> None:
        self.core = core
        self.gateway = Gateway(core)
        self.max_body_bytes = core.settings.server.max_body_bytes

    async def Process(self, requests: AsyncIterator[ProcessingRequest], context: grpc.aio.ServicerContext) -> None:  # noqa: N802 (gRPC's name)
        """One HTTP exchange: each message answered as it comes; what the request held is given back when Envoy
        closes the stream, or cancels it (its client left)."""
        stream = Stream(self.core, self.gateway, self.max_body_bytes)
        try:
            async for answers in stream.run(requests):
                for answer in answers:
                    await context.write(answer)
        finally:
            await stream.close()

    async def check(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        status, _ = await self.core.readiness()
        return SERVING if status == 200 else NOT_SERVING


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


@contextlib.asynccontextmanager
async def running(
    settings: Settings, registry: ModelRegistry, transport: Transport | None = None, port: int | None = None,
    grace_s: float | None = None,
) -> AsyncIterator[Served]:  # fmt: skip
    """The processor served on server.host and `port` (default extproc.port; 0: a free one), with the core's
    background work, until the block exits; yields its port and core. Streams still open get `grace_s` to end."""
    core = Core(settings, registry, transport, chunk_instead=settings.extproc.chunk_instead)
    server = grpc_server(core)
    host, port = settings.server.host, settings.extproc.port if port is None else port
    bound = server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    async with asyncio.TaskGroup() as group:
        jobs = [group.create_task(job) for job in core.jobs()]
        await server.start()
        try:
            yield Served(int(bound), core)
        finally:
            await server.stop(grace_s)
            for job in jobs:
                job.cancel()
    await core.aclose()


def serve(settings: Settings, registry: ModelRegistry) -> None:
    """Run until SIGTERM or SIGINT, then let open streams end for up to server.drain_timeout_s."""
    with asyncio.Runner(loop_factory=NEW_LOOP) as runner:
        runner.run(_serve(settings, registry))


async def _serve(settings: Settings, registry: ModelRegistry) -> None:
    async with running(settings, registry, grace_s=settings.server.drain_timeout_s) as served:
        log.info("token-guard extproc: Envoy's external processor on %s:%d (gRPC), upstream %s",
                 settings.server.host, served.port, ", ".join(settings.upstream.urls))  # fmt: skip
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        await stopping.wait()
