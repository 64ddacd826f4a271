"""vLLM's render routes answered by the guard (`render.local`): the same token ids and the same answer as the
upstream's own render route (the simulator with --enable-scale-out, written apart from the guard's code), without
the upstream being asked; what the guard cannot render goes to the upstream and the answer says why; keys apply as on
any count route. `token-guard render` serves them with no upstream at all."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.counting.registry import ModelRegistry
from proxy.server.app import create_app
from proxy.server.running import ServerThread, uvicorn_options
from proxy.settings import load_settings
from tests.support.servers import MODEL, InMemorySim, guard, keyed_guard, simulator_in_memory, wait_healthy

LONG = "The quick brown fox jumps over the lazy dog. " * 40
REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions/render", {"messages": [{"role": "user", "content": "Hello there 東京"}]}),
    ("/v1/chat/completions/render", {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": LONG},
                     {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "And then?"}],
        "max_tokens": 50, "temperature": 0.2, "stream": True}),
    ("/v1/chat/completions/render", {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                           {"type": "text", "text": "b"}]}],
                                     "add_generation_prompt": False, "seed": 7, "n": 2}),
    ("/v1/completions/render", {"prompt": ["Once upon a time", LONG], "max_tokens": 5}),
    ("/v1/completions/render", {"prompt": [[1, 2, 3], [4, 5]], "echo": True, "logprobs": 2}),
    ("/v1/completions/render", {"prompt": "x y z", "add_special_tokens": False}),
    ("/v1/messages/render", {"max_tokens": 20, "system": "Be kind.",
                             "messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/responses/render", {"input": "Tell me a story", "instructions": "Short.", "max_output_tokens": 30}),
]  # fmt: skip
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.fixture(scope="module", params=["0.32", "0.34"])
def sim(request: pytest.FixtureRequest, deepseek_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(deepseek_dir, profile=request.param, max_model_len=2048, enable_scale_out=True) as sim:
        yield sim


@pytest.fixture(scope="module")
def local(sim: InMemorySim, deepseek_dir: Path) -> Iterator[str]:
    with guard(sim, deepseek_dir, **{"render.local": True}) as served:
        yield served.url


def _comparable(answer: Any) -> Any:
    """An answer with its request ids, random per request on either side, made equal."""
    items = answer if isinstance(answer, list) else [answer]
    for item in items:
        assert isinstance(item["request_id"], str) and item["request_id"]
        item["request_id"] = "-"
    return answer


@pytest.mark.parametrize(("path", "fields"), REQUESTS, ids=[f"{p.split('/')[2]}-{i}" for i, (p, _) in
                                                             enumerate(REQUESTS)])  # fmt: skip
def test_the_guard_answers_with_the_upstreams_ids_and_body_without_asking_it(
    sim: InMemorySim, local: str, path: str, fields: dict[str, Any]
) -> None:
    body = {"model": MODEL, **fields}
    asked = len(sim.stats.requests)
    guarded = httpx.post(local + path, json=body)
    assert len(sim.stats.requests) == asked  # answered by the guard alone
    direct = sim.client.post(path, json=body)
    assert guarded.status_code == direct.status_code == 200, guarded.text
    assert guarded.headers["x-token-guard-render"] == "local"
    assert guarded.headers["content-type"] == "application/json"
    ours, theirs = guarded.json(), direct.json()
    ids = [a["token_ids"] for a in (ours if isinstance(ours, list) else [ours])]
    assert ids == [a["token_ids"] for a in (theirs if isinstance(theirs, list) else [theirs])]
    assert int(guarded.headers["x-token-guard-prompt-tokens"]) == sum(len(i) for i in ids)
    assert _comparable(ours) == _comparable(theirs)


def test_an_image_goes_to_the_upstream_whose_answer_the_client_gets(sim: InMemorySim, local: str) -> None:
    """Only the upstream's processor knows an image's tokens: the guard asks it (the text-only simulator refuses
    images, as vLLM serving a text model does) and the client gets its answer."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "What?"}, IMAGE]}]}
    asked = len(sim.stats.requests)
    answer = httpx.post(local + "/v1/chat/completions/render", json=body)
    direct = sim.client.post("/v1/chat/completions/render", json=body)
    assert len(sim.stats.requests) > asked + 1  # asked by the guard too, not answered locally
    assert answer.status_code == direct.status_code
    assert answer.json()["error"]["message"] == direct.json()["error"]["message"]


def test_a_prompt_over_the_window_is_refused_as_vllms_renderer_refuses_it(sim: InMemorySim, local: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 2100}]}
    guarded = httpx.post(local + "/v1/chat/completions/render", json=body)
    direct = sim.client.post("/v1/chat/completions/render", json=body)
    assert guarded.status_code == direct.status_code == 400
    assert guarded.json()["error"]["type"] == direct.json()["error"]["type"] == "BadRequestError"
    assert "maximum context length is 2048 tokens" in guarded.json()["error"]["message"]


def test_without_render_local_the_upstream_renders_and_no_render_header_is_added(
    sim: InMemorySim, deepseek_dir: Path
) -> None:
    with guard(sim, deepseek_dir) as served:
        answer = httpx.post(served.url + "/v1/chat/completions/render", json={"model": MODEL, **REQUESTS[0][1]})
    assert answer.status_code == 200 and "x-token-guard-render" not in answer.headers


def test_keys_apply_to_the_render_routes(sim: InMemorySim, deepseek_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "guard.toml"
    config.write_text('[render]\nlocal = true\n\n[[keys]]\nname = "router"\nkey = "sk-router"\nmodels = ["none"]\n'
                      '\n[[keys]]\nname = "picker"\nkey = "sk-picker"\n')  # fmt: skip
    body = {"model": MODEL, **REQUESTS[0][1]}
    with keyed_guard(sim, deepseek_dir, config) as served:
        wait_healthy(served.url)
        path = served.url + "/v1/chat/completions/render"
        assert httpx.post(path, json=body).status_code == 401
        assert httpx.post(path, json=body, headers={"authorization": "Bearer sk-router"}).status_code == 404
        allowed = httpx.post(path, json=body, headers={"authorization": "Bearer sk-picker"})
        assert allowed.status_code == 200 and allowed.headers["x-token-guard-render"] == "local"


def test_token_guard_render_serves_the_render_routes_with_no_upstream(deepseek_dir: Path, sim: InMemorySim) -> None:
    settings = load_settings(
        {"model.name": MODEL, "model.tokenizer": str(deepseek_dir), "model.max_model_len": 2048,
         "render.only": True, "render.local": True, "render.vllm_version": "0.32.0",
         "upstream.url": "http://127.0.0.1:9"},  # nothing listens there
        environ={},
    )  # fmt: skip
    app = create_app(settings, ModelRegistry.from_settings(settings.models, settings.counting))
    with ServerThread(app, **uvicorn_options(settings.server)) as served:
        wait_healthy(served.url)
        body = {"model": MODEL, **REQUESTS[0][1]}
        answer = httpx.post(served.url + "/v1/chat/completions/render", json=body)
        assert answer.status_code == 200 and answer.headers["x-token-guard-render"] == "local"
        assert (
            answer.json()["token_ids"] == sim.client.post("/v1/chat/completions/render", json=body).json()["token_ids"]
        )
        for path in ("/v1/chat/completions", "/v1/completions", "/tokenize", "/v1/models"):
            assert httpx.post(served.url + path, json=body).status_code == 404
        image = {"model": MODEL, "messages": [{"role": "user", "content": [IMAGE]}]}
        refused = httpx.post(served.url + "/v1/chat/completions/render", json=image)
        assert refused.status_code == 400 and "asks no upstream" in refused.json()["error"]["message"]


def test_the_reason_names_a_template_sent_with_the_request(sim: InMemorySim, deepseek_dir: Path) -> None:
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    body = {"model": MODEL, **REQUESTS[0][1], "chat_template": template}
    with guard(sim, deepseek_dir, **{"render.local": True, "policy.trust_request_chat_template": True}) as served:
        answer = httpx.post(served.url + "/v1/chat/completions/render", json=body)
    assert answer.headers["x-token-guard-render"] == "upstream; reason=request-template"
