"""`python -m bench chunking`: how long a chunked request with N parts takes compared with one part alone, against
the simulator with realistic pacing (fan-out runs `max_fanout` parts at a time, so it should be far below N x)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from proxy.assets import write_demo_tokenizer_dir
from proxy.counting.registry import ModelRegistry
from proxy.server.app import create_app
from proxy.server.running import ServerThread
from proxy.settings import load_settings
from simulator import SimulatorSettings
from simulator import create_app as create_simulator

MODEL = "tiny"
WINDOW = 2048


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parts", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ttft", type=float, default=0.05)
    parser.add_argument("--itl", type=float, default=0.01)
    parser.add_argument("--runs", type=int, default=3)


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = write_demo_tokenizer_dir(Path(tmp) / "tok")
        sim = create_simulator(SimulatorSettings(tokenizer=tokenizer, model=MODEL, max_model_len=WINDOW,
                                                 ttft_s=args.ttft, itl_s=args.itl))  # fmt: skip
        with ServerThread(sim) as upstream:
            rows = [measure(args, tokenizer, upstream.url, fanout) for fanout in (1, 4, args.parts)]
    print(f"| max_fanout | one part alone | {args.parts}-part chunked request | ratio |")
    print("|---:|---:|---:|---:|")
    for fanout, one, many, parts in rows:
        print(f"| {fanout} | {one:.2f} s | {many:.2f} s ({parts} parts) | {many / one:.1f}x |")
    return 0


def measure(args: argparse.Namespace, tokenizer: Path, upstream: str, fanout: int) -> tuple[int, float, float, int]:
    flags: dict[str, Any] = {"upstream.url": upstream, "model.name": MODEL, "model.tokenizer": str(tokenizer),
                             "model.max_model_len": WINDOW, "policy.max_fanout": fanout}  # fmt: skip
    settings = load_settings(flags, environ={})
    with ServerThread(create_app(settings, ModelRegistry.from_settings(settings.models))) as guard:
        with httpx.Client(base_url=guard.url, timeout=600) as client:
            window = document(client, WINDOW - args.max_tokens - 100)
            long = " ".join([window] * args.parts)
            one = statistics.median(timed(client, window, args.max_tokens, {}) for _ in range(args.runs))
            many, parts = [], 0
            for _ in range(args.runs):
                started = time.perf_counter()
                response = client.post("/v1/chat/completions", json=chat(long, args.max_tokens),
                                       headers={"x-token-guard-overflow": "chunk"})  # fmt: skip
                response.raise_for_status()
                many.append(time.perf_counter() - started)
                parts = int(response.headers["x-token-guard-chunks"])
    return fanout, one, statistics.median(many), parts


def document(client: httpx.Client, tokens: int) -> str:
    words = ["river", "mill", "東京", "code()", "🎉", "quiet", "line", "42"]
    text = " ".join(words[i % len(words)] for i in range(tokens))
    while (
        client.post("/tokenize", json={"model": MODEL, "messages": [{"role": "user", "content": text}]}).json()["count"]
        > tokens
    ):
        text = text[: int(len(text) * 0.95)]
    return text


def chat(content: str, max_tokens: int) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}


def timed(client: httpx.Client, content: str, max_tokens: int, headers: dict[str, str]) -> float:
    started = time.perf_counter()
    client.post("/v1/chat/completions", json=chat(content, max_tokens), headers=headers).raise_for_status()
    return time.perf_counter() - started
