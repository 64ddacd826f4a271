"""prompt_embeds end to end: the `openai` SDK -> token-guard with [[keys]] and admission -> the simulator in memory
(0.31 profile, --enable-prompt-embeds): every tensor is a prompt vLLM runs, so the guard counts its rows, clamps for
the longest, charges every sequence and admits the whole cost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.support.servers import MODEL, InMemorySim, keyed_guard, simulator_in_memory, wait_healthy
from tests.support.torch_save import embeds

HIDDEN, WINDOW, BUDGET = 64, 2048, 8000
KEYS = """
[[keys]]
name = "budget"
key = "sk-budget"
tokens_per_minute = 6000

[[keys]]
name = "open"
key = "sk-open"
tokens_per_minute = 10000000

[[keys]]
name = "text-only"
key = "sk-text"
tokens_per_minute = 10000000
prompt_embeds = false
"""


@pytest.fixture(scope="module")
def sim(deepseek_dir: Path) -> Iterator[InMemorySim]:
    with simulator_in_memory(deepseek_dir, profile="0.31", max_model_len=WINDOW, enable_prompt_embeds=True,
                             hidden_size=HIDDEN) as running:  # fmt: skip
        yield running


@pytest.fixture(scope="module")
def proxy(sim: InMemorySim, deepseek_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    config = tmp_path_factory.mktemp("embeds") / "guard.toml"
    config.write_text(KEYS)
    with keyed_guard(sim, deepseek_dir, config, **{"admission.max_inflight_tokens": BUDGET}) as server:
        wait_healthy(server.url)
        yield server.url


def client(proxy: str, key: str, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy}/v1", api_key=key, max_retries=0, timeout=60, default_headers=headers)


def test_tensors_beside_a_one_token_prompt_are_charged_as_vllm_runs_them(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    four = [embeds((1400, HIDDEN)) for _ in range(4)]  # with "x": 5 prompts, (1400 + 16) x 5 = 7,080 tokens
    with pytest.raises(openai.RateLimitError):  # more than the key's 6,000 a minute
        client(proxy, "sk-budget").completions.create(model=MODEL, prompt="x", max_tokens=16,
                                                      extra_body={"prompt_embeds": four})  # fmt: skip
    eight = [embeds((1500, HIDDEN)) for _ in range(8)]  # 9 prompts, 12,001 tokens: more than a replica's budget
    with pytest.raises(openai.BadRequestError) as caught:
        client(proxy, "sk-open").completions.create(model=MODEL, prompt="x", max_tokens=16,
                                                    extra_body={"prompt_embeds": eight})  # fmt: skip
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "request_too_large"
    assert "1500 input tokens and 1 output for each of 9 sequences" in caught.value.body["message"]
    assert sim.stats.received == before


def test_the_output_limit_is_clamped_for_the_longest_tensor(proxy: str) -> None:
    raw = client(proxy, "sk-open").completions.with_raw_response.create(
        model=MODEL, prompt="x", max_tokens=3000, extra_body={"prompt_embeds": [embeds((300, HIDDEN))]}
    )  # vLLM 0.31 refuses 300 + 2047 > 2048: the clamp must come from the tensor, not the one-token text
    usage = raw.parse().usage
    assert raw.headers["x-token-guard-action"] == "clamp" and raw.headers["x-token-guard-max-tokens"] == "1748"
    assert raw.headers["x-token-guard-prompt-tokens"] == "300"
    assert usage is not None and usage.prompt_tokens == 300 + 1 and usage.completion_tokens == 2 * 1748


def test_a_tensor_over_the_window_is_never_cut(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    with pytest.raises(openai.BadRequestError) as caught:
        client(proxy, "sk-open", **{"x-token-guard-overflow": "truncate"}).completions.create(
            model=MODEL, prompt="x", max_tokens=16, extra_body={"prompt_embeds": embeds((1, 2100, HIDDEN))}
        )
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "context_length_exceeded"
    assert "2100 input tokens" in body["message"] and "token-guard cannot cut them" in body["message"]
    assert sim.stats.received == before


def test_a_tensor_the_guard_cannot_read_is_refused_saying_why(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    with pytest.raises(openai.BadRequestError, match="not torch.save's zip format"):
        client(proxy, "sk-open").completions.create(model=MODEL, prompt="x", max_tokens=4,
                                                    extra_body={"prompt_embeds": "aGVsbG8gd29ybGQh"})  # fmt: skip
    assert sim.stats.received == before


def test_a_key_may_be_refused_prompt_embeds(proxy: str) -> None:
    with pytest.raises(openai.PermissionDeniedError, match="may not send prompt_embeds"):
        client(proxy, "sk-text").completions.create(model=MODEL, prompt="x", max_tokens=4,
                                                    extra_body={"prompt_embeds": embeds((3, HIDDEN))})  # fmt: skip
    assert client(proxy, "sk-text").completions.create(model=MODEL, prompt="x", max_tokens=4).usage is not None


def test_a_tensor_in_a_chat_message_is_not_counted_so_not_passed(proxy: str, sim: InMemorySim) -> None:
    before = sim.stats.received
    message: Any = {"role": "user", "content": [{"type": "prompt_embeds", "data": embeds((900, HIDDEN))}]}
    with pytest.raises(openai.BadRequestError, match="not a text part"):
        client(proxy, "sk-open").chat.completions.create(model=MODEL, max_tokens=4, messages=[message])
    assert sim.stats.received == before
