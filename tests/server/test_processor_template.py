"""A model whose AutoProcessor holds its own chat template: vLLM renders a request without tools with it and one
with tools with the tokenizer's; 0.34 reads a template stored as a dict by its "default" entry, 0.33 refuses every
request without tools on such a dict. Through the real OpenAI SDK, the guard (counting locally) in front of the
simulator's 0.33 and 0.34 profiles, on a directory built from a package tokenizer (DeepSeek's) plus a Llava
processor whose chat_template.json adds a preamble."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from proxy.assets import chat_template_path, write_demo_tokenizer_dir
from tests.support.servers import MODEL, InMemorySim, guard, simulator_in_memory

MESSAGES: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the weather?"}]
# in the shape vLLM re-serializes tools to before its template sees them, so transformers renders them alike here
TOOLS: Any = [{"type": "function", "function": {"name": "weather", "description": "Today's weather.",
                                                "parameters": {"type": "object"}}}]  # fmt: skip
PREAMBLE = "This conversation is seen through the model's processor, which adds these words to every prompt.\n"


def processor_dir(dest: Path, stored: Any) -> Path:
    """The demo tokenizer directory plus a processor as transformers saves one: its class, an image processor's
    config, and `stored` as chat_template.json's "chat_template" (a string, or a dict of named templates)."""
    write_demo_tokenizer_dir(dest)
    (dest / "processor_config.json").write_text(json.dumps({"processor_class": "LlavaProcessor"}))
    (dest / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "CLIPImageProcessor"}))
    (dest / "chat_template.json").write_text(json.dumps({"chat_template": stored}))
    return dest


WITH_PREAMBLE = PREAMBLE + chat_template_path().read_text()
STORED: dict[str, Any] = {
    "string": WITH_PREAMBLE,
    "dict": {"default": WITH_PREAMBLE, "tool_use": "unused: vLLM never asks the processor with tools"},
    "dict-without-default": {"rag": WITH_PREAMBLE},
}


@pytest.fixture(scope="module", params=["0.33", "0.34"])
def profile(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@dataclass(frozen=True)
class Served:
    profile: str
    stored: str
    model: Path
    client: openai.OpenAI
    sim: InMemorySim

    def tokenizer_template_count(self, tools: Any = None) -> int:
        """What the tokenizer's own template (transformers' rendering) charges for MESSAGES."""
        tok = AutoTokenizer.from_pretrained(str(self.model))
        text = tok.apply_chat_template(MESSAGES, tools=tools, tokenize=False, add_generation_prompt=True)
        return len(tok(text, add_special_tokens=False)["input_ids"])

    def charged(self, **extra: Any) -> tuple[int, int]:
        """The guard's count (its header) and what the simulator charged (usage), for one chat request."""
        raw = self.client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES, max_tokens=4,
                                                                    **extra)  # fmt: skip
        assert raw.headers["x-token-guard-count-source"] == "local"
        usage = raw.parse().usage
        assert usage is not None
        return int(raw.headers["x-token-guard-prompt-tokens"]), usage.prompt_tokens


@pytest.fixture(scope="module", params=list(STORED))
def served(request: pytest.FixtureRequest, profile: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    model = processor_dir(tmp_path_factory.mktemp("processor"), STORED[request.param])
    with (
        simulator_in_memory(model, profile=profile, max_model_len=4096) as sim,
        guard(sim, model, **{"counting.source": "local"}) as proxy,
    ):
        client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)
        yield Served(profile, request.param, model, client, sim)


def test_without_tools_the_processor_template_is_counted(served: Served) -> None:
    if served.profile == "0.33" and served.stored != "string":
        received = served.sim.stats.received
        with pytest.raises(openai.BadRequestError) as refused:
            served.client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
        assert served.sim.stats.received == received  # refused by the guard, in vLLM's words
        direct = served.sim.client.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES})
        assert direct.status_code == 400
        assert refused.value.body == direct.json()["error"] == {
            "message": "unhashable type: 'dict'", "type": "BadRequestError", "param": None, "code": 400}  # fmt: skip
        return
    guard_count, usage = served.charged()
    assert guard_count == usage
    plain = served.tokenizer_template_count()
    if served.stored == "dict-without-default":  # 0.34: no "default" entry, the tokenizer's template
        assert usage == plain
    else:
        assert usage > plain  # the processor's preamble is in the prompt


def test_with_tools_the_tokenizer_template_is_counted(served: Served) -> None:
    guard_count, usage = served.charged(tools=TOOLS)
    assert guard_count == usage == served.tokenizer_template_count(TOOLS)
