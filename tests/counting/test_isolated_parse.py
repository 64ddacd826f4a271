"""The largest request bodies, and those of many values, are parsed in a child process (counting/isolated.py), so
that the event loop keeps answering: the result and the errors are the same as parsing here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from proxy import error_bodies
from proxy.api.body import MAX_VALUES, parse_json_object
from proxy.counting.isolated import LARGE_BODY_BYTES, LOOP_VALUES, BodyParser
from proxy.errors import GuardError, InvalidRequest


@pytest.fixture(scope="module")
def parser() -> Iterator[BodyParser]:
    parser = BodyParser()
    yield parser
    parser.close()


def large(content: str = "word " * (LARGE_BODY_BYTES // 5)) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 3}).encode()


def test_a_large_body_parsed_in_the_child_is_the_body_parsed_here(parser: BodyParser) -> None:
    raw = large("naïve 東京 🎉 " * (LARGE_BODY_BYTES // 20))
    assert len(raw) >= LARGE_BODY_BYTES
    assert asyncio.run(parser.parse(raw, 64)) == parse_json_object(raw, 64)


def many_values(count: int = 2 * LOOP_VALUES) -> bytes:
    """A body far below LARGE_BODY_BYTES of many values of every JSON kind."""
    values = [[i, -i * 0.5, None, True, "naïve 東京", {"k": [1e300, -(2**70)]}] for i in range(count // 12)]
    return json.dumps({"model": "m", "prompt": list(range(count // 2)), "extra": values, "long": 10**4299}).encode()


def test_a_body_of_many_values_parsed_in_the_child_is_the_body_parsed_here(parser: BodyParser) -> None:
    raw = many_values()
    assert len(raw) < LARGE_BODY_BYTES
    assert json.dumps(asyncio.run(parser.parse(raw, 64))) == json.dumps(parse_json_object(raw, 64))


@pytest.mark.parametrize("raw", [large(), many_values()], ids=["large", "many values"])
def test_the_loop_keeps_turning_while_the_child_parses(parser: BodyParser, raw: bytes) -> None:

    async def run() -> int:
        turns = 0
        parsing = asyncio.ensure_future(parser.parse(raw, 64))
        while not parsing.done():
            await asyncio.sleep(0)
            turns += 1
        await parsing
        return turns

    assert asyncio.run(run()) > 1  # parsed here, the parse would have been done within the first turn


@pytest.mark.parametrize(
    ("raw", "message", "kind"),
    [
        (large()[:-1], "The request body is not valid JSON", InvalidRequest),
        (b"[" * 100 + large() + b"]" * 100, "nested too deeply", InvalidRequest),
        (b'["' + b"x" * LARGE_BODY_BYTES + b'"]', "must be a JSON object", InvalidRequest),
        (large("a\\ud800b" + "c" * LARGE_BODY_BYTES).replace(b"\\\\ud800", b"\\ud800"), "lone surrogate",
         InvalidRequest),
        (b'{"unused": [' + b",".join([b"[]"] * (LARGE_BODY_BYTES // 3)) + b"]}", "(server.max_json_values)",
         InvalidRequest),
        (b'{"unused": [' + b",".join([b"{}"] * (MAX_VALUES // 2 + 1)) + b"]}", "(server.max_json_values)",
         InvalidRequest),
        (large().replace(b'"max_tokens": 3', b'"max_tokens": 1' + b"0" * 5000), "more than 4300 digits",
         InvalidRequest),
        (many_values().replace(b'"prompt": [0,', b'"prompt": [1' + b"0" * 5000 + b","), "more than 4300 digits",
         InvalidRequest),
        (large().decode().encode("utf-16"), "The request body is UTF-16 text", InvalidRequest),
        (large("a\udc00b" * (LARGE_BODY_BYTES // 5)).decode().encode("utf-8", "surrogatepass").replace(
            b"\\udc00", b"\xed\xb0\x80"), "lone surrogate", InvalidRequest),
    ],
)  # fmt: skip
def test_a_large_body_the_child_refuses_is_refused_with_the_same_error(
    parser: BodyParser, raw: bytes, message: str, kind: type[Exception]
) -> None:
    with pytest.raises(kind) as here:
        parse_json_object(raw, 64)
    with pytest.raises(kind) as there:
        asyncio.run(parser.parse(raw, 64))
    assert message in there.value.args[0]
    assert isinstance(there.value, GuardError) and isinstance(here.value, GuardError)
    assert (type(there.value), error_bodies.body(there.value)) == (type(here.value), error_bodies.body(here.value))


def test_a_body_that_is_not_utf8_never_reaches_the_child() -> None:
    """A 31.5 MiB UTF-16 body of `[]`: refused from its first bytes, before it is scanned or sent to be parsed."""
    fresh = BodyParser()
    try:
        raw = ('{"unused": [' + ",".join(["[]"] * (31 * 2**20 // 6)) + "]}").encode("utf-16-le")
        with pytest.raises(InvalidRequest, match="UTF-16-LE text; a JSON request body must be UTF-8"):
            asyncio.run(fresh.parse(raw, 64))
        assert fresh.child._pool is None  # no child process was started for it
    finally:
        fresh.close()
