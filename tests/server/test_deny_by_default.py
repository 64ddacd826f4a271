"""The side doors, tried as an attacker would: the guard in front of a recording TCP tap in front of the simulator,
two limited keys, an admin key, admission and Redis on, and a listener on loopback that nobody may reach. Every
request that reaches the upstream must be one the route table allows; nothing may connect anywhere but the
configured upstream; nothing here may answer a 5xx."""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as redis_client

from proxy.api.routes import Access, Kind, RouteTable
from proxy.counting.registry import ModelRegistry
from proxy.server.app import create_app
from proxy.server.running import ServerThread, uvicorn_options
from proxy.settings import load_settings
from tests.support.leaving import leave_before_the_headers
from tests.support.polling import eventually
from tests.support.redis import RedisServer, redis_server
from tests.support.servers import MODEL, simulator, wait_checked, wait_healthy
from tests.support.side_doors import CONTROL, UNDECLARED
from tests.support.tcp import Forbidden, TcpTap

ALICE = {"Authorization": "Bearer sk-alice"}  # limited to the model `tiny`, 3,000 tokens a minute
BOB = {"Authorization": "Bearer sk-bob"}  # limited to the model `other`
CAROL = {"Authorization": "Bearer sk-carol"}  # any model, a million tokens a minute
ADMIN = {"Authorization": "Bearer sk-admin"}
SCRAPE = {"Authorization": "Bearer sk-scrape"}  # the metrics key
BUDGET = 16384
CONFIG = """
[server]
admin_api_keys = ["sk-admin"]
metrics_api_key = "sk-scrape"
read_timeout_s = 2.0

[[models]]
name = "other"
tokenizer = "{tokenizer}"
max_model_len = 2048

[[models]]
name = "tiny"
tokenizer = "{tokenizer}"
max_model_len = 2048

[[keys]]
name = "alice"
key = "sk-alice"
tokens_per_minute = 3000
models = ["tiny"]

[[keys]]
name = "carol"
key = "sk-carol"
tokens_per_minute = 1000000

[[keys]]
name = "bob"
key = "sk-bob"
tokens_per_minute = 100000
models = ["other"]

[[keys]]
name = "dave"
key = "sk-dave"
tokens_per_minute = 3000

[[keys]]
name = "erin"
key = "sk-erin"
requests_per_minute = 60
"""


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def doors(deepseek_dir: Path, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """(guard URL, the tap, the forbidden listener, the simulator's stats)."""
    config = tmp_path_factory.mktemp("doors") / "guard.toml"
    config.write_text(CONFIG.format(tokenizer=deepseek_dir))
    with simulator(deepseek_dir, max_model_len=2048) as (sim, stats, _), TcpTap(int(sim.url.rsplit(":", 1)[1])) as tap:
        flags = {"upstream.url": tap.url, "admission.max_inflight_tokens": BUDGET, "redis.url": redis.url}
        settings = load_settings(flags, environ={}, config_file=config)
        app = create_app(settings, ModelRegistry.from_settings(settings.models, settings.counting))
        with Forbidden() as forbidden, ServerThread(app, **uvicorn_options(settings.server)) as guard:
            wait_healthy(guard.url)
            wait_checked(guard, sim.url)  # the start-up check's requests go through the tap too
            yield guard.url, tap, forbidden, stats


@pytest.fixture(scope="module")
def paced(deepseek_dir: Path, redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """(guard URL, the simulator's stats): the guard, with the same keys and Redis, in front of a simulator that
    takes 20 ms a token, so that a non-streamed answer's headers come only once its generation is done."""
    config = tmp_path_factory.mktemp("paced") / "guard.toml"
    config.write_text(CONFIG.format(tokenizer=deepseek_dir))
    with simulator(deepseek_dir, max_model_len=2048, itl_s=0.02) as (sim, stats, _):
        settings = load_settings({"upstream.url": sim.url, "redis.url": redis.url}, environ={}, config_file=config)
        app = create_app(settings, ModelRegistry.from_settings(settings.models, settings.counting))
        with ServerThread(app, **uvicorn_options(settings.server)) as guard:
            wait_healthy(guard.url)
            wait_checked(guard, sim.url)
            yield guard.url, stats


def _quiet(tap: TcpTap) -> bool:
    """No request through the tap for a second."""
    seen = len(tap.requests)
    time.sleep(1.0)
    return len(tap.requests) == seen


def raw(url: str, request: bytes) -> bytes:
    """Send `request` on a fresh connection; everything the guard answers until it closes or goes quiet."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=20) as conn:
        conn.sendall(request)
        data = b""
        try:
            while chunk := conn.recv(65536):
                data += chunk
                if b"connection: close" not in data.lower() and _complete(data):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
    return data


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
        b"content-length:")), None)  # fmt: skip
    return bool(sep) and length is not None and len(body) >= length


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def untouched(tap: TcpTap, before: int) -> bool:
    return len(tap.requests) == before


@pytest.mark.parametrize(
    "target",
    [b"*@127.0.0.1:{port}/x", b"http://127.0.0.1:{port}/v1/models", b"http://u:p@127.0.0.1:{port}/v1/models",
     b"*", b"/v1/../v1/models", b"/v1/models/%2e%2e/x", b"/v1\\models", b"/v1/models%00"],
    ids=["open proxy", "absolute-form, another host", "userinfo", "asterisk", "dot-dot", "encoded dot-dot",
         "backslash", "NUL"],
)  # fmt: skip
def test_targets_that_are_not_a_plain_path_are_400_and_connect_nowhere(doors: Any, target: bytes) -> None:
    url, tap, forbidden, _ = doors
    before = len(tap.requests)
    for method in (b"GET", b"OPTIONS", b"POST"):
        sent = target.replace(b"{port}", str(forbidden.port).encode())
        answer = raw(url, method + b" " + sent + b" HTTP/1.1\r\nhost: guard\r\ncontent-length: 0\r\n\r\n")
        assert status(answer) == 400, answer
        assert b"invalid_request_target" in answer and b"origin-form" in answer
    assert forbidden.connections == 0 and untouched(tap, before)


def test_absolute_form_naming_the_guard_itself_is_served(doors: Any) -> None:
    url, tap, _, _ = doors
    host = url.removeprefix("http://").encode()
    answer = raw(url, b"GET " + url.encode() + b"/v1/models HTTP/1.1\r\nhost: " + host + b"\r\n" + _auth(ALICE))
    assert status(answer) == 200 and tap.requests[-1] == ("GET", "/v1/models")


@pytest.mark.parametrize(("method", "path"), CONTROL)
def test_vllms_administrative_routes_need_an_admin_key(doors: Any, method: str, path: str) -> None:
    url, tap, _, _ = doors
    before = len(tap.requests)
    for headers in ({}, ALICE, BOB, {"Authorization": "Bearer sk-scrape"}):
        refused = httpx.request(method, url + path, headers=headers, json={})
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["code"] == "permission_denied"
    assert untouched(tap, before)
    admitted = httpx.request(method, url + path, headers=ADMIN, json={})
    assert admitted.status_code < 500 and tap.requests[-1] == (method, path)  # forwarded as sent (query included)


CLIENT_ROUTES = [route.path for route in RouteTable().routes() if route.who is Access.CLIENT and "{" not in route.path]
NOT_A_PREFLIGHT = [{}, {"Origin": "https://app.example"}, {"Access-Control-Request-Method": "POST"}]


@pytest.mark.parametrize("path", CLIENT_ROUTES)
def test_options_is_no_way_around_the_keys(doors: Any, path: str) -> None:
    """Only a CORS preflight (Origin and Access-Control-Request-Method, no body) goes on without a key; any other
    OPTIONS is an ordinary request: a key, then a 405, and nothing reaches the upstream."""
    url, tap, _, _ = doors
    before = len(tap.requests)
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    for headers, body in [*((h, None) for h in NOT_A_PREFLIGHT), (preflight, b'{"model": "tiny"}')]:
        refused = httpx.request("OPTIONS", url + path, headers=headers, content=body)
        assert refused.status_code == 401 and "error" in refused.json(), refused.text  # in the route's envelope
        keyed = httpx.request("OPTIONS", url + path, headers={**headers, **CAROL}, content=body)
        assert keyed.status_code == 405 and "OPTIONS" not in keyed.headers["allow"], keyed.text
    assert untouched(tap, before)


GPU = [
    ("/v1/chat/completions/batch", {"messages": [[{"role": "user", "content": "hi"}]], "max_tokens": 100000}),
    ("/inference/v1/generate", {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 100000}}),
    ("/v2/embed", {"texts": ["hi"], "input_type": "search_query"}),
    ("/v1/chat/completions/render", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}),
    ("/v1/completions/render", {"prompt": "hi", "max_tokens": 100000}),
    ("/v1/responses/render", {"input": "hi", "max_output_tokens": 100000}),
]


@pytest.mark.parametrize(("path", "body"), GPU, ids=[p for p, _ in GPU])
def test_every_route_that_reaches_the_gpu_checks_the_keys_models(doors: Any, path: str, body: dict[str, Any]) -> None:
    url, tap, _, _ = doors
    before = len(tap.requests)
    refused = httpx.post(url + path, headers=ALICE, json={"model": "other", **body})
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found", refused.text
    assert untouched(tap, before)
    assert httpx.post(url + path, json={"model": MODEL, **body}).status_code == 401  # and a key


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/v1/audio/translations"])
def test_audio_checks_the_keys_models_too(doors: Any, path: str) -> None:
    url, tap, _, _ = doors
    before = len(tap.requests)
    form = {"model": "other", "max_completion_tokens": "100000"}
    refused = httpx.post(url + path, headers=ALICE, data=form, files={"file": ("a.wav", b"RIFF" + b"\0" * 64)})
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found", refused.text
    assert untouched(tap, before)


def test_unguarded_generation_routes_are_closed_to_everyone(doors: Any) -> None:
    url, tap, _, _ = doors
    before = len(tap.requests)
    for headers in ({}, ALICE, ADMIN):
        answer = httpx.post(url + "/cohere/v2/chat", headers=headers, json={"model": MODEL, "messages": []})
        assert answer.status_code == 404 and "server.passthrough_paths" in answer.json()["error"]["message"]
    assert untouched(tap, before)


@pytest.mark.parametrize("path", UNDECLARED)
def test_a_path_the_table_does_not_declare_never_reaches_the_upstream(doors: Any, path: str) -> None:
    url, tap, _, _ = doors
    before = len(tap.requests)
    for method in ("GET", "POST", "DELETE"):
        answer = httpx.request(method, url + path, headers=ADMIN)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "route_not_found"
    assert untouched(tap, before)


def test_a_stream_over_the_whole_kv_budget_is_clamped_to_fit_it(doors: Any) -> None:
    url, _, _, stats = doors
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 16, "max_tokens": 2000,
            "stream": True}  # fmt: skip
    with httpx.stream("POST", url + "/v1/chat/completions", headers=CAROL, json=body) as s:
        assert s.status_code == 200 and s.headers["x-token-guard-action"] == "clamp"
        limit, prompt = int(s.headers["x-token-guard-max-tokens"]), int(s.headers["x-token-guard-prompt-tokens"])
        s.read()
    assert (prompt + limit) * 16 <= BUDGET and (prompt + limit + 1) * 16 > BUDGET
    assert stats.requests[-1]["max_tokens"] == limit


def test_a_prompt_alone_over_the_budget_is_a_400(doors: Any) -> None:
    url, tap, _, _ = doors
    before = len(tap.requests)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 1200}], "n": 16, "max_tokens": 10}
    answer = httpx.post(url + "/v1/chat/completions", headers=BOB, json={**body, "model": "other"})
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "request_too_large"
    assert untouched(tap, before)


def test_a_key_cannot_spend_ten_minutes_in_one_request(doors: Any) -> None:
    url, tap, _, _ = doors
    before = len(tap.requests)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 500, "max_tokens": 5}
    answer = httpx.post(url + "/v1/chat/completions", headers=ALICE, json=body)
    assert answer.status_code == 429 and "Request too large" in answer.json()["error"]["message"]
    assert answer.headers["x-ratelimit-remaining-tokens"] == "3000" and untouched(tap, before)


def test_a_request_without_a_model_is_checked_against_the_model_that_answers(doors: Any) -> None:
    url, tap, _, _ = doors
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    before = len(tap.requests)
    refused = httpx.post(url + "/v1/chat/completions", headers=BOB, json=body)  # bob may use `other`; vLLM serves
    message = refused.json()["error"]["message"]  # `tiny` when none is named, which bob may not even learn of
    assert refused.status_code == 404 and "tiny" not in message and message.endswith("access to: other.")
    assert untouched(tap, before)
    served = httpx.post(url + "/v1/chat/completions", headers=ALICE, json=body)
    assert served.status_code == 200 and served.json()["model"] == MODEL


def test_metrics_name_no_key_and_no_upstream_without_an_operators_key(doors: Any) -> None:
    url, tap, _, _ = doors
    httpx.post(url + "/v1/chat/completions", headers=ALICE, json={"model": MODEL, "messages": [
        {"role": "user", "content": "hi"}], "max_tokens": 1})  # fmt: skip
    for headers in ({}, ALICE, BOB):
        text = httpx.get(url + "/metrics", headers=headers).text
        assert "token_guard_requests_total" in text and "alice" not in text and "bob" not in text
        assert "127.0.0.1" not in text
    for operator in (SCRAPE, ADMIN):  # the metrics key, and an admin key
        assert 'key="alice"' in httpx.get(url + "/metrics", headers=operator).text


def test_nothing_names_a_model_to_a_key_that_may_not_use_it(doors: Any) -> None:
    """alice may use `tiny`: asking for a model that does not exist and for one she may not use (`other`) get the same
    404, naming only `tiny`; /health and /metrics name no model to her, to bob or to a client without a key (they
    name them to an operator's key). vLLM never hears of any of it."""
    url, tap, _, _ = doors
    before = len(tap.requests)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    words = []
    for model in ("zzz", "other"):
        refused = httpx.post(url + "/v1/chat/completions", headers=ALICE, json={**chat, "model": model})
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "model_not_found"
        words.append(refused.json()["error"]["message"].replace(f"`{model}`", "`x`"))
    assert words[0] == words[1]  # whether `other` exists is not told either
    assert words[0] == "The model `x` does not exist or you do not have access to it. Models you have access to: tiny."
    assert untouched(tap, before)
    for headers in ({}, ALICE, BOB):
        health = httpx.get(url + "/health", headers=headers)
        assert health.json() == {"status": "ok", "checked": True}
        metrics = httpx.get(url + "/metrics", headers=headers).text
        assert "token_guard_prompt_tokens_count" in metrics and not re.search(r'model="|"tiny"|"other"', metrics)
    for operator in (SCRAPE, ADMIN):
        assert httpx.get(url + "/health", headers=operator).json()["models"] == ["other", "tiny"]
        assert 'model="tiny"' in httpx.get(url + "/metrics", headers=operator).text


def test_path_tricks_still_land_on_the_declared_route(doors: Any) -> None:
    url, tap, _, _ = doors
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    head = b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body) + _auth(ALICE)[:-2]
    for target in (b"/v1%2Fchat%2Fcompletions", b"/v1/chat/completions/"):
        answer = raw(url, b"POST " + target + b" HTTP/1.1\r\nhost: guard\r\n" + head + b"\r\n" + body)
        assert status(answer) == 200 and b"x-token-guard-action: pass" in answer.lower()
        assert tap.requests[-1] == ("POST", "/v1/chat/completions")  # the route's own path went upstream
    old = raw(url, b"POST /v1/chat/completions HTTP/1.0\r\n" + head + b"\r\n" + body)
    assert status(old) == 200
    two = raw(url, (b"GET /v1/models HTTP/1.1\r\nhost: g\r\n" + _auth(ALICE)) * 2)
    assert two.count(b"HTTP/1.1 200") >= 1
    # raw() returns with the first answer: the guard may still be forwarding the second, which the next test's tap
    # count must not see
    assert eventually(lambda: _quiet(tap), timeout_s=30)


def _auth(headers: dict[str, str]) -> bytes:
    return b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items()) + b"\r\n"


@pytest.mark.parametrize("path", ["/v1/messages/count_tokens", "/v1/chat/completions/render"])
def test_a_count_route_does_not_count_what_its_size_proves_too_long(doors: Any, path: str) -> None:
    url, tap, _, _ = doors
    before = len(tap.requests)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "antidisestablishmentarianism " * 80_000}]}
    answer = httpx.post(url + path, headers=CAROL, json=body, timeout=60)
    assert answer.status_code == 400 and answer.headers["x-token-guard-count-source"] == "size"
    assert "at least" in answer.text and untouched(tap, before)


def test_relay_requests_count_against_the_keys_requests_per_minute(doors: Any) -> None:
    """80 /tokenize of a megabyte each from a key allowed 60 requests a minute: vLLM reads each one it gets, so the
    key's minute runs out on them as on any route, and the rest are 429s that never reach it."""
    url, tap, _, _ = doors
    body = json.dumps({"model": MODEL, "prompt": "hi", "padding": "x" * 2**20}).encode()
    headers = {"Authorization": "Bearer sk-erin", "content-type": "application/json"}
    before, started = len(tap.requests), time.monotonic()
    answers = [httpx.post(url + "/tokenize", content=body, headers=headers, timeout=30) for _ in range(80)]
    refill = (time.monotonic() - started) + 1  # a request a second comes back to a 60-a-minute key
    reached = tap.requests[before:].count(("POST", "/tokenize"))
    served = [a for a in answers if a.status_code != 429]
    assert reached == len(served) <= 60 + refill
    refused = [a for a in answers if a.status_code == 429]
    assert len(refused) >= 20 - refill and all(a.json()["error"]["code"] == "rate_limit_exceeded" for a in refused)
    assert "requests per min (RPM): Limit 60" in refused[0].json()["error"]["message"]
    assert int(refused[0].headers["retry-after"]) >= 1 and refused[0].headers["x-ratelimit-remaining-requests"] == "0"


def quota_left(redis: RedisServer, name: str, limit: int) -> float:
    """A key's tokens left now, read from its bucket in Redis (fleet/quotas.py) on Redis's clock."""
    client = redis_client.Redis.from_url(redis.url)
    try:
        level, at = client.hmget(f"token-guard:quota:{name}", "tokens", "tokens_at")
        seconds, micros = client.time()
    finally:
        client.close()
    if not isinstance(level, bytes) or not isinstance(at, bytes):
        return float(limit)
    now = seconds * 1000 + micros / 1000
    return min(float(limit), float(level) + max(0.0, now - float(at)) * limit / 60000)


def test_clients_that_leave_before_the_answers_headers_pay_for_what_ran(paced: Any, redis: RedisServer) -> None:
    """Twelve non-streamed requests whose clients leave while vLLM generates: each reached the upstream, which
    worked on it until the abort, so the key pays at least its prompt and what was generated (the guard charges
    what it reserved: it cannot see how far vLLM got), never nothing."""
    url, stats = paced
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 200}
    prompt = int(httpx.post(url + "/v1/chat/completions", headers=CAROL, json={**body, "max_tokens": 1},
                            timeout=30).headers["x-token-guard-prompt-tokens"])  # fmt: skip
    assert eventually(lambda: stats.active == 0)
    stats.reset()
    started = time.monotonic()
    leave_before_the_headers(url, "/v1/chat/completions", body, "sk-dave", 12, lambda: stats.received)
    assert eventually(lambda: stats.aborted == 12 and stats.active == 0, timeout_s=20)  # the guard let go of them
    ran = 12 * prompt + stats.tokens_generated  # what the upstream did for them
    assert stats.completed == 0 and stats.tokens_generated > 0
    refill = 3000 * (time.monotonic() - started) / 60 + 1
    assert eventually(lambda: 3000 - quota_left(redis, "dave", 3000) + refill >= ran, timeout_s=10)
    assert 3000 - quota_left(redis, "dave", 3000) <= 12 * (prompt + 200)  # never more than it reserved


def test_nothing_reached_the_upstream_that_the_table_does_not_allow(doors: Any) -> None:
    """Run last in this module: over every request above."""
    _, tap, forbidden, _ = doors
    table = RouteTable()
    for method, target in tap.requests:
        found = table.find(target.split("?", 1)[0])
        assert found is not None and found.route.kind is not Kind.UNGUARDED, target
        assert method in found.route.methods, (method, target)
    assert forbidden.connections == 0 and tap.requests
