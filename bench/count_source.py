"""`python -m bench count-source`: what counting through the upstream (counting.source "upstream", and the fallback
of "auto") adds to a request, against counting locally: two guards in front of the same upstream, one per source, and
the same chat requests sent direct, through each guard, interleaved.

By default the upstream is the built-in simulator answering at once (max_tokens 1), so the figures are the guard's
own cost plus one more HTTP round trip and the upstream's (cached) counting; `--upstream URL --tokenizer DIR` measures
against a running vLLM instead (start it with --enable-scale-out to count through its render endpoint).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.systems import MODEL, Running, free_port, spawn, start_simulator, wait_ready
from proxy.assets import write_demo_tokenizer_dir

WINDOW = 32_768
SIZES = {"small chat": 1, "medium prompt": 180, "long prompt": 540}  # words of text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=100, help="requests per size and system (medians reported)")
    parser.add_argument("--upstream", help="a running vLLM to measure against (default: the built-in simulator)")
    parser.add_argument("--tokenizer", type=Path, help="the upstream model's tokenizer directory (with --upstream)")
    parser.add_argument("--model", default=MODEL, help="the served model name (with --upstream)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        started: list[Running] = []
        try:
            if args.upstream:
                url, tokenizer = args.upstream, args.tokenizer
            else:
                tokenizer = write_demo_tokenizer_dir(work / "tok")
                started.append(start_simulator(tokenizer, WINDOW, 0.0, 0.0, work))
                url = started[-1].url
            guards = {source: _guard(source, url, tokenizer, args.model, work) for source in ("local", "upstream")}
            started += guards.values()
            result = measure(args, url, {s: g.url for s, g in guards.items()})
        finally:
            for running in reversed(started):
                running.stop()
    print(markdown(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    return 0


def _guard(source: str, upstream: str, tokenizer: Path, model: str, work: Path) -> Running:
    port = free_port()
    argv = [sys.executable, "-m", "proxy", "serve", "--upstream", upstream, "--model", model, "--tokenizer",
            str(tokenizer), "--port", str(port), "--log-level", "warning", "--count-source", source]  # fmt: skip
    process, log = spawn(f"token-guard-{source}", argv, work)
    running = Running(f"token-guard ({source})", f"http://127.0.0.1:{port}", process, log)
    wait_ready(running, "/health")
    return running


def measure(args: argparse.Namespace, direct: str, guards: dict[str, str]) -> dict[str, Any]:
    systems = {"direct": direct, **guards}
    sizes: dict[str, Any] = {}
    with httpx.Client(timeout=120) as client:
        for label, words in SIZES.items():
            times: dict[str, list[float]] = {name: [] for name in systems}
            tokens = 0
            for i in range(args.requests + 3):  # three warm-up rounds, not kept
                text = " ".join(f"word{(i * 7 + j) % 997}" for j in range(words)) + f" (request {i})"
                body = {"model": args.model, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
                client.post(direct + "/v1/chat/completions", json=body)  # the upstream has seen it: its caches cancel
                counted: dict[str, int] = {}
                for name, url in _rotated(systems, i):
                    started = time.perf_counter()
                    answer = client.post(url + "/v1/chat/completions", json=body)
                    elapsed = time.perf_counter() - started
                    answer.raise_for_status()
                    if name != "direct" and answer.headers.get("x-token-guard-count-source") != name:
                        raise RuntimeError(f"{name}: counted by {answer.headers.get('x-token-guard-count-source')}")
                    if i >= 3:
                        times[name].append(elapsed)
                    counted[name] = answer.json().get("usage", {}).get("prompt_tokens", 0) if name == "direct" else int(
                        answer.headers["x-token-guard-prompt-tokens"])  # fmt: skip
                if len(set(counted.values())) != 1:  # both sources must count what the upstream charges
                    raise RuntimeError(f"counts differ: {counted}")
                tokens = counted["direct"]
            median = {name: statistics.median(t) * 1000 for name, t in times.items()}
            sizes[label] = {
                "prompt_tokens": tokens,
                "direct_ms": median["direct"],
                "added_local_ms": median["local"] - median["direct"],
                "added_upstream_ms": median["upstream"] - median["direct"],
            }
    return {"upstream": direct, "requests": args.requests, "sizes": sizes}


def _rotated(systems: dict[str, str], i: int) -> list[tuple[str, str]]:
    """Each round in another order, so that none is always first after the warm-up."""
    items = list(systems.items())
    return items[i % len(items) :] + items[: i % len(items)]


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"upstream {result['upstream']}, {result['requests']} requests per size (medians)",
        "",
        "| prompt | direct | added, counted locally | added, counted by the upstream | upstream counting costs |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, row in result["sizes"].items():
        extra = row["added_upstream_ms"] - row["added_local_ms"]
        added = (row["added_local_ms"], row["added_upstream_ms"], extra)
        cells = [
            f"{label} ({row['prompt_tokens']} tokens)",
            f"{row['direct_ms']:.2f} ms",
            *(f"+{a:.2f} ms" for a in added),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
