"""Room for the next turn: a clamp on a route with a next-turn share keeps that share of the window free (at most half
the room the prompt leaves), so that an agent's continuation after a length stop (the conversation with the answer
appended) fits; a request asking for less is not touched, and the thinking budget follows the lowered limit."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from proxy.api.anthropic import messages_request
from proxy.policy import thinking
from proxy.policy.converted import Converted, decide, message_kept, message_turn
from proxy.policy.decide import Limits, decide_chat, decide_output, next_turn_share
from proxy.policy.outcome import Forward
from proxy.settings import PolicySettings
from tests.policy.test_decide import chat

W = 32768
CONTINUE = 20  # what an agent adds to the conversation to continue: a short user turn ("continue"), its template


@pytest.mark.parametrize(
    ("share", "prompt", "limit"),
    [
        (0.5, 4000, 14384),  # half the room: 28768 // 2 kept
        (0.25, 4000, 20576),  # a quarter of the window kept (8192)
        (0.25, 20000, 6384),  # the quarter would leave 4576: half the room (12768 // 2) kept instead
        (0.0, 4000, 28768),  # off: all the room
    ],
)
def test_a_clamp_keeps_the_share_of_the_window_for_the_next_turn(share: float, prompt: int, limit: int) -> None:
    plan = decide_output(prompt, Limits(W, next_turn=share), "max_tokens", 64000, "messages")
    assert (plan.action, plan.max_tokens, plan.changes) == ("clamp", limit, {"max_tokens": limit})
    assert plan.next_turn == (W - prompt - limit if share else None)


def test_a_request_asking_for_less_than_the_kept_limit_is_not_touched() -> None:
    plan = decide_output(4000, Limits(W, next_turn=0.5), "max_tokens", 8000, "messages")
    assert (plan.action, plan.changes, plan.max_tokens, plan.next_turn) == ("pass", {}, 8000, None)


def test_a_request_without_a_limit_gets_the_kept_one_set() -> None:
    """vLLM would give it all the room the prompt leaves; the continuation of such an answer never fits."""
    plan = decide_output(4000, Limits(W, next_turn=0.5), "max_output_tokens", None, "input")
    assert plan.changes == {"max_output_tokens": 14384} and plan.next_turn == 14384


@pytest.mark.parametrize("prompt", [100, 4000, 16000, 30000, 32000])
def test_the_continuation_of_an_answer_that_filled_its_limit_fits(prompt: int) -> None:
    limits = Limits(W, next_turn=0.5, min_output_tokens=16)
    plan = decide_output(prompt, limits, "max_tokens", 64000, "messages")
    assert plan.max_tokens is not None
    continued = decide_output(prompt + plan.max_tokens + CONTINUE, limits, "max_tokens", 64000, "messages")
    assert continued.error is None and continued.max_tokens is not None and continued.max_tokens >= 16
    without = decide_output(prompt, Limits(W, min_output_tokens=16), "max_tokens", 64000, "messages")
    assert without.max_tokens is not None  # what a clamp gave before: all the room, and then no room at all
    assert decide_output(prompt + without.max_tokens + CONTINUE, limits, "max_tokens", 64000, "messages").error


def test_chat_keeps_its_room_only_when_configured() -> None:
    assert decide_chat(chat(max_tokens=64000), 4000, Limits(W)).max_tokens == W - 4000
    plan = decide_chat(chat(max_tokens=64000), 4000, Limits(W, next_turn=0.5))
    assert plan.max_tokens == 14384 and plan.next_turn == 14384


def test_the_shares_are_read_per_route() -> None:
    policy = PolicySettings()
    assert [next_turn_share(policy, r) for r in ("messages", "responses", "chat", "completions")] == [0.5, 0.5, 0, 0]


def test_the_headers_say_how_much_was_kept() -> None:
    outcome = asyncio.run(decide(messages(64000), 4000, Limits(W, next_turn=0.5), "reject", None))
    assert isinstance(outcome, Forward)
    headers = outcome.decision.headers()
    assert headers["x-token-guard-action"] == "clamp" and headers["x-token-guard-max-tokens"] == "14384"
    assert headers["x-token-guard-next-turn-tokens"] == "14384"


def test_the_thinking_budget_stays_below_the_kept_limit() -> None:
    """Claude Code's thinking budget of 31999 under 32000: lowered with the limit, below it, at least vLLM's 1024."""
    outcome = asyncio.run(decide(messages(32000, budget=31999), 4000, Limits(W, next_turn=0.5), "reject", None))
    assert isinstance(outcome, Forward)
    sent = json.loads(outcome.body)
    assert sent["max_tokens"] == 14384 and 1024 <= sent["thinking"]["budget_tokens"] < 14384


def messages(max_tokens: int, budget: int | None = None) -> Converted:
    body: dict[str, Any] = {"model": "m", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
    if budget is not None:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    req = messages_request(body)
    return Converted("/v1/messages", body, json.dumps(body).encode(), "max_tokens", max_tokens, "messages",
                     "messages", req.messages, message_turn, message_kept, follow=thinking.follower(req))  # fmt: skip


def test_a_truncated_prompt_keeps_the_reserve_its_cut_made_for_the_answer() -> None:
    """truncate cuts the oldest turns to leave the answer its reserve (policy/choice.py); the continuation of such an
    answer is cut again, so no room is kept for it on top."""
    items: list[Any] = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                        {"role": "user", "content": "c"}]  # fmt: skip

    async def count(kept: list[Any]) -> int:
        return 12000 * len(kept)  # 36000 tokens: over the window; the last turn alone fits

    body = {"model": "m", "max_tokens": 16000, "messages": items}
    req = messages_request(body)
    conv = Converted("/v1/messages", body, json.dumps(body).encode(), "max_tokens", 16000, "messages", "messages",
                     req.messages, message_turn, message_kept)  # fmt: skip
    outcome = asyncio.run(decide(conv, 36000, Limits(W, next_turn=0.5), "truncate", count))
    assert isinstance(outcome, Forward) and outcome.decision.action == "truncate"
    assert outcome.decision.max_tokens == 16000 and outcome.decision.next_turn is None  # kept: 10384 with room kept
