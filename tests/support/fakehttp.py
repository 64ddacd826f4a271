"""The guard's HTTP client toward ASGI apps in its own event loop, without a socket (as httpx's ASGITransport): each
replica's base URL names an app, usually the simulator's, so that every answer is the app's own, streams included
(each body message the app sends is a piece as it is sent). A base with no app is a replica that refuses
connections. Closing an answer before its end is a disconnect, as the app sees one from uvicorn (http.disconnect).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message

from proxy.errors import UpstreamRefused, UpstreamTimeout, UpstreamUnavailable
from proxy.settings import UpstreamSettings
from proxy.upstream.transport import GET_BYTES, Answer

log = logging.getLogger("tests.fakehttp")
END = None  # in an answer's queue: the body is complete
BROKEN = "broken"  # in an answer's queue: the app failed after the status was sent


class AppCall:
    """One request to an app, running in a task: what the app sends goes to `started` and `body`."""

    def __init__(self, app: ASGIApp, scope: dict[str, object], body: bytes) -> None:
        self._request: Message | None = {"type": "http.request", "body": body, "more_body": False}
        self.gone = asyncio.Event()  # the guard closed the answer before its end
        self.started: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.body: asyncio.Queue[bytes | str | None] = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._run(app, scope))

    async def _run(self, app: ASGIApp, scope: dict[str, object]) -> None:
        try:
            await app(scope, self._receive, self._send)
        except Exception:
            log.exception("the app failed answering %s %s", scope["method"], scope["path"])  # as uvicorn logs it
            if self.started.done():
                self.body.put_nowait(BROKEN)  # after the status: the connection breaks
                return
        if not self.started.done():  # what uvicorn answers for an app that failed or returned before its status
            self.started.set_result({"status": 500, "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
            self.body.put_nowait(b"Internal Server Error")
        self.body.put_nowait(END)  # an app that returned without ending its body: the answer ends here

    async def status(self) -> None:
        """Wait for the app's status and headers; a caller that stops waiting (timeout, cancelled) disconnects."""
        try:
            await asyncio.shield(self.started)
        except BaseException:
            self.gone.set()
            raise

    async def _receive(self) -> Message:
        if self._request is not None:
            request, self._request = self._request, None
            return request
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if self.gone.is_set():
            return  # as uvicorn (ASGI spec 2.3): what is sent after a disconnect goes nowhere
        if message["type"] == "http.response.start":
            self.started.set_result(message)
        elif message["type"] == "http.response.body":
            if message.get("body"):
                self.body.put_nowait(bytes(message["body"]))
            if not message.get("more_body", False):
                self.body.put_nowait(END)


class AsgiAnswer(Answer):
    def __init__(self, call: AppCall, base: str, silence_s: float | None) -> None:
        start = call.started.result()
        self._call, self.url, self._silence_s = call, base, silence_s
        self.status = int(start["status"])
        self.raw_headers = [(bytes(k), bytes(v)) for k, v in start.get("headers", [])]
        self.headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self.raw_headers}
        self.content_type = self.headers.get("content-type", "")
        self.is_sse = self.content_type.startswith("text/event-stream")
        self._held: bytes | None = None
        self._ended = False

    async def first(self) -> bytes:
        if self._held is None:
            self._held = await self._next() or b""
        return self._held

    async def pieces(self) -> AsyncGenerator[bytes, None]:
        if self._held is not None:
            held, self._held = self._held, b""
            if held:
                yield held
        while (piece := await self._next()) is not None:
            yield piece

    async def _next(self) -> bytes | None:
        if self._ended:
            return None
        try:
            async with asyncio.timeout(self._silence_s):
                item = await self._call.body.get()
        except TimeoutError:
            raise UpstreamTimeout("The upstream did not answer in time (silent for read_timeout_s).") from None
        if item == BROKEN:
            raise UpstreamUnavailable("The upstream broke the connection.")
        if item is END:
            self._ended = True
            return None
        assert isinstance(item, bytes)
        return item

    def close(self) -> None:
        if not self._ended:
            self._call.gone.set()


class AsgiTransport:
    """transport.Transport over in-memory ASGI apps, with the upstream's header and read timeouts."""

    def __init__(self, apps: Mapping[str, ASGIApp], settings: UpstreamSettings | None = None) -> None:
        self._apps = {base.rstrip("/"): app for base, app in apps.items()}
        self._header_s = min(settings.first_byte_timeout_s, settings.read_timeout_s) if settings else None
        self._read_s = settings.read_timeout_s if settings else None
        self._running: set[asyncio.Task[None]] = set()

    async def open(
        self, method: str, base: str, path: str, query: str, headers: Mapping[str, str], body: bytes
    ) -> AsgiAnswer:
        call = self._start(method, base, path, query, headers, body)
        try:
            async with asyncio.timeout(self._header_s):
                await call.status()
        except TimeoutError:
            raise UpstreamTimeout("The upstream did not answer in time (no response headers).") from None
        return AsgiAnswer(call, base, self._read_s)

    async def get(
        self, base: str, path: str, headers: Mapping[str, str], timeout_s: float, limit: int = GET_BYTES
    ) -> tuple[int, bytes]:
        """The request and its whole answer within `timeout_s`, as http.HttpClient.get."""
        call = self._start("GET", base, path, "", headers, b"")
        try:
            async with asyncio.timeout(timeout_s):
                await call.status()
                answer = AsgiAnswer(call, base, None)
                try:
                    return answer.status, await answer.read(limit)
                finally:
                    answer.close()
        except TimeoutError:
            call.gone.set()
            raise UpstreamTimeout("The upstream did not answer in time (no response headers).") from None

    def _start(self, method: str, base: str, path: str, query: str, headers: Mapping[str, str], body: bytes) -> AppCall:
        app = self._apps.get(base.rstrip("/"))
        if app is None:
            raise UpstreamRefused("The upstream could not be reached (connection refused).")
        call = AppCall(app, scope(method, base, path, query, headers, body), body)
        self._running.add(call.task)
        call.task.add_done_callback(self._running.discard)
        return call

    async def aclose(self) -> None:
        """Cancel what the apps are still doing for answers nobody reads, as closing a pool's connections would."""
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)


def scope(method: str, base: str, path: str, query: str, headers: Mapping[str, str], body: bytes) -> dict[str, object]:
    """The ASGI scope uvicorn would build for this request, with the Host and Content-Length it would receive."""
    parts = urlsplit(base)
    host = parts.hostname or "upstream"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    prefix = parts.path.rstrip("/")
    sent = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()]
    if not any(name == b"host" for name, _ in sent):
        sent.insert(0, (b"host", parts.netloc.rpartition("@")[2].encode("latin-1")))
    if body and not any(name == b"content-length" for name, _ in sent):
        sent.append((b"content-length", str(len(body)).encode()))
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1", "method": method,
        "scheme": parts.scheme or "http", "path": prefix + path, "raw_path": (prefix + path).encode("latin-1"),
        "query_string": query.encode("latin-1"), "root_path": "", "headers": sent, "server": (host, port),
        "client": ("127.0.0.1", 50000),
    }  # fmt: skip
