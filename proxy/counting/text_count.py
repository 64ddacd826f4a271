"""The per-model token counter: cut each text at its added tokens, look every segment up in a memory-bounded LRU;
count an uncached short segment word by word from a second LRU of words (fresh text is mostly familiar words), and
encode everything still uncached in one GIL-releasing batch call, long segments split first so the batch spreads
over the cores. A count is always exactly `len(backend.encode(text, add_special_tokens=...))`.

All cache access happens on the event loop's thread; only the encoding runs elsewhere.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.counting.components import added_special_tokens
from proxy.counting.memo import LONG_KEY_CHARS, Memo, key_of
from proxy.counting.segments import Cut, Segmenter, segmenter_for
from proxy.counting.selfcheck import segments_agree, splits_agree, words_agree
from proxy.counting.splitting import splitter_for, words
from proxy.counting.text_ids import TokenIds
from proxy.settings import CountingSettings

log = logging.getLogger("token_guard.counter")

FLOOR_SLICE_CHARS = 65536  # the floor reads a text in slices of this many characters
OFF_LOOP_CHARS = 2**20  # texts longer than this are cut, digested and split in a worker thread
INLINE_MAX_CHARS = 8192  # about 2K tokens: ~2 ms of encoding, less than a thread hop adds to a small request
PLAIN_MAX_CHARS = 256  # a few texts this short are encoded one by one: cheaper than the batch call's threads
BATCH_CHARS = 4 * 65536  # encoded at once at most: a few MB of encodings
WHITESPACE_RUN = re.compile(r"\s+")


Prepared = tuple[str, tuple[bool, list[str]]]  # a long segment's cache key, and its plan (TokenCounter._plan)


@dataclass(frozen=True)
class CounterStats:
    hits: int
    misses: int
    entries: int
    bytes: int
    max_bytes: int
    fallbacks: int = 0  # prompts counted locally because the upstream's counting failed (counting/source.py)


class TokenCounter:
    def __init__(self, backend: Any, settings: CountingSettings, cores: int | None = None, name: str = "") -> None:
        self.backend = backend
        self.segmenter = segmenter_for(backend)
        self.splitter = splitter_for(backend, cores or available_cores(), settings.split_min_chars)
        self.specials = added_special_tokens(backend)  # None: the post-processor adds a varying number
        self._cache: Memo[int] = Memo(int(settings.cache_mb * 2**20))
        self._words: Memo[int] = Memo(int(settings.word_cache_mb * 2**20))
        self._word_limit = settings.split_min_chars  # longer segments are split per core instead
        self.by_words = False
        self.hits = self.misses = 0
        self.fallbacks = 0
        self._ids: TokenIds | None = None
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
        self.by_words = self.splitter is not None and words_agree(self.backend)
        if self.splitter is not None and not self.by_words:
            log.warning("%s: texts are not counted word by word: the self-check failed", name)
        self.max_token_bytes = max_token_bytes(self.backend) if self.splitter is not None else None

    def fresh(self) -> TokenCounter:
        """This counter with empty caches and statistics. The load-time self-checks depend only on the tokenizer, so
        they carry over: on a large vocabulary they cost a few hundred milliseconds."""
        counter = copy.copy(self)
        counter._cache = Memo(self._cache.max_bytes)
        counter._words = Memo(self._words.max_bytes)
        counter.hits = counter.misses = counter.fallbacks = 0
        counter._ids = None
        return counter

    def token_ids(self, cache_mb: float) -> TokenIds:
        """This tokenizer's id encoder (the render routes'), made on first use: its caches cost nothing until then."""
        if self._ids is None:
            size = int(cache_mb * 2**20)
            self._ids = TokenIds(self.backend, self.segmenter, self.splitter, self.by_words, size, size // 4)
        return self._ids

    async def count(self, texts: Sequence[str], add_special_tokens: bool) -> list[int]:
        """Each text's token count, exactly as the tokenizer encodes it."""
        if add_special_tokens and self.specials is None:
            return await self._encode_lengths(list(texts), add_special_tokens=True)
        if sum(len(t) for t in texts) > OFF_LOOP_CHARS:
            cuts, long = await asyncio.to_thread(self._prepare, texts)
        else:
            cuts, long = [self.segmenter.cut(t) for t in texts], {}
        counts, missing = self._look_up((s for cut in cuts for s in cut.texts), long)
        counts.update(await self._encode(missing, long))
        extra = (self.specials or 0) if add_special_tokens else 0
        return [cut.added + sum(counts[s] for s in cut.texts) + extra for cut in cuts]

    def stats(self) -> CounterStats:
        cache = self._cache
        return CounterStats(self.hits, self.misses, len(cache), cache.bytes, cache.max_bytes, self.fallbacks)

    def _prepare(self, texts: Sequence[str]) -> tuple[list[Cut], dict[str, Prepared]]:
        """In a worker thread, for long texts: their cuts, and each long segment's cache key and plan. At 30 MB these
        take a second or more, and none of it touches the caches (which only the event loop's thread does)."""
        cuts = [self.segmenter.cut(t) for t in texts]
        long = {s: (key_of(s), self._plan(s)) for cut in cuts for s in cut.texts if len(s) > LONG_KEY_CHARS}
        return cuts, long

    def _look_up(self, segments: Iterable[str], long: dict[str, Prepared]) -> tuple[dict[str, int], list[str]]:
        known: dict[str, int] = {}
        missing: list[str] = []
        get = self._cache.get
        for segment in dict.fromkeys(segments):
            count = get(long[segment][0] if segment in long else segment)
            if count is None:
                missing.append(segment)
            else:
                known[segment] = count
        self.hits += len(known)
        self.misses += len(missing)
        return known, missing

    async def _encode(self, segments: list[str], long: dict[str, Prepared]) -> dict[str, int]:
        """Counts of uncached segments: short ones summed over their words (familiar words from the word cache),
        long ones split per core; whatever is still unknown is encoded in one batch."""
        if not segments:
            return {}
        plans = [long[s][1] if s in long else self._plan(s) for s in segments]
        found = [self._words.sum_found(parts) if by_words else (0, []) for by_words, parts in plans]
        # the words the young generation did not hold: found in the old one, or unknown
        known, unknown = self._words.get_many(p for _, rest in found for p in rest)
        whole = [p for by_words, parts in plans if not by_words for p in parts]
        lengths = iter(await self._encode_lengths(unknown + whole, add_special_tokens=False))
        fresh = {word: next(lengths) for word in unknown}
        self._remember(self._words, fresh)
        known.update(fresh)
        counts = {
            s: total + sum(known[p] for p in rest) if by_words else sum(next(lengths) for _ in parts)
            for s, (by_words, parts), (total, rest) in zip(segments, plans, found, strict=True)
        }
        self._remember(self._cache, {long[s][0] if s in long else s: n for s, n in counts.items()})
        return counts

    def _plan(self, segment: str) -> tuple[bool, list[str]]:
        """(True, its words) to count it word by word, or (False, its parts) to encode it whole, in parts."""
        if self.by_words and len(segment) <= self._word_limit:
            pieces = words(segment)
            if len(pieces) > 1:
                return True, pieces
        return False, self.splitter.split(segment) if self.splitter else [segment]

    @staticmethod
    def _remember(cache: Memo[int], counts: dict[str, int]) -> None:
        for text, count in counts.items():
            cache.put(text, count)

    async def _encode_lengths(self, texts: list[str], add_special_tokens: bool) -> list[int]:
        # encode_batch_fast releases the GIL (plain `encode` does not), so the loop keeps running while it works.
        # A worker thread costs ~0.1 ms per call against ~0.6 ms for tokenizers' own async_encode_batch_fast, with
        # the same event-loop stalls at 128K tokens (measured with tokenizers 0.23.3). Short texts are encoded right
        # here: the hop to a thread and back costs more than they do (a few ms at most hold the loop). A long prompt
        # goes in batches of at most BATCH_CHARS: the encodings of a whole 30 MB prompt at once take gigabytes.
        # A few new words (a fresh prompt's) go one `encode` call each: the batch call splits two texts or more over
        # its thread pool and waits for it, which took twice the CPU of plain calls for 2 to 16 words (tokenizers
        # 0.23.3; one text it encodes on the calling thread, as fast as `encode`).
        encode = self.backend.encode_batch_fast
        if not texts:
            return []
        total = sum(len(t) for t in texts)
        if len(texts) > 1 and total <= PLAIN_MAX_CHARS:
            one = self.backend.encode
            return [len(one(t, add_special_tokens=add_special_tokens)) for t in texts]
        if total <= INLINE_MAX_CHARS:
            return [len(e) for e in encode(texts, add_special_tokens=add_special_tokens)]
        lengths: list[int] = []
        for batch in _batches(texts, BATCH_CHARS):
            encodings = await asyncio.to_thread(encode, batch, add_special_tokens=add_special_tokens)
            lengths += [len(e) for e in encodings]
            del encodings
        return lengths

    def floor(self, texts: Sequence[str], ceiling: int) -> int | None:
        """A lower bound of the tokens of any prompt that holds these texts verbatim, from their size alone, when it
        proves more than `ceiling` tokens; else None (also when the vocabulary gives no bound: only byte-level BPE
        with a regex pre-tokenizer, where every token stands for bytes of the text, is taken). No token covers more
        than `max_token_bytes` bytes; whitespace is left out, since an added token may strip a run of it."""
        if self.max_token_bytes is None or sum(len(t) for t in texts) <= ceiling:
            return None  # each token is at least one character: fewer characters than the ceiling prove nothing
        size = 0
        for text in texts:  # in slices: a copy of a whole 30 MB text without its spaces costs hundreds of MB
            for at in range(0, len(text), FLOOR_SLICE_CHARS):
                size += len(WHITESPACE_RUN.sub("", text[at : at + FLOOR_SLICE_CHARS]).encode("utf-8", "surrogatepass"))
        bound = size // self.max_token_bytes
        return bound if bound > ceiling else None

    async def floor_off_loop(self, texts: Sequence[str], ceiling: int) -> int | None:
        """floor(), in a worker thread when the texts are long: slice by slice, the event loop gets its turns."""
        if sum(len(t) for t in texts) <= INLINE_MAX_CHARS:
            return self.floor(texts, ceiling)
        return await asyncio.to_thread(self.floor, texts, ceiling)

    async def at_least(self, texts: Sequence[str], ceiling: int) -> int | None:
        """A lower bound of the tokens of any prompt that holds these texts verbatim, proven by counting them exactly
        only until the count passes `ceiling` (None if it never does, or the texts cannot be cut exactly): the
        floor() of a vocabulary with long tokens proves little, and an exact count of a 30 MB prompt takes seconds.

        Counted are the parts the splitter cuts each text into between its added tokens, but not the first and last
        part of each: a part's tokens are the same alone as in its whole text (the splitter's rule), and inside a
        prompt only the edges of a text meet other characters (the template's, a trimmed space, an added token's
        stripped whitespace). The texts are read in growing prefixes, so a prompt far over the ceiling costs about
        the ceiling's worth of encoding."""
        if self.splitter is None:
            return None
        total = 0
        for text in texts:
            reach = 16 * (ceiling + 1) + 2 * self.splitter.slice_chars  # most texts take ~4 characters a token
            while True:
                prefix = text[:reach]
                counted = await self._interior_tokens(prefix, ceiling - total)
                if total + counted > ceiling:
                    return total + counted
                if len(prefix) == len(text):
                    total += counted
                    break
                reach *= 4
        return None

    async def _interior_tokens(self, text: str, enough: int) -> int:
        """The tokens of the interior parts of `text` (as at_least() takes them), stopping once past `enough`."""
        splitter = self.splitter
        assert splitter is not None
        cut = self.segmenter.cut
        parts = await asyncio.to_thread(lambda: [p for s in cut(text).texts for p in splitter.split(s)[1:-1]])
        counted = 0
        for batch in _batches(parts, BATCH_CHARS):
            counted += sum(await self._encode_lengths(batch, add_special_tokens=False))
            if counted > enough:
                break
        return counted


def _batches(texts: list[str], limit: int) -> Iterable[list[str]]:
    batch: list[str] = []
    size = 0
    for text in texts:
        if batch and size + len(text) > limit:
            yield batch
            batch, size = [], 0
        batch.append(text)
        size += len(text)
    if batch:
        yield batch


def max_token_bytes(backend: Any) -> int:
    """The most bytes any one token stands for, counted high (a byte-level symbol is one byte but two in UTF-8)."""
    return max(len(token.encode("utf-8", "surrogatepass")) for token in backend.get_vocab(with_added_tokens=True))


def available_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
