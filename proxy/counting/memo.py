"""A bounded map from a text to its token count, at the speed of a plain dict.

Two generations of dicts stand in for an LRU list: new entries and hits go to the young one; when the young one fills
its half of the byte budget, it becomes the old one and the old one is dropped. A lookup is one or two dict gets, with
no list to reorder on every hit (cachetools' LRUCache spent more time in its bookkeeping than the counting saved on a
small prompt). What is used keeps being promoted; what is not ages out within two generations.

A long text is kept under a 128-bit digest of itself, not as itself: a document sent again is still found, and a huge
prompt is not held in memory after its answer.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar, cast

ENTRY_OVERHEAD = 120  # bytes a dict slot and the int cost beyond the key string
LONG_KEY_CHARS = 4096  # texts longer than this are kept under their digest
DIGEST_SLICE_CHARS = 2**20  # a long text is digested this much at a time

V = TypeVar("V")


def key_of(text: str) -> str:
    if len(text) <= LONG_KEY_CHARS:
        return text
    digest = hashlib.blake2b(digest_size=16)
    for at in range(0, len(text), DIGEST_SLICE_CHARS):  # the same digest as of the whole text's bytes, without a
        # copy of them all (at 30 MB, a copy holds the interpreter lock for tens of milliseconds)
        digest.update(text[at : at + DIGEST_SLICE_CHARS].encode("utf-8", "surrogatepass"))
    return f"\x00{len(text)}:{digest.hexdigest()}"


def entry_size(text: str) -> int:
    return sys.getsizeof(text) + ENTRY_OVERHEAD


def _no_bytes(value: object) -> int:
    return 0


class Memo(Generic[V]):
    """`value_bytes`: what a value holds beyond the slot (a count holds nothing; token ids do)."""

    def __init__(self, max_bytes: int, value_bytes: Callable[[V], int] = _no_bytes) -> None:
        self.max_bytes = max_bytes
        self._half = max_bytes // 2
        self._value_bytes = value_bytes
        self._young: dict[str, V] = {}
        self._old: dict[str, V] = {}
        self._young_bytes = self._old_bytes = 0

    def get(self, text: str) -> V | None:
        text = key_of(text)
        count = self._young.get(text)
        if count is None:
            count = self._old.pop(text, None)
            if count is not None:
                self._old_bytes -= entry_size(text) + self._value_bytes(count)
                self._add(text, count)
        return count

    def get_many(self, texts: Iterable[str]) -> tuple[dict[str, V], list[str]]:
        """What get() finds of each text, and the texts it does not find (each once). The word-by-word count asks
        here only for the words sum_found() did not find in the young generation."""
        known: dict[str, V] = {}
        unknown: dict[str, None] = {}
        for text in texts:
            if text in known or text in unknown:
                continue
            count = self.get(text)
            if count is None:
                unknown[text] = None
            else:
                known[text] = count
        return known, list(unknown)

    def sum_found(self, texts: list[str]) -> tuple[int, list[str]]:
        """The summed counts of the texts found in the young generation at C speed (a fresh prompt's words, most of
        them familiar), and the others, in order and as often as they occur, for get_many()."""
        counts = cast(list[int | None], list(map(self._young.get, texts)))
        if None not in counts:
            return sum(cast(list[int], counts)), []
        total = 0
        rest = []
        for text, count in zip(texts, counts, strict=True):
            if count is None:
                rest.append(text)
            else:
                total += count
        return total, rest

    def found(self, texts: list[str]) -> list[V | None]:
        """What the young generation holds of each text, at C speed (None where it holds nothing)."""
        return list(map(self._young.get, texts))

    def put(self, text: str, count: V) -> None:
        text = key_of(text)
        if text not in self._young:
            self._add(text, count)

    def _add(self, text: str, count: V) -> None:
        size = entry_size(text) + self._value_bytes(count)
        if size > self._half:
            return  # larger than a generation: not worth keeping
        if self._young_bytes + size > self._half:
            self._old, self._old_bytes = self._young, self._young_bytes
            self._young, self._young_bytes = {}, 0
        self._young[text] = count
        self._young_bytes += size

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    @property
    def bytes(self) -> int:
        return self._young_bytes + self._old_bytes
