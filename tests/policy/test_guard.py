"""The Guard itself, without a socket: a body to each guarded route, read, counted with the model's real tokenizer and
decided; its counts checked against transformers (the reference), its decisions against the window."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from proxy.api.routes import ROUTES, Kind, Reads, Route, RouteTable
from proxy.counting.isolated import BodyParser
from proxy.counting.registry import ModelRegistry
from proxy.errors import ContextLengthExceeded, InvalidRequest
from proxy.policy.guard import Guard
from proxy.policy.outcome import Answer, Findings, Forward, Outcome, Refuse
from proxy.policy.recipes import COUNTED, RECIPES
from proxy.policy.steps import Steps
from proxy.settings import load_settings

MODEL = "tiny"
WINDOW = 512
HELLO = [{"role": "user", "content": "Hello, how are you today?"}]


@pytest.fixture(scope="module")
def guard(tokenizer_dir: Path) -> Iterator[Guard]:
    flags = {"model.name": MODEL, "model.tokenizer": str(tokenizer_dir), "model.max_model_len": WINDOW}
    settings = load_settings(flags, environ={})
    parser = BodyParser()  # started on the first large body only
    try:
        yield Guard(Steps(settings, ModelRegistry.from_settings(settings.models, settings.counting)), parser)
    finally:
        parser.close()


def handle(guard: Guard, path: str, body: dict[str, Any], headers: Mapping[str, str] | None = None,
           findings: Findings | None = None) -> Outcome:  # fmt: skip
    found = RouteTable().find(path)
    assert found is not None
    return asyncio.run(guard.handle(found.route, json.dumps(body).encode(), headers or {}, findings or Findings()))


def chat_tokens(reference: Any, messages: list[dict[str, Any]]) -> int:
    text = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(reference(text, add_special_tokens=False)["input_ids"])  # vLLM's chat: the template writes them


def text_tokens(reference: Any, text: str) -> int:
    return len(reference(text)["input_ids"])


def test_a_chat_that_fits_is_forwarded_as_sent_with_its_exact_count(guard: Guard, reference: Any) -> None:
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 20}
    findings = Findings()
    outcome = handle(guard, "/v1/chat/completions", body, findings=findings)
    assert isinstance(outcome, Forward) and json.loads(outcome.body) == body
    decision = outcome.decision
    assert (decision.action, decision.prompt_tokens, decision.max_tokens) == ("pass", chat_tokens(reference, HELLO), 20)
    assert (decision.count_source, findings.model, findings.decision) == ("local", MODEL, decision)
    assert outcome.cost == decision.prompt_tokens + 20


def test_a_chat_limit_over_the_room_is_clamped_to_it(guard: Guard, reference: Any) -> None:
    outcome = handle(guard, "/v1/chat/completions", {"model": MODEL, "messages": HELLO, "max_tokens": 10 * WINDOW})
    room = WINDOW - chat_tokens(reference, HELLO)
    assert isinstance(outcome, Forward) and json.loads(outcome.body)["max_tokens"] == room
    assert (outcome.decision.action, outcome.decision.max_tokens) == ("clamp", room)


def test_a_completion_counts_its_prompt_as_vllm_tokenizes_it(guard: Guard, reference: Any) -> None:
    prompt = "The quick brown fox jumps over the lazy dog."
    outcome = handle(guard, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 5})
    assert isinstance(outcome, Forward)
    assert (outcome.decision.action, outcome.decision.prompt_tokens) == ("pass", text_tokens(reference, prompt))


def test_a_responses_input_counts_as_the_chat_vllm_renders(guard: Guard, reference: Any) -> None:
    body = {"model": MODEL, "input": HELLO[0]["content"], "max_output_tokens": 30}
    outcome = handle(guard, "/v1/responses", body)
    assert isinstance(outcome, Forward)
    decision = outcome.decision
    assert (decision.action, decision.prompt_tokens, decision.max_tokens) == ("pass", chat_tokens(reference, HELLO), 30)


def test_a_messages_request_counts_as_the_chat_vllm_renders(guard: Guard, reference: Any) -> None:
    outcome = handle(guard, "/v1/messages", {"model": MODEL, "messages": HELLO, "max_tokens": 40})
    assert isinstance(outcome, Forward)
    decision = outcome.decision
    assert (decision.action, decision.prompt_tokens, decision.max_tokens) == ("pass", chat_tokens(reference, HELLO), 40)


def test_anthropic_count_tokens_is_answered_by_the_guard(guard: Guard, reference: Any) -> None:
    outcome = handle(guard, "/v1/messages/count_tokens", {"model": MODEL, "messages": HELLO})
    assert isinstance(outcome, Answer)
    assert json.loads(outcome.body)["input_tokens"] == chat_tokens(reference, HELLO)
    assert outcome.decision.action == "count"


def test_an_embeddings_request_counts_each_input(guard: Guard, reference: Any) -> None:
    texts = ["one small input", "and a second, somewhat longer input than the first"]
    outcome = handle(guard, "/v1/embeddings", {"model": MODEL, "input": texts})
    assert isinstance(outcome, Forward)
    total = sum(text_tokens(reference, t) for t in texts)
    assert (outcome.decision.action, outcome.decision.prompt_tokens, outcome.cost) == ("pass", total, total)


def test_an_invocations_body_is_read_as_the_endpoint_vllm_dispatches_it_to(guard: Guard, reference: Any) -> None:
    headers = {"x-amzn-sagemaker-adapter-identifier": MODEL}
    outcome = handle(guard, "/invocations", {"messages": HELLO, "max_tokens": 8}, headers)
    assert isinstance(outcome, Forward) and json.loads(outcome.body)["model"] == MODEL
    assert outcome.decision.prompt_tokens == chat_tokens(reference, HELLO)


def long_chat() -> list[dict[str, Any]]:
    turn = "Tell me more about the history of the printing press in Europe. " * 4
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: {turn}"} for i in range(25)]


def test_a_chat_over_the_window_is_refused_with_the_overflow_400(guard: Guard, reference: Any) -> None:
    messages = long_chat()
    counted = chat_tokens(reference, messages)
    assert counted > WINDOW
    outcome = handle(guard, "/v1/chat/completions", {"model": MODEL, "messages": messages})
    assert isinstance(outcome, Refuse) and isinstance(outcome.error, ContextLengthExceeded)
    assert outcome.error.status == 400 and f"{WINDOW} tokens" in outcome.error.message
    assert (outcome.decision.action, outcome.decision.prompt_tokens) == ("reject", counted)


def test_a_chat_over_the_window_asking_truncate_is_cut_to_fit(guard: Guard, reference: Any) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": long_chat(), "max_tokens": 50}
    outcome = handle(guard, "/v1/chat/completions", body, {"x-token-guard-overflow": "truncate"})
    assert isinstance(outcome, Forward) and outcome.decision.action == "truncate"
    sent = json.loads(outcome.body)["messages"]
    assert len(sent) < len(body["messages"]) and sent[-1] == body["messages"][-1]
    assert outcome.decision.prompt_tokens == chat_tokens(reference, sent) <= WINDOW - 50


def test_an_unknown_overflow_choice_is_the_clients_400(guard: Guard) -> None:
    with pytest.raises(InvalidRequest, match="x-token-guard-overflow header must be one of"):
        handle(guard, "/v1/chat/completions", {"model": MODEL, "messages": HELLO}, {"x-token-guard-overflow": "drop"})


@pytest.mark.parametrize(
    ("route", "said"),
    [(Route("/v1/new", frozenset({"POST"}), Kind.GENERATE), "cannot read requests of this endpoint (None)"),
     (Route("/v1/new/render", frozenset({"POST"}), Kind.COUNT, Reads.EMBEDDINGS),
      "cannot count requests of this endpoint (embeddings)")],
)  # fmt: skip
def test_a_route_whose_kind_has_no_recipe_is_refused_with_a_400(guard: Guard, route: Route, said: str) -> None:
    raw = json.dumps({"model": MODEL, "input": "hi"}).encode()
    with pytest.raises(InvalidRequest, match=re.escape(said)) as refused:
        asyncio.run(guard.handle(route, raw, {}, Findings()))
    assert refused.value.status == 400


def test_every_guarded_route_has_a_recipe() -> None:
    """A route declared without one would answer every request with the 400 above."""
    own = {Reads.AUDIO, Reads.INVOCATIONS}  # a form; a body of one of the others
    missing = [
        route.path for route in ROUTES if route.guarded
        if route.reads is None or route.reads not in {*(COUNTED if route.kind is Kind.COUNT else RECIPES), *own}
    ]  # fmt: skip
    assert not missing
