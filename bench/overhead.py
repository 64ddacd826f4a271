"""`python -m bench overhead`: what counting adds end to end, through the running proxy in front of a simulator that
answers at once (max_tokens 1), as a ratio to the raw `Tokenizer.encode` floor of the same rendered prompt measured
in the same run; plus the latency of small requests sent while a huge prompt is being counted.

Added latency = (through token-guard) - (direct), for the same prompt, after the simulator has seen it once (it caches
its counts), so that its own counting cancels out.
One-shot prompts are new each run, so nothing is cached; turn 20 is sent after turns 1-19 went through the guard.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from transformers import AutoTokenizer

from bench.counting import _chars_per_token, _conversation, _earlier_turns, _one_shot
from bench.systems import Upstream, start_simulator, start_token_guard
from proxy.assets import write_demo_tokenizer_dir
from proxy.counting.tokenizer import load_tokenizer

MODEL = "tiny"
WINDOW = 200_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5, help="prompts per case (medians are reported)")
    parser.add_argument("--tokens", type=int, default=100_000, help="size of the one-shot prompt")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tokenizer = write_demo_tokenizer_dir(work / "tok")
        simulator = start_simulator(tokenizer, WINDOW, 0.0, 0.0, work)
        guard = start_token_guard(Upstream(simulator.url, tokenizer, WINDOW), work)
        try:
            result = asyncio.run(measure(args, tokenizer, simulator.url, guard.url))
        finally:
            guard.stop()
            simulator.stop()
    print(markdown(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


async def measure(args: argparse.Namespace, tokenizer: Path, direct: str, guard: str) -> dict[str, Any]:
    tok = load_tokenizer(str(tokenizer))
    reference = AutoTokenizer.from_pretrained(str(tokenizer))
    chars = int(args.tokens * _chars_per_token(tok))
    async with httpx.AsyncClient(timeout=600) as client:
        one_shot = [
            await _compare(client, reference, tok, direct, guard, _one_shot(chars, 100 + i)) for i in range(args.runs)
        ]
        turns = []
        for i in range(args.runs):
            conversation = _conversation(_chars_per_token(tok), 200 + i)
            for earlier in _earlier_turns(conversation, 19):
                await _send(client, guard, earlier)
            turns.append(await _compare(client, reference, tok, direct, guard, conversation))
        stall = await _small_requests_meanwhile(client, direct, guard, _one_shot(chars, 999))
    return {"one_shot": _summary(one_shot), "turn_20": _summary(turns), "small_requests": stall}


async def _compare(client: httpx.AsyncClient, reference: Any, tok: Any, direct: str, guard: str,
                   messages: list[dict[str, str]]) -> dict[str, float]:  # fmt: skip
    rendered = reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    started = time.perf_counter()
    tokens = len(tok.backend.encode(rendered, add_special_tokens=False).ids)
    floor = time.perf_counter() - started
    await _send(client, direct, messages)  # the simulator caches its own counts: prime it, so both sides hit it
    direct_s = await _send(client, direct, messages)
    guard_s = await _send(client, guard, messages)
    return {"tokens": tokens, "floor_s": floor, "direct_s": direct_s, "guard_s": guard_s,
            "added_s": guard_s - direct_s}  # fmt: skip


async def _send(client: httpx.AsyncClient, url: str, messages: list[dict[str, str]]) -> float:
    started = time.perf_counter()
    body = {"model": MODEL, "messages": messages, "max_tokens": 1}
    response = await client.post(f"{url}/v1/chat/completions", json=body)
    response.raise_for_status()
    return time.perf_counter() - started


async def _small_requests_meanwhile(
    client: httpx.AsyncClient, direct: str, guard: str, huge: list[dict[str, str]]
) -> dict[str, Any]:
    small = [{"role": "user", "content": "Hi there, how are you?"}]
    await _send(client, direct, huge)  # primed upstream: what stalls now is the guard's own counting, not the simulator
    baseline = sorted([await _send(client, guard, small) for _ in range(20)])
    big = asyncio.ensure_future(_send(client, guard, huge))
    during: list[float] = []
    while not big.done():
        during.append(await _send(client, guard, small))
        await asyncio.sleep(0.005)
    big_s = await big
    return {"baseline_p50_ms": round(statistics.median(baseline) * 1000, 1), "during_count": len(during),
            "during_max_ms": round(max(during, default=0.0) * 1000, 1), "huge_request_s": round(big_s, 3)}  # fmt: skip


def _summary(rows: list[dict[str, float]]) -> dict[str, float]:
    return {
        "tokens": statistics.median(r["tokens"] for r in rows),
        "floor_ms": round(statistics.median(r["floor_s"] for r in rows) * 1000, 1),
        "direct_ms": round(statistics.median(r["direct_s"] for r in rows) * 1000, 1),
        "guard_ms": round(statistics.median(r["guard_s"] for r in rows) * 1000, 1),
        "added_ms": round(statistics.median(r["added_s"] for r in rows) * 1000, 1),
        "added_over_floor": round(statistics.median(r["added_s"] / r["floor_s"] for r in rows), 3),
    }


def markdown(result: dict[str, Any]) -> str:
    lines = ["| case | prompt tokens | raw encode floor | direct | through token-guard | added | added / floor |",
             "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for case, title in (("one_shot", "one-shot, nothing cached"), ("turn_20", "turn 20, turns 1-19 sent before")):
        r = result[case]
        times = f"{r['floor_ms']} ms | {r['direct_ms']} ms | {r['guard_ms']} ms | {r['added_ms']} ms"
        lines.append(f"| {title} | {r['tokens']:,.0f} | {times} | {r['added_over_floor']}x |")
    s = result["small_requests"]
    lines.append(f"\nSmall requests through token-guard while a {result['one_shot']['tokens']:,.0f}-token prompt was "
                 f"counted: {s['during_count']} sent, slowest {s['during_max_ms']} ms (alone: p50 "
                 f"{s['baseline_p50_ms']} ms).")  # fmt: skip
    return "\n".join(lines)
