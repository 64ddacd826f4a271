"""The simulator counts prompts exactly like vLLM: chat through the template (transformers), completions with
add_special_tokens, for /tokenize and for usage.prompt_tokens alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.counting.conversation import detect_content_format, to_conversation, to_tools
from proxy.counting.roles import developer_as_system, has_developer, mentions_developer
from simulator import SimulatorSettings
from simulator.chat import plan_chat
from simulator.context import Context
from simulator.profiles import get_profile
from simulator.tokenize import tokenize
from simulator.tokenizer import SimTokenizer
from tests.corpus import CHAT_CASES, COMPLETION_PROMPTS, WEATHER_TOOL
from tests.support.sim_fixtures import (  # noqa: F401
    RunningSim,
    fixture_hf_tokenizer,
    fixture_sim,
    fixture_sim031,
    fixture_sim032,
    fixture_sim_tokenizer_dir,
)
from tests.support.trained import write_trained_tokenizer_dir


def reference_chat_ids(tokenizer: Any, request: dict[str, Any], normalize_tools: bool = True) -> list[int]:
    """The count a vLLM would reach: vLLM's conversation and tools (developer messages as system for a template
    that never names the role), then transformers' own apply_chat_template."""
    template = tokenizer.chat_template
    conversation = to_conversation(request["messages"], detect_content_format(template))
    if has_developer(conversation) and not mentions_developer(template):
        conversation = developer_as_system(conversation)
    tools = request.get("tools")
    encoded = tokenizer.apply_chat_template(
        conversation,
        tools=to_tools(tools) if normalize_tools else tools,
        chat_template=template,
        add_generation_prompt=request.get("add_generation_prompt", True),
        continue_final_message=request.get("continue_final_message", False),
        tokenize=True,
        return_dict=True,
        **request.get("chat_template_kwargs", {}),
    )
    return list(encoded["input_ids"])


@pytest.mark.parametrize(("case", "request_fields"), CHAT_CASES, ids=[c for c, _ in CHAT_CASES])
def test_chat_tokenize_matches_transformers(
    sim032: RunningSim, hf_tokenizer: Any, case: str, request_fields: dict[str, Any]
) -> None:
    response = sim032.client.post("/tokenize", json=request_fields)
    assert response.status_code == 200, response.text
    body = response.json()
    expected = reference_chat_ids(hf_tokenizer, request_fields)
    assert body["tokens"] == expected
    assert body["count"] == len(expected)
    assert body["max_model_len"] == 2048


@pytest.mark.parametrize(("case", "request_fields"), CHAT_CASES, ids=[c for c, _ in CHAT_CASES])
def test_chat_usage_prompt_tokens_matches_tokenize(
    sim032: RunningSim, hf_tokenizer: Any, case: str, request_fields: dict[str, Any]
) -> None:
    response = sim032.client.post("/v1/chat/completions", json={**request_fields, "max_tokens": 3})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["prompt_tokens"] == len(reference_chat_ids(hf_tokenizer, request_fields))


@pytest.mark.parametrize(("case", "prompt"), COMPLETION_PROMPTS, ids=[c for c, _ in COMPLETION_PROMPTS])
def test_completion_prompt_counts_match_transformers(
    sim: RunningSim, hf_tokenizer: Any, case: str, prompt: str
) -> None:
    expected = list(hf_tokenizer(prompt).input_ids)
    tokenized = sim.client.post("/tokenize", json={"prompt": prompt}).json()
    assert tokenized["tokens"] == expected
    completion = sim.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert completion.status_code == 200, completion.text
    assert completion.json()["usage"]["prompt_tokens"] == len(expected)


def test_profiles_count_alike(sim031: RunningSim, sim032: RunningSim) -> None:
    request = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1}
    counts = [
        s.client.post("/v1/chat/completions", json=request).json()["usage"]["prompt_tokens"] for s in (sim031, sim032)
    ]
    assert counts[0] == counts[1] == sim032.client.post("/tokenize", json=request).json()["count"]


def test_real_vllm_anchor_for_a_plain_prompt(sim: RunningSim) -> None:
    # real-vllm.md: a real vLLM 0.32 answered count 8 for this prompt with this tokenizer (no BOS added).
    assert sim.client.post("/tokenize", json={"prompt": "Hello world, this is a test."}).json()["count"] == 8


def test_chat_add_special_tokens_tokenizes_the_rendered_text_with_specials(
    sim032: RunningSim, hf_tokenizer: Any
) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    text = hf_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    body = sim032.client.post("/tokenize", json={"messages": messages, "add_special_tokens": True}).json()
    assert body["tokens"] == list(hf_tokenizer(text, add_special_tokens=True).input_ids)


def test_return_token_strs_gives_vocabulary_pieces(sim032: RunningSim) -> None:
    body = sim032.client.post("/tokenize", json={"prompt": "the cat", "return_token_strs": True}).json()
    assert body["token_strs"] == ["the", "Ġcat"]


def test_tools_are_normalised_like_vllm_before_rendering(sim032: RunningSim, hf_tokenizer: Any) -> None:
    # vLLM re-serialises each tool through its request model: a missing description becomes null, unknown keys
    # go, and `type` comes first. The template renders `tool | tojson`, so the count changes.
    bare = {"function": {"name": "ping", "extra": 1}, "type": "function"}
    messages = [{"role": "user", "content": "Ping?"}]
    normalised = {"type": "function", "function": {"name": "ping", "description": None, "parameters": None}}
    expected = reference_chat_ids(hf_tokenizer, {"messages": messages, "tools": [normalised]})
    assert expected != reference_chat_ids(hf_tokenizer, {"messages": messages, "tools": [bare]}, normalize_tools=False)
    body = sim032.client.post("/tokenize", json={"messages": messages, "tools": [bare]}).json()
    assert body["tokens"] == expected
    full = sim032.client.post("/tokenize", json={"messages": messages, "tools": [WEATHER_TOOL]}).json()
    assert full["tokens"] == reference_chat_ids(hf_tokenizer, {"messages": messages, "tools": [WEATHER_TOOL]})


def handler_context(hf: Any, directory: Path, template: str | None = None) -> Context:
    """The simulator's handlers over an already loaded tokenizer: the same code path as the HTTP routes,
    without starting a server (or loading the tokenizer) again."""
    settings = SimulatorSettings(tokenizer=directory)
    tokenizer = SimTokenizer(hf, template if template is not None else hf.chat_template)
    return Context(settings=settings, profile=get_profile("0.32"), tokenizer=tokenizer, fingerprint="fp")


def test_template_inputs_reach_the_template(hf_tokenizer: Any, sim_tokenizer_dir: Path) -> None:
    template = (
        "{% for m in messages %}{{ greeting }} {{ m['content'] }}{% endfor %}{% if enable_thinking %} think{% endif %}"
    )
    ctx = handler_context(hf_tokenizer, sim_tokenizer_dir, template)
    messages = [{"role": "user", "content": "world"}]
    plain = tokenize(ctx, {"messages": messages})["count"]
    greeted = tokenize(ctx, {"messages": messages, "chat_template_kwargs": {"greeting": "hello there, dear"}})
    assert greeted["count"] > plain
    # vLLM turns reasoning_effort into enable_thinking for templates that need the opt-in.
    request = {"messages": messages, "max_tokens": 1}
    without = plan_chat(ctx, request, {}).prompts[0].token_ids
    thinking = plan_chat(ctx, {**request, "reasoning_effort": "high"}, {}).prompts[0].token_ids
    assert (len(without), len(thinking)) == (plain, plain + 1)


@pytest.fixture(scope="module", name="chatml")
def fixture_chatml(tmp_path_factory: pytest.TempPathFactory) -> tuple[Context, Any]:
    from transformers import AutoTokenizer

    directory = write_trained_tokenizer_dir(tmp_path_factory.mktemp("chatml"))
    hf = AutoTokenizer.from_pretrained(str(directory))
    return handler_context(hf, directory), hf


@pytest.mark.parametrize(("case", "request_fields"), CHAT_CASES, ids=[c for c, _ in CHAT_CASES])
def test_chat_parity_with_a_template_that_loops_over_parts(
    chatml: tuple[Context, Any], case: str, request_fields: dict[str, Any]
) -> None:
    ctx, hf = chatml
    assert tokenize(ctx, request_fields)["tokens"] == reference_chat_ids(hf, request_fields)
