"""Stored responses through the guard (serve), in front of two simulator replicas of vLLM 0.31 that store Responses
as vLLM does (VLLM_ENABLE_RESPONSES_API_STORE=1: each in its own memory, 404 on the other): a conversation continued
by `previous_response_id` is counted with its stored part and clamped so that 0.31 serves it, each turn reaches the
replica that holds what it continues, and a key reaches only the responses it created. The same through two guards
sharing a real Redis."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.server.running import ServerThread
from tests.support.polling import eventually
from tests.support.redis import RedisServer, redis_server
from tests.support.servers import MODEL, Tap, guard, keyed_guard, simulator, wait_checked, wait_healthy

WINDOW = 2048
KEYS = '[[keys]]\nname = "bob"\nkey = "sk-bob"\n\n[[keys]]\nname = "alice"\nkey = "sk-alice"\n'
COMMAND = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
TOOL: Any = {"type": "function", "name": "shell", "description": "Run a command", "parameters": COMMAND}
Replicas = list[tuple[ServerThread, Any, Tap]]


@pytest.fixture(scope="module")
def replicas(deepseek_dir: Path) -> Iterator[Replicas]:
    with (
        simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW, responses_store=True) as a,
        simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW, responses_store=True) as b,
    ):
        yield [a, b]


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("stored") / "guard.toml"
    path.write_text(KEYS)
    return path


def urls(replicas: Replicas) -> str:
    return ",".join(server.url for server, _, _ in replicas)


@pytest.fixture(scope="module")
def guard_url(replicas: Replicas, deepseek_dir: Path, config: Path) -> Iterator[str]:
    with keyed_guard(urls(replicas), deepseek_dir, config) as server:
        wait_healthy(server.url)
        wait_checked(server, replicas[0][0].url)
        yield server.url


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def fleet(replicas: Replicas, deepseek_dir: Path, config: Path, redis: RedisServer) -> Iterator[list[str]]:
    """Two guards on one Redis, in front of the same two replicas."""
    with ExitStack() as stack:
        servers = [stack.enter_context(keyed_guard(urls(replicas), deepseek_dir, config, **{"redis.url": redis.url}))
                   for _ in range(2)]  # fmt: skip
        for server in servers:
            wait_healthy(server.url)
            wait_checked(server, replicas[0][0].url)
        yield [server.url for server in servers]


def client(url: str, key: str = "sk-bob") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def holder(replicas: Replicas, response_id: str) -> list[int]:
    """The replicas whose own store holds the response (asked directly, not through the guard)."""
    return [i for i, (server, _, _) in enumerate(replicas)
            if httpx.get(f"{server.url}/v1/responses/{response_id}").status_code == 200]  # fmt: skip


def conversation(guards: list[str], replicas: Replicas, turns: int, stream: bool = False) -> list[tuple[int, int]]:
    """`turns` turns of one conversation, alternating over `guards`, each asking for far more output than the window
    and stopping early (as a model does at its end of text): (the guard's count, vLLM's input_tokens) per turn."""
    counts, previous = [], None
    for turn in range(turns):
        oai = client(guards[turn % len(guards)])
        extra: dict[str, Any] = {"stop": ["that"]}
        tools: Any = [TOOL] if turn % 3 == 2 else openai.NOT_GIVEN
        raw = oai.responses.with_raw_response.create(
            model=MODEL, input=f"Turn {turn}: what next?", instructions="Be brief.", previous_response_id=previous,
            max_output_tokens=100000, tools=tools, stream=stream, extra_body=extra,
        )  # fmt: skip
        assert raw.http_response.status_code == 200
        assert raw.headers["x-token-guard-action"] == "clamp"
        reply: Any = _completed(raw.parse()) if stream else raw.parse()
        assert reply.usage is not None
        counts.append((int(raw.headers["x-token-guard-prompt-tokens"]), reply.usage.input_tokens))
        assert holder(replicas, reply.id) != [], "the response is stored on a replica"
        previous = reply.id
    return counts


def _completed(events: Any) -> Any:
    return next(event.response for event in events if event.type == "response.completed")


def test_ten_turns_are_counted_exactly_and_served_with_a_limit_far_over_the_window(
    guard_url: str, replicas: Replicas
) -> None:
    counts = conversation([guard_url], replicas, 10)
    assert [guard for guard, _ in counts] == [vllm for _, vllm in counts]
    assert counts[-1][1] > counts[0][1] + 9 * 8  # each turn renders the whole stored conversation before its input


def test_a_streamed_conversation_is_recorded_from_its_completed_event(guard_url: str, replicas: Replicas) -> None:
    counts = conversation([guard_url], replicas, 4, stream=True)
    assert [guard for guard, _ in counts] == [vllm for _, vllm in counts]


def test_each_turn_reaches_the_replica_that_holds_what_it_continues(guard_url: str, replicas: Replicas) -> None:
    before = [tap.paths.count("/v1/responses") for _, _, tap in replicas]
    conversation([guard_url], replicas, 6)
    served = [tap.paths.count("/v1/responses") - was for was, (_, _, tap) in zip(before, replicas, strict=True)]
    assert sorted(served) == [0, 6]  # all on the replica of the first turn: the only one that holds the conversation


def test_two_guards_on_one_redis_continue_each_others_turns(fleet: list[str], replicas: Replicas) -> None:
    counts = conversation(fleet, replicas, 10)
    assert [guard for guard, _ in counts] == [vllm for _, vllm in counts]


def test_a_continuation_that_cannot_fit_is_the_guards_400(guard_url: str) -> None:
    oai = client(guard_url)
    first = oai.responses.create(model=MODEL, input="word " * 1500, max_output_tokens=5)
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model=MODEL, input="word " * 600, previous_response_id=first.id, max_output_tokens=10)
    assert caught.value.code == "context_length_exceeded"
    assert "x-token-guard-prompt-tokens" in caught.value.response.headers


def stored_by_bob(url: str) -> str:
    return client(url).responses.create(model=MODEL, input="Bob's secret plan", max_output_tokens=5).id


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/v1/responses/{id}"), ("GET", "/v1/responses/{id}?stream=true"), ("POST", "/v1/responses/{id}/cancel")],
)
def test_another_keys_response_is_not_found_on_every_route(guard_url: str, method: str, path: str) -> None:
    rid = stored_by_bob(guard_url)
    url = guard_url + path.format(id=rid)
    alice = httpx.request(method, url, headers={"Authorization": "Bearer sk-alice"}, timeout=30)
    assert alice.status_code == 404
    assert alice.json()["error"] == {"message": f"Response with id '{rid}' not found.", "type": "invalid_request_error",
                                     "param": "response_id", "code": 404}  # fmt: skip
    bob = httpx.request(method, url, headers={"Authorization": "Bearer sk-bob"}, timeout=30)
    assert bob.status_code != 404  # (a completed response cannot be cancelled: vLLM's 400)


def test_another_keys_response_cannot_be_continued(guard_url: str) -> None:
    rid = stored_by_bob(guard_url)
    for _ in range(4):  # whichever replica the guard would pick
        with pytest.raises(openai.NotFoundError, match=f"Response with id '{rid}' not found"):
            client(guard_url, "sk-alice").responses.create(model=MODEL, input="And then?", previous_response_id=rid)


def test_a_create_cannot_take_another_keys_response_id(guard_url: str, replicas: Replicas) -> None:
    rid = stored_by_bob(guard_url)
    with pytest.raises(openai.BadRequestError, match="request_id"):
        client(guard_url, "sk-alice").responses.create(model=MODEL, input="Mine now", extra_body={"request_id": rid})
    bobs = httpx.get(f"{guard_url}/v1/responses/{rid}", headers={"Authorization": "Bearer sk-bob"}).json()
    assert bobs["id"] == rid and bobs["output"]  # still his


def test_an_id_the_ledger_does_not_know_is_not_found_where_keys_are_checked(guard_url: str, replicas: Replicas) -> None:
    made = httpx.post(f"{replicas[0][0].url}/v1/responses", json={"model": MODEL, "input": "made before the guard",
                                                                     "max_output_tokens": 3}).json()  # fmt: skip
    for key in ("sk-bob", "sk-alice"):
        seen = httpx.get(f"{guard_url}/v1/responses/{made['id']}", headers={"Authorization": f"Bearer {key}"})
        assert seen.status_code == 404


def test_a_replica_that_lost_its_store_drops_the_entry(guard_url: str, replicas: Replicas) -> None:
    rid = stored_by_bob(guard_url)
    (index,) = holder(replicas, rid)
    store = replicas[index][0].app.app.state.store  # the replica restarted: its memory is gone
    store.responses.pop(rid)
    bob = {"Authorization": "Bearer sk-bob"}
    assert httpx.get(f"{guard_url}/v1/responses/{rid}", headers=bob).status_code == 404  # the replica's own 404
    with pytest.raises(openai.NotFoundError):  # now the guard's, from its ledger: no replica is asked
        client(guard_url).responses.create(model=MODEL, input="again", previous_response_id=rid)


def test_without_keys_an_unknown_id_is_continued_as_partial_and_a_lost_replica_is_not_found(
    deepseek_dir: Path,
) -> None:
    with ExitStack() as stack:
        started = [stack.enter_context(ExitStack()) for _ in range(2)]
        sims = [started[i].enter_context(simulator(deepseek_dir, profile="0.31", max_model_len=WINDOW,
                                                   responses_store=True)) for i in range(2)]  # fmt: skip
        server = stack.enter_context(guard(urls(sims), deepseek_dir))
        body = {"model": MODEL, "input": "next", "previous_response_id": "resp_made_elsewhere"}
        unknown = httpx.post(f"{server.url}/v1/responses", json=body)
        assert unknown.headers["x-token-guard-action"] == "partial" and unknown.status_code == 404  # vLLM's own
        rid = client(server.url).responses.create(model=MODEL, input="Hi", max_output_tokens=5).id
        (index,) = holder(sims, rid)
        started[index].close()  # the replica that holds it goes away
        other = sims[1 - index][2].paths
        asked = len(other)
        gone = httpx.get(f"{server.url}/v1/responses/{rid}")
        assert gone.status_code == 404 and gone.json()["error"]["message"] == f"Response with id '{rid}' not found."
        with pytest.raises(openai.NotFoundError):  # never answered by the other replica
            client(server.url).responses.create(model=MODEL, input="again", previous_response_id=rid)
        assert other[asked:] == []  # nothing was sent to the replica that does not hold it


def test_a_background_response_is_its_keys_alone(guard_url: str) -> None:
    bob, alice = client(guard_url), client(guard_url, "sk-alice")
    rid = bob.responses.create(model=MODEL, input="Bob's background plan", max_output_tokens=5, background=True).id
    assert rid.startswith("resp_")  # the guard named it (the id it follows), and the ledger holds it for bob
    for method, path in (("GET", f"/v1/responses/{rid}"), ("POST", f"/v1/responses/{rid}/cancel")):
        seen = httpx.request(method, guard_url + path, headers={"Authorization": "Bearer sk-alice"}, timeout=30)
        assert seen.status_code == 404 and seen.json()["error"]["param"] == "response_id"
    with pytest.raises(openai.BadRequestError, match="taken"):
        alice.responses.create(model=MODEL, input="Mine now", background=True, extra_body={"request_id": rid})
    with pytest.raises(openai.NotFoundError):
        alice.responses.create(model=MODEL, input="And then?", previous_response_id=rid)
    assert eventually(lambda: bob.responses.retrieve(rid).status == "incomplete", timeout_s=30)
    raw = bob.responses.with_raw_response.create(model=MODEL, input="And then?", previous_response_id=rid,
                                                 max_output_tokens=5)  # fmt: skip
    assert raw.http_response.status_code == 200
    assert raw.headers["x-token-guard-action"] == "partial"  # recorded without its conversation: answered empty
    assert alice.responses.create(model=MODEL, input="Mine", max_output_tokens=5, background=True).id != rid


def test_a_background_continuation_runs_and_is_followed_on_the_replica_that_holds_what_it_continues(
    guard_url: str, replicas: Replicas
) -> None:
    oai = client(guard_url)
    first = oai.responses.create(model=MODEL, input="Hi", max_output_tokens=5)
    (index,) = holder(replicas, first.id)
    marks = [len(tap.paths) for _, _, tap in replicas]
    queued = oai.responses.create(model=MODEL, input="And then?", previous_response_id=first.id, max_output_tokens=5,
                                  background=True)  # fmt: skip
    assert queued.status == "queued"
    polled = f"/v1/responses/{queued.id}"
    holding, other = replicas[index][2].paths, replicas[1 - index][2].paths
    assert eventually(lambda: polled in holding[marks[index] :], timeout_s=30)  # the guard's follower looks there
    assert holding[marks[index] :].count("/v1/responses") == 1
    assert {"/v1/responses", polled}.isdisjoint(other[marks[1 - index] :])  # neither the create nor a look went there
    assert eventually(lambda: oai.responses.retrieve(queued.id).status == "incomplete", timeout_s=30)
    done = oai.responses.retrieve(queued.id)
    assert done.usage is not None and first.usage is not None
    assert done.usage.input_tokens > first.usage.input_tokens  # rendered with the conversation it continues
