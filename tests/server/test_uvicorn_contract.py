"""What proxy/server/protocol.py relies on in uvicorn's internal httptools protocol, checked on the uvicorn installed:
the version pyproject.toml allows, the methods the subclass overrides and their signatures, how uvicorn builds the
protocol, the attributes it reads, and the parser paths it hooks into. An upgrade that changes any of them fails here
rather than in production; widen the pin only once this file passes on the new version."""

from __future__ import annotations

import asyncio
import inspect
import pickle
import tomllib
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from proxy import error_bodies
from proxy.errors import HeaderTooLarge, InvalidRequest
from proxy.server.asgi import BODY_IN, CLIENT_GONE, DONE, NOTHING, ON_GONE, SENT, TARGET
from proxy.server.protocol import ConnectionLimits, GuardedHttpProtocol, protocol_factory
from proxy.server.running import uvicorn_options
from proxy.settings import ServerSettings

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
REQUEST = b"GET /v1/models HTTP/1.1\r\nhost: guard\r\n\r\n"


def test_the_installed_uvicorn_is_one_the_pin_allows() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    pin = next(Requirement(d) for d in dependencies if Requirement(d).name == "uvicorn")
    assert pin.specifier.contains(Version(uvicorn.__version__)), (uvicorn.__version__, str(pin))
    assert any(s.operator == "<" for s in pin.specifier), "uvicorn needs an upper bound: protocol.py uses its internals"


def parameters(function: Any) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


OVERRIDDEN = sorted(
    name for name, value in vars(GuardedHttpProtocol).items() if callable(value) and name != "__init__"
    and hasattr(HttpToolsProtocol, name)
)  # fmt: skip


def test_the_subclass_overrides_methods_uvicorn_still_has() -> None:
    expected = ["connection_lost", "connection_made", "data_received", "on_headers_complete", "on_message_begin",
                "on_message_complete", "on_response_complete", "pause_writing", "resume_writing",
                "send_400_response"]  # fmt: skip
    assert OVERRIDDEN == expected  # a method renamed or dropped in uvicorn would leave an override never called


@pytest.mark.parametrize("name", OVERRIDDEN)
def test_each_override_takes_what_uvicorn_passes(name: str) -> None:
    assert parameters(getattr(GuardedHttpProtocol, name)) == parameters(getattr(HttpToolsProtocol, name))


def test_uvicorn_builds_the_protocol_with_the_keywords_the_subclass_passes_on() -> None:
    kinds = inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert parameters(HttpToolsProtocol.__init__) == [
        ("self", kinds), ("config", kinds), ("server_state", kinds), ("app_state", kinds), ("_loop", kinds),
    ]  # fmt: skip
    startup = inspect.getsource(uvicorn.Server.startup)
    assert "config.http_protocol_class(" in startup  # the factory given as `http` is what it calls per connection
    for keyword in ("config=", "server_state=", "app_state=", "_loop="):
        assert keyword in startup


def test_the_limits_reach_worker_processes_with_uvicorns_config() -> None:
    """`serve --workers N`: uvicorn pickles its config into each spawned worker, the protocol factory with it."""
    options = uvicorn_options(ServerSettings(read_timeout_s=4.0, write_timeout_s=6.0))
    config = pickle.loads(pickle.dumps(uvicorn.Config("proxy.server.worker:app", factory=True, workers=2, **options)))
    assert config.http.keywords == {"limits": ConnectionLimits(header_timeout_s=4.0, write_timeout_s=6.0)}
    assert config.http.func is GuardedHttpProtocol


def test_flow_control_has_what_the_subclass_calls() -> None:
    for name in ("pause_reading", "resume_reading", "pause_writing", "resume_writing"):
        assert callable(getattr(FlowControl, name))
    for name in ("response_complete", "disconnected", "more_body", "scope", "response_started", "chunked_encoding"):
        assert name in inspect.getsource(RequestResponseCycle.__init__)  # read on the request's cycle
    assert callable(HttpToolsProtocol._unset_keepalive_if_required)  # while the rest of an unread body arrives


class Transport(asyncio.Transport):
    """A connection held in memory: what the protocol writes, and whether it closed it."""

    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5000) if name in ("peername", "sockname") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def ok(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})


def connected(limits: ConnectionLimits | None = None) -> tuple[GuardedHttpProtocol, Transport]:
    """The protocol as uvicorn builds it from the guard's options (inside a running loop), connected in memory."""
    options = uvicorn_options(ServerSettings(read_timeout_s=7.0, write_timeout_s=9.0))
    if limits is not None:
        options["http"] = protocol_factory(limits)
    config = uvicorn.Config(ok, lifespan="off", log_level="warning", **options)
    config.load()
    factory: Any = config.http_protocol_class  # typed by uvicorn as a class of asyncio.Protocol
    built = factory(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
    assert isinstance(built, GuardedHttpProtocol)
    transport = Transport()
    built.connection_made(transport)
    return built, transport


def test_a_request_goes_through_the_hooks_with_what_they_read() -> None:
    async def run() -> None:
        protocol, transport = connected()
        assert (protocol.header_timeout_s, protocol.write_timeout_s) == (7.0, 9.0)  # from the settings, per server
        assert protocol.transport is transport and isinstance(protocol.flow, FlowControl)
        assert protocol.client == ("127.0.0.1", 5000) and protocol.loop is asyncio.get_running_loop()
        assert protocol._deadline is not None  # connection_made armed the header deadline
        protocol.data_received(REQUEST)
        assert protocol.url == b"/v1/models" and (b"host", b"guard") in protocol.headers
        assert protocol._deadline is None  # on_headers_complete ran: the headers are in
        cycle = protocol.cycle
        assert cycle.scope is protocol.scope and {CLIENT_GONE, ON_GONE, BODY_IN, TARGET, SENT} <= set(protocol.scope)
        assert protocol.scope[TARGET] == b"/v1/models" and protocol.scope[BODY_IN]() is True
        assert protocol.scope[SENT]() == NOTHING
        for _ in range(100):  # the app's task runs on this loop
            if cycle.response_complete:
                break
            await asyncio.sleep(0)
        assert transport.written.startswith(b"HTTP/1.1 200") and transport.written.endswith(b"ok")
        assert protocol.scope[SENT]() == DONE
        assert not protocol._in_request and protocol._deadline is not None  # on_response_complete: idle, re-armed
        protocol.pause_writing()
        assert protocol.flow.write_paused and protocol._stalled is not None
        protocol.resume_writing()
        assert not protocol.flow.write_paused and protocol._stalled is None
        protocol.connection_lost(None)
        assert protocol._lost_at is not None and protocol._deadline is None

    asyncio.run(run())


def test_a_parser_error_reaches_send_400_response() -> None:
    async def run() -> None:
        protocol, transport = connected()
        protocol.data_received(b"\x00 this is not HTTP\r\n\r\n")
        assert transport.closed
        assert transport.written == error_bodies.raw_reply(
            InvalidRequest("Invalid HTTP request received. (the request line or headers could not be parsed)")
        )

    asyncio.run(run())


def test_an_exception_raised_in_a_parser_callback_reaches_send_400_response() -> None:
    """on_headers_complete stops the parser by raising: uvicorn must turn that into send_400_response."""

    async def run() -> None:
        protocol, transport = connected(ConnectionLimits(max_header_bytes=100))
        protocol.data_received(b"GET / HTTP/1.1\r\nhost: guard\r\nx-big: " + b"a" * 200 + b"\r\n\r\n")
        assert transport.closed
        assert transport.written == error_bodies.raw_reply(
            HeaderTooLarge("The request line and headers are larger than 100 bytes.")
        )

    asyncio.run(run())
