"""API keys: with server.api_keys set, /v1/* needs `Authorization: Bearer <key>` (401 in the OpenAI envelope before
anything else happens); probes stay open; upstream.api_key replaces the client's key on the way to the upstream."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from starlette.types import ASGIApp, Receive, Scope, Send

from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support.servers import MODEL, InMemorySim, guard, in_memory

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


class HeaderTap:
    """ASGI middleware keeping the request headers of every HTTP request the upstream received, in order."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, list[tuple[str, str]]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append((scope["path"], [(k.decode(), v.decode()) for k, v in scope["headers"]]))
        await self.app(scope, receive, send)

    def authorization(self, path: str) -> list[str]:
        """The Authorization values of the last request to `path`."""
        headers = next(h for p, h in reversed(self.seen) if p == path)
        return [v for k, v in headers if k.lower() == "authorization"]


@pytest.fixture(scope="module")
def upstream(deepseek_dir: Path) -> Iterator[tuple[InMemorySim, HeaderTap]]:
    app = create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL))
    tap = HeaderTap(app)
    with in_memory(app, tap) as sim:
        yield sim, tap


@pytest.fixture(scope="module")
def keyed(upstream: tuple[InMemorySim, HeaderTap], deepseek_dir: Path) -> Iterator[str]:
    with guard(upstream[0], deepseek_dir, **{"server.api_keys": "k1,second-key"}) as server:
        yield server.url


def call(url: str, method: str, path: str, authorization: str | None) -> httpx.Response:
    headers = {} if authorization is None else {"Authorization": authorization}
    body = CHAT if method == "POST" else None
    return httpx.request(method, url + path, headers=headers, json=body)


AUTH_TABLE = [
    (None, 401),
    ("", 401),
    ("k1", 401),  # no scheme
    ("Basic k1", 401),  # wrong scheme
    ("Bearer", 401),
    ("Bearer k2", 401),  # wrong key
    ("Bearer k1x", 401),
    ("Bearer  k1", 401),  # the key is everything after the first space, as in vLLM
    ("Bearer k1", 200),
    ("bearer k1", 200),  # the scheme in any case
    ("BEARER second-key", 200),  # any of the keys
]


@pytest.mark.parametrize(("authorization", "status"), AUTH_TABLE)
def test_chat_completions_needs_a_valid_key(keyed: str, authorization: str | None, status: int) -> None:
    response = call(keyed, "POST", "/v1/chat/completions", authorization)
    assert response.status_code == status, response.text
    if status == 401:
        assert response.json() == {
            "error": {
                "message": "Invalid or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`).",
                "type": "AuthenticationError",
                "param": None,
                "code": "invalid_api_key",
            }
        }
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.headers["x-request-id"]


PATHS = [  # method, path, status without a key, status with a client key
    ("POST", "/v1/completions", 401, 400),  # in: a chat body is no completions request
    ("GET", "/v1/models", 401, 200),
    ("POST", "/v2/rerank", 401, 400),
    ("GET", "/version", 401, 200),  # every route but the guard's own probes needs a key, also those vLLM leaves open
    ("POST", "/tokenize", 401, 200),
    ("GET", "/v1/no-such-route", 404, 404),  # not in the route table: never forwarded, key or not
    ("GET", "//v1/models", 404, 404),  # no way around it by spelling the path differently
    ("GET", "/V1/models", 404, 404),
    ("POST", "/sleep", 403, 403),  # administrative: a client key is not enough (server.admin_api_keys)
    ("GET", "/health", 200, 200),
    ("GET", "/livez", 200, 200),
    ("GET", "/metrics", 200, 200),
]


@pytest.mark.parametrize(("method", "path", "without", "with_key"), PATHS)
def test_which_paths_need_a_key(keyed: str, method: str, path: str, without: int, with_key: int) -> None:
    assert call(keyed, method, path, None).status_code == without
    assert call(keyed, method, path, "Bearer k1").status_code == with_key


PREFLIGHT = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}


def test_a_cors_preflight_needs_no_key_and_carries_nothing_upstream(
    keyed: str, upstream: tuple[InMemorySim, HeaderTap]
) -> None:
    answer = httpx.request("OPTIONS", keyed + "/v1/chat/completions", headers=PREFLIGHT)
    assert answer.status_code not in (401, 403, 404)
    path, headers = upstream[1].seen[-1]
    assert path == "/v1/chat/completions" and dict(headers).get("content-length", "0") == "0"
    assert httpx.request("OPTIONS", keyed + "/sleep", headers=PREFLIGHT).status_code == 403  # not an admin route


@pytest.mark.parametrize(
    ("headers", "body"),
    [({}, None), ({"Origin": "https://app.example"}, None), ({"Access-Control-Request-Method": "POST"}, None),
     (PREFLIGHT, b"x" * 100_000)],
    ids=["bare", "origin only", "method only", "with a body"],
)  # fmt: skip
def test_any_other_options_needs_a_key_then_is_a_405(
    keyed: str, upstream: tuple[InMemorySim, HeaderTap], headers: dict[str, str], body: bytes | None
) -> None:
    before = len(upstream[1].seen)
    refused = httpx.request("OPTIONS", keyed + "/v1/chat/completions", headers=headers, content=body)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    keyed_headers = {**headers, "Authorization": "Bearer k1"}
    answer = httpx.request("OPTIONS", keyed + "/v1/chat/completions", headers=keyed_headers, content=body)
    assert answer.status_code == 405 and answer.headers["allow"] == "POST" and "error" in answer.json()
    assert len(upstream[1].seen) == before


def test_a_refused_request_never_reaches_the_upstream(keyed: str, upstream: tuple[InMemorySim, HeaderTap]) -> None:
    before = len(upstream[1].seen)
    for _ in range(3):
        assert call(keyed, "POST", "/v1/chat/completions", "Bearer nope").status_code == 401
    assert len(upstream[1].seen) == before


def test_openai_sdk_with_and_without_the_key(keyed: str) -> None:
    good = openai.OpenAI(base_url=f"{keyed}/v1", api_key="second-key", max_retries=0)
    assert good.chat.completions.create(**CHAT).usage is not None  # type: ignore[call-overload]
    bad = openai.OpenAI(base_url=f"{keyed}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert info.value.code == "invalid_api_key"


def test_without_keys_everything_is_open(upstream: tuple[InMemorySim, HeaderTap], deepseek_dir: Path) -> None:
    with guard(upstream[0], deepseek_dir) as server:
        assert call(server.url, "POST", "/v1/chat/completions", None).status_code == 200
        assert call(server.url, "POST", "/v1/chat/completions", "Bearer anything").status_code == 200
        assert upstream[1].authorization("/v1/chat/completions") == ["Bearer anything"]  # passed through as sent


def test_the_upstream_key_replaces_the_clients(upstream: tuple[InMemorySim, HeaderTap], deepseek_dir: Path) -> None:
    flags = {"server.api_keys": "k1", "upstream.api_key": "up-secret"}
    with guard(upstream[0], deepseek_dir, **flags) as server:
        assert call(server.url, "POST", "/v1/chat/completions", "Bearer k1").status_code == 200
        assert upstream[1].authorization("/v1/chat/completions") == ["Bearer up-secret"]
        assert call(server.url, "GET", "/v1/models", "Bearer k1").status_code == 200  # pass-through too
        assert upstream[1].authorization("/v1/models") == ["Bearer up-secret"]


@pytest.mark.parametrize(("key", "status"), [("k1", 200), ("second-key", 200), ("k2", 401), ("", 401)])
def test_anthropic_clients_send_the_key_as_x_api_key(keyed: str, key: str, status: int) -> None:
    response = httpx.post(keyed + "/v1/chat/completions", headers={"x-api-key": key}, json=CHAT)
    assert response.status_code == status, response.text


def test_a_refusal_on_the_messages_api_is_in_anthropics_shape(keyed: str) -> None:
    response = httpx.post(keyed + "/v1/messages", headers={"x-api-key": "nope"}, json={})
    assert response.status_code == 401
    assert response.json() == {
        "type": "error",
        "error": {
            "type": "AuthenticationError",
            "message": "Invalid or missing API key: send `Authorization: Bearer <key>` (or `x-api-key: <key>`).",
        },
    }


def test_invocations_need_a_key_although_vllm_leaves_them_open(keyed: str) -> None:
    assert call(keyed, "POST", "/invocations", None).status_code == 401
    assert call(keyed, "POST", "/invocations", "Bearer k1").status_code == 200


@pytest.mark.parametrize("path", ["/pooling", "/classify", "/score", "/rerank", "/rerank/"])
def test_the_pooling_routes_vllm_leaves_open_need_a_key(keyed: str, path: str) -> None:
    body = {"model": MODEL, "input": "x"} if path in ("/pooling", "/classify") else \
        {"model": MODEL, "query": "q", "documents": ["d"], "text_1": "q", "text_2": "d"}  # fmt: skip
    assert httpx.post(keyed + path, json=body).status_code == 401
    answer = httpx.post(keyed + path, json=body, headers={"Authorization": "Bearer k1"})
    assert answer.status_code == 200 and "x-token-guard-action" in answer.headers


def test_the_upstream_key_replaces_an_x_api_key_too(
    upstream: tuple[InMemorySim, HeaderTap], deepseek_dir: Path
) -> None:
    flags = {"server.api_keys": "k1", "upstream.api_key": "up-secret"}
    with guard(upstream[0], deepseek_dir, **flags) as server:
        answer = httpx.post(server.url + "/v1/chat/completions", headers={"x-api-key": "k1"}, json=CHAT)
        assert answer.status_code == 200
        headers = next(h for p, h in reversed(upstream[1].seen) if p == "/v1/chat/completions")
        assert [k for k, _ in headers if k.lower() == "x-api-key"] == []
        assert upstream[1].authorization("/v1/chat/completions") == ["Bearer up-secret"]


def test_a_key_the_guard_checks_never_reaches_the_upstream_without_an_upstream_key(
    upstream: tuple[InMemorySim, HeaderTap], deepseek_dir: Path
) -> None:
    """The client's key and the admin key are the guard's: without upstream.api_key they are removed, not sent on."""
    flags = {"server.api_keys": "k1", "server.admin_api_keys": "admin-key"}
    with guard(upstream[0], deepseek_dir, **flags) as server:
        sent = {"Authorization": "Bearer k1", "x-api-key": "k1"}
        assert httpx.post(server.url + "/v1/chat/completions", headers=sent, json=CHAT).status_code == 200
        assert httpx.get(server.url + "/version", headers=sent).status_code == 200
        assert httpx.get(server.url + "/is_sleeping", headers={"Authorization": "Bearer admin-key"}).status_code < 500
        for path in ("/v1/chat/completions", "/version", "/is_sleeping"):
            headers = next(h for p, h in reversed(upstream[1].seen) if p == path)
            assert [k for k, _ in headers if k.lower() in ("authorization", "x-api-key")] == [], path
