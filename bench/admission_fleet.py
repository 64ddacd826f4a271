"""`python -m bench admission --instances N`: N guards (`token-guard serve`, each a process of its own) in front of
one simulator with a small KV cache, first each with its own budget (the whole KV cache each: N times too much
together), then sharing one budget through Redis (redis.url). A burst spread over the guards: p50/p99,
errors, and the simulator's peak running tokens against its capacity. Then what the fleet's budget adds to a
request: p50 and p99 of sequential one-token requests through a guard with a budget in Redis against one without,
in front of a simulator that answers at once."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench.admission import MODEL, burst

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(condition: Any, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (httpx.HTTPError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout_s:g} s")


@contextmanager
def process(command: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(
        command, stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    try:
        yield child
    finally:
        child.terminate()
        child.wait(timeout=30)


@contextmanager
def redis_server(logs: Path) -> Iterator[str]:
    port = free_port()
    command = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    with process(command, logs / "redis.log"):
        url = f"redis://127.0.0.1:{port}/0"

        def answers() -> bool:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")

        wait_for(answers, "redis-server")
        yield url


@contextmanager
def guards(sim_url: str, tokenizer: Path, logs: Path, budgets: list[tuple[int, str | None]]) -> Iterator[list[str]]:
    """One `token-guard serve` per (budget, redis URL or None), started at once; their URLs once all are healthy."""
    with ExitStack() as stack:
        urls = []
        for budget, redis_url in budgets:
            port = free_port()
            command = [sys.executable, "-m", "proxy", "serve", "--upstream", sim_url, "--model", MODEL,
                       "--tokenizer", str(tokenizer), "--max-model-len", "8192", "--port", str(port),
                       "--log-level", "warning"]  # fmt: skip
            env = {"TOKEN_GUARD_ADMISSION_MAX_INFLIGHT_TOKENS": str(budget),
                   "TOKEN_GUARD_ADMISSION_QUEUE_TIMEOUT_S": "600",
                   "TOKEN_GUARD_ADMISSION_MAX_QUEUE": "10000"}  # fmt: skip
            if redis_url:
                env["TOKEN_GUARD_REDIS_URL"] = redis_url
            stack.enter_context(process(command, logs / f"guard-{port}.log", env))
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_for(lambda url=url: httpx.get(f"{url}/health").status_code == 200, f"the guard at {url}")
        yield urls


def run_instances(args: argparse.Namespace, tokenizer: Path, logs: Path) -> list[dict[str, Any]]:
    prompt = " ".join(f"word{i % 50}" for i in range(args.prompt_words))
    sim_port = free_port()
    sim_url = f"http://127.0.0.1:{sim_port}"
    with ExitStack() as stack:
        redis_url = args.redis_url or stack.enter_context(redis_server(logs))
        cost = _count(tokenizer, prompt) + args.max_tokens
        capacity = cost * args.capacity_requests
        sim = ["simulate", "--tokenizer", str(tokenizer), "--model", MODEL, "--max-model-len", "8192", "--port",
               str(sim_port), "--itl", str(args.itl), "--kv-capacity", str(capacity)]  # fmt: skip
        stack.enter_context(process([sys.executable, "-m", "proxy", *sim], logs / "simulator.log"))
        wait_for(lambda: httpx.get(f"{sim_url}/health").status_code == 200, "the simulator")
        results = [
            _burst(args, tokenizer, logs, sim_url, prompt, [(capacity, None)] * args.instances, "per-process"),
            _burst(args, tokenizer, logs, sim_url, prompt, [(capacity, redis_url)] * args.instances, "shared"),
        ]
        for r in results:
            r.update(kv_capacity_tokens=capacity, cost_per_request=cost)
        results.append(_round_trip(args, tokenizer, logs, redis_url))
    return results


def _count(tokenizer: Path, prompt: str) -> int:
    from proxy.server.running import ServerThread
    from simulator import SimulatorSettings
    from simulator import create_app as create_simulator

    with ServerThread(create_simulator(SimulatorSettings(tokenizer=tokenizer, model=MODEL, max_model_len=8192))) as s:
        messages = [{"role": "user", "content": prompt}]
        return int(httpx.post(f"{s.url}/tokenize", json={"model": MODEL, "messages": messages}).json()["count"])


def _burst(args: argparse.Namespace, tokenizer: Path, logs: Path, sim_url: str, prompt: str,
           budgets: list[tuple[int, str | None]], mode: str) -> dict[str, Any]:  # fmt: skip
    with guards(sim_url, tokenizer, logs, budgets) as urls:
        httpx.post(f"{sim_url}/sim/reset")
        latencies, statuses = asyncio.run(_spread(urls, prompt, args.requests, args.max_tokens))
        stats = httpx.get(f"{sim_url}/sim/stats").json()
        scraped = "".join(httpx.get(f"{url}/metrics").text for url in urls)
    ok = sorted(lat for lat, status in zip(latencies, statuses, strict=True) if status == 200)
    return {
        "budget": mode,
        "instances": len(urls),
        "requests": args.requests,
        "p50_s": statistics.median(ok) if ok else None,
        "p99_s": ok[min(len(ok) - 1, int(0.99 * len(ok)))] if ok else None,
        "errors": sum(status != 200 for status in statuses),
        "peak_running_tokens": stats["peak_running_tokens"],
        "preemptions": stats.get("preemptions"),
        "redis_errors": _metric(scraped, "token_guard_redis_errors_total"),
        "local_fallbacks": _metric(scraped, "token_guard_admission_local_fallbacks_total"),
    }


def _metric(text: str, name: str) -> int:
    """A counter summed over the guards (0 where none has it: no Redis)."""
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + " ")))


async def _spread(urls: list[str], prompt: str, requests: int, max_tokens: int) -> tuple[list[float], list[int]]:
    """The burst, its requests dealt round-robin over the guards, all at once."""
    shares = [requests // len(urls) + (i < requests % len(urls)) for i in range(len(urls))]
    parts = await asyncio.gather(*(burst(url, prompt, n, max_tokens) for url, n in zip(urls, shares, strict=True)))
    return [lat for p in parts for lat in p[0]], [status for p in parts for status in p[1]]


def _round_trip(args: argparse.Namespace, tokenizer: Path, logs: Path, redis_url: str) -> dict[str, Any]:
    """What the fleet's budget adds to a request: sequential one-token requests through a guard whose budget lives in
    Redis and one whose budget is its own (both far larger than anything asked), in front of a simulator of their
    own that answers at once (no time to first token, none between tokens), so that the guards' own cost is what
    shows. The two sides alternate in pairs whose order flips every pair, so that drift on a shared machine falls on
    both alike."""
    huge, port = 10**9, free_port()
    sim_url = f"http://127.0.0.1:{port}"
    sim = ["simulate", "--tokenizer", str(tokenizer), "--model", MODEL, "--max-model-len", "8192", "--port", str(port),
           "--itl", "0", "--ttft", "0"]  # fmt: skip
    with process([sys.executable, "-m", "proxy", *sim], logs / "simulator-instant.log"):
        wait_for(lambda: httpx.get(f"{sim_url}/health").status_code == 200, "the instant simulator")
        with guards(sim_url, tokenizer, logs, [(huge, None), (huge, redis_url)]) as (local, shared):
            timings = _alternate({"local": local, "shared": shared}, args.round_trips, warm_up=40)
    figures: dict[str, Any] = {"budget": "round trip", "requests": args.round_trips}
    for name, values in timings.items():
        values.sort()
        figures[f"p50_{name}_ms"] = statistics.median(values) * 1000
        figures[f"p99_{name}_ms"] = values[min(len(values) - 1, int(0.99 * len(values)))] * 1000
    figures["added_p50_ms"] = figures["p50_shared_ms"] - figures["p50_local_ms"]
    figures["added_p99_ms"] = figures["p99_shared_ms"] - figures["p99_local_ms"]
    return figures


def _alternate(urls: dict[str, str], pairs: int, warm_up: int) -> dict[str, list[float]]:
    """`pairs` timed requests per URL (after `warm_up` untimed pairs), one URL then the other, the order flipped
    every pair (A B B A A B ...)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    names = list(urls)
    timings: dict[str, list[float]] = {name: [] for name in names}
    with httpx.Client(timeout=60) as client:
        for i in range(pairs + warm_up):
            for name in names if i % 2 else names[::-1]:
                started = time.perf_counter()
                assert client.post(f"{urls[name]}/v1/chat/completions", json=body).status_code == 200
                if i >= warm_up:
                    timings[name].append(time.perf_counter() - started)
    return timings


def table(results: list[dict[str, Any]]) -> str:
    bursts = [r for r in results if r["budget"] != "round trip"]
    rows = ["| budget | guards | p50 s | p99 s | errors | simulator peak running tokens | KV capacity | preemptions "
            "| Redis errors | admitted on a local share |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in bursts:
        rows.append(
            f"| {r['budget']} | {r['instances']} | {r['p50_s']:.2f} | {r['p99_s']:.2f} | {r['errors']} | "
            f"{r['peak_running_tokens']:,} | {r['kv_capacity_tokens']:,} | {r['preemptions']} | "
            f"{r['redis_errors']} | {r['local_fallbacks']} |"
        )
    for r in results:
        if r["budget"] == "round trip":
            rows += ["", f"The fleet budget's cost per request, {r['requests']} sequential 1-token requests each "
                         "through a simulator that answers at once:", "",
                         "| budget | p50 ms | p99 ms |", "|---|---:|---:|",
                         f"| local | {r['p50_local_ms']:.2f} | {r['p99_local_ms']:.2f} |",
                         f"| in Redis | {r['p50_shared_ms']:.2f} | {r['p99_shared_ms']:.2f} |",
                         f"| added | {r['added_p50_ms']:+.2f} | {r['added_p99_ms']:+.2f} |"]  # fmt: skip
    return "\n".join(rows)
