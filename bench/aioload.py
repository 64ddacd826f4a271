"""The ceiling comparison's load generator: one aiohttp client under uvloop, in a process of its own so that its CPU is
not charged to the systems measured, driven over stdin/stdout one JSON line at a time.

For each job: warm up (every connection opened, code paths hot), say `ready` and wait for `go`, run closed-loop for the
duration, let requests in flight finish (at most `drain_s`, then cut them), say `done`, then send the figures. The
driver (`Generator`) reads the systems' CPU between `ready`/`go` and at `done`, so the window holds exactly the
measured requests. Every request carries a prompt of its own: a new random chat turn each time.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from yarl import URL

from bench.stats import distribution_ms

PATH = "/v1/chat/completions"
WORDS = (
    "the a of to and in is it that for on with as was at by an be this from or have are not but what all were when we "
    "there can your which their said if do will each about how up out them then she many some so these would other "
    "into has more her two like him see time could no make than first been its who now people my made over did down "
    "only way find use may water long little very after words called just where most know get through back much go "
    "good new write our me man too any day same right look think also around another came come work three word must "
    "because does part even place well such here take why help put different away again off went old number great "
    "tell men say small every found still between name should home big give air line set own under read last never "
    "us left end along while might next sound below saw something thought both few those always show large often "
    "together asked house world going want school important until form food keep children feet land side without boy "
    "once animal life enough took four head above kind began almost live page got earth need far hand high year mother"
).split()


@dataclass(frozen=True)
class Job:
    url: str  # the system's root, e.g. http://127.0.0.1:8080
    concurrency: int
    duration_s: float
    stream: bool
    chunks: int  # max_tokens: the events the instant upstream sends per stream
    warmup_s: float = 1.0
    drain_s: float = 5.0  # after the duration: how long requests in flight may take before they are cut
    api_key: str = "bench"
    seed: int = 0


class Prompts:
    """A fresh chat turn for every request: a numbered question of 20 to 60 random common words (about 30 to 90
    tokens) after a short system prompt, so no cache of whole requests can answer from memory."""

    def __init__(self, job: Job) -> None:
        self._rng = random.Random(job.seed)
        self._count = 0
        head = '{"model":"tiny","messages":[{"role":"system","content":"You are a helpful assistant."},'
        self._head = (head + '{"role":"user","content":"').encode()
        tail = f'"}}],"max_tokens":{job.chunks}' + (',"stream":true}' if job.stream else "}")
        self._tail = tail.encode()

    def next(self) -> bytes:
        self._count += 1
        words = self._rng.choices(WORDS, k=self._rng.randint(20, 60))
        return self._head + f"Question {self._count}: {' '.join(words)}?".encode() + self._tail


@dataclass
class Tally:
    """What the workers saw, filled as answers arrive."""

    t0: float
    deadline: float
    totals: list[float] = field(default_factory=list)  # seconds, completed requests only
    first_bytes: list[float] = field(default_factory=list)
    events: list[int] = field(default_factory=list)  # SSE data events per completed stream, [DONE] excluded
    shares: float = 0.0  # completed requests, those that end after the deadline by their share inside it
    chunks: int = 0  # SSE data events received in the whole CPU window
    window_chunks: int = 0  # ... received before the deadline
    cut: int = 0
    cut_chunks: int = 0
    errors: Counter[str] = field(default_factory=Counter)

    def completed(self, start: float, first: float, end: float, events: int) -> None:
        self.totals.append(end - start)
        self.first_bytes.append(first - start)
        self.events.append(events)
        inside = 1.0 if end <= self.deadline else max(0.0, self.deadline - start) / (end - start)
        self.shares += inside


async def _one(session: aiohttp.ClientSession, job: Job, url: URL, body: bytes, headers: dict[str, str],
               tally: Tally) -> None:  # fmt: skip
    start = time.perf_counter()
    events = 0
    try:
        async with session.post(url, data=body, headers=headers) as response:
            if response.status != 200 or not job.stream:
                data = await response.read()
                end = time.perf_counter()
                if response.status != 200:
                    tally.errors[f"HTTP {response.status}"] += 1
                elif b'"choices"' not in data:
                    tally.errors["no choices in the answer"] += 1
                else:
                    tally.completed(start, end, end, 0)
                return
            first, tail = 0.0, b""
            async for data in response.content.iter_any():
                now = time.perf_counter()
                first = first or now
                # "data:" is 5 bytes: one split across two reads lies whole in the last 4 bytes + the first 4
                seen = data.count(b"data:") + (tail[-4:] + data[:4]).count(b"data:")
                events += seen
                tally.chunks += seen
                if now <= tally.deadline:
                    tally.window_chunks += seen
                tail = data[-16:] if len(data) >= 16 else (tail + data)[-16:]
        end = time.perf_counter()
        if not tail.rstrip().endswith(b"data: [DONE]"):
            tally.errors["stream ended without [DONE]"] += 1
            return
        tally.chunks -= 1
        tally.window_chunks -= end <= tally.deadline
        tally.completed(start, first, end, events - 1)
    except asyncio.CancelledError:
        tally.cut += 1
        tally.cut_chunks += events
        raise
    except (aiohttp.ClientError, TimeoutError) as exc:
        tally.errors[type(exc).__name__] += 1


async def _closed_loop(session: aiohttp.ClientSession, job: Job, prompts: Prompts, tally: Tally, until: float) -> None:
    url = URL(job.url + PATH)
    headers = {"authorization": f"Bearer {job.api_key}", "content-type": "application/json"}

    async def worker() -> None:
        while True:  # at least one request each, so that every connection is opened
            await _one(session, job, url, prompts.next(), headers, tally)
            if time.perf_counter() >= until:
                return

    try:
        async with asyncio.timeout(until - time.perf_counter() + job.drain_s), asyncio.TaskGroup() as group:
            for _ in range(job.concurrency):
                group.create_task(worker())
    except TimeoutError:
        pass  # requests still in flight were cut and counted as such


async def run(job: Job, say: Callable[[dict[str, Any]], None], hear: Callable[[], str]) -> dict[str, Any]:
    warm_job = replace(job, chunks=min(job.chunks, 16))  # short streams: connections open and code hot, no backlog
    connector = aiohttp.TCPConnector(limit=job.concurrency, ttl_dns_cache=None)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False
    ) as session:
        warm = Tally(time.perf_counter(), time.perf_counter() + job.warmup_s)
        await _closed_loop(session, warm_job, Prompts(warm_job), warm, warm.deadline)
        say({"event": "ready", "warmup_requests": len(warm.totals), "warmup_errors": dict(warm.errors)})
        await loop.run_in_executor(None, hear)
        cpu0, t0 = time.process_time(), time.perf_counter()
        tally = Tally(t0, t0 + job.duration_s)
        await _closed_loop(session, job, Prompts(replace(job, seed=job.seed + 1)), tally, tally.deadline)
        cpu_window_s, generator_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
        say({"event": "done"})
    return _figures(job, tally, cpu_window_s, generator_cpu_s)


def _figures(job: Job, tally: Tally, cpu_window_s: float, generator_cpu_s: float) -> dict[str, Any]:
    partial = tally.cut_chunks / job.chunks if job.stream else 0.0
    return {
        "requests": len(tally.totals),
        "requests_in_cpu_window": len(tally.totals) + partial,  # cut streams count by the share of them received
        "per_s": tally.shares / job.duration_s,
        "chunks": tally.chunks,
        "chunks_per_s": tally.window_chunks / job.duration_s if job.stream else None,
        "events_per_stream": statistics.median(tally.events) if job.stream and tally.events else None,
        "total_ms": distribution_ms(tally.totals),
        "first_byte_ms": distribution_ms(tally.first_bytes) if job.stream else None,
        "cut": tally.cut,
        "errors": dict(tally.errors),
        "cpu_window_s": cpu_window_s,
        "generator_cpu_s": generator_cpu_s,
    }


def serve() -> None:
    """The generator's side: one job per line on stdin, `go` lines in between, JSON lines out."""

    def say(message: dict[str, Any]) -> None:
        print(json.dumps(message), flush=True)

    async def jobs() -> None:
        loop = asyncio.get_running_loop()
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            result = await run(Job(**json.loads(line)), say, sys.stdin.readline)
            say({"event": "result", **result})

    uvloop.run(jobs())


class Generator:
    """The driver's side: the generator process, and one job at a time through it."""

    def __init__(self, log: Path) -> None:
        with log.open("ab") as err:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "bench.aioload"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self.log = log

    @property
    def pid(self) -> int:
        return self._process.pid

    def run(self, job: Job, before: Callable[[], None], after: Callable[[], None]) -> dict[str, Any]:
        """`before` runs once the generator is warm and idle, `after` as soon as its measured requests are over."""
        self._send(json.dumps(asdict(job)))
        ready = self._expect("ready")
        before()
        self._send("go")
        self._expect("done")
        after()
        return {**self._expect("result"), "warmup": ready}

    def _send(self, line: str) -> None:
        assert self._process.stdin is not None
        self._process.stdin.write(line + "\n")
        self._process.stdin.flush()

    def _expect(self, event: str) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the load generator exited; see {self.log}")
        message: dict[str, Any] = json.loads(line)
        if message.get("event") != event:
            raise RuntimeError(f"the load generator said {message!r}, not {event!r}")
        return message

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


if __name__ == "__main__":
    serve()
