"""The ledger of stored responses: for each response the guard relayed with `store` in effect, the key that created
it, the replica that holds it, its model and the conversation vLLM renders in front of the next turn. vLLM keeps a
stored response in the memory of the replica that answered (VLLM_ENABLE_RESPONSES_API_STORE=1), shares it with no
other replica and checks no owner; the ledger is what lets the guard count a continued turn exactly, send it to that
replica and hold each response to its key.

What vLLM 0.31/0.32 render for `previous_response_id` (responses/serving.py, responses/utils.py
construct_input_messages): the new request's instructions, then the messages stored with the previous response less
their system messages, then one assistant message per text part of the previous response's output messages (its
function calls and reasoning are not carried), then the new input. The messages stored with a response are all of
that, its own instructions included; `history_after` is what the next turn prepends.

A gpt-oss model's responses are rendered with openai_harmony, and vLLM keeps them another way: every harmony message
rendered for a response (its preamble and the previous turns included) and those parsed from its answer, all of
which a next turn renders as they are (counting/harmony_responses.py); `harmony_after` rebuilds them.

Pure bookkeeping and the in-memory store (one guard); fleet/ledger.py keeps the same entries in Redis.
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.counting.harmony_responses import HarmonyHistory, harmony_after

NOBODY = ""  # the owner when the guard checks no client key: every client reaches every response


@dataclass(frozen=True, slots=True)
class Stored:
    """One stored response. `history` is None when its conversation is unknown (a stream that ended before its
    response.completed, a background response, a renderer the ledger does not follow): the next turn is then counted
    as `partial`, still on its replica and by its key only."""

    id: str
    owner: str  # the SHA-256 of the key that created it (hex), or NOBODY
    replica: str  # the URL of the replica that holds it
    model: str
    history: list[dict[str, Any]] | None
    harmony: HarmonyHistory | None = None  # a gpt-oss model's: what vLLM holds for it (then `history` is None)

    def encode(self) -> str:
        # a harmony history takes the chat history's place, as an object: a guard that reads no harmony ignores it
        history = self.harmony.encode() if self.harmony is not None else self.history
        return json.dumps([self.id, self.owner, self.replica, self.model, history], separators=(",", ":"))

    @staticmethod
    def decode(raw: str | bytes) -> Stored | None:
        try:
            rid, owner, replica, model, history = json.loads(raw)
        except (ValueError, TypeError):
            return None
        if isinstance(history, dict):
            return Stored(rid, owner, replica, model, None, HarmonyHistory.decode(history))
        return Stored(rid, owner, replica, model, history if isinstance(history, list) else None)


class Ledger(Protocol):
    """Where entries are kept: this process's memory (MemoryLedger) or Redis (fleet/ledger.py)."""

    async def find(self, response_id: str) -> Stored | None: ...

    async def put(self, entry: Stored) -> None: ...

    async def drop(self, response_id: str) -> None: ...


@dataclass(slots=True)
class Turn:
    """A Responses create as the ledger sees it: who asked, the model, the messages vLLM builds for it (None: not
    known), the entry it continues (its replica answers it), and whether vLLM stores its answer (then recorded)."""

    owner: str
    model: str
    messages: list[dict[str, Any]] | None
    previous: Stored | None = None
    store: bool = True
    harmony: bool = False  # `messages` are harmony messages (a gpt-oss model)


def recorded(turn: Turn, rid: str, replica: str, messages: list[dict[str, Any]] | None, output: Any) -> Stored:
    """The entry for a response of `turn`: `messages` as forwarded (None: not known), its `output` items (None: not
    yet known)."""
    if turn.harmony:
        return Stored(rid, turn.owner, replica, turn.model, None, harmony_after(messages, output))
    return Stored(rid, turn.owner, replica, turn.model, history_after(messages, output))


def history_after(messages: list[dict[str, Any]] | None, output: Any) -> list[dict[str, Any]] | None:
    """The conversation vLLM renders in front of the next turn, from the messages it built for a response and that
    response's `output` items; None when either is not known or not of the shape vLLM writes."""
    if messages is None or not isinstance(output, list):
        return None
    history = [m for m in messages if m.get("role") != "system"]
    for item in output:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue  # reasoning and function calls are not carried over (construct_input_messages)
        parts = item.get("content")
        if not isinstance(parts, list):
            return None
        for part in parts:
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str):
                return None  # a refusal part: vLLM fails on it (it reads .text), so nothing exact is known
            history.append({"role": "assistant", "content": text})
    return history


def owns(entry: Stored, owner: str) -> bool:
    return entry.owner == owner


class MemoryLedger:
    """The entries of one guard: each kept `ttl_s`, and at most `max_bytes` of them (their encoded size), the oldest
    evicted first."""

    def __init__(self, ttl_s: float, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_bytes, self._clock = ttl_s, max_bytes, clock
        self._entries: OrderedDict[str, tuple[float, int, Stored]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def find(self, response_id: str) -> Stored | None:
        held = self._entries.get(response_id)
        if held is None:
            return None
        if held[0] <= self._clock():
            self._remove(response_id)
            return None
        return held[2]

    async def put(self, entry: Stored) -> None:
        size = len(entry.encode())
        self._remove(entry.id)
        if size > self.max_bytes:
            return  # larger than the whole bound: not kept (its next turn is counted as partial)
        self._entries[entry.id] = (self._clock() + self.ttl_s, size, entry)
        self.bytes += size
        now = self._clock()
        while self.bytes > self.max_bytes or (self._entries and next(iter(self._entries.values()))[0] <= now):
            self._remove(next(iter(self._entries)))

    async def drop(self, response_id: str) -> None:
        self._remove(response_id)

    def _remove(self, response_id: str) -> None:
        held = self._entries.pop(response_id, None)
        if held is not None:
            self.bytes -= held[1]
