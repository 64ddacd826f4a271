"""The answers of /inference/v1/generate, key for key as vLLM 0.31 and 0.32 write them (captured from a real vLLM
serving the tiny model with --enable-scale-out): token ids, not text; 0.32 adds `output_mode` and each choice's
`stop_reason` and `weight_versions`. A stream is one event per choice and step, then usage only when
`stream_options.include_usage` asks for it, then [DONE]."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from simulator.generation import Engine, Generation, Sequence, sequences, steps
from simulator.responses import DONE, Output, short_usage, sse, usage
from simulator.stats import RequestTracker

TAIL = ("prompt_logprobs", "prompt_token_id_logprobs", "prompt_token_ids", "mm_placeholders", "metrics",
        "kv_transfer_params", "ec_transfer_params")  # fmt: skip


def _mode(g: Generation) -> str | None:
    """0.32's output_mode ("tokens" or "text"); None for 0.31, which has no such field."""
    return None if g.request is None else str(g.request.get("output_mode", "tokens"))


def _choice(g: Generation, seq: Sequence, token_ids: list[int], text: str, final: bool) -> dict[str, Any]:
    mode = _mode(g)
    finish = seq.finish_reason if final else None
    if mode is None:
        return {"index": seq.index, "logprobs": None, "finish_reason": finish, "token_ids": token_ids,
                "routed_experts": None, "sampling_mask": None}  # fmt: skip
    spans = [{"version": "default", "start": 0, "end": seq.max_tokens}] if final else None
    choice = {"index": seq.index, "finish_reason": finish, "stop_reason": seq.stop_reason if final else None,
              "token_ids": token_ids, "routed_experts": None, "sampling_mask": None,
              "weight_versions": spans}  # fmt: skip
    if mode == "text":
        choice["text"] = text
    choice["logprobs"] = None
    return choice


def generate_body(g: Generation, outputs: list[Output], omit_null_details: bool = False) -> dict[str, Any]:
    prompt = len(g.prompts[0].token_ids)
    choices = [_choice(g, o.sequence, o.token_ids, o.text, True) for o in outputs]
    head: dict[str, Any] = {"request_id": g.response_id, "model": g.model, "created": g.created}
    spent = usage(prompt, sum(len(o.token_ids) for o in outputs), omit_null_details)
    tail = dict.fromkeys(TAIL)
    if _mode(g) is None:
        return {**head, "choices": choices, "usage": spent, **tail}
    return {**head, "usage": spent, **tail, "output_mode": _mode(g), "choices": choices}


def _event(g: Generation, choices: list[dict[str, Any]], spent: dict[str, Any] | None) -> str:
    if _mode(g) is None:
        return sse({"request_id": g.response_id, "choices": choices, "usage": spent})
    return sse({"request_id": g.response_id, "usage": spent, "output_mode": _mode(g), "choices": choices})


async def generate_events(
    g: Generation, engine: Engine, tracker: RequestTracker, omit_null_details: bool = False
) -> AsyncGenerator[str, None]:
    seqs = sequences(g)
    generated = [0] * len(seqs)
    prompt = len(g.prompts[0].token_ids)
    async for step in steps(seqs, engine):
        tracker.generated(len(step))
        for token in step:
            generated[token.sequence.index] += 1
            choice = _choice(g, token.sequence, [token.token_id], token.text, token.last)
            count = generated[token.sequence.index]
            spent = usage(prompt, count, omit_null_details) if g.continuous_usage else None
            yield _event(g, [choice], spent)
    if g.include_usage:
        yield _event(g, [], short_usage(prompt, sum(generated)))
    yield DONE
