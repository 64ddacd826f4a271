"""Responses and Anthropic Messages requests counted as vLLM counts them: each converted to the chat request vLLM
renders, then counted by the chat path, equals the token count of vLLM 0.31.0's and 0.32.0's own renderer.

`endpoints/vllm_counts.json` holds a corpus of requests (function calls and outputs, reasoning items, namespace and
custom tools, output messages, continuation, efforts, CJK; system blocks and billing headers, inline system messages,
tool use and results, thinking, tool choices, tool edits) with the length of the token ids vLLM's own `OnlineRenderer`
produced for each, in-process, per version and template: the tiny model's template, one that prints every field
(`rich`), one that needs the system message first (`qwenlike`), one that honours enable_thinking (`thinking`), and the
model's tokenizer with a BOS post-processor (`bos`: Responses tokenizes with add_special_tokens true). Requests vLLM
refuses are recorded with its message.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxy.api.anthropic import parse_messages
from proxy.api.chat import ChatRequest
from proxy.api.responses import parse_responses
from proxy.assets import write_demo_tokenizer_dir
from proxy.counting.anthropic import messages_chat
from proxy.counting.local_count import count_chat
from proxy.counting.responses import responses_chat
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer, load_tokenizer
from proxy.errors import InvalidRequest
from proxy.settings import CountingSettings

HERE = Path(__file__).with_name("endpoints")
CASES: list[dict[str, Any]] = json.loads((HERE / "vllm_counts.json").read_text())
PROFILES = sorted({key for case in CASES for key in case["vllm"]})
# vLLM lays a Responses request's own template kwargs in unfiltered when the server has no default kwargs, so a
# client's `"custom_flag": null` reaches the template; the chat path (and so the guard) drops null kwargs.
KNOWN = {("client add_generation_prompt overridden", "rich"): "a null chat_template_kwargs value (vLLM keeps it)"}
# Refused by vLLM for its window, which the guard clamps instead (policy/decide.py), so the count is all it needs.
CLAMPED = {"reject max_output_tokens > window", "reject max_tokens > window"}
# Refused by a vLLM started without a tool parser: a server setting the guard cannot see, not the request's fault.
SERVER_FLAGS = {"tool_choice any", "tool_choice named"}


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[ModelTokenizer, TokenCounter]]:
    plain = write_demo_tokenizer_dir(tmp_path_factory.mktemp("tok"))
    bos = write_demo_tokenizer_dir(tmp_path_factory.mktemp("bos"))
    spec = json.loads((bos / "tokenizer.json").read_text())
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [
        {"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<｜begin▁of▁sentence｜>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<｜begin▁of▁sentence｜>": {"id": "<｜begin▁of▁sentence｜>", "ids": [0],
                                                       "tokens": ["<｜begin▁of▁sentence｜>"]}}}  # fmt: skip
    (bos / "tokenizer.json").write_text(json.dumps(spec))
    loaded = {"model": load_tokenizer(str(plain)), "bos": load_tokenizer(str(bos))}
    for name in ("rich", "qwenlike", "thinking"):
        loaded[name] = load_tokenizer(str(plain), HERE / f"{name}.jinja")
    return {name: (tok, TokenCounter(tok.backend, CountingSettings(), name=name)) for name, tok in loaded.items()}


def convert(case: dict[str, Any], tok: ModelTokenizer, newer: bool) -> ChatRequest:
    raw = json.dumps(case["body"]).encode()
    if case["endpoint"] == "responses":
        return responses_chat(parse_responses(raw), newer)
    return messages_chat(tok, parse_messages(raw, count_only=case["endpoint"] == "count_tokens"), newer)


COUNTED = [(c, p) for c in CASES for p in PROFILES if isinstance(c["vllm"].get(p), int) and c["name"] not in CLAMPED]
REFUSED = [
    (c, v) for c in CASES for v in ("0.31", "0.32")
    if isinstance(c["vllm"].get(f"{v}/model"), dict) and c["name"] not in CLAMPED | SERVER_FLAGS
]  # fmt: skip


@pytest.mark.parametrize("case,profile", COUNTED, ids=[f"{c['endpoint']}: {c['name']} ({p})" for c, p in COUNTED])
def test_count_equals_vllms(
    case: dict[str, Any], profile: str, tokenizers: dict[str, tuple[ModelTokenizer, TokenCounter]]
) -> None:
    version, template = profile.split("/")
    expected = case["vllm"][profile]
    if (case["name"], template) in KNOWN:
        pytest.skip(KNOWN[case["name"], template])
    newer = version == "0.32"
    tok, counter = tokenizers[template]
    tok = replace(tok, strip_billing_header=newer)  # as the registry sets it from the version
    assert asyncio.run(count_chat(tok, convert(case, tok, newer), counter)) == expected


@pytest.mark.parametrize("case,version", REFUSED, ids=[f"{c['endpoint']}: {c['name']} ({v})" for c, v in REFUSED])
def test_refused_like_vllm(
    case: dict[str, Any], version: str, tokenizers: dict[str, tuple[ModelTokenizer, TokenCounter]]
) -> None:
    refused = case["vllm"][f"{version}/model"]
    with pytest.raises(InvalidRequest) as caught:
        convert(case, tokenizers["model"][0], version == "0.32")
    if "(parameter=" in refused["refused"]:  # vLLM's own validation text, which the guard repeats
        assert caught.value.message == refused["refused"]
