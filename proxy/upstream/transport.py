"""What the guard uses of an HTTP client toward the upstream, as a seam: send a request and have its status and
headers, read or stream its body, close. http.py's aiohttp client is the one the guard serves with; a test can pass
another (as httpx's MockTransport swaps for its network transport), such as one that drives the simulator's ASGI app
in memory (tests/support/fakehttp.py).

And how much of an answer the guard reads whole: an upstream that answers with hundreds of megabytes (broken, or not
the server it should be) would otherwise take the guard's memory and hold its event loop while the body is joined.
What is relayed piece by piece needs no limit, as flow control keeps only a buffer of it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Protocol

from proxy.errors import UpstreamTooLarge

# The most the guard reads of an answer it reads whole (Answer.read, Transport.get).
ERROR_BYTES = 64 * 2**10  # an error's body: a 5xx is relayed cut to this, the rest dropped with the connection
GET_BYTES = 2**20  # the guard's own GETs (/health, /v1/models, /version) and the model lists it filters for a key
METRICS_BYTES = 16 * 2**20  # vLLM's Prometheus /metrics, read for the KV budget (~100 KB for one model)
ANSWER_BYTES = 64 * 2**20  # a whole generation's answer (a chunked request's parts)
EVENT_BYTES = 4 * 2**20  # one event of a stream the guard parses (a chunked request's parts)


def count_bytes(sent: int) -> int:
    """The limit for a counting answer (/tokenize, the render endpoints): it lists a token id per prompt token, so it
    grows with the request; 16 bytes per byte sent holds a token per byte, and 1 MiB the images a URL names."""
    return 2**20 + 16 * sent


class Answer(Protocol):
    """An upstream answer whose status and headers have arrived; the body is still to be read. An implementation
    subclasses this to inherit read() and head(), which are written on pieces()."""

    url: str  # the base URL of the replica that answered
    status: int
    raw_headers: Sequence[tuple[bytes, bytes]]
    headers: Mapping[str, str]
    content_type: str
    is_sse: bool

    async def first(self) -> bytes:
        """The body's first piece, read ahead (b"" for an empty body); pieces() still yields it first."""
        ...

    def pieces(self) -> AsyncGenerator[bytes, None]:
        """The body's bytes as they arrive; a failure is raised as the guard's own error (proxy.errors)."""
        ...

    def close(self) -> None:
        """Release the connection: kept if the answer was read to its end, else closed, which makes vLLM abort the
        generation. Synchronous, so that it happens even while the task is being cancelled."""
        ...

    async def read(self, limit: int) -> bytes:
        """The whole body, or UpstreamTooLarge once it passes `limit` bytes (then nothing more is read, and close()
        closes the connection instead of draining it)."""
        body, cut = await self.head(limit)
        if cut:
            raise UpstreamTooLarge(f"The upstream's answer is larger than {limit} bytes; the guard reads no more.")
        return body

    async def head(self, limit: int) -> tuple[bytes, bool]:
        """The body's first `limit` bytes, and whether there was more (left unread)."""
        pieces: list[bytes] = []
        size = 0
        async with contextlib.aclosing(self.pieces()) as reading:
            async for piece in reading:
                pieces.append(piece)
                size += len(piece)
                if size > limit:
                    return b"".join(pieces)[:limit], True
        return b"".join(pieces), False


class Transport(Protocol):
    """The client toward every replica: one connection pool, with the upstream timeouts."""

    async def open(
        self, method: str, base: str, path: str, query: str, headers: Mapping[str, str], body: bytes
    ) -> Answer:
        """Send a request to the replica at `base` (`path`: a declared route's, `query` as the client sent it);
        return once the status and headers have arrived. Failures are raised as the guard's own errors."""
        ...

    async def get(
        self, base: str, path: str, headers: Mapping[str, str], timeout_s: float, limit: int
    ) -> tuple[int, bytes]:
        """A small GET read whole within `timeout_s` (health, discovery, metrics): status and at most `limit` bytes."""
        ...

    async def aclose(self) -> None: ...
