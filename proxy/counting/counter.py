"""The per-model token counter: cut each text at its added tokens, look every piece up in a memory-bounded LRU, and
encode everything uncached in one GIL-releasing batch call on a worker thread, long pieces split first so the batch
spreads over the cores. A count is always exactly `len(backend.encode(text, add_special_tokens=...))`.

All cache access happens on the event loop's thread; only the encoding runs elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cachetools import LRUCache

from proxy.counting.components import added_special_tokens
from proxy.counting.segments import Segmenter, segmenter_for
from proxy.counting.selfcheck import segments_agree, splits_agree
from proxy.counting.splitting import splitter_for
from proxy.settings import CountingSettings

log = logging.getLogger("token_guard.counter")

INLINE_MAX_CHARS = 8192  # about 2K tokens: ~2 ms of encoding, less than a thread hop adds to a small request
ENTRY_OVERHEAD = 256  # bytes an LRU entry costs beyond its key string (dict slots, LRU links, the value tuple)


@dataclass(frozen=True)
class CounterStats:
    hits: int
    misses: int
    entries: int
    bytes: int
    max_bytes: int


class TokenCounter:
    def __init__(self, backend: Any, settings: CountingSettings, cores: int | None = None, name: str = "") -> None:
        self.backend = backend
        self.segmenter = segmenter_for(backend)
        self.splitter = splitter_for(backend, cores or available_cores(), settings.split_min_chars)
        self.specials = added_special_tokens(backend)  # None: the post-processor adds a varying number
        self._cache: LRUCache[str, tuple[int, int]] = LRUCache(int(settings.cache_mb * 2**20), getsizeof=_size)
        self.hits = self.misses = 0
        self._check(name or "tokenizer")

    def _check(self, name: str) -> None:
        if self.segmenter.refusal is None and not segments_agree(self.backend, self.segmenter):
            log.warning("%s: cutting at added tokens failed the self-check; counting whole texts", name)
            self.segmenter = Segmenter([], refusal="the load-time self-check failed")
        elif self.segmenter.refusal is not None:
            log.info("%s: counting whole texts, not pieces: %s", name, self.segmenter.refusal)
        if self.segmenter.refusal is not None:
            self.splitter = None  # a whole text still holds added tokens, which a pre-tokenizer window cannot see
        if self.splitter is not None and not splits_agree(self.backend, self.splitter):
            log.warning("%s: long texts are not split for parallel counting: the self-check failed", name)
            self.splitter = None

    async def count(self, texts: Sequence[str], add_special_tokens: bool) -> list[int]:
        """Each text's token count, exactly as the tokenizer encodes it."""
        if add_special_tokens and self.specials is None:
            return await self._encode_lengths(list(texts), add_special_tokens=True)
        cuts = [self.segmenter.cut(t) for t in texts]
        counts, missing = self._look_up(s for cut in cuts for s in cut.texts)
        counts.update(await self._encode(missing))
        extra = (self.specials or 0) if add_special_tokens else 0
        return [cut.added + sum(counts[s] for s in cut.texts) + extra for cut in cuts]

    def stats(self) -> CounterStats:
        cache = self._cache
        return CounterStats(self.hits, self.misses, len(cache), int(cache.currsize), int(cache.maxsize))

    def _look_up(self, segments: Iterable[str]) -> tuple[dict[str, int], list[str]]:
        known: dict[str, int] = {}
        missing: list[str] = []
        for segment in dict.fromkeys(segments):
            entry = self._cache.get(segment)
            if entry is None:
                missing.append(segment)
            else:
                known[segment] = entry[0]
        self.hits += len(known)
        self.misses += len(missing)
        return known, missing

    async def _encode(self, segments: list[str]) -> dict[str, int]:
        if not segments:
            return {}
        parts = [self.splitter.split(s) if self.splitter else [s] for s in segments]
        lengths = iter(await self._encode_lengths([p for ps in parts for p in ps], add_special_tokens=False))
        counts = {s: sum(next(lengths) for _ in ps) for s, ps in zip(segments, parts, strict=True)}
        for segment, count in counts.items():
            entry = (count, sys.getsizeof(segment) + ENTRY_OVERHEAD)
            if entry[1] <= self._cache.maxsize:  # cachetools refuses an entry larger than the whole cache
                self._cache[segment] = entry
        return counts

    async def _encode_lengths(self, texts: list[str], add_special_tokens: bool) -> list[int]:
        # encode_batch_fast releases the GIL (plain `encode` does not), so the loop keeps running while it works.
        # A worker thread costs ~0.1 ms per call against ~0.6 ms for tokenizers' own async_encode_batch_fast, with
        # the same event-loop stalls at 128K tokens (measured with tokenizers 0.23.3). Short texts are encoded right
        # here: the hop to a thread and back costs more than they do (a few ms at most hold the loop).
        encode = self.backend.encode_batch_fast
        if sum(len(t) for t in texts) <= INLINE_MAX_CHARS:
            return [len(e) for e in encode(texts, add_special_tokens=add_special_tokens)]
        return [len(e) for e in await asyncio.to_thread(encode, texts, add_special_tokens=add_special_tokens)]


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _size(entry: tuple[int, int]) -> int:
    return entry[1]
