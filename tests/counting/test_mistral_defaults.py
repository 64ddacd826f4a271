"""A server's --default-chat-template-kwargs for a model vLLM renders with mistral_common (`--tokenizer-mode
mistral`), against vLLM's own call path as the reference: `build_chat_params(...).with_defaults(...)` merges the
defaults under what the request sets (`merge_kwargs`: a None value is unset), the renderer hands the result to its
MistralTokenizer, which up to 0.33 passes on only `reasoning_effort` (v15+ tokenizers) and from 0.34 every kwarg it
does not read itself; `tools` is a parameter of its own on every release. The request's own chat_template_kwargs
stay refused.
"""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxy.api.chat import parse_chat
from proxy.counting.local_count import count_chat
from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer, load_tokenizer
from proxy.errors import InvalidRequest
from proxy.settings import CountingSettings
from tests.support import zoo

MESSAGES = [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Name a colour."}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA, "strict": True}}
TOOL: dict[str, Any] = {"type": "function", "function": {"name": "paint", "description": "Paint a wall.",
                                         "parameters": {"type": "object", "properties": {}}}}  # fmt: skip
EFFORT = {"reasoning_effort": "minimal"}  # "minimal" is one token longer than the file's default "none"


@functools.cache  # loaded once per directory: the tests' time goes there
def _backend(directory: str) -> Any:
    from mistral_common.protocol.instruct.validator import ValidationMode
    from transformers.tokenization_mistral_common import MistralCommonBackend

    return MistralCommonBackend.from_pretrained(directory, mode=ValidationMode.test)


def vllm(directory: str, release: str, defaults: dict[str, Any], **request: Any) -> int:
    """The prompt's length as vLLM `release` renders it: `ChatCompletionRequest.build_chat_params` and
    `ChatParams.with_defaults` (renderers/params.py), `preprocess_chat`'s tools and tokenize, then
    `MistralTokenizer.apply_chat_template` (tokenizers/mistral.py) into transformers' MistralCommonBackend."""

    def merge(low: dict[str, Any], high: dict[str, Any]) -> dict[str, Any]:
        return low | {k: v for k, v in high.items() if v not in (None, "auto")}

    effort = request.get("reasoning_effort")
    extra = {"add_generation_prompt": True, "continue_final_message": False, "documents": None,
             "reasoning_effort": effort}  # fmt: skip
    if effort is not None:
        extra["enable_thinking"] = effort != "none"
    server = merge(defaults, {"tools": request.get("tools"), "tokenize": True})
    kwargs = merge(server, extra) | {"return_dict": False}
    fmt = request.get("response_format")
    if release == "0.34" and fmt is not None and (fmt["type"] == "json_object" or "schema" in fmt["json_schema"]):
        kwargs["response_format"] = fmt
    backend = _backend(directory)
    tools = kwargs.pop("tools", None)
    if release == "0.34":
        for key in ("add_generation_prompt", "continue_final_message", "tokenize", "padding", "truncation",
                    "max_length", "return_tensors", "return_dict"):  # fmt: skip
            kwargs.pop(key, None)
        passed = kwargs
    else:
        version = int(str(backend.tokenizer.instruct_tokenizer.tokenizer.version.value).rsplit("v", 1)[-1])
        passed = {"reasoning_effort": kwargs.get("reasoning_effort")} if version >= 15 else {}
    ids = backend.apply_chat_template(MESSAGES, tools=tools, continue_final_message=False, tokenize=True,
                                      return_dict=False, **passed)  # fmt: skip
    return len(ids)


def served(directory: Path, release: str, defaults: dict[str, Any]) -> ModelTokenizer:
    """The model's tokenizer as a guard configured with the server's defaults leaves it once it learns the upstream
    is vLLM `release`."""
    tok = replace(_loaded(directory), default_kwargs=defaults)
    counter = TokenCounter(tok.backend, CountingSettings(cache_mb=0), name="m")
    models = ModelRegistry([GuardedModel("m", tok, 4096, "config", counter)], discovering=False)
    models.set_upstream_version(f"{release}.0")
    return models.resolve("m").tokenizer


@functools.cache
def _loaded(directory: Path) -> ModelTokenizer:
    return load_tokenizer(str(directory), None, "mistral")


def guard(tok: ModelTokenizer, **body: Any) -> int:
    return asyncio.run(count_chat(tok, parse_chat(json.dumps({"messages": MESSAGES, **body}).encode())))


@pytest.fixture(scope="module")
def v15(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zoo.mistral_v15_dir(tmp_path_factory.mktemp("v15"), efforts=["none", "minimal"])


@pytest.fixture(scope="module")
def nemo() -> Path:
    return zoo.family_dir("mistral-nemo")


@pytest.mark.parametrize("release", ["0.33", "0.34"])
def test_a_default_effort_reaches_a_v15_tokenizer(v15: Path, release: str) -> None:
    plain = guard(served(v15, release, {}))
    tok = served(v15, release, EFFORT)
    assert guard(tok) == vllm(str(v15), release, EFFORT) == plain + 1
    # the request's own effort wins over the default
    assert guard(tok, reasoning_effort="none") == vllm(str(v15), release, EFFORT, reasoning_effort="none") == plain


def test_a_default_effort_is_refused_by_an_older_tokenizer_from_034(nemo: Path) -> None:
    """0.33 hands a pre-v15 tokenizer no effort at all; 0.34 hands it the default, which mistral_common refuses."""
    defaults = {"reasoning_effort": "high"}
    assert guard(served(nemo, "0.33", defaults)) == vllm(str(nemo), "0.33", defaults) == guard(served(nemo, "0.33", {}))
    from mistral_common.exceptions import MistralCommonException  # vLLM's safe_apply_chat_template: a 400

    with pytest.raises(MistralCommonException, match="reasoning_effort='high' is not supported for this model"):
        vllm(str(nemo), "0.34", defaults)
    with pytest.raises(InvalidRequest, match="reasoning_effort='high' is not supported for this model"):
        guard(served(nemo, "0.34", defaults))


def test_a_default_response_format_reaches_mistral_common_from_034(v15: Path) -> None:
    defaults = {"response_format": JSON_SCHEMA}
    plain = guard(served(v15, "0.34", {}))
    assert guard(served(v15, "0.34", defaults)) == vllm(str(v15), "0.34", defaults) > plain  # the schema's in
    assert guard(served(v15, "0.33", defaults)) == vllm(str(v15), "0.33", defaults) == plain
    # a response_format vLLM hands over replaces the default; one it keeps back leaves the default in place
    own = {"type": "json_object"}
    assert guard(served(v15, "0.34", defaults), response_format=own) == vllm(str(v15), "0.34", defaults,
                                                                              response_format=own)  # fmt: skip
    text = {"type": "text"}
    assert guard(served(v15, "0.34", defaults), response_format=text) == vllm(str(v15), "0.34", defaults) > plain


@pytest.mark.parametrize("release", ["0.33", "0.34"])
def test_default_tools_reach_a_request_without_tools(nemo: Path, release: str) -> None:
    defaults = {"tools": [TOOL]}
    plain = guard(served(nemo, release, {}))
    assert guard(served(nemo, release, defaults)) == vllm(str(nemo), release, defaults) > plain
    own = {"type": "function", "function": {**TOOL["function"], "name": "a_much_longer_tool_name_than_paint"}}
    counted = guard(served(nemo, release, defaults), tools=[own])
    assert counted == guard(served(nemo, release, {}), tools=[own]) > guard(served(nemo, release, defaults))


@pytest.mark.parametrize("release", ["0.33", "0.34"])
def test_defaults_the_request_always_sets_change_nothing(v15: Path, release: str) -> None:
    """add_generation_prompt and continue_final_message: every chat request sets both, over any default."""
    defaults = {"add_generation_prompt": False, "continue_final_message": True, "enable_thinking": False}
    assert guard(served(v15, release, defaults)) == vllm(str(v15), release, defaults) == guard(served(v15, release, {}))


def test_the_requests_own_kwargs_stay_refused(v15: Path) -> None:
    with pytest.raises(InvalidRequest, match="chat_template is not supported for Mistral tokenizers"):
        guard(served(v15, "0.34", EFFORT), chat_template_kwargs={"reasoning_effort": "none"})
