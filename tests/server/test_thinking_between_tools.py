"""vLLM 0.34 takes Anthropic's `thinking: {"type": "between_tools"}` ("off up front") and renders it as disabled
thinking; 0.33 and earlier refuse it. The guard counts it as 0.34 renders it (Qwen3's real template, where thinking
off adds an empty think block), and in front of 0.32 the client gets vLLM's own 400."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests.support import zoo
from tests.support.servers import MODEL, guard, simulator_in_memory

MESSAGES: Any = [{"role": "user", "content": "List the files in this directory."}]


@pytest.fixture(scope="module", params=["0.32", "0.34"])
def claude(request: pytest.FixtureRequest) -> Iterator[tuple[str, anthropic.Anthropic]]:
    tokenizer = zoo.family_dir("qwen3")
    with simulator_in_memory(tokenizer, profile=request.param) as sim, guard(sim, tokenizer) as proxy:
        yield request.param, anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0)


def counted(claude: anthropic.Anthropic, thinking: Any) -> tuple[int, int]:
    """(the guard's count, vLLM's input_tokens) of one Messages request."""
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=5, messages=MESSAGES, thinking=thinking)
    return int(raw.headers["x-token-guard-prompt-tokens"]), raw.parse().usage.input_tokens


def test_between_tools_is_counted_as_vllm_034_renders_it(claude: tuple[str, anthropic.Anthropic]) -> None:
    profile, client = claude
    if profile == "0.32":
        with pytest.raises(anthropic.BadRequestError, match="between_tools|does not match"):
            counted(client, {"type": "between_tools"})
        return
    guard_count, charged = counted(client, {"type": "between_tools"})
    assert guard_count == charged
    assert charged == counted(client, {"type": "disabled"})[1]  # rendered as disabled thinking
    assert charged != counted(client, {"type": "adaptive"})[1]  # which the template renders differently
