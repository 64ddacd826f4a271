"""The route table: every route of vLLM 0.31 and 0.32 is declared (guarded, relayed on purpose, administrative or
closed), so that a route vLLM adds is a decision, not a side door; and lookups find exactly the declared paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.api.routes import Access, Kind, Reads, Route, RouteTable
from proxy.error_bodies import Envelope

VLLM_ROUTES: dict[str, list[list[str]]] = json.loads((Path(__file__).with_name("vllm_routes.json")).read_text())
TABLE = RouteTable()
CASES = [(version, method, path) for version, routes in VLLM_ROUTES.items() for method, path in routes]


def test_the_snapshot_holds_every_version_the_guard_follows() -> None:
    assert set(VLLM_ROUTES) == {"0.31.0", "0.32.0", "0.33.0", "0.34.0"}
    assert all(len(r) > 70 for r in VLLM_ROUTES.values())


@pytest.mark.parametrize(("version", "method", "path"), CASES, ids=[f"{v}-{m}-{p}" for v, m, p in CASES])
def test_every_vllm_route_is_declared(version: str, method: str, path: str) -> None:
    route = TABLE.declares(path)
    assert route is not None, f"vLLM {version} serves {method} {path}: declare it in proxy/api/routes.py"
    if route.kind in (Kind.GENERATE, Kind.POOL, Kind.COUNT, Kind.RELAY):  # served through the guard: as vLLM takes it
        assert method in route.methods, f"{method} {path} is {route.kind} but the table takes {route.methods}"
    if method == "WEBSOCKET":  # the guard relays HTTP only
        assert route.kind in (Kind.UNGUARDED, Kind.CONTROL)


ADMINISTRATIVE = ["/sleep", "/wake_up", "/is_sleeping", "/collective_rpc", "/pause", "/resume", "/scale_elastic_ep",
                  "/reset_prefix_cache", "/reset_mm_cache", "/start_profile", "/stop_profile", "/server_info",
                  "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/abort_requests",
                  "/inference/v1/abort_requests", "/update_weights",
                  # 0.34: taken with --enable-sleep-mode, and vLLM's own --api-key does not protect them
                  "/checkpoint/prepare", "/checkpoint/restore", "/checkpoint/status",
                  "/v1/fault_tolerance/apply", "/v1/fault_tolerance/status"]  # fmt: skip


@pytest.mark.parametrize("path", ADMINISTRATIVE)
def test_administrative_routes_need_an_admin_key(path: str) -> None:
    found = TABLE.find(path)
    assert found is not None and found.route.kind is Kind.CONTROL and found.route.who is Access.ADMIN


GPU = {"/v1/chat/completions/batch": Kind.GENERATE, "/inference/v1/generate": Kind.GENERATE,
       "/v1/audio/transcriptions": Kind.GENERATE, "/v1/audio/translations": Kind.GENERATE, "/v2/embed": Kind.POOL,
       "/v1/chat/completions/render": Kind.COUNT, "/v1/completions/render": Kind.COUNT}  # fmt: skip


@pytest.mark.parametrize(("path", "kind"), GPU.items())
def test_every_route_that_reaches_the_gpu_is_guarded(path: str, kind: Kind) -> None:
    found = TABLE.find(path)
    assert found is not None and found.route.kind is kind and found.route.guarded and found.route.reads


def test_decisions_are_guarded_from_vllm_0_33_on() -> None:
    """vLLM 0.33's /v1/decisions runs a prefill and a token for each of up to 64 questions: counted and charged as a
    generation (policy/decisions.py), by a client key, and only in front of a release that serves it."""
    found = TABLE.find("/v1/decisions")
    assert found is not None and found.route.kind is Kind.GENERATE and found.route.who is Access.CLIENT
    assert found.route.reads is Reads.DECISIONS and found.route.since == (0, 33)
    assert RouteTable(passthrough=["/v1/decisions"]).kept == [found.route]  # a passthrough path cannot unguard it


@pytest.mark.parametrize("route", [r for r in TABLE.routes() if r.since is not None], ids=lambda r: r.path)
def test_a_route_since_a_release_is_in_that_releases_snapshot_and_not_before(route: Route) -> None:
    serving = sorted(v for v, routes in VLLM_ROUTES.items() if any(p == route.path for _, p in routes))
    assert serving and tuple(int(n) for n in serving[0].split(".")[:2]) == route.since
    assert serving == sorted(v for v in VLLM_ROUTES if tuple(int(n) for n in v.split(".")[:2]) >= route.since)


def test_lookups() -> None:
    assert TABLE.find("/v1/chat/completions/") == TABLE.find("/v1/chat/completions")  # vLLM redirects it there
    assert TABLE.find("/v1/nothing") is None and TABLE.find("/V1/chat/completions") is None
    assert TABLE.find("//v1/chat/completions") is None and TABLE.find("/v1/chat/completions//") is None
    found = TABLE.find("/v1/responses/resp_0a1b")
    assert found is not None and found.path == "/v1/responses/resp_0a1b"  # forwarded with its id
    assert found.route.path == "/v1/responses/{response_id}" and found.route.kind is Kind.RELAY
    cancel = TABLE.find("/v1/responses/resp_0a1b/cancel")
    assert cancel is not None and cancel.route.methods == {"POST"}
    for odd in ("/v1/responses/a b", "/v1/responses/%2e", "/v1/responses/x/y", "/v1/responses/"):
        assert TABLE.find(odd) is None or TABLE.find(odd) == TABLE.find("/v1/responses"), odd


def test_passthrough_paths_open_only_what_the_table_does_not_decide() -> None:
    table = RouteTable(passthrough=["/v1/my-route", "/sleep", "/v1/chat/completions", "/cohere/v2/chat"])
    mine = table.find("/v1/my-route")
    assert mine is not None and mine.route.kind is Kind.RELAY and mine.route.who is Access.CLIENT
    assert table.find("/sleep").route.kind is Kind.CONTROL  # type: ignore[union-attr]
    assert table.find("/v1/chat/completions").route.kind is Kind.GENERATE  # type: ignore[union-attr]
    assert table.find("/cohere/v2/chat").route.kind is Kind.RELAY  # type: ignore[union-attr]  # opened on purpose
    assert RouteTable().find("/cohere/v2/chat").route.who is Access.NOBODY  # type: ignore[union-attr]
    assert [r.path for r in table.kept] == ["/sleep", "/v1/chat/completions"]  # the guard logs both at start-up
    assert table.unguarded == ["/cohere/v2/chat"]


def test_anthropic_routes_answer_in_anthropics_envelope() -> None:
    anthropic = {r.path for r in TABLE.routes() if r.envelope == "anthropic"}
    assert anthropic == {"/v1/messages", "/v1/messages/count_tokens", "/v1/messages/render"}


def test_the_messages_api_speaks_the_upstreams_error_vocabulary() -> None:
    table = RouteTable()
    messages = ("/v1/messages", "/v1/messages/count_tokens", "/v1/messages/render")

    def envelopes() -> set[str]:
        return {found.route.envelope for path in messages if (found := table.find(path)) is not None}

    assert envelopes() == {Envelope.ANTHROPIC}  # the release not known yet: vLLM's exception names, as before
    table.speak(anthropic_types=True)
    assert envelopes() == {Envelope.ANTHROPIC_TYPES}
    assert {r.path for r in table.routes() if r.envelope == Envelope.ANTHROPIC_TYPES} == set(messages)
    assert {r.path for r in table.routes() if r.envelope == Envelope.OPENAI} == {
        r.path for r in TABLE.routes() if r.envelope == Envelope.OPENAI
    }  # every other route keeps OpenAI's
    table.speak(anthropic_types=False)  # a replica came back as an older release
    assert envelopes() == {Envelope.ANTHROPIC}
