"""A model in mistral mode (a v15 Tekken tokenizer that takes a `json_schema` model setting) behind the guard, in
front of the simulator's 0.32 and 0.34 profiles, through the real `openai` and `anthropic` SDKs: the guard learns the
release from the upstream and counts a JSON response format into the prompt only on 0.34, whose renderer hands it to
mistral_common. The simulator renders every model with its Jinja template (it has no mistral mode), so its usage is
no reference here; the reference for the count is mistral_common's own encoding of the request vLLM 0.34 builds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from tests.support import zoo
from tests.support.servers import MODEL, guard, simulator_in_memory

SCHEMA: Any = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
MESSAGES: Any = [{"role": "user", "content": "Name a colour."}]
JSON_SCHEMA: Any = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def v15_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.mistral_v15_dir(tmp_path_factory.mktemp("v15"))


@pytest.fixture(scope="module", params=["0.32", "0.34"])
def served(request: pytest.FixtureRequest, v15_dir: Path) -> Iterator[tuple[str, str]]:
    flags = {"model.tokenizer_mode": "mistral", "counting.source": "local"}
    with (
        simulator_in_memory(v15_dir, profile=request.param, max_model_len=4096) as sim,
        guard(sim, v15_dir, **flags) as proxy,
    ):
        yield request.param, proxy.url


def schema_tokens(directory: Path, fmt: dict[str, Any]) -> int:
    """What mistral_common adds to the prompt for `fmt` as vLLM 0.34 hands it over."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tok = MistralTokenizer.from_file(str(directory / "tekken.json"), mode=ValidationMode.test)
    with_it = ChatCompletionRequest.from_openai(messages=MESSAGES, response_format=fmt)
    without = ChatCompletionRequest.from_openai(messages=MESSAGES)
    return len(tok.encode_chat_completion(with_it).tokens) - len(tok.encode_chat_completion(without).tokens)


def test_chat_counts_the_response_format_as_the_release_renders_it(served: tuple[str, str], v15_dir: Path) -> None:
    profile, url = served
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    def counted(**extra: Any) -> int:
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=5, **extra)
        return int(raw.headers["x-token-guard-prompt-tokens"])

    added = counted(response_format=JSON_SCHEMA) - counted()
    assert added == (schema_tokens(v15_dir, JSON_SCHEMA) if profile == "0.34" else 0)
    assert profile == "0.32" or added > 10  # the schema itself, between [MODEL_SETTINGS] and [/MODEL_SETTINGS]


def test_messages_count_the_output_format_as_the_release_renders_it(served: tuple[str, str], v15_dir: Path) -> None:
    profile, url = served
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)

    def counted(**extra: Any) -> int:
        raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=5, messages=MESSAGES, **extra)
        return int(raw.headers["x-token-guard-prompt-tokens"])

    output = {"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}
    as_vllm_hands_it = {"type": "json_schema", "json_schema": {"name": "json_schema", "schema": SCHEMA}}
    added = counted(extra_body=output) - counted()
    assert added == (schema_tokens(v15_dir, as_vllm_hands_it) if profile == "0.34" else 0)
