"""The ledger's bookkeeping: what vLLM renders in front of a continued turn (construct_input_messages), and the
in-memory store's time to live and bound."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from proxy.counting.harmony_responses import HarmonyHistory
from proxy.policy.ledger import MemoryLedger, Stored, history_after

ASKED = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def output_message(*texts: str) -> dict[str, Any]:
    parts = [{"type": "output_text", "text": text, "annotations": []} for text in texts]
    return {"type": "message", "role": "assistant", "content": parts, "status": "completed"}


def test_the_history_drops_system_messages_and_adds_each_text_part_of_the_output() -> None:
    output = [{"type": "reasoning", "summary": []}, output_message("Hello", "there"),
              {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"}]  # fmt: skip
    assert history_after(ASKED, output) == [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
        {"role": "assistant", "content": "there"},
    ]  # fmt: skip


def test_a_refusal_part_or_unknown_messages_leave_the_history_unknown() -> None:
    refusal = {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]}
    assert history_after(ASKED, [refusal]) is None
    assert history_after(None, [output_message("x")]) is None
    assert history_after(ASKED, None) is None


def entry(rid: str, words: int = 1) -> Stored:
    return Stored(rid, "owner", "http://replica", "tiny", [{"role": "user", "content": "w " * words}])


def test_an_entry_is_forgotten_once_its_time_to_live_has_passed() -> None:
    now = [0.0]
    ledger = MemoryLedger(ttl_s=10, max_bytes=10_000, clock=lambda: now[0])
    asyncio.run(ledger.put(entry("a")))
    now[0] = 9.9
    assert asyncio.run(ledger.find("a")) == entry("a")
    now[0] = 10.0
    assert asyncio.run(ledger.find("a")) is None and ledger.bytes == 0


def test_the_bound_evicts_the_oldest_first() -> None:
    size = len(entry("a", 100).encode())
    ledger = MemoryLedger(ttl_s=100, max_bytes=2 * size)
    for rid in ("a", "b", "c"):
        asyncio.run(ledger.put(entry(rid, 100)))
    assert [asyncio.run(ledger.find(rid)) is not None for rid in ("a", "b", "c")] == [False, True, True]
    assert ledger.bytes == 2 * size


def test_an_entry_larger_than_the_bound_is_not_kept_and_a_rewrite_replaces() -> None:
    ledger = MemoryLedger(ttl_s=100, max_bytes=200)
    asyncio.run(ledger.put(entry("big", 500)))
    assert asyncio.run(ledger.find("big")) is None and len(ledger) == 0
    asyncio.run(ledger.put(entry("a", 2)))
    asyncio.run(ledger.put(entry("a", 3)))
    assert asyncio.run(ledger.find("a")) == entry("a", 3) and ledger.bytes == len(entry("a", 3).encode())
    asyncio.run(ledger.drop("a"))
    assert asyncio.run(ledger.find("a")) is None and ledger.bytes == 0


def test_a_harmony_entry_keeps_its_messages_and_calls_in_the_histories_place() -> None:
    """Five fields as before, the fifth an object: a guard that reads no harmony history finds no chat history."""
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    harmony = HarmonyHistory(messages, {"call_1": "get_weather"})
    stored = Stored("resp_1", "owner", "http://replica", "gpt-oss", None, harmony)
    raw = stored.encode()
    assert len(json.loads(raw)) == 5 and isinstance(json.loads(raw)[4], dict)
    assert Stored.decode(raw) == stored
    assert Stored.decode(raw.replace('"calls"', '"other"')) == Stored("resp_1", "owner", "http://replica", "gpt-oss",
                                                                        None, None)  # fmt: skip
