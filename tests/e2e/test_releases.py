"""What moved in vLLM 0.33 and 0.34, against the real 0.34.0 API layer (tests/e2e/overlay), with the real `openai`
and `anthropic` SDKs: the Decisions API counted as vLLM charges it (on Qwen3) and refused over the window, Anthropic
errors in Anthropic's vocabulary from the guard as from vLLM, count_tokens past the window counted,
`truncate_prompt_tokens: -1` with no output limit served as vLLM serves it, and a Responses stream cut at its limit
ending `response.incomplete`. Each test runs on every selected version from 0.33 on (by default 0.34.0)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.e2e import runtime
from tests.e2e.families import FAMILIES, WINDOW, Served, served
from tests.e2e.runtime import MAX_MODEL_LEN, SERVED_NAME
from tests.e2e.stack import Stack, Stacks
from tests.e2e.wire import GUARD_ACTION, GUARD_PROMPT, words

pytestmark = pytest.mark.e2e

NEWER = [version for version in runtime.VERSIONS if tuple(map(int, version.split("."))) >= (0, 33)]
QUESTIONS: list[dict[str, Any]] = [
    {"type": "predicate", "instructions": "Is the customer angry?", "name": "angry"},
    {"type": "choice", "instructions": "Which team should answer?", "choices": [
        {"value": "billing", "description": "money, invoices"}, {"value": "support"}]},
    {"type": "score", "instructions": "How urgent?", "levels": [{"label": "calm"}, {"label": "urgent"}]},
]  # fmt: skip
TICKET = "My invoice is wrong for the third month running and nobody answers my mails. 東京から。"


@pytest.fixture(scope="module", params=NEWER)
def newer(request: pytest.FixtureRequest, stacks: Stacks) -> Stack:
    return stacks.get(request.param)


@pytest.fixture(scope="module")
def claude(newer: Stack) -> Iterator[tuple[anthropic.Anthropic, anthropic.Anthropic]]:
    """(through the guard, straight to vLLM)."""
    with (
        anthropic.Anthropic(base_url=newer.proxy_url, api_key="x", max_retries=0, timeout=120) as guarded,
        anthropic.Anthropic(base_url=newer.vllm_url, api_key="x", max_retries=0, timeout=120) as direct,
    ):
        yield guarded, direct


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Served]]:
    """Qwen3 (thinking off by default) served by each newer release: vLLM reads decisions with Qwen3, Qwen3.5, Gemma 4
    and a few others only; any other architecture answers 501."""
    family = next(family for family in FAMILIES if family.zoo_family == "qwen3")
    with served(family, NEWER, tmp_path_factory.mktemp("decisions")) as running:
        yield running


def decide(client: httpx.Client, url: str, body: dict[str, Any]) -> httpx.Response:
    return client.post(url + "/v1/decisions", json={"model": SERVED_NAME, **body})


@pytest.mark.parametrize("version", NEWER)
def test_a_decisions_call_is_counted_as_vllm_charges_it(qwen3: dict[str, Served], version: str) -> None:
    server = qwen3[version]
    response = decide(server.http, server.guard_url, {"input": TICKET, "questions": QUESTIONS})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert response.headers[GUARD_ACTION] == "pass"
    assert int(response.headers[GUARD_PROMPT]) == usage["input_tokens"]  # every question's whole prompt
    assert usage["output_tokens"] == len(QUESTIONS)  # one token each
    assert [answer["type"] for answer in response.json()["answers"]] == ["predicate", "choice", "score"]


@pytest.mark.parametrize("version", NEWER)
def test_a_decision_over_the_window_is_refused_before_vllm(qwen3: dict[str, Served], version: str) -> None:
    server = qwen3[version]
    body = {"input": words(WINDOW + 100), "questions": QUESTIONS[:1]}
    assert decide(server.http, server.vllm_url, body).status_code == 400  # vLLM refuses it too
    response = decide(server.http, server.guard_url, body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "context_length_exceeded"
    assert f"maximum context length is {WINDOW} tokens" in error["message"]


def test_messages_errors_speak_anthropics_vocabulary_from_the_guard_as_from_vllm(
    claude: tuple[anthropic.Anthropic, anthropic.Anthropic],
) -> None:
    guarded, direct = claude
    with pytest.raises(anthropic.BadRequestError) as vllms:
        direct.messages.create(model=SERVED_NAME, max_tokens=100_000, messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(anthropic.BadRequestError) as guards:  # the guard's own refusal: it never reaches vLLM
        guarded.messages.create(model=SERVED_NAME, max_tokens=10,
                                messages=[{"role": "user", "content": words(MAX_MODEL_LEN + 10)}])  # fmt: skip
    for caught in (vllms, guards):
        error = caught.value.body
        assert isinstance(error, dict) and error["type"] == "error"
        assert error["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        guarded.messages.create(model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "hi"}])
    assert isinstance(missing.value.body, dict) and missing.value.body["error"]["type"] == "not_found_error"


def test_count_tokens_counts_a_prompt_longer_than_the_window_as_vllm_does(
    claude: tuple[anthropic.Anthropic, anthropic.Anthropic],
) -> None:
    guarded, direct = claude
    long: Any = [{"role": "user", "content": words(MAX_MODEL_LEN + 100)}]
    vllms = direct.messages.count_tokens(model=SERVED_NAME, messages=long).input_tokens
    raw = guarded.messages.with_raw_response.count_tokens(model=SERVED_NAME, messages=long)
    assert raw.headers[GUARD_ACTION] == "count"  # answered by the guard itself
    assert raw.parse().input_tokens == vllms > MAX_MODEL_LEN


def test_minus_one_with_no_output_limit_keeps_all_but_one_token_and_answers_one(newer: Stack) -> None:
    long: Any = [{"role": "user", "content": words(MAX_MODEL_LEN + 100)}]
    extra = {"truncate_prompt_tokens": -1}
    direct = newer.direct.chat.completions.create(model=SERVED_NAME, messages=long, extra_body=extra)
    raw = newer.guarded.chat.completions.with_raw_response.create(model=SERVED_NAME, messages=long, extra_body=extra)
    answer = raw.parse()
    assert direct.usage is not None and answer.usage is not None
    assert answer.usage.prompt_tokens == direct.usage.prompt_tokens == MAX_MODEL_LEN - 1
    assert int(raw.headers[GUARD_PROMPT]) == answer.usage.prompt_tokens
    assert answer.usage.completion_tokens == direct.usage.completion_tokens == 1


def test_a_responses_stream_cut_at_its_limit_ends_incomplete(newer: Stack) -> None:
    events = list(newer.guarded.responses.create(model=SERVED_NAME, input=words(MAX_MODEL_LEN - 60),
                                                 max_output_tokens=100_000, temperature=0, stream=True))  # fmt: skip
    last = events[-1]  # the limit the guard clamped it to: what the prompt leaves, less the next turn's share
    assert last.type == "response.incomplete" and last.response.status == "incomplete"
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    usage = last.response.usage
    assert usage is not None and 0 < usage.output_tokens < MAX_MODEL_LEN - usage.input_tokens
