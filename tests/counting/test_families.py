"""Each rendering path against vLLM's own token ids, without vLLM: five families' real tokenizers and templates (the
zoo, tests/support/zoo.py) and a corpus of chat and completions requests per family, counted by the guard and compared
with what vLLM 0.31.0's own renderer produced for the same files (tests/counting/families/*.jsonl.gz: one line per
request with vLLM's token ids, or its error, and vLLM 0.32.0's count where it differs).

Configurations as `vllm serve` runs them: the Hugging Face template for Llama 3.1, Qwen3 (also with
--default-chat-template-kwargs '{"enable_thinking": false}'), Mistral Nemo and Gemma 4; --tokenizer-mode mistral for
Nemo (mistral_common); harmony for gpt-oss (chosen from its config.json).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxy.api.chat import parse_chat
from proxy.api.completions import parse_completion
from proxy.counting.harmony import HarmonyChat
from proxy.counting.local_count import count_chat, count_completion
from proxy.counting.modes import resolve_mode
from proxy.counting.render import render_chat
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer, load_tokenizer
from proxy.errors import InvalidRequest
from proxy.settings import CountingSettings
from tests.support import zoo, zoo_models

REFERENCES = Path(__file__).with_name("families")
CONFIGS = {  # name: family, tokenizer_mode, default_chat_template_kwargs
    "llama3.1": ("llama3.1", "auto", None),
    "qwen3": ("qwen3", "auto", None),
    "qwen3-nothink": ("qwen3", "auto", {"enable_thinking": False}),
    "mistral-nemo-hf": ("mistral-nemo", "auto", None),
    "mistral-nemo-mistral": ("mistral-nemo", "mistral", None),
    "gpt-oss": ("gpt-oss", "auto", None),
    "gemma": ("gemma", "auto", None),
}
# The one rule that changed between vLLM 0.31 and 0.32 on these corpora: 0.32 drops a leading
# "x-anthropic-billing-header" line from system messages (template-rendered models only).
CHANGED_IN_0_32 = {"billing-header"}


def references(config: str) -> list[dict[str, Any]]:
    with gzip.open(REFERENCES / f"{config}.jsonl.gz", "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelTokenizer]:
    loaded = {}
    for config, (family, mode, kwargs) in CONFIGS.items():
        directory = zoo.family_dir(family)
        if family == "gpt-oss":  # harmony is chosen from config.json, as vLLM chooses it
            directory = tmp_path_factory.mktemp("gpt-oss")
            shutil.copytree(zoo.family_dir(family), directory, dirs_exist_ok=True)
            (directory / "config.json").write_text(json.dumps(zoo_models.gpt_oss_config()))
        loaded[config] = load_tokenizer(str(directory), None, mode, kwargs)
    return loaded


async def guard_count(tok: ModelTokenizer, case: dict[str, Any], counter: TokenCounter) -> int:
    raw = json.dumps(case["body"]).encode()
    if case["kind"] == "chat":
        return await count_chat(tok, parse_chat(raw), counter)
    return sum(await count_completion(tok, parse_completion(raw), counter))


async def guard_ids(tok: ModelTokenizer, case: dict[str, Any]) -> list[int] | None:
    """The ids behind the guard's count where it makes them (a template-rendered chat), for a sharper comparison."""
    if case["kind"] != "chat" or tok.native is not None:
        return None
    req = parse_chat(json.dumps(case["body"]).encode())
    return list(tok.backend.encode(render_chat(tok, req), add_special_tokens=req.add_special_tokens).ids)


@pytest.mark.parametrize("config", list(CONFIGS))
def test_counts_equal_vllm_on_the_family_corpus(tokenizers: dict[str, ModelTokenizer], config: str) -> None:
    tok = tokenizers[config]
    counter = TokenCounter(tok.backend, CountingSettings(cache_mb=0), name=config)  # built once: get_vocab is slow
    differ, counted, refused = [], 0, 0
    for case in references(config):
        try:
            got = asyncio.run(guard_count(tok, case, counter))
        except InvalidRequest as exc:
            if "error" not in case:
                differ.append(
                    f"{case['id']} ({case['kind']}): guard refused ({exc.message[:80]}), vLLM {len(case['ids'])}"
                )
            refused += 1
            continue
        if "error" in case:
            differ.append(f"{case['id']} ({case['kind']}): guard {got}, vLLM refused ({case['error'][:80]})")
            continue
        counted += 1
        if got != len(case["ids"]):
            differ.append(f"{case['id']} ({case['kind']}): guard {got}, vLLM {len(case['ids'])}")
        ids = asyncio.run(guard_ids(tok, case))
        if ids is not None and ids != case["ids"]:
            differ.append(f"{case['id']}: same count, different ids")
        later = case.get("vllm_0_32")
        if later is not None:
            as_032 = asyncio.run(guard_count(replace(tok, strip_billing_header=True), case, counter))
            if case["id"] not in CHANGED_IN_0_32 or as_032 != later:
                differ.append(f"{case['id']} ({case['kind']}): vLLM 0.32 counts {later}, the guard for 0.32 {as_032}")
    assert not differ, "\n".join(differ)
    assert counted >= 35 and refused >= 1  # the corpus really ran, and vLLM's 400s were reached too


def test_the_rendering_path_is_chosen_as_vllm_chooses_it(tmp_path: Path, tokenizers: dict[str, ModelTokenizer]) -> None:
    assert tokenizers["gpt-oss"].rendering.mode == "harmony"
    assert tokenizers["mistral-nemo-mistral"].rendering.mode == "mistral"
    assert tokenizers["mistral-nemo-hf"].rendering.mode == "hf"  # tekken.json alone is not enough
    shutil.copyfile(zoo.tekken_file(), tmp_path / "tekken.json")
    assert resolve_mode(tmp_path).mode == "hf"
    (tmp_path / "consolidated.safetensors").write_bytes(b"")
    assert resolve_mode(tmp_path).mode == "mistral"  # a Mistral-format repository: vLLM's auto picks mistral
    assert resolve_mode(tmp_path, "hf").mode == "hf"


def test_harmony_tool_calls_use_vllms_legacy_headers(tokenizers: dict[str, ModelTokenizer]) -> None:
    native = tokenizers["gpt-oss"].native
    assert isinstance(native, HarmonyChat)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "21C"},
    ]
    req = parse_chat(json.dumps({"messages": messages}).encode())
    text = native._enc.decode(native.render(req))
    assert "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>" in text
    assert "<|start|>functions.get_weather<|channel|>commentary to=assistant<|message|>21C" in text  # the tool's name
