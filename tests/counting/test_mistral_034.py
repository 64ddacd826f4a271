"""What vLLM 0.34 changed for models it renders with mistral_common (`--tokenizer-mode mistral`), against vLLM's own
call path as the reference (transformers' `MistralCommonBackend.apply_chat_template`, which vLLM's MistralTokenizer
calls with the renderer's kwargs) and the guard's count for an upstream of each release:

- `response_format`: 0.34's renderer hands it to mistral_common (json_object, or a json_schema with a schema); a v15
  tokenizer that configures a json_schema model setting writes it into the prompt; older tokenizers add nothing;
- `reasoning_effort`: 0.34 hands it over whatever the tokenizer's version (a pre-v15 one refuses it); 0.33 only to
  v15+;
- the Messages API's inline-system probe: up to 0.33 the --chat-template decides (none: merged); 0.34 renders
  through mistral_common (merged, for every tokenizer version mistral_common 1.13 has).
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from proxy.api.anthropic import messages_request
from proxy.api.chat import parse_chat
from proxy.counting.anthropic import messages_chat
from proxy.counting.anthropic_probes import disabled_thinking_effort, keeps_inline_system, merges_inline_system
from proxy.counting.local_count import count_chat
from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer, load_tokenizer
from proxy.errors import InvalidRequest
from proxy.settings import CountingSettings
from tests.support import zoo

MESSAGES = [{"role": "system", "content": "Answer in JSON."}, {"role": "user", "content": "Name a colour."}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "hex": {"type": "string"}}, "required": ["name"]}
JSON_OBJECT = {"type": "json_object"}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA, "strict": True}}
LENIENT = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"  # accepts a system message anywhere


@pytest.fixture(scope="module")
def v15(tmp_path_factory: pytest.TempPathFactory) -> ModelTokenizer:
    return load_tokenizer(str(zoo.mistral_v15_dir(tmp_path_factory.mktemp("v15"))), None, "mistral")


@pytest.fixture(scope="module")
def nemo() -> ModelTokenizer:
    return load_tokenizer(str(zoo.family_dir("mistral-nemo")), None, "mistral")


def release(tok: ModelTokenizer, version: str) -> ModelTokenizer:
    """The tokenizer as the registry leaves it once it learns the upstream is vLLM `version`."""
    counter = TokenCounter(tok.backend, CountingSettings(cache_mb=0), name="m")
    models = ModelRegistry([GuardedModel("m", tok, 4096, "config", counter)], discovering=False)
    models.set_upstream_version(f"{version}.0")
    return models.resolve("m").tokenizer


def guard(tok: ModelTokenizer, **body: Any) -> int:
    return asyncio.run(count_chat(tok, parse_chat(json.dumps({"messages": MESSAGES, **body}).encode())))


def vllm_034(directory: str, conversation: list[Any] = MESSAGES, **kwargs: Any) -> int:
    """vLLM 0.34's count: its MistralTokenizer hands transformers' backend every remaining kwarg."""
    from mistral_common.protocol.instruct.validator import ValidationMode
    from transformers.tokenization_mistral_common import MistralCommonBackend

    backend = MistralCommonBackend.from_pretrained(directory, mode=ValidationMode.test)
    ids = backend.apply_chat_template(conversation, tokenize=True, return_dict=False, **kwargs)
    return len(ids)


@pytest.mark.parametrize("fmt", [JSON_OBJECT, JSON_SCHEMA], ids=["json_object", "json_schema"])
def test_a_v15_prompt_carries_the_response_format_from_034(v15: ModelTokenizer, fmt: dict[str, Any]) -> None:
    plain = guard(release(v15, "0.34"))
    counted = guard(release(v15, "0.34"), response_format=fmt)
    assert counted == vllm_034(v15.source, response_format=fmt) > plain  # the schema is in the prompt
    assert guard(release(v15, "0.33"), response_format=fmt) == plain  # 0.33's renderer does not pass it


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "text"},
        {"type": "json_schema", "json_schema": {"name": "colour"}},  # no schema: vLLM keeps it from mistral_common
        {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": [], "tags": []}},
    ],
    ids=["text", "json_schema-without-schema", "structural_tag"],
)
def test_formats_vllm_does_not_hand_over_add_nothing(v15: ModelTokenizer, fmt: dict[str, Any]) -> None:
    assert guard(release(v15, "0.34"), response_format=fmt) == guard(release(v15, "0.34"))


def test_none_fields_are_left_out_as_vllm_dumps_them(v15: ModelTokenizer) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "colour", "description": None, "schema": SCHEMA}}
    dumped = {"type": "json_schema", "json_schema": {"name": "colour", "schema": SCHEMA}}
    assert guard(release(v15, "0.34"), response_format=fmt) == vllm_034(v15.source, response_format=dumped)


def test_a_v15_tokenizer_without_a_json_schema_setting_ignores_it(tmp_path: Path) -> None:
    tok = load_tokenizer(str(zoo.mistral_v15_dir(tmp_path, json_schema=False)), None, "mistral")
    assert guard(release(tok, "0.34"), response_format=JSON_SCHEMA) == guard(release(tok, "0.34"))


def test_an_older_tokenizer_adds_nothing_for_a_response_format(nemo: ModelTokenizer) -> None:
    """Nemo's v3 tokenizer takes no model settings: 0.34 hands it the format, and the prompt stays the same."""
    plain = guard(release(nemo, "0.34"))
    for fmt in (JSON_OBJECT, JSON_SCHEMA):
        assert guard(release(nemo, "0.34"), response_format=fmt) == plain == vllm_034(nemo.source, response_format=fmt)


def test_034_validates_the_schema_it_hands_over(nemo: ModelTokenizer) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "colour", "schema": {"type": "colour"}}}
    with pytest.raises(InvalidRequest, match="schema"):
        guard(release(nemo, "0.34"), response_format=bad)
    assert guard(release(nemo, "0.33"), response_format=bad) == guard(release(nemo, "0.33"))


def test_reasoning_effort_reaches_every_tokenizer_version_from_034(nemo: ModelTokenizer, v15: ModelTokenizer) -> None:
    with pytest.raises(InvalidRequest, match="reasoning_effort='high' is not supported for this model"):
        guard(release(nemo, "0.34"), reasoning_effort="high")
    assert guard(release(nemo, "0.33"), reasoning_effort="high") == guard(release(nemo, "0.33"))
    # v15+ got it from 0.33 already (this file configures no reasoning setting, so it adds nothing either way)
    assert guard(release(v15, "0.33"), reasoning_effort="high") == guard(release(v15, "0.34"), reasoning_effort="high")


def test_messages_output_format_is_counted_as_034_renders_it(v15: ModelTokenizer) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Name a colour."}],
            "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}  # fmt: skip
    req = messages_request(body, True, 100)
    chat = messages_chat(v15, req, True)
    assert chat.body["response_format"] == {"type": "json_schema", "json_schema": {"name": "json_schema",
                                                                                    "schema": SCHEMA}}  # fmt: skip
    without = messages_chat(v15, messages_request({**body, "output_config": {}}, True, 100), True)
    new, old = release(v15, "0.34"), release(v15, "0.33")
    assert asyncio.run(count_chat(new, chat)) > asyncio.run(count_chat(new, without))
    assert asyncio.run(count_chat(old, chat)) == asyncio.run(count_chat(old, without))


def lenient_dir(into: Path) -> Path:
    """Nemo in mistral mode whose tokenizer_config.json template takes a system message anywhere: a template vLLM
    never renders this model with."""
    shutil.copytree(zoo.family_dir("mistral-nemo"), into, dirs_exist_ok=True)
    config = json.loads((into / "tokenizer_config.json").read_text())
    (into / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": LENIENT}))
    return into


def test_inline_system_messages_are_merged_for_mistral_common_on_every_release(tmp_path: Path) -> None:
    """vLLM does not probe the tokenizer's own template of a model it renders with mistral_common: up to 0.33 it
    probes the --chat-template (none here: merged), 0.34 mistral_common's rendering (merged)."""
    tok = load_tokenizer(str(lenient_dir(tmp_path)), None, "mistral")
    assert merges_inline_system(release(tok, "0.33"))
    assert merges_inline_system(release(tok, "0.34"))


@pytest.mark.parametrize("v15_file", [False, True], ids=["v3", "v15"])
def test_a_configured_template_decides_up_to_033_and_mistral_common_from_034(tmp_path: Path, v15_file: bool) -> None:
    template = tmp_path / "lenient.jinja"
    template.write_text(LENIENT)
    directory = zoo.mistral_v15_dir(tmp_path / "model") if v15_file else zoo.family_dir("mistral-nemo")
    tok = load_tokenizer(str(directory), template, "mistral")
    assert not merges_inline_system(release(tok, "0.33"))  # the --chat-template takes inline system messages
    assert merges_inline_system(release(tok, "0.34"))  # mistral_common renders them out of place or as user text


def test_the_034_probe_keeps_what_renders_as_system_turns_in_order() -> None:
    def turns(messages: list[dict[str, Any]]) -> str:
        return "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages) + "<|assistant|>"

    def refuses(messages: list[dict[str, Any]]) -> str:
        raise ValueError("system message must be first")

    def joined(messages: list[dict[str, Any]]) -> str:  # system text folded into the user turns
        return "".join(f"<|user|>{m['content']}<|end|>" for m in messages) + "<|assistant|>"

    assert keeps_inline_system(turns)
    assert not keeps_inline_system(refuses)
    assert not keeps_inline_system(joined)
    assert not keeps_inline_system(lambda messages: turns(messages[::-1]))  # out of order


@pytest.mark.parametrize(
    ("efforts", "expected"),
    [(["none", "high"], "none"), (["low", "high"], "low"), (None, "low")],
    ids=["none-listed", "none-not-listed", "no-reasoning-setting"],
)
def test_disabled_thinking_maps_to_the_effort_vllm_probes_through_mistral_common(
    tmp_path: Path, efforts: list[str] | None, expected: str
) -> None:
    """vLLM renders "none" and each effort through mistral_common: "none" unless it is refused or renders like an
    effort. The guard used "low" for every mistral model, which a v15 file listing only none and high refuses."""
    tok = load_tokenizer(str(zoo.mistral_v15_dir(tmp_path, efforts=efforts)), None, "mistral")
    assert disabled_thinking_effort(tok) == expected
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}],
            "thinking": {"type": "disabled"}}  # fmt: skip
    for version in ("0.33", "0.34"):
        chat = messages_chat(release(tok, version), messages_request(body, True, 100), True)
        counted = asyncio.run(count_chat(release(tok, version), chat))
        assert counted == vllm_034(tok.source, conversation=chat.messages, reasoning_effort=expected)


def test_an_older_tokenizer_gets_low_for_disabled_thinking(nemo: ModelTokenizer) -> None:
    assert disabled_thinking_effort(nemo) == "low"
