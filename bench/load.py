"""An async OpenAI-compatible load generator: closed loop at a concurrency or open loop with Poisson arrivals,
per-request time to first token, total time, tokens, status and errors, and a summary of them.

`python -m bench load --base-url http://127.0.0.1:8080 --model my-model --concurrency 8 --duration 30 \\
--prompt-tokens 2000 --max-tokens 128 --stream --out run.json`

The base URL may end in /v1 (the OpenAI SDK's habit) or not. A run whose first requests all fail stops at once and
says why, instead of sending thousands of requests that cannot succeed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.prompts import Conversation, Message, OneShotPrompts, PromptCounter
from bench.stats import summarize
from bench.wire import PATH, Record, send

# A conversation: the prompt of each turn, sent one after another on one connection slot.
Conversations = Callable[[int], list[list[Message]]]
# When this many requests have come back and not one succeeded, the run stops: the URL, model or key is wrong.
GIVE_UP_AFTER = 10


def server_root(base_url: str) -> str:
    """The server's root from either spelling: `http://host:port` or the OpenAI SDK's `http://host:port/v1`."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


class AllFailed(Exception):
    """Raised inside the run to stop every worker at once when the first requests all failed."""


@dataclass(frozen=True)
class LoadSpec:
    base_url: str
    model: str
    duration_s: float
    prompt_tokens: int
    max_tokens: int
    concurrency: int | None = None
    rate: float | None = None
    stream: bool = False
    turns: int = 1  # above 1: conversations that grow to prompt_tokens over this many turns
    api_key: str = "bench"
    timeout_s: float = 600.0
    extra: dict[str, Any] = field(default_factory=dict)  # more body fields, e.g. {"ignore_eos": true}

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("give exactly one of concurrency (closed loop) and rate (open loop)")

    def body(self, messages: list[Message]) -> bytes:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens, **self.extra}
        if self.stream:
            body |= {"stream": True, "stream_options": {"include_usage": True}}
        return json.dumps(body, ensure_ascii=False).encode()


@dataclass
class LoadResult:
    spec: LoadSpec
    records: list[Record]
    started: float  # wall clock (time.time()) at the start
    window_s: float  # the time new requests were being started (the whole run for fixed conversations)
    gave_up: str | None = None  # why the run stopped early: every request failed

    @property
    def summary(self) -> dict[str, Any]:
        return summarize(self.records, self.window_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "spec": asdict(self.spec),
            "started": self.started,
            "window_s": self.window_s,
            "gave_up": self.gave_up,
            "summary": self.summary,
            "records": [r.to_json() for r in self.records],
        }


def prompt_source(counter: PromptCounter, prompt_tokens: int, turns: int = 1) -> Conversations:
    if turns > 1:
        conversation = Conversation(counter, turns, prompt_tokens)
        return lambda i: [conversation.turn(i, k) for k in range(1, turns + 1)]
    prompts = OneShotPrompts(counter, prompt_tokens)
    return lambda i: [prompts.messages(i)]


async def run_load(spec: LoadSpec, conversations: Conversations, progress: bool = False, first: int = 0) -> LoadResult:
    """Run the load for spec.duration_s; requests in flight at the end are awaited and kept. If the first
    GIVE_UP_AFTER requests all fail, the run stops there (requests in flight are dropped) and says why in gave_up."""
    slots = spec.concurrency or 1000
    limits = httpx.Limits(max_connections=slots, max_keepalive_connections=slots)
    timeout = httpx.Timeout(spec.timeout_s, connect=10.0)
    headers = {"authorization": f"Bearer {spec.api_key}", "content-type": "application/json"}
    records: list[Record] = []
    ids = itertools.count(first)
    root = server_root(spec.base_url)
    gave_up: str | None = None
    succeeded = False
    async with httpx.AsyncClient(base_url=root, limits=limits, timeout=timeout, headers=headers) as client:
        t0, started = time.perf_counter(), time.time()
        deadline = t0 + spec.duration_s

        async def converse(index: int) -> None:
            nonlocal gave_up, succeeded
            for turn, messages in enumerate(conversations(index), start=1):
                record = await send(client, spec.stream, spec.body(messages), t0)
                record.turn = turn if spec.turns > 1 else None
                records.append(record)
                succeeded = succeeded or record.error is None
                if not succeeded and len(records) >= GIVE_UP_AFTER:
                    gave_up = _all_failed(records, f"{root}{PATH}")
                    raise AllFailed(gave_up)
                if record.error is not None:
                    return

        async def closed_worker() -> None:
            while True:  # at least one conversation each, so a duration of 0 means exactly one
                await converse(next(ids))
                if time.perf_counter() >= deadline:
                    return

        try:
            async with asyncio.TaskGroup() as group:
                done = asyncio.Event()
                if progress:
                    group.create_task(_progress(records, t0, spec.duration_s, done))
                async with asyncio.TaskGroup() as load:
                    if spec.rate is not None:
                        for delay in _poisson(spec.rate, deadline):
                            await asyncio.sleep(delay)
                            load.create_task(converse(next(ids)))
                    else:
                        for _ in range(spec.concurrency or 0):
                            load.create_task(closed_worker())
                done.set()
        except* AllFailed:
            pass  # gave_up says why
        elapsed = time.perf_counter() - t0
    records.sort(key=lambda r: r.start)
    window = elapsed if gave_up else spec.duration_s or elapsed
    return LoadResult(spec, records, started, window, gave_up)


def _all_failed(records: list[Record], url: str) -> str:
    """Why the run stopped: every request so far failed; the last one's failure is the likely reason."""
    last = records[-1]
    status = f"HTTP {last.status}" if last.status else "no response"
    return (
        f"stopped: the first {len(records)} requests all failed ({status}: {(last.error or '').strip()[:200]}). "
        f"They went to POST {url}: check --base-url (the server, with or without /v1), --model and --api-key."
    )


def _poisson(rate: float, deadline: float) -> Iterator[float]:
    """Delays until each next arrival, on an absolute schedule so the loop's own lag does not lower the rate."""
    rng = random.Random(0)
    due = time.perf_counter()
    while True:
        due += rng.expovariate(rate)
        if due >= deadline:
            return
        yield max(0.0, due - time.perf_counter())


async def _progress(records: list[Record], t0: float, duration: float, done: asyncio.Event) -> None:
    tty = sys.stderr.isatty()
    last = 0.0
    while not done.is_set():
        with_timeout = asyncio.wait_for(done.wait(), 0.5 if tty else 5.0)
        try:
            await with_timeout
        except TimeoutError:
            pass
        elapsed = time.perf_counter() - t0
        errors = sum(1 for r in records if r.error is not None)
        rate = (len(records) - last) / (0.5 if tty else 5.0)
        last = len(records)
        line = (
            f"[{min(elapsed, duration):5.1f}/{duration:.0f} s] {len(records)} done, {errors} errors, {rate:.0f} req/s"
        )
        print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
    if tty:
        print(file=sys.stderr)


def print_summary(summary: dict[str, Any]) -> None:
    def ms(stat: dict[str, float] | None) -> str:
        if not stat:
            return "-"
        return " / ".join(f"{stat[k]:.2f}" for k in ("p50", "p90", "p99")) + " ms"

    print(f"requests   {summary['requests']} ({summary['ok']} ok), errors {summary['errors'] or 'none'}")
    print(f"throughput {summary['throughput_rps']:.1f} req/s, {summary['output_tokens_per_s']:.0f} output tokens/s")
    print(f"ttft       p50 / p90 / p99 {ms(summary['ttft_ms'])}")
    print(f"total      p50 / p90 / p99 {ms(summary['total_ms'])}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--base-url", required=True, help="the server, e.g. http://127.0.0.1:8080 or http://127.0.0.1:8080/v1"
    )
    parser.add_argument("--model", required=True)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--concurrency", type=int, help="closed loop: this many requests in flight")
    mode.add_argument("--rate", type=float, help="open loop: Poisson arrivals, requests per second")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds to start requests for")
    parser.add_argument("--prompt-tokens", type=int, default=100, help="exact prompt_tokens of every request")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--turns", type=int, default=1, help="conversations growing to --prompt-tokens in N turns")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer directory (default: the DeepSeek demo tokenizer)")
    parser.add_argument("--api-key", default="bench", help="sent as a bearer token")
    parser.add_argument(
        "--extra", type=json.loads, default={}, help="more body fields as JSON: '{\"ignore_eos\": true}'"
    )
    parser.add_argument("--out", type=Path, help="write the spec, summary and every request's record as JSON")


def main(args: argparse.Namespace) -> int:
    spec = LoadSpec(
        base_url=args.base_url.rstrip("/"),
        model=args.model,
        duration_s=args.duration,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        concurrency=args.concurrency,
        rate=args.rate,
        stream=args.stream,
        turns=args.turns,
        api_key=args.api_key,
        extra=args.extra,
    )
    counter = PromptCounter(args.tokenizer or demo_tokenizer())
    result = asyncio.run(run_load(spec, prompt_source(counter, spec.prompt_tokens, spec.turns), progress=True))
    if result.gave_up:
        print(result.gave_up, file=sys.stderr)
    summary = result.summary
    print_summary(summary)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result.to_json()) + "\n")
        print(f"records    {args.out}")
    return 0 if summary["ok"] else 1


def demo_tokenizer() -> Path:
    from proxy.assets import write_demo_tokenizer_dir

    return write_demo_tokenizer_dir(Path.home() / ".cache" / "token-guard" / "bench-tokenizer")
