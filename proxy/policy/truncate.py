"""The truncate policy: make an overflowing prompt fit by cutting it, keeping what matters.

Completions keep the last, first, or first-and-last tokens of the prompt and send the kept ids, so nothing is
re-tokenized differently. Chat is structure-aware: system/developer messages and the last user message stay;
the oldest other turns go first (an assistant tool call with its tool results as one unit); if that is not enough,
the longest remaining non-system message is shortened in the middle with a visible marker. Every step is re-counted
exactly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from proxy.api.completions import CompletionRequest
from proxy.counting.ids import char_cut, cut_middle, encode, encode_with_offsets
from proxy.counting.local_count import CountMessages
from proxy.counting.text_count import TokenCounter
from proxy.counting.tokenizer import ModelTokenizer
from proxy.errors import GuardError

KEEP_ROLES = ("system", "developer")
MARKER = "\n[... {cut} tokens cut by token-guard ...]\n"
MIN_KEEP = 16  # tokens a shortened message keeps at least (head and tail together)
ENDS_MARGIN = 64  # tokens a long text's encoded ends hold beyond what a cut can keep


@dataclass(frozen=True)
class Truncation:
    prompt: Any  # completions: the new `prompt`; chat: the new `messages`
    prompt_tokens: int
    dropped_messages: int
    cut_tokens: int


async def truncate_completion(
    tok: ModelTokenizer, req: CompletionRequest, counts: list[int], budget: int, side: str
) -> Truncation:
    texts = [p for p in req.prompts if isinstance(p, str)]
    encoded = iter(await encode(tok, texts, req.add_special_tokens) if texts else [])
    kept: list[list[int]] = []
    for prompt in req.prompts:
        ids = next(encoded) if isinstance(prompt, str) else prompt
        kept.append(ids if len(ids) <= budget else keep_side(ids, budget, side))
    new_prompt: Any = kept[0] if len(kept) == 1 else kept
    return Truncation(new_prompt, max(len(k) for k in kept), 0, sum(counts) - sum(len(k) for k in kept))


def keep_side(ids: list[int], keep: int, side: str) -> list[int]:
    if side == "left":  # keep the end, as vLLM's truncate_prompt_tokens does
        return ids[len(ids) - keep :]
    if side == "right":
        return ids[:keep]
    head, tail = cut_middle(ids, keep)
    return head + tail


def droppable_units(messages: list[Any]) -> list[list[int]]:
    """Indices of the messages that may go, oldest first, an assistant tool call grouped with its tool results."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    last = users[-1] if users else len(messages) - 1
    units: list[list[int]] = []
    for i, message in enumerate(messages):
        if i == last or message.get("role") in KEEP_ROLES:
            continue
        if message.get("role") == "tool" and units and _is_call_unit(messages, units[-1]) and units[-1][-1] == i - 1:
            units[-1].append(i)
        else:
            units.append([i])
    return units


def _is_call_unit(messages: list[Any], unit: list[int]) -> bool:
    first = messages[unit[0]]
    return first.get("role") == "assistant" and bool(first.get("tool_calls"))


async def truncate_chat(
    tok: ModelTokenizer, messages: list[Any], prompt_tokens: int, budget: int, count: CountMessages,
    counter: TokenCounter | None = None,
) -> Truncation | None:  # fmt: skip
    """The shortest cut that fits `budget` tokens, or None when even the kept messages cannot be made to fit."""
    units = droppable_units(messages)
    low, high = 0, len(units)  # find the fewest oldest units to drop; the count falls as more are dropped
    while low < high:
        middle = (low + high) // 2
        if await count(_without(messages, units[:middle])) <= budget:
            high = middle
        else:
            low = middle + 1
    kept = _without(messages, units[:low])
    tokens = await count(kept) if low else prompt_tokens  # nothing dropped: the count is the one already made
    dropped = sum(len(u) for u in units[:low])
    if tokens > budget:
        shortened = await _shorten(tok, kept, tokens, budget, count, counter)
        if shortened is None:
            return None
        kept, tokens = shortened
    return Truncation(kept, tokens, dropped, prompt_tokens - tokens)


def _without(messages: list[Any], units: list[list[int]]) -> list[Any]:
    gone = {i for unit in units for i in unit}
    return [m for i, m in enumerate(messages) if i not in gone]


async def _shorten(
    tok: ModelTokenizer, messages: list[Any], tokens: int, budget: int, count: CountMessages,
    counter: TokenCounter | None,
) -> tuple[list[Any], int] | None:  # fmt: skip
    messages = copy.deepcopy(messages)
    exhausted: set[int] = set()
    for _ in range(3 * len(messages) + 3):  # each pass cuts more or gives up on one message; bounded
        if tokens <= budget:
            return messages, tokens
        target = _longest(messages, exhausted)
        if target is None:
            return None
        index, part = target
        text = _text(messages[index], part)
        ends = await _Ends.of(tok, counter, text, budget)
        total = ends.total
        rest = tokens - total if total is not None else await _rest(messages, index, part, text, count)
        if rest is None:  # the template refuses the message without its text: count the text itself
            total = await ends.count(text)
            rest = tokens - total
        most = total if total is not None else len(text)  # the marker's number has at most as many digits
        keep = budget - rest - len((await encode(tok, [MARKER.format(cut=most)], False))[0]) - 2
        if keep < MIN_KEEP:
            keep = min(MIN_KEEP, most)
            exhausted.add(index)
        head_end, tail_start = ends.head_end((keep + 1) // 2), ends.tail_start(keep // 2)
        if tail_start <= head_end:
            exhausted.add(index)
            continue
        # What the cut takes: how much shorter the prompt is without the middle (counting the middle itself would
        # take seconds for a 30 MB text, and the prompt's count is known already)
        _set_text(messages[index], part, text[:head_end] + text[tail_start:])
        cut = tokens - await count(messages)
        _set_text(messages[index], part, text[:head_end] + MARKER.format(cut=cut) + text[tail_start:])
        tokens = await count(messages)
    return (messages, tokens) if tokens <= budget else None


async def _rest(messages: list[Any], index: int, part: int | None, text: str, count: CountMessages) -> int | None:
    """The tokens of the prompt without this text (its message kept, empty): what a cut of a long text must leave
    room for, counted without the text, which takes seconds at 30 MB. None when the template refuses it empty."""
    _set_text(messages[index], part, "")
    try:
        return await count(messages)
    except GuardError:
        return None
    finally:
        _set_text(messages[index], part, text)


@dataclass(frozen=True)
class _Ends:
    """Where a message text's first and last tokens start, and for a short text its token count. A long text is
    encoded with offsets only at its two ends, and not counted whole (that takes seconds at 30 MB; what a cut takes is
    counted from the prompt without it): the offsets of a whole 30 MB text take gigabytes. Its ends are `reach`
    tokens' worth of characters long, more than a cut can keep, and an encoding is the same well inside a slice as
    in the whole text (tokens do not span words)."""

    text_length: int
    total: int | None  # the text's tokens; None for a long text (not counted whole: its cut is counted instead)
    head: list[int]  # start offsets of the text's first tokens
    tail: list[int]  # start offsets, in the whole text, of its last tokens
    counter: TokenCounter | None
    tok: ModelTokenizer

    @classmethod
    async def of(cls, tok: ModelTokenizer, counter: TokenCounter | None, text: str, budget: int) -> _Ends:
        reach = counter.max_token_bytes if counter is not None else None  # no token spans more characters
        end = (budget + ENDS_MARGIN) * reach if reach is not None else None
        if counter is None or end is None or len(text) <= 2 * end:
            ids, starts = await encode_with_offsets(tok, text)
            return cls(len(text), len(ids), starts, starts, None, tok)
        head = await _end_offsets(tok, text, budget + ENDS_MARGIN, end, tail=False)
        tail = await _end_offsets(tok, text, budget + ENDS_MARGIN, end, tail=True)
        return cls(len(text), None, head, tail, counter, tok)

    def head_end(self, keep: int) -> int:
        return char_cut(self.head, keep, self.text_length)

    def tail_start(self, keep: int) -> int:
        return char_cut(self.tail, len(self.tail) - keep, self.text_length)

    async def count(self, text: str) -> int:
        if self.counter is not None:
            (n,) = await self.counter.count([text], False)
            return n
        return len((await encode(self.tok, [text], False))[0])


async def _end_offsets(tok: ModelTokenizer, text: str, tokens: int, most: int, tail: bool) -> list[int]:
    """Start offsets (in `text`) of the tokens of a slice at its head or tail holding at least `tokens` tokens: a
    slice of `most` characters always does (no token is longer), but text of the usual 3 to 5 characters a token
    needs a few percent of that, and offsets of a few hundred thousand tokens take tens of milliseconds to build."""
    size = min(tokens * 8, most)
    while True:
        _, starts = await encode_with_offsets(tok, text[-size:] if tail else text[:size])
        if len(starts) >= tokens or size >= most:
            return [len(text) - size + start for start in starts] if tail else starts
        size = min(size * 4, most)


def _longest(messages: list[Any], exhausted: set[int]) -> tuple[int, int | None] | None:
    best: tuple[int, tuple[int, int | None]] | None = None
    for i, message in enumerate(messages):
        if i in exhausted or message.get("role") in KEEP_ROLES:
            continue
        content = message.get("content")
        parts = [(None, content)] if isinstance(content, str) else list(enumerate(content or []))
        for part, value in parts:
            text = value if isinstance(value, str) else value.get("text") if isinstance(value, dict) else None
            if isinstance(text, str) and (best is None or len(text) > best[0]):
                best = (len(text), (i, part))
    return best[1] if best else None


def _text(message: dict[str, Any], part: int | None) -> str:
    content = message["content"]
    value = content if part is None else content[part]
    return value if isinstance(value, str) else str(value["text"])


def _set_text(message: dict[str, Any], part: int | None, text: str) -> None:
    if part is None:
        message["content"] = text
    elif isinstance(message["content"][part], str):
        message["content"][part] = text
    else:
        message["content"][part]["text"] = text
