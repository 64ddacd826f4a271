"""An agent's turn clamped by the guard, then the agent's own continuation, through the guard to the simulator (a
2,048-token window that refuses every overflow): Claude Code's way with the anthropic SDK (the answer stopped on
max_tokens appended to the conversation, and a user turn asking to go on), and a Responses agent's with the openai
SDK (the incomplete answer's output items appended to the input). With room kept for the next turn
(policy.next_turn_share_*) the continuation fits; a clamp to all the room left would make it a 400."""

from __future__ import annotations

from typing import Any

import anthropic
import openai

from tests.server.conftest import WINDOW
from tests.support.servers import MODEL

GO_ON = "Continue exactly where you stopped."


def essay(words: int) -> str:
    return " ".join(f"word{i % 50}" for i in range(words))


def test_claude_codes_continuation_after_a_clamped_turn_fits(proxy: str) -> None:
    claude = anthropic.Anthropic(base_url=proxy, api_key="unused", max_retries=0, timeout=60)
    system: Any = [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."}]
    conversation: list[Any] = [{"role": "user", "content": essay(600)}]
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=32000, system=system,
                                                   messages=conversation)  # fmt: skip
    first = raw.parse()
    assert raw.headers["x-token-guard-action"] == "clamp" and first.stop_reason == "max_tokens"
    kept = int(raw.headers["x-token-guard-next-turn-tokens"])
    assert first.usage.input_tokens + first.usage.output_tokens + kept == WINDOW
    conversation += [{"role": "assistant", "content": [block.model_dump() for block in first.content]},
                     {"role": "user", "content": GO_ON}]  # fmt: skip
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=32000, system=system,
                                                   messages=conversation)  # fmt: skip
    second = raw.parse()
    assert raw.headers["x-token-guard-action"] == "clamp" and second.usage.output_tokens > 0
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_a_responses_agents_continuation_after_a_clamped_turn_fits(oai: openai.OpenAI) -> None:
    items: list[Any] = [{"role": "user", "content": essay(600)}]
    raw = oai.responses.with_raw_response.create(model=MODEL, input=items)  # no limit: vLLM would fill the window
    first = raw.parse()
    assert raw.headers["x-token-guard-action"] == "clamp" and first.status == "incomplete"
    assert first.usage is not None and int(raw.headers["x-token-guard-max-tokens"]) == first.usage.output_tokens
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"role": "user", "content": GO_ON})
    second = oai.responses.create(model=MODEL, input=items)
    assert second.usage is not None and second.usage.output_tokens > 0
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
