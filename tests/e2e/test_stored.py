"""Stored responses against real vLLM: two replicas of one version, each with its Responses store on
(VLLM_ENABLE_RESPONSES_API_STORE=1), behind two guards sharing a real Redis, with two keys. A Codex-shaped client
(Responses, a tool called each turn, the tool's output sent back with `previous_response_id`, `max_output_tokens` far
over the window) and the OpenAI Agents SDK's tool loop (`auto_previous_response_id`) run through them: every turn
answered, every count equal to vLLM's own `usage.input_tokens`, every turn on the replica that holds what it
continues; another key's response id is a 404 on every route that takes one. 0.31 and 0.32, two vLLM starts each."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import openai
import pytest

from tests.e2e import runtime
from tests.e2e.stack import PROXY_READY_TIMEOUT, VLLM_READY_TIMEOUT
from tests.e2e.wire import GUARD_ACTION, GUARD_PROMPT
from tests.support.redis import redis_server

pytestmark = pytest.mark.e2e

WINDOW = runtime.MAX_MODEL_LEN
STORE = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
# a tool's arguments end where their schema does (compact JSON): random weights then stop on their own
TOOLS = ("--enable-auto-tool-choice", "--tool-call-parser", "pythonic",
         "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}')  # fmt: skip
KEYS = '[[keys]]\nname = "bob"\nkey = "sk-bob"\n\n[[keys]]\nname = "alice"\nkey = "sk-alice"\n'
SHELL: Any = {"type": "function", "name": "shell", "description": "Run a shell command.", "strict": True,
         "parameters": {"type": "object", "properties": {"command": {"type": "string", "enum": ["ls", "pwd"]}},
                        "required": ["command"], "additionalProperties": False}}  # fmt: skip


@dataclass
class Fleet:
    version: str
    replicas: list[str]
    guards: list[str]
    http: httpx.Client

    def holders(self, response_id: str) -> list[int]:
        """The replicas whose own store holds the response, asked directly."""
        return [i for i, url in enumerate(self.replicas)
                if self.http.get(f"{url}/v1/responses/{response_id}").status_code == 200]  # fmt: skip


@pytest.fixture(scope="module", params=runtime.VERSIONS)
def fleet(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    version: str = request.param
    workdir = tmp_path_factory.mktemp(f"stored-{version}")
    model = runtime.tiny_model(runtime.vllm_venv(runtime.VERSIONS[0]) / "bin" / "python")
    config = workdir / "guard.toml"
    config.write_text(KEYS)
    processes: list[runtime.Process] = []
    try:
        venv = runtime.vllm_venv(version)
        vllms = [runtime.start_vllm(venv, model, workdir / f"vllm{i}", TOOLS, STORE) for i in range(2)]
        processes += vllms
        for vllm in vllms:
            vllm.wait_ready("/v1/models", VLLM_READY_TIMEOUT)
        upstream = ",".join(v.url for v in vllms)
        with redis_server() as redis:
            args = ("--redis-url", redis.url, "--config", str(config))
            guards = [runtime.start_proxy(upstream, model, workdir / f"guard{i}", extra_args=args) for i in range(2)]
            processes += guards
            for guard in guards:
                guard.wait_ready("/health", PROXY_READY_TIMEOUT)
            with httpx.Client(timeout=180) as http:
                yield Fleet(version, [v.url for v in vllms], [g.url for g in guards], http)
    finally:
        for process in reversed(processes):
            process.stop()


def client(url: str, key: str = "sk-bob") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=180)


def test_ten_codex_turns_through_two_guards_are_counted_exactly_on_the_replica_that_holds_them(fleet: Fleet) -> None:
    previous: str | None = None
    items: Any = [{"role": "user", "content": "List the files, then say where we are."}]
    answered, exact, pinned = 0, 0, 0
    for turn in range(10):
        raw = client(fleet.guards[turn % 2]).responses.with_raw_response.create(
            model=runtime.SERVED_NAME, instructions="You are a coding agent.", input=items, tools=[SHELL],
            tool_choice={"type": "function", "name": "shell"}, previous_response_id=previous,
            max_output_tokens=100000, temperature=0,
        )  # fmt: skip
        assert raw.http_response.status_code == 200, raw.http_response.text
        reply = raw.parse()
        assert raw.headers[GUARD_ACTION] == "clamp"
        answered += 1
        exact += reply.usage is not None and reply.usage.input_tokens == int(raw.headers[GUARD_PROMPT])
        holders = fleet.holders(reply.id)
        if previous is not None:
            pinned += holders == fleet.holders(previous)
        call = next(item for item in reply.output if item.type == "function_call")
        items = [{"type": "function_call_output", "call_id": call.call_id, "output": f"file{turn}.py"},
                 {"role": "user", "content": f"Turn {turn}: go on."}]  # fmt: skip
        previous = reply.id
    assert (answered, exact, pinned) == (10, 10, 9)
    assert previous is not None and len(fleet.holders(previous)) == 1  # on one replica only: it never moved


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/v1/responses/{id}"), ("POST", "/v1/responses/{id}/cancel"), ("POST", "/v1/responses")],
)
def test_another_keys_response_is_not_found_on_every_route(fleet: Fleet, method: str, path: str) -> None:
    bobs = client(fleet.guards[0]).responses.create(model=runtime.SERVED_NAME, input="Bob's plan", max_output_tokens=3)
    body = {"model": runtime.SERVED_NAME, "input": "and?", "previous_response_id": bobs.id, "max_output_tokens": 3}
    alices = {"Authorization": "Bearer sk-alice"}
    for guard in fleet.guards:
        alice = fleet.http.request(method, guard + path.format(id=bobs.id), headers=alices,
                                   json=body if method == "POST" else None)  # fmt: skip
        assert alice.status_code == 404, alice.text
        assert alice.json()["error"]["message"] == f"Response with id '{bobs.id}' not found."
    assert fleet.http.get(f"{fleet.guards[1]}/v1/responses/{bobs.id}",
                          headers={"Authorization": "Bearer sk-bob"}).status_code == 200  # fmt: skip


def test_the_agents_sdk_chains_its_turns_through_two_guards(fleet: Fleet) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # offline: no traces exported
    calls: list[str] = []

    @function_tool
    def weather(city: Literal["Paris"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return "sunny"

    async def run(guard: str, previous: str | None) -> Any:
        oai = AsyncOpenAI(base_url=guard + "/v1", api_key="sk-bob", max_retries=0, timeout=180)
        model = OpenAIResponsesModel(model=runtime.SERVED_NAME, openai_client=oai)
        settings = ModelSettings(max_tokens=100_000, tool_choice="weather", temperature=0)
        agent = Agent(name="forecaster", instructions="Call the tool.", tools=[weather], model=model,
                      model_settings=settings, tool_use_behavior="stop_on_first_tool")  # fmt: skip
        try:
            return await Runner.run(agent, "What is the weather in Paris?", max_turns=3, previous_response_id=previous,
                                    auto_previous_response_id=True)  # fmt: skip
        finally:
            await oai.close()

    first = asyncio.run(run(fleet.guards[0], None))
    second = asyncio.run(run(fleet.guards[1], first.last_response_id))  # the other guard continues it
    assert calls == ["Paris", "Paris"]
    assert first.last_response_id is not None and second.last_response_id is not None
    assert fleet.holders(second.last_response_id) == fleet.holders(first.last_response_id)
    assert all(r.usage.input_tokens + r.usage.output_tokens <= WINDOW for r in second.raw_responses)


def test_vllm_alone_answers_the_other_replicas_ids_with_404(fleet: Fleet) -> None:
    """What the guard's pinning prevents: each replica's store is its own."""
    made = fleet.http.post(f"{fleet.replicas[0]}/v1/responses", json={
        "model": runtime.SERVED_NAME, "input": "hi", "max_output_tokens": 3}).json()  # fmt: skip
    assert fleet.http.get(f"{fleet.replicas[1]}/v1/responses/{made['id']}").status_code == 404
