"""A chat template whose Messages API start-up probe raises something other than a template error (here a TypeError:
`length` of the `bos_token` the bare probe leaves undefined), which the real renders, given the special tokens, get
through. vLLM 0.34 reads any error of `_detect_merge_inline_system` as "merge inline system messages"; 0.33 catches
only jinja2.TemplateError, so the error leaves AnthropicServingMessages' constructor and the server does not start.
Through the real `anthropic` SDK, the guard in front of the simulator's 0.34 profile counts what the simulator charges,
inline system message merged; the simulator's 0.33 profile does not start; the guard facing 0.33 says why it cannot
count rather than fail with a TypeError."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import anthropic
import pytest

from proxy.api.anthropic import messages_request
from proxy.counting.anthropic import messages_chat
from proxy.counting.anthropic_probes import fails_inline_system, merges_inline_system
from proxy.counting.local_count import count_chat
from proxy.counting.registry import GuardedModel, ModelRegistry
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer, load_tokenizer
from proxy.errors import GuardError
from proxy.server.running import ServerThread
from proxy.settings import CountingSettings
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support.servers import MODEL, guard

# keeps inline system messages where they are; only the probe, without bos_token, fails (len(None))
TEMPLATE = (
    "{%- set width = (bos_token | default(none)) | length -%}"
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# renders the probe: inline system messages kept
PLAIN = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
MESSAGES: Any = [
    {"role": "user", "content": "Name a lake."},
    {"role": "assistant", "content": "Lake Baikal."},
    {"role": "system", "content": "Answer in one word from now on."},  # an inline system message
    {"role": "user", "content": "And a river?"},
]
SYSTEM = "You are a geographer."


@pytest.fixture
def template(tmp_path: Path) -> Path:
    path = tmp_path / "probe-raises.jinja"
    path.write_text(TEMPLATE)
    return path


def released(tok: ModelTokenizer, version: str) -> ModelTokenizer:
    counter = TokenCounter(tok.backend, CountingSettings(cache_mb=0), name=MODEL)
    models = ModelRegistry([GuardedModel(MODEL, tok, 4096, "config", counter)], discovering=False)
    models.set_upstream_version(f"{version}.0")
    return models.resolve(MODEL).tokenizer


def test_the_probe_follows_the_release() -> None:
    assert fails_inline_system(TEMPLATE, catches_any=True)  # 0.34: merged
    with pytest.raises(GuardError, match="TypeError.*vLLM up to 0.33 does not start"):
        fails_inline_system(TEMPLATE, catches_any=False)
    assert not fails_inline_system(PLAIN, catches_any=True) and not fails_inline_system(PLAIN, catches_any=False)


def test_the_guard_merges_on_034_and_says_why_it_cannot_count_on_033(deepseek_dir: Path, template: Path) -> None:
    tok = load_tokenizer(str(deepseek_dir), template)
    assert merges_inline_system(released(tok, "0.34"))
    req = messages_request({"model": MODEL, "max_tokens": 5, "system": SYSTEM, "messages": MESSAGES}, True, 100)
    chat = messages_chat(released(tok, "0.34"), req, True)
    assert [m["role"] for m in chat.messages] == ["system", "user", "assistant", "user"]
    assert asyncio.run(count_chat(released(tok, "0.34"), chat)) > 0
    with pytest.raises(GuardError, match="does not start"):
        messages_chat(released(tok, "0.33"), req, True)


def test_vllm_033_does_not_start_with_such_a_template(deepseek_dir: Path, template: Path) -> None:
    settings = SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, profile="0.33", chat_template=template)
    with pytest.raises(TypeError, match="has no len"):
        create_simulator(settings)


def test_the_guard_counts_what_034_charges(deepseek_dir: Path, template: Path) -> None:
    served = SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, profile="0.34", chat_template=template)
    flags: dict[str, Any] = {"model.chat_template": str(template), "counting.source": "local"}
    with ServerThread(create_simulator(served)) as sim, guard(sim.url, deepseek_dir, **flags) as proxy:
        claude = anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)
        raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=5, system=SYSTEM, messages=MESSAGES)
        counted, charged = int(raw.headers["x-token-guard-prompt-tokens"]), raw.parse().usage.input_tokens
        direct = anthropic.Anthropic(base_url=sim.url, api_key="unused", max_retries=0)
        kept = [m for m in MESSAGES if m["role"] != "system"]  # the same prompt, inline system message merged
        merged = direct.messages.count_tokens(model=MODEL, system=SYSTEM + MESSAGES[2]["content"], messages=kept)
    assert counted == charged == merged.input_tokens
