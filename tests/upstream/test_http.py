"""The upstream client sends a request's headers as they are: nothing added that the client did not send (aiohttp
would add User-Agent, Accept, Accept-Encoding and Content-Type), nothing changed that it did send."""

from __future__ import annotations

import asyncio

import pytest

from proxy.settings import UpstreamSettings
from proxy.upstream.http import HttpClient

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
    client = HttpClient(UpstreamSettings(url="http://unused"))
    try:
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        response = await client.open("POST", base, "/v1/chat/completions", "", headers, b'{"model":"m"}')
        assert (response.status, await response.read()) == (200, b"{}")
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
