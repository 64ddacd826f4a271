"""The guard's own count of a chat or completions prompt, exactly as vLLM counts it (docs/vllm-wire-contract.md,
section 12), without blocking the event loop; the upstream's count is proxy/upstream/remote_count.py.

Chat: messages -> vLLM's conversation -> the chat template -> encode with add_special_tokens false by default.
Completions: each string prompt encoded with special tokens (default true); token-id prompts counted as given.
The model's `TokenCounter` does the encoding: segment-cached, and off the event loop (see text_count.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from proxy.api.chat import ChatRequest
from proxy.api.completions import CompletionRequest
from proxy.counting.bound import verbatim_texts
from proxy.counting.render import render_chat, render_chat_isolated
from proxy.counting.text_count import OFF_LOOP_CHARS, TokenCounter
from proxy.counting.text_ids import TokenIds
from proxy.counting.tokenizer import ModelTokenizer
from proxy.settings import CountingSettings

CountMessages = Callable[[list[Any]], Awaitable[int]]
"""Counts a chat request's prompt as if it held these messages: how the overflow policies try their cuts."""


async def count_chat(tok: ModelTokenizer, req: ChatRequest, counter: TokenCounter | None = None) -> int:
    prompt = await render_prompt(tok, req)
    if not isinstance(prompt, str):
        return len(prompt)
    (count,) = await _counter(tok, counter).count([prompt], req.add_special_tokens)
    return count


async def chat_ids(tok: ModelTokenizer, req: ChatRequest, ids: TokenIds) -> list[int]:
    """The prompt's token ids, exactly as vLLM renders and encodes it (the render routes' answer)."""
    prompt = await render_prompt(tok, req)
    if not isinstance(prompt, str):
        return prompt
    (out,) = await ids.ids([prompt], req.add_special_tokens)
    return out


async def render_prompt(tok: ModelTokenizer, req: ChatRequest) -> str | list[int]:
    """The prompt text the chat template renders, or the token ids a native renderer (mistral_common, harmony)
    makes straight from the messages."""
    if tok.effort_map:  # most servers map no effort: the request is read only where one does
        req = _effort_mapped(req, tok.effort_map)
    if tok.native is not None:
        return await asyncio.to_thread(tok.native.chat_ids, req, tok.mistral_034, tok.default_kwargs)
    # A template the request brought is the client's code: it runs in a child process, bounded (isolated.py). A
    # long conversation renders in a worker thread: ~80 ms for 31 MB, and the event loop gets its turns meanwhile.
    if req.chat_template is not None:
        return await render_chat_isolated(tok, req)
    if sum(len(t) for t in verbatim_texts(req.messages)) > OFF_LOOP_CHARS:
        return await asyncio.to_thread(render_chat, tok, req)
    return render_chat(tok, req)


async def count_completion(
    tok: ModelTokenizer, req: CompletionRequest, counter: TokenCounter | None = None
) -> list[int]:
    texts = [p for p in req.prompts if isinstance(p, str)]
    if tok.native is not None and texts:
        native = [tok.native.text_ids(t, req.add_special_tokens) for t in texts]
        if all(n is not None for n in native):
            counts = iter(native)
            return [len(next(counts) or ()) if isinstance(p, str) else len(p) for p in req.prompts]
    text_counts = iter(await _counter(tok, counter).count(texts, req.add_special_tokens) if texts else [])
    return [next(text_counts) if isinstance(p, str) else len(p) for p in req.prompts]


async def completion_ids(tok: ModelTokenizer, req: CompletionRequest, ids: TokenIds) -> list[list[int]]:
    """Each prompt's token ids: text encoded as vLLM encodes it, token-id prompts as given."""
    texts = [p for p in req.prompts if isinstance(p, str)]
    native = [tok.native.text_ids(t, req.add_special_tokens) for t in texts] if tok.native is not None else []
    if texts and native and all(n is not None for n in native):
        encoded = iter([list(n or ()) for n in native])
    else:
        encoded = iter(await ids.ids(texts, req.add_special_tokens) if texts else [])
    return [next(encoded) if isinstance(p, str) else list(p) for p in req.prompts]


def _effort_mapped(req: ChatRequest, effort_map: Mapping[str, str]) -> ChatRequest:
    """The effort the server's --reasoning-effort-map rewrites the request's to before templating (vLLM 0.33+
    build_chat_params, on chat and on what Responses and Messages become); only the count's copy changes, what goes
    upstream keeps the client's effort, which vLLM maps itself."""
    effort = req.body.get("reasoning_effort")
    if not isinstance(effort, str) or effort not in effort_map:
        return req
    return replace(req, body={**req.body, "reasoning_effort": effort_map[effort]})


def _counter(tok: ModelTokenizer, counter: TokenCounter | None) -> TokenCounter:
    """The model's counter; one-off callers without one get a throwaway counter with no cache."""
    return counter if counter is not None else TokenCounter(tok.backend, CountingSettings(cache_mb=0), name=tok.source)
