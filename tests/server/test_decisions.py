"""vLLM 0.33's Decisions API end to end: the real `openai` SDK (its generic `post`: it has no typed method for it) ->
token-guard on loopback -> the simulator in its 0.33 profile (in memory) with a real Qwen3 tokenizer and template.
Each question counted as vLLM renders it (a chat user turn, thinking off), the call charged its fan-out (every
question's prompt and its one token), refused as vLLM refuses it over the window or past 64 questions, and a 404 in
front of vLLM 0.32, which has no such route."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support import zoo
from tests.support.servers import MODEL, InMemorySim, guard, keyed_guard, simulator_in_memory, wait_healthy

WINDOW = 1024
KEYS = """
[[keys]]
name = "decider"
key = "sk-decider"
tokens_per_minute = 100000
requests_per_minute = 100
"""
QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "instructions": "Is the customer angry?", "name": "angry"},
    {"type": "choice", "instructions": "Which team should answer?", "choices": [
        {"value": "billing", "description": "money, invoices"}, {"value": "support"}, {"value": True}]},
    {"type": "score", "instructions": "", "levels": [{"label": "calm"}, {"label": "upset", "description": "loud"}]},
]  # fmt: skip
TICKET = "My invoice is wrong for the third month running and nobody answers my mails. 東京から。"


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("qwen3")
    shutil.copytree(zoo.family_dir("qwen3"), directory, dirs_exist_ok=True)
    return directory


@pytest.fixture(scope="module")
def sim(qwen3_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(qwen3_dir, profile="0.33", max_model_len=WINDOW) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(sim: InMemorySim, qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("keys") / "keys.toml"
    config.write_text(KEYS)
    with keyed_guard(sim, qwen3_dir, config) as server:
        wait_healthy(server.url)
        yield server.url


@pytest.fixture
def oai(proxy: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy}/v1", api_key="sk-decider", max_retries=0, timeout=30)


def decide(oai: openai.OpenAI, body: dict[str, Any]) -> httpx.Response:
    response: httpx.Response = oai.post("/decisions", body={"model": MODEL, **body}, cast_to=httpx.Response)
    return response


def refused(oai: openai.OpenAI, body: dict[str, Any]) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        decide(oai, body)
    return caught.value


def remaining(response: httpx.Response) -> int:
    return int(response.headers["x-ratelimit-remaining-tokens"])


PARTS = [{"type": "input_text", "text": "Line one"}, {"type": "input_text", "text": "two"}]


@pytest.mark.parametrize("given", [TICKET, [{"role": "user", "content": TICKET}, {"role": "user", "content": PARTS}]])
def test_the_guards_count_is_vllms_usage(oai: openai.OpenAI, sim: InMemorySim, given: Any) -> None:
    response = decide(oai, {"input": given, "questions": QUESTIONS})
    usage = response.json()["usage"]
    assert response.headers["x-token-guard-action"] == "pass"
    assert int(response.headers["x-token-guard-prompt-tokens"]) == usage["input_tokens"] > 3 * 40
    assert usage["output_tokens"] == len(QUESTIONS) and [a["type"] for a in response.json()["answers"]] == [
        "predicate", "choice", "score"]  # fmt: skip
    assert sim.stats.requests[-1] == {"model": MODEL, "input": given, "questions": QUESTIONS}  # forwarded as sent


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's buckets on a stopped clock: nothing refills while a test looks."""
    now = time.monotonic() * 1000
    monkeypatch.setattr("proxy.exchange.quotas._now_ms", lambda: now)


def test_a_call_is_charged_its_fan_out_as_one_request(oai: openai.OpenAI, frozen: None) -> None:
    before = decide(oai, {"input": "warm-up", "questions": QUESTIONS[:1]})
    response = decide(oai, {"input": TICKET, "questions": QUESTIONS * 4})
    usage = response.json()["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + 12
    assert remaining(before) - remaining(response) == usage["total_tokens"]  # every prompt and its one token
    requests = [int(r.headers["x-ratelimit-remaining-requests"]) for r in (before, response)]
    assert requests[0] - requests[1] == 1  # one call is one request of the key's quota, however many questions
    later = decide(oai, {"input": TICKET, "questions": QUESTIONS})
    assert remaining(response) - remaining(later) == later.json()["usage"]["total_tokens"]  # settled: nothing owed


def test_a_question_over_the_window_is_refused_without_reaching_vllm(oai: openai.OpenAI, sim: InMemorySim) -> None:
    before = sim.stats.received
    error = refused(oai, {"input": "apple " * 1100, "questions": QUESTIONS[:1]})
    assert error.status_code == 400 and error.body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert f"maximum context length is {WINDOW} tokens" in error.message
    assert sim.stats.received == before


def test_a_question_that_fills_the_window_is_refused_as_vllms_engine_refuses_it(
    oai: openai.OpenAI, sim: InMemorySim
) -> None:
    questions = [{"type": "predicate", "instructions": ""}]
    short = decide(oai, {"input": "a", "questions": questions}).json()["usage"]["input_tokens"]
    filling = "a" + " apple" * (WINDOW - short)  # each " apple" is one token more
    assert sim.client.post("/v1/decisions", json={"model": MODEL, "input": filling, "questions": questions}).json()[
        "error"]["message"].startswith(f"The decoder prompt (length {WINDOW}) plus")  # fmt: skip
    before = sim.stats.received
    error = refused(oai, {"input": filling, "questions": questions})
    assert error.status_code == 400 and f"The decoder prompt (length {WINDOW}) plus" in error.message
    assert sim.stats.received == before


@pytest.mark.parametrize(
    "body,words",
    [({"questions": QUESTIONS[:1] * 65}, "at most 64"), ({"questions": QUESTIONS[:1] * 201}, "1 to 200"),
     ({"questions": []}, "1 to 200"), ({"questions": QUESTIONS, "temperature": 0}, "extra inputs"),
     ({"questions": [{**QUESTIONS[0], "weight": 2}]}, "extra inputs"),
     ({"questions": [{**QUESTIONS[0], "name": None}]}, "must be a string"),
     ({"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": 1}, {"value": 2}]}]}, "string or"),
     ({"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": "a"}, {"value": "a"}]}]},
      "distinct"),
     ({"questions": [{"type": "choice", "instructions": "?", "choices": [{"value": str(i)} for i in range(27)]}]},
      "at most 26 choices"),
     ({"questions": QUESTIONS, "joint": True}, "joint reads need"),
     ({"questions": QUESTIONS, "input": [{"role": "assistant", "content": "x"}]}, "'user'"),
     ({"questions": QUESTIONS, "input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "images")],
)  # fmt: skip
def test_bodies_vllm_refuses_are_refused_before_it(
    oai: openai.OpenAI, sim: InMemorySim, body: dict[str, Any], words: str
) -> None:
    body = {"input": "x", **body}
    assert sim.client.post("/v1/decisions", json={"model": MODEL, **body}).status_code == 400
    before = sim.stats.received
    error = refused(oai, body)
    assert error.status_code == 400 and words in error.message and error.body["type"] == "BadRequestError"  # type: ignore[index]
    assert sim.stats.received == before


def test_a_duplicate_key_is_read_as_vllm_reads_it_the_last_one(proxy: str) -> None:
    raw = f'{{"model":"{MODEL}","input":"x","questions":[],"questions":[{{"type":"predicate","instructions":"?"}}]}}'
    response = httpx.post(f"{proxy}/v1/decisions", content=raw, headers={"authorization": "Bearer sk-decider",
                          "content-type": "application/json"})  # fmt: skip
    assert response.status_code == 200 and len(response.json()["answers"]) == 1


def test_the_route_is_a_404_in_front_of_vllm_0_32(qwen3_dir: Path) -> None:
    with simulator_in_memory(qwen3_dir, profile="0.32", max_model_len=WINDOW) as older, guard(older, qwen3_dir) as g:
        body = {"model": MODEL, "input": "x", "questions": QUESTIONS}
        assert older.client.post("/v1/decisions", json=body).status_code == 404
        before = older.stats.received
        response = httpx.post(f"{g.url}/v1/decisions", json=body)
        assert response.status_code == 404 and "0.32.0" in response.json()["error"]["message"]
        assert older.stats.received == before


def test_a_call_whose_fan_out_outgrows_the_kv_budget_is_refused(sim: InMemorySim, qwen3_dir: Path) -> None:
    with guard(sim, qwen3_dir, **{"admission.max_inflight_tokens": 300}) as small:
        one = httpx.post(f"{small.url}/v1/decisions", json={"model": MODEL, "input": TICKET, "questions": QUESTIONS})
        assert one.status_code == 200 and one.json()["usage"]["total_tokens"] <= 300
        before = sim.stats.received
        many = httpx.post(f"{small.url}/v1/decisions", json={"model": MODEL, "input": TICKET,
                                                             "questions": QUESTIONS * 2})  # fmt: skip
        error = many.json()["error"]
        assert many.status_code == 400 and error["code"] == "request_too_large" and "6 questions" in error["message"]
        assert sim.stats.received == before


@pytest.mark.parametrize("policy", ["truncate", "chunk"])
def test_an_overflow_policy_never_cuts_a_decision_and_says_so(
    oai: openai.OpenAI, sim: InMemorySim, policy: str
) -> None:
    before = sim.stats.received
    with pytest.raises(openai.BadRequestError) as caught:
        oai.post("/decisions", body={"model": MODEL, "input": "apple " * 1100, "questions": QUESTIONS},
                 cast_to=httpx.Response, options={"headers": {"x-token-guard-overflow": policy}})  # fmt: skip
    assert f"The {policy} policy was not applied" in caught.value.message and sim.stats.received == before


def test_a_call_that_names_no_model_is_the_served_ones_and_answered_in_its_name(proxy: str) -> None:
    body = {"model": "", "input": TICKET, "questions": QUESTIONS}
    response = httpx.post(f"{proxy}/v1/decisions", json=body, headers={"authorization": "Bearer sk-decider"})
    assert response.status_code == 200 and response.json()["model"] == MODEL
    assert int(response.headers["x-token-guard-prompt-tokens"]) == response.json()["usage"]["input_tokens"]
