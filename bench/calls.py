"""`python -m bench calls`: the Python function calls token-guard makes per request, for checkouts side by side, in
front of the instant upstream. A count, not a time: it does not move with the host's load, so it tells whether a change
added work to the request path when the ceiling's CPU figures are too noisy to say (a shared host), though not what
that work costs: a C call (a tokenizer encode, a socket write) counts one, whatever it takes.

Each system runs twice per scenario under cProfile: `--warm` requests, then `--warm` + `--requests`; the difference
over `--requests` is what a request costs once the guard is warm (start-up, warm-up and loading cancel out; background
jobs that tick while it runs add a little, the same for every checkout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pstats
import re
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.ceiling_systems import start_instant
from bench.instant import MAX_MODEL_LEN, MODEL
from bench.load import demo_tokenizer
from bench.systems import Running, SetupError, checkout, free_port, spawn, wait_ready

OTHER_TREE = "token-guard@"
PROMPT = [{"role": "user", "content": "Tell me a story about a river that runs to the sea."}]
SCENARIOS = {"c32": False, "stream-c32": True}  # name -> stream; 32 requests at once, 16 events per stream
CONCURRENCY = 32
ADDRESS = re.compile(r" at 0x[0-9a-f]+")  # a builtin's name carries its address, which differs between processes


@dataclass
class Profile:
    calls: int
    by_function: Counter[str]  # "module:function" -> calls


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--systems", default="token-guard", help="token-guard (this checkout), token-guard@<checkout>")
    parser.add_argument("--scenarios", default="c32,stream-c32", help=f"from {', '.join(SCENARIOS)}")
    parser.add_argument("--requests", type=int, default=2000, help="requests measured, after the warm-up")
    parser.add_argument("--warm", type=int, default=200, help="requests sent before the measured ones")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    parser.add_argument("--top", type=int, default=12, help="functions listed where two systems differ most")


def main(args: argparse.Namespace) -> int:
    systems, scenarios = args.systems.split(","), args.scenarios.split(",")
    if unknown := [s for s in scenarios if s not in SCENARIOS]:
        sys.stderr.write(f"unknown scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)}\n")
        return 2
    result: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-calls-") as folder:
        workdir = Path(folder)
        upstream = start_instant(workdir)
        try:
            profiles = {(system, scenario): _per_request(system, scenario, upstream, workdir, args)
                        for system in systems for scenario in scenarios}  # fmt: skip
        except SetupError as exc:
            sys.stderr.write(f"{exc}\n")
            return 2
        finally:
            upstream.stop()
    for scenario in scenarios:
        print(f"\n{scenario}: Python function calls per request (warm, {args.requests} requests)")
        for system in systems:
            print(f"  {profiles[system, scenario].calls / args.requests:9.1f}  {system}")
            result.setdefault(system, {})[scenario] = profiles[system, scenario].calls / args.requests
        if len(systems) > 1:
            _movers(profiles[systems[0], scenario], profiles[systems[-1], scenario], args.requests, args.top)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {"requests": args.requests, "warm": args.warm, "concurrency": CONCURRENCY}
        commits = {system: _commit(system) for system in systems}
        document = {"settings": settings, "commits": commits, "calls_per_request": result}
        args.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


def _per_request(system: str, scenario: str, upstream: Running, workdir: Path, args: argparse.Namespace) -> Profile:
    """The calls of `args.requests` warm requests: a run of warm + requests less a run of warm alone."""
    short = _profiled(system, scenario, upstream, workdir, args.warm)
    long = _profiled(system, scenario, upstream, workdir, args.warm + args.requests)
    return Profile(long.calls - short.calls, long.by_function - short.by_function)


def _profiled(system: str, scenario: str, upstream: Running, workdir: Path, requests: int) -> Profile:
    if system != "token-guard" and not system.startswith(OTHER_TREE):
        raise SetupError(f"unknown system {system!r}: token-guard or token-guard@<checkout>")
    tree, env = (None, None) if system == "token-guard" else checkout(system, system.removeprefix(OTHER_TREE))
    output, port = workdir / f"{len(list(workdir.glob('*.prof')))}.prof", free_port()
    argv = [sys.executable, "-m", "cProfile", "-o", str(output), "-m", "proxy", "serve", "--upstream", upstream.url,
            "--model", MODEL, "--tokenizer", str(demo_tokenizer()), "--max-model-len", str(MAX_MODEL_LEN),
            "--port", str(port)]  # fmt: skip
    process, log = spawn(f"calls-{port}", argv, workdir, env, tree)
    running = Running(system, f"http://127.0.0.1:{port}", process, log, signal.SIGINT)
    wait_ready(running, "/health")
    try:
        asyncio.run(_send(running.url, requests, SCENARIOS[scenario]))
    finally:
        running.stop()  # SIGINT: the guard stops, and cProfile writes what it saw
    return _read(output)


async def _send(url: str, requests: int, stream: bool) -> None:
    body = {"model": MODEL, "messages": PROMPT, "max_tokens": 16, "stream": stream}
    gate = asyncio.Semaphore(CONCURRENCY)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=CONCURRENCY)) as client:

        async def one() -> None:
            async with gate, client.stream("POST", f"{url}/v1/chat/completions", json=body) as answer:
                async for _ in answer.aiter_bytes():
                    pass
                if answer.status_code != 200:
                    raise SetupError(f"{url} answered {answer.status_code}")

        await asyncio.gather(*(one() for _ in range(requests)))


def _read(output: Path) -> Profile:
    if not output.exists():
        raise SetupError(f"no profile at {output}: the guard did not exit cleanly")
    stats = pstats.Stats(str(output))
    by_function: Counter[str] = Counter()
    for (file, _, function), row in stats.stats.items():  # type: ignore[attr-defined]
        name = f"{file.split('site-packages/')[-1].split('/proxy/')[-1]}:{function}"
        by_function[ADDRESS.sub("", name)] += row[1]
    return Profile(stats.total_calls, by_function)  # type: ignore[attr-defined]


def _commit(system: str) -> str:
    tree = "." if system == "token-guard" else system.removeprefix(OTHER_TREE)
    found = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return found.stdout.strip() or "unknown"


def _movers(first: Profile, last: Profile, requests: int, top: int) -> None:
    names = set(first.by_function) | set(last.by_function)
    moved = sorted(names, key=lambda n: -abs(last.by_function[n] - first.by_function[n]))[:top]
    print("  where the first and the last system differ most (calls per request):")
    for name in moved:
        a, b = first.by_function[name] / requests, last.by_function[name] / requests
        print(f"    {a:8.2f} {b:8.2f} {b - a:+8.2f}  {name[-90:]}")
