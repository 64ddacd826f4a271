"""A model in mistral mode behind a guard configured with the server's `default_chat_template_kwargs`, in front of the
simulator's 0.32 and 0.34 profiles, through the real `openai` SDK: the guard learns the release from the upstream and
counts the defaults as that release hands them to mistral_common (a default effort on both, a default response format
from 0.34). The simulator has no mistral mode, so its usage is no reference; mistral_common's own encoding is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support import zoo
from tests.support.servers import MODEL, guard, simulator_in_memory

SCHEMA: Any = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
JSON_SCHEMA: Any = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA}}
MESSAGES: Any = [{"role": "user", "content": "Name a colour."}]
DEFAULTS = {"reasoning_effort": "minimal", "response_format": JSON_SCHEMA}


@pytest.fixture(scope="module")
def v15_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.mistral_v15_dir(tmp_path_factory.mktemp("v15"), efforts=["none", "minimal"])


def encoded(directory: Path, **kwargs: Any) -> int:
    """mistral_common's prompt length for the messages with these request fields."""
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.validator import ValidationMode
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tok = MistralTokenizer.from_file(str(directory / "tekken.json"), mode=ValidationMode.test)
    return len(tok.encode_chat_completion(ChatCompletionRequest.from_openai(messages=MESSAGES, **kwargs)).tokens)


@pytest.fixture(scope="module", params=["0.32", "0.34"])
def served(request: pytest.FixtureRequest, v15_dir: Path) -> Iterator[tuple[str, openai.OpenAI]]:
    flags = {"model.tokenizer_mode": "mistral", "counting.source": "local",
             "model.default_chat_template_kwargs": json.dumps(DEFAULTS)}  # fmt: skip
    with (
        simulator_in_memory(v15_dir, profile=request.param, max_model_len=4096) as sim,
        guard(sim, v15_dir, **flags) as proxy,
    ):
        yield request.param, openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)


def counted(client: openai.OpenAI, **extra: Any) -> int:
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=5, **extra)
    return int(raw.headers["x-token-guard-prompt-tokens"])


def test_the_defaults_are_counted_as_the_release_hands_them_to_mistral_common(
    served: tuple[str, openai.OpenAI], v15_dir: Path
) -> None:
    profile, client = served
    expected = {"reasoning_effort": "minimal"}
    if profile == "0.34":
        expected["response_format"] = JSON_SCHEMA
    assert counted(client) == encoded(v15_dir, **expected)
    # the request's own effort wins over the default
    assert counted(client, reasoning_effort="none") == encoded(v15_dir, **{**expected, "reasoning_effort": "none"})
