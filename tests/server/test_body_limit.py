"""Limits at the door: a body above server.max_body_bytes is a 413 without being read whole (declared or chunked), a
body past those the process holds at once (server.max_held_body_bytes) is a 503 with Retry-After (before it is read
when its declared length does not fit), a slow upload holds only what it sent,
a client answered before its upload was read still gets that answer and keeps its connection, and pathological JSON
(deep nesting, too many messages) is a clear 400 before anything else looks at it."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.types import Message

from proxy.errors import PayloadTooLarge, RequestTimeout
from proxy.server.asgi import BODY_IN, Incoming, read_body
from proxy.server.running import ServerThread
from tests.support.polling import eventually
from tests.support.servers import MODEL, guard, simulator
from tests.support.uploads import begun, ended

LIMIT = 64 * 1024
HELD = 256 * 1024  # server.max_body_bytes and server.max_held_body_bytes of the `held` guard


JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[Any]:
    with simulator(deepseek_dir) as (server, stats, _):
        yield server, stats


@pytest.fixture(scope="module")
def small(sim: Any, deepseek_dir: Path) -> Iterator[str]:
    with guard(sim[0].url, deepseek_dir, **{"server.max_body_bytes": LIMIT}) as server:
        yield server.url


@pytest.fixture(scope="module")
def held(sim: Any, deepseek_dir: Path) -> Iterator[ServerThread]:
    with guard(
        sim[0].url, deepseek_dir, **{"server.max_body_bytes": HELD, "server.max_held_body_bytes": HELD}
    ) as server:
        yield server


@pytest.fixture(scope="module")
def default(sim: Any, deepseek_dir: Path) -> Iterator[str]:
    with guard(sim[0].url, deepseek_dir) as server:
        yield server.url


def chat(content: str = "Hi", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 3, **fields}


def raw_socket(url: str) -> socket.socket:
    address = urlsplit(url)
    assert address.hostname is not None and address.port is not None
    return socket.create_connection((address.hostname, address.port), timeout=30)


def padded(size: int) -> bytes:
    """A valid chat body of exactly `size` bytes, padded in a field that is not counted (`user`)."""
    raw = json.dumps(chat(user="")).encode()
    return json.dumps(chat(user="x" * (size - len(raw)))).encode()


def assert_too_large(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("PayloadTooLargeError", 413)
    assert f"limit of {LIMIT} bytes" in error["message"]
    assert response.headers["x-request-id"]


def test_declared_length_above_the_limit_is_413_and_never_forwarded(small: str, sim: Any) -> None:
    before = sim[1].received
    assert_too_large(httpx.post(f"{small}/v1/chat/completions", content=padded(LIMIT + 1)))
    assert_too_large(httpx.post(f"{small}/tokenize", content=padded(2 * LIMIT)))  # pass-through routes too
    assert sim[1].received == before


def test_declared_length_is_refused_before_any_body_byte_is_sent(small: str) -> None:
    with raw_socket(small) as conn:
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\n\r\n"
        )  # and not one byte of the gigabyte: a server that waited for it would never answer
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 ")


def test_chunked_body_above_the_limit_is_413_and_never_forwarded(small: str, sim: Any) -> None:
    before = sim[1].received
    raw = padded(4 * LIMIT)
    chunks = (raw[i : i + 4096] for i in range(0, len(raw), 4096))  # no Content-Length: sent chunked
    assert_too_large(httpx.post(f"{small}/v1/chat/completions", content=chunks))
    assert sim[1].received == before


def test_a_chunked_body_above_the_limit_that_arrives_in_one_piece_is_413(small: str, sim: Any) -> None:
    """Sent in one write, the body is usually all in before the guard reads it, and taken without a deadline."""
    before = sim[1].received
    raw = padded(LIMIT + 100)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(raw), raw)
    with raw_socket(small) as conn:
        conn.sendall(head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += conn.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert sim[1].received == before


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_a_body_past_those_held_at_once_is_503_unread_and_the_room_comes_back(
    held: ServerThread, sim: Any, chunked: bool
) -> None:
    raw, bodies = padded(HELD * 3 // 4), held.app.core.bodies
    holding = begun(held.url, raw, chunked)
    assert eventually(lambda: bodies.held >= len(raw) - 1000)  # its declared length, or what came of it
    before = sim[1].received
    for late in (raw, iter([raw[:100], raw[100:]])):  # declared: refused from its length; chunked: at the piece
        refused = httpx.post(f"{held.url}/v1/chat/completions", content=late, headers=JSON)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("ServiceUnavailableError", "server_busy")
        assert "server.max_held_body_bytes" in error["message"] and refused.headers["x-request-id"]
    assert sim[1].received == before
    assert ended(holding, raw, chunked) == 200
    assert eventually(lambda: bodies.held == 0)  # given back with its request
    assert httpx.post(f"{held.url}/v1/chat/completions", content=raw, headers=JSON).status_code == 200


def test_a_slow_upload_holds_only_what_it_sent_not_the_room_it_declared(held: ServerThread, sim: Any) -> None:
    """Three clients that declare most of the room each and send a trickle: at 0d315b6 their declared
    lengths held every other upload off (503) until server.read_timeout_s ran out; they hold a few bytes."""
    raw, bodies = padded(HELD * 3 // 4), held.app.core.bodies
    trickles = []
    for _ in range(3):
        conn = raw_socket(held.url)
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw[:100]))  # fmt: skip
        trickles.append(conn)
    try:
        assert eventually(lambda: bodies.held == 300)  # what came of them
        assert httpx.post(f"{held.url}/v1/chat/completions", content=raw, headers=JSON).status_code == 200
    finally:
        for conn in trickles:
            conn.close()
    assert eventually(lambda: bodies.held == 0)


def test_an_upload_answered_before_it_was_read_gets_that_answer_and_keeps_its_connection(small: str) -> None:
    """A client that sends its whole body before it reads (httpx, the OpenAI SDK): the rest of the upload is read
    and dropped, not taken for the next request's headers (at e63017a: a 431 after the 413, and a reset)."""
    raw = padded(4 * LIMIT)
    with raw_socket(small) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(raw), raw))  # fmt: skip
        conn.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        with conn.makefile("rb") as answers:
            first, second = _answer(answers), _answer(answers)
    assert first[0] == 413 and f"limit of {LIMIT} bytes".encode() in first[1]
    assert second == (200, b'{"status":"alive"}')


def _answer(answers: Any) -> tuple[int, bytes]:
    """One HTTP/1.1 answer with a Content-Length, read off the connection: its status and body."""
    status, length = int(answers.readline().split()[1]), 0
    while (line := answers.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
    return status, bytes(answers.read(length))


@pytest.mark.parametrize("size", [LIMIT // 2, LIMIT])
def test_bodies_up_to_the_limit_pass(small: str, size: int) -> None:
    raw = padded(size)
    assert httpx.post(f"{small}/v1/chat/completions", content=raw, headers=JSON).status_code == 200
    chunked = iter([raw[:100], raw[100:]])
    assert httpx.post(f"{small}/v1/chat/completions", content=chunked, headers=JSON).status_code == 200


def test_counting_stops_reading_at_the_limit() -> None:
    pulled = 0

    async def receive() -> Message:
        nonlocal pulled
        pulled += 1
        return {"type": "http.request", "body": b"x" * 1000, "more_body": True}  # an endless upload

    async def read_all() -> None:
        scope = {"method": "POST", "path": "/v1/chat/completions", "query_string": b"", "headers": []}
        await read_body(receive, Incoming(scope), 10_500, timeout_s=30)

    with pytest.raises(PayloadTooLarge):
        asyncio.run(read_all())
    assert pulled == 11  # the chunk that crossed 10,500 bytes was the last one taken


def test_a_body_said_to_be_in_but_still_arriving_keeps_its_deadline() -> None:
    """A server that says the body is in (BODY_IN) but hands over only part of it: the rest is still waited for
    within the read timeout, not for ever."""
    first = True

    async def receive() -> Message:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": b'{"model":', "more_body": True}
        await asyncio.Event().wait()  # the rest never comes
        raise AssertionError("unreachable")

    async def read() -> bytes:
        scope = {"method": "POST", "path": "/", "query_string": b"", "headers": [], BODY_IN: lambda: True}
        return await read_body(receive, Incoming(scope), 10_500, timeout_s=0.2)

    with pytest.raises(RequestTimeout, match="got 9 bytes"):
        asyncio.run(read())


def test_a_body_that_is_in_is_read_whole_and_held_to_the_limit() -> None:
    async def read(body: bytes) -> bytes:
        async def receive() -> Message:
            return {"type": "http.request", "body": body, "more_body": False}

        scope = {"method": "POST", "path": "/", "query_string": b"", "headers": [], BODY_IN: lambda: True}
        return await read_body(receive, Incoming(scope), 100, timeout_s=30)

    assert asyncio.run(read(b"x" * 100)) == b"x" * 100
    with pytest.raises(PayloadTooLarge):
        asyncio.run(read(b"x" * 101))


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def test_deep_nesting_is_a_400_at_the_guard(default: str, sim: Any) -> None:
    before = sim[1].received
    message = {"role": "user", "content": "Hi", "extra": nested(100)}
    response = httpx.post(f"{default}/v1/chat/completions", json={"model": MODEL, "messages": [message]})
    assert response.status_code == 400
    assert "nested too deeply" in response.json()["error"]["message"]
    bomb = b'{"messages": ' + b"[" * 5_000_000 + b"]" * 5_000_000 + b"}"
    response = httpx.post(f"{default}/v1/completions", content=bomb, timeout=60)
    assert response.status_code == 400 and "nested too deeply" in response.json()["error"]["message"]
    assert sim[1].received == before


def test_too_many_messages_is_a_400_at_the_guard(default: str, sim: Any) -> None:
    before = sim[1].received
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}] * 10_001}
    response = httpx.post(f"{default}/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "messages" and "at most 10000" in error["message"]
    assert sim[1].received == before
