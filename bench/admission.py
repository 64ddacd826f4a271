"""`python -m bench admission`: a burst of long requests against a simulator with a small KV cache, through
token-guard with admission off and then on; prints p50/p99 latency, errors, and what the simulator saw (peak
running tokens, preemptions). The simulator emulates preemption: over its capacity every sequence slows down."""

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

from proxy.assets import write_demo_tokenizer_dir
from proxy.counting.registry import ModelRegistry
from proxy.server.app import create_app
from proxy.server.running import ServerThread
from proxy.settings import load_settings
from simulator import SimulatorSettings
from simulator import create_app as create_simulator

MODEL = "tiny"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=32, help="requests in the burst")
    parser.add_argument("--prompt-words", type=int, default=300, help="words of prompt per request")
    parser.add_argument("--max-tokens", type=int, default=100)
    parser.add_argument("--itl", type=float, default=0.01, help="simulator inter-token delay, seconds")
    parser.add_argument("--capacity-requests", type=int, default=8, help="KV capacity, in requests' worth")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    parser.add_argument("--instances", type=int, default=1,
                        help="guards in front of the simulator: above 1, per-process budgets against one shared "
                             "through Redis (bench/admission_fleet.py)")  # fmt: skip
    parser.add_argument("--redis-url", help="with --instances: this Redis (default: a redis-server started here)")
    parser.add_argument("--round-trips", type=int, default=300, help="with --instances: requests timed per side")


def main(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = write_demo_tokenizer_dir(Path(tmp) / "tok")
        if args.instances > 1:
            from bench import admission_fleet

            results = admission_fleet.run_instances(args, tokenizer, Path(tmp))
            print(admission_fleet.table(results))
        else:
            results = [run(args, tokenizer, admission) for admission in (False, True)]
            print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


def run(args: argparse.Namespace, tokenizer: Path, admission: bool) -> dict[str, Any]:
    prompt = " ".join(f"word{i % 50}" for i in range(args.prompt_words))
    probe = create_simulator(SimulatorSettings(tokenizer=tokenizer, model=MODEL, max_model_len=8192))
    with ServerThread(probe) as server:
        messages = [{"role": "user", "content": prompt}]
        count = httpx.post(f"{server.url}/tokenize", json={"model": MODEL, "messages": messages}).json()["count"]
    cost = count + args.max_tokens
    capacity = cost * args.capacity_requests
    sim = create_simulator(SimulatorSettings(tokenizer=tokenizer, model=MODEL, max_model_len=8192, itl_s=args.itl,
                                             kv_capacity_tokens=capacity))  # fmt: skip
    with ServerThread(sim) as upstream:
        flags: dict[str, Any] = {"upstream.url": upstream.url, "model.name": MODEL, "model.tokenizer": str(tokenizer),
                                 "model.max_model_len": 8192, "admission.queue_timeout_s": 600}  # fmt: skip
        if admission:
            flags["admission.max_inflight_tokens"] = capacity
        settings = load_settings(flags, environ={})
        with ServerThread(create_app(settings, ModelRegistry.from_settings(settings.models))) as proxy:
            latencies, statuses = asyncio.run(burst(proxy.url, prompt, args.requests, args.max_tokens))
    stats = sim.state.stats
    ok = sorted(lat for lat, status in zip(latencies, statuses, strict=True) if status == 200)
    return {
        "admission": admission,
        "requests": args.requests,
        "kv_capacity_tokens": capacity,
        "cost_per_request": cost,
        "p50_s": statistics.median(ok) if ok else None,
        "p99_s": ok[min(len(ok) - 1, int(0.99 * len(ok)))] if ok else None,
        "max_s": ok[-1] if ok else None,
        "errors": sum(status != 200 for status in statuses),
        "peak_running_tokens": stats.kv.peak,
        "preemptions": stats.kv.preemptions,
    }


async def burst(url: str, prompt: str, requests: int, max_tokens: int) -> tuple[list[float], list[int]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as client:

        async def one() -> tuple[float, int]:
            started = time.perf_counter()
            response = await client.post(f"{url}/v1/chat/completions", json=body)
            return time.perf_counter() - started, response.status_code

        results = await asyncio.gather(*(one() for _ in range(requests)))
    return [r[0] for r in results], [r[1] for r in results]


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| admission | p50 s | p99 s | errors | simulator peak running tokens | KV capacity | preemptions |",
            "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in results:
        rows.append(
            f"| {'on' if r['admission'] else 'off'} | {r['p50_s']:.2f} | {r['p99_s']:.2f} | {r['errors']} | "
            f"{r['peak_running_tokens']:,} | {r['kv_capacity_tokens']:,} | {r['preemptions']} |"
        )
    return "\n".join(rows)
