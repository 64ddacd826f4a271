"""The chunk policy's split: an overflowing prompt becomes consecutive chunks, each sent as its own request.

Completions split the prompt's token ids. Chat keeps the conversation as a frame and splits the text of its longest
user message at token boundaries that are also character boundaries, so the chunks cover the text exactly once, in
order (plus the configured overlap). Each chunk is re-counted exactly; if decoding shifted a count over the budget,
the chunk size shrinks and the split is made again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from proxy.api.chat import ChatRequest
from proxy.api.completions import CompletionRequest
from proxy.counting.ids import char_cut, chunk_spans, encode, encode_with_offsets
from proxy.counting.local_count import CountMessages
from proxy.counting.tokenizer import ModelTokenizer

MIN_CHUNK_TOKENS = 32  # a chat chunk's text smaller than this: too little room beside the rest of the conversation


@dataclass(frozen=True)
class Split:
    prompts: list[Any]  # completions: token-id prompts; chat: whole `messages` lists
    prompt_tokens: list[int]
    spans: list[tuple[int, int]]  # chat: character spans of the split text; completions: token spans


class CannotChunk(Exception):
    """Chunking has no sound meaning for this request; the message says why."""


MAX_CHUNKS = 64  # a prompt that needs more chunks than this is not chunked: 64 answers glued together say little


def refuse_too_many_chunks(prompt_tokens: int, chunk_tokens: int) -> None:
    if prompt_tokens > MAX_CHUNKS * chunk_tokens:
        raise CannotChunk(f"the prompt would take more than {MAX_CHUNKS} chunks of {chunk_tokens} tokens")


def output_shares(total: int, chunks: int) -> list[int]:
    """The client's output limit split across the chunks of an answer they make together, in order (the first chunks
    take the remainder), so that the answer it receives stays within what it asked for."""
    if total < chunks:
        raise CannotChunk(f"max_tokens of {total} cannot be shared by {chunks} chunks (each answers 1 token or more)")
    base, extra = divmod(total, chunks)
    return [base + (i < extra) for i in range(chunks)]


def refuse_unsound(body: dict[str, Any], n: int, kind: str) -> None:
    reasons = []
    if n > 1:
        reasons.append("n > 1")
    if body.get("tools"):
        reasons.append("tools")
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") in ("json_schema", "json_object"):
        reasons.append("a JSON response_format")
    if body.get("logprobs") or body.get("top_logprobs") or body.get("prompt_logprobs"):
        reasons.append("logprobs")
    if kind == "completion" and isinstance(body.get("prompt"), list) and _is_batch(body["prompt"]):
        reasons.append("a batch of prompts")
    if reasons:
        raise CannotChunk(f"the chunk policy cannot split a request with {', '.join(reasons)}")


def _is_batch(prompt: list[Any]) -> bool:
    return len(prompt) > 1 and all(isinstance(p, str | list) for p in prompt)


async def split_completion(tok: ModelTokenizer, req: CompletionRequest, budget: int, size: int, overlap: int) -> Split:
    (prompt,) = req.prompts
    ids = prompt if isinstance(prompt, list) else (await encode(tok, [prompt], req.add_special_tokens))[0]
    spans = chunk_spans(len(ids), min(size, budget), overlap)
    return Split([ids[s:e] for s, e in spans], [e - s for s, e in spans], spans)


async def split_chat(
    tok: ModelTokenizer,
    req: ChatRequest,
    budget: int,
    size: int,
    overlap: int,
    prefix: str | None,
    count: CountMessages,
) -> Split:
    index = _longest_user(req.messages)
    text = _plain_text(req.messages[index])
    ids, starts = await encode_with_offsets(tok, text)
    frame = await count(_with_content(req.messages, index, _prefix(prefix, 999, 999)))
    chunk_size = min(size, budget - frame - 4)
    for _ in range(6):
        if chunk_size < MIN_CHUNK_TOKENS:
            raise CannotChunk(
                f"the rest of the conversation ({frame} tokens) leaves too little room in the window to split the "
                "long message"
            )
        token_spans = chunk_spans(len(ids), chunk_size, min(overlap, chunk_size // 2))
        spans = [(char_cut(starts, s, len(text)), char_cut(starts, e, len(text))) for s, e in token_spans]
        spans = [(s, e) for s, e in spans if e > s]
        chunks = [
            _with_content(req.messages, index, _prefix(prefix, i + 1, len(spans)) + text[s:e])
            for i, (s, e) in enumerate(spans)
        ]
        counts = [await count(c) for c in chunks]
        if max(counts) <= budget:
            return Split(chunks, counts, spans)
        chunk_size -= max(counts) - budget + 8
    raise CannotChunk("the long message could not be split into chunks that fit")


def _longest_user(messages: list[Any]) -> int:
    users = [(len(_plain_text(m)), i) for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users or max(users)[0] == 0:
        raise CannotChunk("the chunk policy needs a user message with text to split")
    return max(users)[1]


def _plain_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p if isinstance(p, str) else p.get("text") for p in content if isinstance(p, str | dict)]
        return "\n".join(t for t in texts if isinstance(t, str))
    return ""


def _with_content(messages: list[Any], index: int, text: str) -> list[Any]:
    copied = copy.copy(messages)
    copied[index] = {**messages[index], "content": text}
    return copied


def _prefix(template: str | None, i: int, n: int) -> str:
    if not template:
        return ""
    text = template.format(i=i, n=n)
    return text if text[-1:].isspace() else text + "\n"
