"""Hostile and careless input, over real sockets to the guard (the simulator behind it in memory): every field with
wrong types, broken and pathological JSON, encodings, paths and methods, header tricks, huge and slow requests. Each
answer is checked for its status, the OpenAI error envelope, no traceback, path or upstream address in it, and a guard
that still serves afterwards."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.support.polling import eventually
from tests.support.prometheus import metric
from tests.support.servers import MODEL, InMemorySim, guard, keyed_guard, simulator, wait_healthy

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
JSON_HEADERS = {"content-type": "application/json"}
LEAKS = ("Traceback", 'File "', "site-packages", "/usr/", "/home/", "/root/", "proxy/")


@pytest.fixture(scope="module")
def proxy(sim: InMemorySim, deepseek_dir: Path) -> Iterator[str]:
    flags = {"model.max_model_len": 2048, "server.read_timeout_s": 1.0}
    with guard(sim, deepseek_dir, **flags) as server:
        yield server.url


def assert_clean_error(response: httpx.Response, status: int, upstream: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    for leak in (*LEAKS, urlsplit(upstream).netloc):
        assert leak not in response.text, leak
    return dict(error)


def assert_still_serving(proxy: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 2}
    response = httpx.post(proxy + CHAT, json=body, timeout=30)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **fields}


WRONG = {"a string": "x", "an object": {"a": 1}, "an array": [1], "a boolean": True, "a fraction": 2.5}
COUNTS = ["max_tokens", "max_completion_tokens", "min_tokens", "n"]
FLAGS = ["stream", "add_generation_prompt", "continue_final_message", "add_special_tokens"]
FIELD_CASES = (
    [(f"{f}={k}", chat(**{f: v}), f) for f in COUNTS for k, v in WRONG.items()]
    + [(f"{f}=negative", chat(**{f: -3}), f) for f in COUNTS]
    + [(f"{f}={k}", chat(**{f: v}), f) for f in FLAGS for k, v in WRONG.items() if k != "a boolean"]
    + [(f"model={k}", chat(model=v), "model") for k, v in WRONG.items() if k != "a string"]
    + [(f"tools={k}", chat(tools=v), "tools") for k, v in WRONG.items() if k != "an array"]
    + [(f"chat_template_kwargs={k}", chat(chat_template_kwargs=v), "chat_template_kwargs")
       for k, v in WRONG.items() if k != "an object"]
    + [(f"messages={k}", chat(messages=v), "messages") for k, v in WRONG.items()]
    + [("messages=[]", chat(messages=[]), "messages"), ("messages=null", chat(messages=None), "messages"),
       ("message is a string", chat(messages=["hi"]), "messages"),
       ("message without role", chat(messages=[{"content": "hi"}]), "messages"),
       ("role is a number", chat(messages=[{"role": 3, "content": "hi"}]), "messages"),
       ("content is a number", chat(messages=[{"role": "user", "content": 3}]), "messages"),
       ("content part is a number", chat(messages=[{"role": "user", "content": [3]}]), "messages"),
       ("tool call is a string", chat(messages=[{"role": "assistant", "content": None, "tool_calls": ["x"]}]),
        "messages"),
       ("continue and generation prompt", chat(continue_final_message=True), "continue_final_message"),
       ("min_tokens over max_tokens", chat(min_tokens=50, max_tokens=5), "min_tokens"),
       ("n is zero", chat(n=0), "n")]
)  # fmt: skip


@pytest.mark.parametrize(("body", "param"), [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES])
def test_every_wrong_chat_field_is_a_clear_400(proxy: str, sim: InMemorySim, body: dict[str, Any], param: str) -> None:
    before = sim.stats.received
    error = assert_clean_error(httpx.post(proxy + CHAT, json=body, timeout=30), 400, sim.url)
    assert error["param"] == param and sim.stats.received == before  # refused at the door
    assert_still_serving(proxy)


PROMPTS = {
    "number": 3, "object": {"a": 1}, "null": None, "empty array": [], "empty batch": [[]], "mixed": ["a", [1, 2]],
    "negative id": [1, -2], "float id": [1, 2.5], "boolean ids": [True, False], "nested too deep": [[[1]]],
}  # fmt: skip


@pytest.mark.parametrize("prompt", PROMPTS.values(), ids=PROMPTS.keys())
def test_every_wrong_prompt_is_a_clear_400(proxy: str, sim: InMemorySim, prompt: Any) -> None:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3}
    error = assert_clean_error(httpx.post(proxy + COMPLETIONS, json=body, timeout=30), 400, sim.url)
    assert error["param"] == "prompt"
    assert_still_serving(proxy)


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


RAW_BODIES = {
    "empty": b"", "truncated": b'{"model": "tiny", "messages": [', "not json": b"hello", "a list": b"[]",
    "a string": b'"hi"', "null": b"null", "trailing comma": b'{"a": 1,}', "single quotes": b"{'a': 1}",
    "invalid utf-8": b'{"model": "\xff\xfe"}',
    "lone surrogate": json.dumps(chat(messages=[{"role": "user", "content": "a\ud800b"}])).encode(),
    "lone surrogate's bytes": b'{"model": "tiny", "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
    "lone low surrogate": b'{"model": "tiny", "messages": [{"role": "user", "content": "\\udc00"}], "max_tokens": 2}',
    "NaN max_tokens": b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": NaN}',
    "Infinity n": b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": Infinity}',
    "bracket bomb": b"[" * 100_000, "object bomb": b'{"a":' * 50_000,
    "deep messages": json.dumps(chat(messages=[{"role": "user", "content": "x", "extra": nested(80)}])).encode(),
    "ten thousand and one messages": json.dumps(chat(messages=[{"role": "user", "content": "x"}] * 10_001)).encode(),
    "values bomb": json.dumps(chat(unused=[[]] * 100_000)).encode(),
    "long integer": json.dumps(chat()).replace('"max_tokens": 5', '"max_tokens": 1' + "0" * 5000).encode(),
}  # fmt: skip


@pytest.mark.parametrize("raw", RAW_BODIES.values(), ids=RAW_BODIES.keys())
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_broken_and_pathological_bodies_are_400(proxy: str, sim: InMemorySim, path: str, raw: bytes) -> None:
    response = httpx.post(proxy + path, content=raw, headers=JSON_HEADERS, timeout=30)
    assert_clean_error(response, 400, sim.url)
    assert_still_serving(proxy)


def with_tool_call(arguments: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    turns = [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "tool_call_id": "c1",
                                                                             "content": "ok"}]  # fmt: skip
    return chat(messages=[{"role": "user", "content": "hi"}, *turns])


BOMBS = {  # each refused before its values are built, by the setting its message names
    "values": (json.dumps(chat(unused=[[]] * 100_000)).encode(), "holds 200007 JSON values; at most 131072 are "
               "accepted (server.max_json_values)"),
    "values in tool call arguments": (json.dumps(with_tool_call(json.dumps([[]] * 100_000))).encode(),
                                      "at most 131072 are accepted (server.max_json_values)"),
    "long integer": (json.dumps(chat()).replace('"max_tokens": 5', '"max_tokens": 1' + "0" * 5000).encode(),
                     "holds an integer of more than 4300 digits"),
}  # fmt: skip


@pytest.mark.parametrize(("raw", "message"), BOMBS.values(), ids=BOMBS.keys())
def test_parsing_bombs_are_a_400_that_says_why(proxy: str, sim: InMemorySim, raw: bytes, message: str) -> None:
    before = sim.stats.received
    response = httpx.post(proxy + CHAT, content=raw, headers=JSON_HEADERS, timeout=30)
    error = assert_clean_error(response, 400, sim.url)
    assert message in error["message"] and error["param"] is None
    assert sim.stats.received == before  # refused at the door
    assert_still_serving(proxy)


def not_utf8(encoding: str) -> dict[str, bytes]:
    """Chat bodies json.loads reads in `encoding` (it guesses from the first four bytes), as vLLM's FastAPI reads them:
    nested 100 deep, of 200,000 values, with a lone surrogate. The bounds scan bytes as UTF-8, and "∀" (U+2200) holds
    a byte 0x22 in UTF-16 and UTF-32, a quote to that scan: the bombs behind it looked like the inside of a string."""
    bodies = {
        "depth 100": chat(hidden="∀", unused=nested(100)),
        "200,000 values": chat(hidden="∀", unused=[[]] * 200_000),
        "lone surrogate": chat(messages=[{"role": "user", "content": "a\ud800b"}]),
    }
    return {f"{encoding} {what}": json.dumps(body, ensure_ascii=False).encode(encoding, "surrogatepass")
            for what, body in bodies.items()}  # fmt: skip


NOT_UTF8 = {**not_utf8("utf-16-le"), **not_utf8("utf-16-be"), **not_utf8("utf-16"), **not_utf8("utf-32")}


@pytest.mark.parametrize("raw", NOT_UTF8.values(), ids=NOT_UTF8.keys())
def test_a_json_body_that_is_not_utf8_is_refused_at_the_door(proxy: str, sim: InMemorySim, raw: bytes) -> None:
    before = sim.stats.received
    error = assert_clean_error(httpx.post(proxy + CHAT, content=raw, headers=JSON_HEADERS, timeout=30), 400, sim.url)
    assert " text; a JSON request body must be UTF-8 (RFC 8259)" in error["message"] and error["param"] is None
    assert sim.stats.received == before
    assert_still_serving(proxy)


def test_a_utf8_byte_order_mark_is_read_past_as_vllm_reads_it(proxy: str, sim: InMemorySim) -> None:
    plain = json.dumps(chat(messages=[{"role": "user", "content": "東京"}], max_tokens=100_000)).encode()
    answers = [httpx.post(proxy + CHAT, content=raw, headers=JSON_HEADERS, timeout=30)
               for raw in (plain, b"\xef\xbb\xbf" + plain)]  # fmt: skip
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].headers["x-token-guard-prompt-tokens"] == answers[1].headers["x-token-guard-prompt-tokens"]
    assert sim.stats.requests[-1] == sim.stats.requests[-2] and sim.stats.requests[-1]["max_tokens"] < 2048


def test_tool_call_arguments_with_an_integer_too_long_to_read_count_as_empty(proxy: str) -> None:
    """As malformed arguments do: vLLM renders {} for them, and one bad turn in a history fails no later request."""
    counts = [httpx.post(proxy + CHAT, json=with_tool_call(arguments), timeout=30) for arguments in
              ['{"n": 1' + "0" * 5000 + "}", "{}"]]  # fmt: skip
    assert [r.status_code for r in counts] == [200, 200]
    assert counts[0].headers["x-token-guard-prompt-tokens"] == counts[1].headers["x-token-guard-prompt-tokens"]


def test_integral_floats_are_counts_as_vllm_reads_them(proxy: str) -> None:
    response = httpx.post(proxy + CHAT, json=chat(max_tokens=2.0, n=1.0), timeout=30)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS, CHAT + "/"])
def test_other_methods_on_guarded_paths_are_405_in_the_envelope(
    proxy: str, sim: InMemorySim, method: str, path: str
) -> None:
    response = httpx.request(method, proxy + path, timeout=30)
    assert_clean_error(response, 405, sim.url)
    assert response.headers["allow"] == "POST"


def test_a_trailing_slash_is_guarded_too(proxy: str, sim: InMemorySim) -> None:
    response = httpx.post(proxy + CHAT + "/", json=chat(max_tokens=100_000), timeout=30)
    assert response.status_code == 200 and response.headers["x-token-guard-action"] == "clamp"
    assert sim.stats.requests[-1]["max_tokens"] < 2048


def test_a_trailing_slash_is_the_route_itself(proxy: str, sim: InMemorySim) -> None:
    response = httpx.get(proxy + "/v1/models/", timeout=30)  # the route's own path goes upstream: no redirect
    assert response.status_code == 200 and response.json()["data"][0]["id"] == MODEL


def test_the_query_string_goes_upstream_exactly_as_sent(proxy: str, sim: InMemorySim) -> None:
    httpx.get(proxy + "/v1/models?y=%20z&g", timeout=30)
    assert sim.tap.queries[-1] == b"y=%20z&g"


def address(url: str) -> tuple[str, int]:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    assert host is not None and port is not None
    return host, port


def raw_socket(proxy: str) -> socket.socket:
    return socket.create_connection(address(proxy), timeout=10)


def read_all(conn: socket.socket) -> bytes:
    """Everything the guard sends until it closes the connection (a socket timeout, 10 s, fails the test)."""
    data = b""
    try:
        while chunk := conn.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_headers_sent_too_slowly_get_408_and_the_connection_closed(proxy: str) -> None:
    with raw_socket(proxy) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # then nothing more
        answer = read_all(conn)  # read_timeout_s is 1 s here: cut, not held open (the socket would time out)
    assert answer.startswith(b"HTTP/1.1 408") and b'"code":408' in answer.replace(b" ", b"")


def test_a_connection_that_says_nothing_is_closed(proxy: str) -> None:
    with raw_socket(proxy) as conn:
        assert read_all(conn) == b""  # closed by the guard (the 10 s socket timeout would fail the test)


def test_a_body_sent_too_slowly_gets_408(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    with raw_socket(proxy) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"model\":")  # fmt: skip
        answer = read_all(conn)
    assert answer.startswith(b"HTTP/1.1 408") and b"server.read_timeout_s" in answer
    assert sim.stats.received == before
    assert_still_serving(proxy)


@pytest.mark.parametrize(
    "request_bytes",
    [(b"GET /v1/models HTTP/1.1\r\nhost: x\r\nx-junk: " + b"a" * 200_000 + b"\r\n\r\n", 431),
     (b"NOT HTTP AT ALL\r\n\r\n", 400),
     (b"POST /v1/chat/completions HTTP/1.1\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n", 400)],
    ids=["huge header", "not http", "both lengths"],
)  # fmt: skip
def test_what_cannot_be_a_request_is_refused_in_the_envelope(proxy: str, request_bytes: tuple[bytes, int]) -> None:
    with raw_socket(proxy) as conn:
        try:
            conn.sendall(request_bytes[0])
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it was all sent
        answer = read_all(conn)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % request_bytes[1]) and set(json.loads(body)["error"]) >= {"message", "type"}
    assert_still_serving(proxy)


def with_header(size: int, close: bool = True) -> bytes:
    """A GET whose request line and headers come to about `size` bytes."""
    head = b"GET /v1/models HTTP/1.1\r\nhost: x\r\n" + (b"connection: close\r\n" if close else b"")
    return head + b"x-junk: " + b"a" * (size - len(head) - 12) + b"\r\n\r\n"


def answers(raw: bytes) -> list[tuple[int, bytes]]:
    """The status and body of each response in `raw` (each with a Content-Length)."""
    found = []
    while raw:
        head, _, rest = raw.partition(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.startswith(b"content-length")))
        found.append((int(head.split(b" ")[1]), rest[:length]))
        raw = rest[length:]
    return found


@pytest.mark.parametrize("size", [70_000, 120_000])
@pytest.mark.parametrize("reads", [1, 2], ids=["sent at once", "completed by a second write"])
def test_a_request_line_and_headers_over_64_kib_get_431_however_they_arrive(proxy: str, size: int, reads: int) -> None:
    request = with_header(size)
    with raw_socket(proxy) as conn:
        try:
            conn.sendall(request[: 60_000 if reads == 2 else None])
            if reads == 2:
                time.sleep(0.2)  # most likely read apart: the first read leaves the headers incomplete
                conn.sendall(request[60_000:])
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it was all sent
        ((status, body),) = answers(read_all(conn))
    assert status == 431 and json.loads(body)["error"]["code"] == 431
    assert_still_serving(proxy)


def test_headers_just_under_64_kib_are_served(proxy: str) -> None:
    with raw_socket(proxy) as conn:
        conn.sendall(with_header(60_000))
        assert [status for status, _ in answers(read_all(conn))] == [200]


def test_a_request_with_headers_over_64_kib_pipelined_behind_others_gets_431_after_their_answers(proxy: str) -> None:
    with raw_socket(proxy) as conn:
        conn.sendall(with_header(200, close=False) * 2 + with_header(70_000))
        replies = answers(read_all(conn))  # then closed by the guard (a socket timeout would fail the test)
    assert [status for status, _ in replies] == [200, 200, 431]
    assert json.loads(replies[0][1])["data"][0]["id"] == MODEL
    assert json.loads(replies[2][1])["error"]["type"] == "RequestHeaderFieldsTooLargeError"


def test_a_client_that_leaves_mid_upload_is_a_499_record_not_an_error(
    proxy: str, sim: InMemorySim, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="token_guard")
    with raw_socket(proxy) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     b"content-length: 100000\r\nx-request-id: left-mid-upload\r\n\r\n{\"model\":")  # fmt: skip
    assert eventually(lambda: any("left-mid-upload" in r.getMessage() for r in caplog.records))
    (line,) = [r.getMessage() for r in caplog.records if "left-mid-upload" in r.getMessage()]
    assert "status=499" in line and "client_gone=True" in line
    assert not any(r.exc_info or r.levelname == "ERROR" for r in caplog.records)
    assert_still_serving(proxy)


def test_a_client_that_stops_reading_is_cut_off_and_its_budget_comes_back(deepseek_dir: Path, tmp_path: Path) -> None:
    """One stream of 16 x 2,000 tokens to a client with a tiny receive buffer that never reads: it holds the whole
    admission budget, so everyone else gets 429, until server.write_timeout_s passes with nothing read. Its key pays
    the reservation: vLLM generated on, whatever the client read, until the guard hung up."""
    hog = chat(stream=True, n=16, max_tokens=2000)
    config = tmp_path / "guard.toml"
    config.write_text('[server]\nmetrics_api_key = "sk-scrape"\n'
                      '[[keys]]\nname = "hog"\nkey = "sk-hog"\ntokens_per_minute = 10000000\n'
                      '[[keys]]\nname = "other"\nkey = "sk-other"\ntokens_per_minute = 10000000\n')  # fmt: skip
    with simulator(deepseek_dir, max_model_len=2048) as (sim, _, _):
        prompt = httpx.post(f"{sim.url}/tokenize", json={"model": MODEL, "messages": hog["messages"]}).json()["count"]
        cost = (prompt + 2000) * 16
        flags = {"model.max_model_len": 2048, "admission.max_inflight_tokens": cost, "admission.queue_timeout_s": 0.2,
                 "server.write_timeout_s": 1.0}  # fmt: skip
        with keyed_guard(sim.url, deepseek_dir, config, **flags) as proxy:
            wait_healthy(proxy.url)
            budget = proxy.app.upstream.admission.budgets[0]
            other = {"authorization": "Bearer sk-other"}

            def small() -> int:
                return httpx.post(proxy.url + CHAT, json=chat(max_tokens=2), headers=other, timeout=30).status_code

            with socket.socket() as conn:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)  # before connecting: the window it offers
                conn.settimeout(10)
                conn.connect(address(proxy.url))
                body = json.dumps(hog).encode()
                head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer sk-hog\r\n"
                conn.sendall(head + b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
                assert eventually(lambda: budget.tokens == cost)  # admitted, and reading nothing
                assert small() == 429  # the budget is held: no one else gets in
                assert eventually(lambda: small() == 200, timeout_s=20)
                assert eventually(lambda: budget.tokens == 0)
                got = read_all(conn)
            assert got.startswith(b"HTTP/1.1 200") and b"[DONE]" not in got  # cut off, not let finish
            scraped = httpx.get(f"{proxy.url}/metrics", headers={"authorization": "Bearer sk-scrape"}).text
    assert metric(scraped, "token_guard_inflight_tokens") == 0
    charged = metric(scraped, "token_guard_key_tokens_charged_total", key="hog")
    assert charged == cost  # no usage came before it was cut off: what it reserved
