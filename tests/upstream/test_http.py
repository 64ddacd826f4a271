"""The upstream client sends a request's headers as they are: nothing added that the client did not send (aiohttp
would add User-Agent, Accept, Accept-Encoding and Content-Type), nothing changed that it did send; and it reads no
more of an answer it reads whole than its limit."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from proxy.errors import UpstreamTooLarge
from proxy.settings import UpstreamSettings
from proxy.upstream.http import HttpClient

T = TypeVar("T")
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def sent_head(headers: dict[str, str]) -> dict[str, str]:
    """The header lines a loopback upstream received for a POST with these headers, lower-cased names."""
    heads: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(ANSWER)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    client = HttpClient(UpstreamSettings(urls=("http://unused",)))
    try:
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        response = await client.open("POST", base, "/v1/chat/completions", "", headers, b'{"model":"m"}')
        assert (response.status, await response.read(1024)) == (200, b"{}")
        response.close()
    finally:
        await client.aclose()
        server.close()
    lines = heads[0].decode("latin-1").split("\r\n")[1:]
    return {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines if line)}


@pytest.mark.parametrize(
    "given",
    [{}, {"content-type": "application/json"}, {"User-Agent": "OpenAI/Python 2.8.1", "x-request-id": "r1"},
     {"user-agent": "ua", "accept": "application/json", "accept-encoding": "identity", "content-type": "text/plain"}],
    ids=["none", "content type only", "mixed case", "all four"],
)  # fmt: skip
def test_only_the_clients_own_headers_go_upstream(given: dict[str, str]) -> None:
    head = asyncio.run(sent_head(given))
    assert {k: v for k, v in head.items() if k not in ("host", "content-length")} == {
        k.lower(): v for k, v in given.items()
    }
    assert head["content-length"] == "13"


class Endless:
    """A loopback upstream that answers every request with a body that never ends; `sent` counts the body bytes it
    got out, and `closed` is set once the guard has hung up on it."""

    def __init__(self) -> None:
        self.sent, self.closed = 0, asyncio.Event()

    async def answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"x" * 65536
        try:
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
                self.sent += len(chunk)
        except (ConnectionError, OSError):
            self.closed.set()


async def against_endless(work: Callable[[HttpClient, str], Awaitable[T]]) -> tuple[T | UpstreamTooLarge, Endless]:
    """What `work(client, base)` returns or raises against an endless answer, once the upstream saw the connection
    closed (within 10 s, else TimeoutError)."""
    endless = Endless()
    server = await asyncio.start_server(endless.answer, "127.0.0.1", 0)
    client = HttpClient(UpstreamSettings(urls=("http://unused",)))
    try:
        result: T | UpstreamTooLarge = await work(client, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    except UpstreamTooLarge as exc:
        result = exc
    try:
        await asyncio.wait_for(endless.closed.wait(), 10)
    finally:
        await client.aclose()
        server.close()
    return result, endless


async def read_whole(client: HttpClient, base: str) -> bytes:
    response = await client.open("GET", base, "/", "", {}, b"")
    try:
        return await response.read(100_000)
    finally:
        response.close()


async def read_head(client: HttpClient, base: str) -> tuple[bytes, bool]:
    response = await client.open("GET", base, "/", "", {}, b"")
    try:
        return await response.head(100_000)
    finally:
        response.close()


async def get(client: HttpClient, base: str) -> tuple[int, bytes]:
    return await client.get(base, "/metrics", {}, timeout_s=10, limit=100_000)


@pytest.mark.parametrize("work", [read_whole, get], ids=["read", "get"])
def test_an_answer_read_whole_stops_at_its_limit_and_its_connection_is_closed(
    work: Callable[[HttpClient, str], Awaitable[object]],
) -> None:
    result, endless = asyncio.run(against_endless(work))
    assert isinstance(result, UpstreamTooLarge) and result.status == 502
    assert "larger than 100000 bytes" in result.message
    assert endless.closed.is_set() and endless.sent < 2**20 * 16  # hung up on, not drained


def test_the_head_of_an_answer_is_its_first_bytes_and_says_there_was_more() -> None:
    result, endless = asyncio.run(against_endless(read_head))
    assert result == (b"x" * 100_000, True) and endless.closed.is_set()
