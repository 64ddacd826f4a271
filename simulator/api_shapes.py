"""The answers of /v1/responses and /v1/messages, key for key as vLLM 0.31/0.32 write them (captured from a real
vLLM serving the tiny model): the Responses object and its `event: ...` stream (no [DONE]), and the Anthropic message
and its stream. The engine always runs to max tokens, so a response is "incomplete" and a message stops at
"max_tokens", as with a random-weight model."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from simulator.generation import Engine, Generation, sequences, steps
from simulator.stats import RequestTracker


def event(name: str, payload: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _hex() -> str:
    return f"{uuid.uuid4().int & (2**64 - 1):016x}"


# --- Responses --------------------------------------------------------------------------------------------------


def _text_part(text: str, logprobs: list[Any] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _output_item(item_id: str, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text, None)]
    status = "in_progress" if text is None else "completed"
    return {"id": item_id, "content": content, "role": "assistant", "status": status, "type": "message", "phase": None}


def responses_object(g: Generation, text: str | None, output_tokens: int) -> dict[str, Any]:
    """The response; `text` None while it is still in progress."""
    request = dict(g.request or {})
    tools = request.get("tools") or []
    done = text is not None
    prompt = len(g.prompts[0].token_ids)
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0, "input_tokens_per_turn": [],
                                 "cached_tokens_per_turn": []},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                  "tool_output_tokens_per_turn": []},
        "total_tokens": prompt + output_tokens,
    }  # fmt: skip
    return {
        "id": g.response_id, "created_at": g.created,
        "incomplete_details": {"reason": "max_output_tokens"} if done else None,
        "instructions": request.get("instructions"), "metadata": request.get("metadata"), "model": g.model,
        "object": "response", "output": [_output_item(f"msg_{_hex()}", text)] if done else [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "temperature": float(request.get("temperature", 1.0)), "tool_choice": request.get("tool_choice") or (
            "auto" if tools else "none"), "tools": tools, "top_p": float(request.get("top_p", 1.0)),
        "background": bool(request.get("background")), "max_output_tokens": g.prompts[0].max_tokens,
        "max_tool_calls": None, "previous_response_id": request.get("previous_response_id"), "prompt": None,
        **(_prompt_cache(request) if g.echoes_prompt_cache else {}),
        "reasoning": request.get("reasoning"),
        **({"safety_identifier": request.get("safety_identifier")} if g.echoes_prompt_cache else {}),
        "service_tier": "auto", "status": "incomplete" if done else "in_progress",
        "text": None, "top_logprobs": None, "truncation": request.get("truncation") or "disabled",
        "usage": usage if done else None, "user": None, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "kv_transfer_params": None, "ec_transfer_params": None, "input_messages": None, "output_messages": None,
    }  # fmt: skip


def _prompt_cache(request: dict[str, Any]) -> dict[str, Any]:
    """0.33's echo of the prompt-cache fields (vLLM acts on none of them): the options without the request-only
    `prewarm`, and the retention's old spelling "in-memory" as "in_memory"."""
    options = request.get("prompt_cache_options")
    if isinstance(options, dict):
        options = {"mode": options.get("mode", "implicit"), "ttl": options.get("ttl", "30m"),
                   "comparison_response_id": options.get("comparison_response_id")}  # fmt: skip
    retention = request.get("prompt_cache_retention")
    return {"prompt_cache_options": options, "prompt_cache_key": request.get("prompt_cache_key"),
            "prompt_cache_retention": "in_memory" if retention == "in-memory" else retention}  # fmt: skip


async def responses_events(g: Generation, engine: Engine, tracker: RequestTracker) -> AsyncGenerator[str, None]:
    number = iter(range(1 << 30))

    def send(name: str, payload: dict[str, Any]) -> str:
        return event(name, {**payload, "sequence_number": next(number), "type": name})

    yield send("response.created", {"response": responses_object(g, None, 0)})
    yield send("response.in_progress", {"response": responses_object(g, None, 0)})
    item = _hex()
    at = {"item_id": item, "output_index": 0}
    yield send("response.output_item.added", {"item": _output_item(item, None), "output_index": 0})
    yield send("response.content_part.added", {"content_index": 0, **at, "part": _text_part("", [])})
    text, count = "", 0
    async for step in steps(sequences(g), engine):
        tracker.generated(len(step))
        for token in step:
            text, count = text + token.text, count + 1
            yield send("response.output_text.delta", {"content_index": 0, "delta": token.text, **at, "logprobs": []})
    yield send("response.output_text.done", {"content_index": 0, **at, "logprobs": [], "text": text})
    yield send("response.content_part.done", {"content_index": 0, **at, "part": _text_part(text, None)})
    yield send("response.output_item.done", {"item": {**_output_item(item, text), "summary": []}, "output_index": 0})
    completed = responses_object(g, text, count)
    if g.keep is not None:
        g.keep(completed)
    incomplete = g.ends_incomplete and completed["status"] == "incomplete"
    yield send("response.incomplete" if incomplete else "response.completed", {"response": completed})


# --- Anthropic Messages -------------------------------------------------------------------------------------------


def message_object(g: Generation, text: str, output_tokens: int) -> dict[str, Any]:
    return {
        "id": g.response_id, "type": "message", "role": "assistant", "content": [{"type": "text", "text": text}],
        "model": g.model, "stop_reason": "max_tokens",
        "usage": {"input_tokens": len(g.prompts[0].token_ids), "output_tokens": output_tokens},
    }  # fmt: skip


async def message_events(g: Generation, engine: Engine, tracker: RequestTracker) -> AsyncGenerator[str, None]:
    usage = {"input_tokens": len(g.prompts[0].token_ids), "output_tokens": 0}
    start: dict[str, Any] = {"id": g.response_id, "type": "message", "role": "assistant", "content": [],
                             "model": g.model, "stop_reason": None, "stop_sequence": None, "usage": usage}  # fmt: skip
    yield event("message_start", {"type": "message_start", "message": start})
    block = {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0}
    yield event("content_block_start", block)
    count = 0
    async for step in steps(sequences(g), engine):
        tracker.generated(len(step))
        for token in step:
            count += 1
            delta = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": token.text}, "index": 0}
            yield event("content_block_delta", delta)
    yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
    ending = {"stop_reason": "max_tokens", "stop_sequence": None}
    yield event("message_delta", {"type": "message_delta", "delta": ending, "usage": {**usage, "output_tokens": count}})
    yield event("message_stop", {"type": "message_stop"})


def whole_body(g: Generation, text: str, output_tokens: int) -> dict[str, Any]:
    if g.endpoint == "responses":
        body = responses_object(g, text, output_tokens)
        if g.keep is not None:
            g.keep(body)
        return body
    return message_object(g, text, output_tokens)


def api_events(g: Generation, engine: Engine, tracker: RequestTracker) -> AsyncGenerator[str, None]:
    return responses_events(g, engine, tracker) if g.endpoint == "responses" else message_events(g, engine, tracker)
