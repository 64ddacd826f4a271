"""Token ids and text for the overflow policies, which cut prompts at token boundaries (counting alone never needs
the ids). Encoding releases the GIL, like counting does."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.counting.tokenizer import ModelTokenizer


async def encode(tok: ModelTokenizer, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    backend: Any = tok.backend
    if hasattr(backend, "async_encode_batch_fast"):
        encodings = await backend.async_encode_batch_fast(texts, add_special_tokens=add_special_tokens)
    else:
        encodings = await asyncio.to_thread(backend.encode_batch_fast, texts, add_special_tokens=add_special_tokens)
    return [list(e.ids) for e in encodings]


def decode(tok: ModelTokenizer, ids: list[int]) -> str:
    text: str = tok.backend.decode(ids, skip_special_tokens=False)
    return text


def cut_middle(ids: list[int], keep: int) -> tuple[list[int], list[int]]:
    """The head and tail that keep `keep` ids in all (the head gets the extra one)."""
    head = (keep + 1) // 2
    return ids[:head], ids[len(ids) - (keep - head) :] if keep - head else []


def chunk_spans(length: int, size: int, overlap: int) -> list[tuple[int, int]]:
    """The chunk policy's split: consecutive [start, end) spans of `size` covering `length`, each starting `overlap`
    before the last end."""
    if length <= 0:
        return []
    spans, start = [], 0
    while True:
        end = min(start + size, length)
        spans.append((start, end))
        if end == length:
            return spans
        start = end - overlap


async def encode_with_offsets(tok: ModelTokenizer, text: str) -> tuple[list[int], list[int]]:
    """Ids of `text` (no special tokens) and, for each id, the character offset where it starts."""
    backend: Any = tok.backend

    def encoded() -> tuple[list[int], list[int]]:  # the lists too are built off the loop: 30 ms at 200K tokens
        (encoding,) = backend.encode_batch([text], add_special_tokens=False)
        return list(encoding.ids), [start for start, _ in encoding.offsets]

    return await asyncio.to_thread(encoded)


def char_cut(starts: list[int], token_index: int, text_length: int) -> int:
    """The character position where token `token_index` starts, moved forward past tokens that share a character
    (byte-level BPE can split one character's bytes over several tokens), so that text slices stay whole."""
    while 0 < token_index < len(starts) and starts[token_index] == starts[token_index - 1]:
        token_index += 1
    return starts[token_index] if token_index < len(starts) else text_length
