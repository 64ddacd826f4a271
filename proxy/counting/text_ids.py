"""The per-model token-id encoder: a text's ids exactly as `backend.encode(text, add_special_tokens=...).ids`, built
from cached pieces as the counter builds counts (text_count.py). A text is cut at its added tokens (each one id), each
piece between them is looked up in a bounded cache of ids; an uncached piece is made of its words' ids (a cache of
words: fresh text is mostly familiar words), and what is still unknown is encoded in one GIL-releasing batch call.

Every shortcut is confirmed at load on the counter's probe texts, comparing ids, not counts; one that misses is off
for this tokenizer. All cache access happens on the event loop's thread; only the encoding runs elsewhere.
"""

from __future__ import annotations

import asyncio
import logging
from array import array
from collections.abc import Sequence
from itertools import compress
from operator import not_
from typing import Any, cast

from proxy.counting.memo import Memo
from proxy.counting.segments import Piece, Segmenter
from proxy.counting.selfcheck import ids_segments_agree, ids_splits_agree, ids_words_agree
from proxy.counting.splitting import Splitter, words

log = logging.getLogger("token_guard.ids")

INLINE_MAX_CHARS = 8192  # encoded right on the event loop: a thread hop costs more than this much encoding
WORDS_MAX_CHARS = 2**21  # longer pieces are encoded in parts in a worker thread (their word lists cost too much memory)
BATCH_PARTS = 4  # a long piece's parts (each at most the splitter's slice, 64K characters) encoded at once

Ids = bytes  # the ids as array("i") bytes: cached compactly (4 bytes an id) and joined at C speed


def _ids_bytes(ids: Ids) -> int:
    return 33 + len(ids)


def _packed(ids: Sequence[int]) -> Ids:
    return array("i", ids).tobytes()


class TokenIds:
    def __init__(
        self, backend: Any, segmenter: Segmenter, splitter: Splitter | None, by_words: bool, cache_bytes: int,
        word_bytes: int,
    ) -> None:  # fmt: skip
        self.backend = backend
        self.segmenter = segmenter if ids_segments_agree(backend, segmenter) else Segmenter([], refusal="self-check")
        self.by_words = by_words and ids_words_agree(backend)
        self.splitter = splitter if splitter is not None and ids_splits_agree(backend, splitter) else None
        for shortcut, kept in (("pieces", self.segmenter is segmenter), ("words", self.by_words == by_words),
                               ("parts", self.splitter is splitter)):  # fmt: skip
            if not kept:
                log.warning("token ids are not built from %s: the self-check failed", shortcut)
        self.specials = _special_frame(backend)  # the ids add_special_tokens puts before and after; None: varies
        self._added = {t.content: _packed([i]) for i, t in backend.get_added_tokens_decoder().items()}
        self._pieces: Memo[Ids] = Memo(cache_bytes, _ids_bytes)
        self._words: Memo[Ids] = Memo(word_bytes, _ids_bytes)
        self.hits = self.misses = 0

    async def ids(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[int]]:
        """Each text's token ids."""
        if add_special_tokens and self.specials is None:
            return [list(e.ids) for e in await _encode(self.backend, list(texts), True)]
        out = []
        for text in texts:
            body = await self._text_ids(text)
            if add_special_tokens and self.specials is not None:
                before, after = self.specials
                body = _packed(before) + body + _packed(after)
            ids = array("i")
            ids.frombytes(body)
            out.append(ids.tolist())
        return out

    async def _text_ids(self, text: str) -> Ids:
        pieces = self.segmenter.in_order(text)
        if pieces is None:
            pieces = [Piece(text)]
        known: dict[str, Ids] = {}
        missing: list[str] = []
        for piece in pieces:
            if piece.added or piece.text in known:
                continue
            found = self._pieces.get(piece.text)
            if found is None:
                missing.append(piece.text)
            else:
                known[piece.text] = found
        self.hits += len(known)
        self.misses += len(missing)
        known.update(await self._fresh(list(dict.fromkeys(missing))))
        return b"".join(self._added[p.text] if p.added else known[p.text] for p in pieces)

    async def _fresh(self, texts: list[str]) -> dict[str, Ids]:
        """Ids of uncached pieces: from their words where that is exact, the rest encoded whole; all cached."""
        if not texts:
            return {}
        by_words = [t for t in texts if self.by_words and len(t) <= WORDS_MAX_CHARS]
        whole = [t for t in texts if not (self.by_words and len(t) <= WORDS_MAX_CHARS)]
        fresh = {text: await self._whole(text) for text in whole}
        for text in by_words:
            fresh[text] = await self._from_words(words(text))
        for text, ids in fresh.items():
            self._pieces.put(text, ids)
        return fresh

    async def _whole(self, text: str) -> Ids:
        """A long piece's ids, encoded in parts cut where pre-tokenization is unchanged, a batch at a time: the
        encodings of a whole long text at once take gigabytes."""
        parts = self.splitter.split(text) if self.splitter is not None else [text]
        packed = []
        for start in range(0, len(parts), BATCH_PARTS):
            packed += [_packed(e.ids) for e in await _encode(self.backend, parts[start : start + BATCH_PARTS], False)]
        return b"".join(packed)

    async def _from_words(self, parts: list[str]) -> Ids:
        """The ids of a text cut into words: the young generation's at C speed, the rest found or encoded."""
        found = self._words.found(parts)
        if None in found:  # found in the old generation (get_many moves them to the young one) or encoded now
            known, unknown = self._words.get_many(compress(parts, map(not_, found)))  # a word's ids are never b""
            for word, encoding in zip(unknown, await _encode(self.backend, unknown, False), strict=True):
                ids = known[word] = _packed(encoding.ids)
                self._words.put(word, ids)
            found = self._words.found(parts)  # all young now, unless the generation turned over meanwhile
            if None in found:
                found = [ids if ids is not None else known[p] for p, ids in zip(parts, found, strict=True)]
        return b"".join(cast(list[Ids], found))


async def _encode(backend: Any, texts: list[str], add_special_tokens: bool) -> list[Any]:
    """Encodings of the texts; a large batch in a worker thread (encode_batch_fast releases the GIL there)."""
    if not texts:
        return []
    if sum(len(t) for t in texts) <= INLINE_MAX_CHARS:
        return list(backend.encode_batch_fast(texts, add_special_tokens=add_special_tokens))
    return list(await asyncio.to_thread(backend.encode_batch_fast, texts, add_special_tokens=add_special_tokens))


def _special_frame(backend: Any) -> tuple[list[int], list[int]] | None:
    """The ids `add_special_tokens=True` puts before and after any text, when they are always the same."""
    probes = ["a", " Hello, world!\n", "東京 🎉", "x y z"]
    frames = set()
    for text in probes:
        plain = backend.encode(text, add_special_tokens=False).ids
        full = backend.encode(text, add_special_tokens=True).ids
        for start in range(len(full) - len(plain) + 1):
            if full[start : start + len(plain)] == plain:
                frames.add((tuple(full[:start]), tuple(full[start + len(plain) :])))
                break
        else:
            return None
    if len(frames) != 1:
        return None
    before, after = frames.pop()
    return list(before), list(after)
