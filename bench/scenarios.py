"""The comparison's scenarios, and one interleaved measurement of them: each round runs every system once per
scenario (A B C D, the order rotated each round) so drift on a shared machine hits every system alike."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.load import Conversations, LoadSpec, run_load
from bench.procstats import reset_peak, usage
from bench.systems import LITELLM_KEY, MODEL, Running
from bench.wire import Record

# Upstream timing variants: zero delay exposes the pure proxy cost, "paced" is a small model on a fast GPU.
TIMINGS = {"zero": (0.0, 0.0), "paced": (0.020, 0.005)}
IDS_PER_RUN = 100_000  # every run sends prompts no other run sent, so no cache anywhere answers from memory


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    timing: str
    concurrency: int
    prompt_tokens: int = 100
    max_tokens: int = 16
    stream: bool = False
    turns: int = 1

    def spec(self, url: str, duration_s: float) -> LoadSpec:
        duration = 0.0 if self.turns > 1 else duration_s  # conversations: one per worker
        return LoadSpec(
            url,
            MODEL,
            duration,
            self.prompt_tokens,
            self.max_tokens,
            concurrency=self.concurrency,
            stream=self.stream,
            turns=self.turns,
            api_key=LITELLM_KEY,
        )


SCENARIOS = [
    Scenario("c1", "non-stream, max_tokens 16, concurrency 1", "zero", 1),
    Scenario("c8", "non-stream, max_tokens 16, concurrency 8 (prompt 100 tokens)", "zero", 8),
    Scenario("c32", "non-stream, max_tokens 16, concurrency 32", "zero", 32),
    Scenario("p2000", "prompt 2,000 tokens, concurrency 8", "zero", 8, prompt_tokens=2000),
    Scenario("p8000", "prompt 8,000 tokens, concurrency 8", "zero", 8, prompt_tokens=8000),
    Scenario("p32000", "prompt 32,000 tokens, concurrency 8", "zero", 8, prompt_tokens=32000),
    Scenario(
        "turns",
        "multi-turn: 4 conversations of 20 turns growing to 30,000 tokens",
        "zero",
        4,
        prompt_tokens=30000,
        turns=20,
    ),
    Scenario(
        "stream-c64",
        "streaming 256 tokens, concurrency 64, TTFT 20 ms, ITL 5 ms",
        "paced",
        64,
        max_tokens=256,
        stream=True,
    ),
    Scenario(
        "stream-c64-zero", "streaming 256 tokens, concurrency 64, no delay", "zero", 64, max_tokens=256, stream=True
    ),
]


@dataclass
class Run:
    scenario: str
    system: str
    round: int
    summary: dict[str, Any]
    cpu_s: float | None  # the proxy's CPU seconds during the measured run (None for direct)
    peak_mb: float | None  # the proxy's peak RSS during the measured run
    records: list[Record] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "records"}


@dataclass
class Measurement:
    duration_s: float
    warmup: bool
    raw: Path
    conversations: Callable[[int, int], Conversations]  # (prompt tokens, turns) -> prompts
    runs: list[Run] = field(default_factory=list)
    _next_id: int = 0

    def interleaved(self, scenario: Scenario, systems: list[Running], rounds: int) -> None:
        for r in range(rounds):
            shift = r % len(systems)
            for system in systems[shift:] + systems[:shift]:
                self.runs.append(self.once(scenario, system, r + 1))

    def once(self, scenario: Scenario, system: Running, round_: int) -> Run:
        if self.warmup:  # one short request per connection: connections open and code paths warm, nothing more
            warm = replace(scenario, turns=1, prompt_tokens=min(scenario.prompt_tokens, 2000), max_tokens=16)
            source = self.conversations(warm.prompt_tokens, 1)
            asyncio.run(run_load(warm.spec(system.url, 0.0), source, first=self._ids()))
        source = self.conversations(scenario.prompt_tokens, scenario.turns)
        pid = system.pid
        if pid is not None:
            reset_peak(pid)
            before = usage(pid)
        result = asyncio.run(run_load(scenario.spec(system.url, self.duration_s), source, first=self._ids()))
        after = usage(pid) if pid is not None else None
        run = Run(
            scenario.key,
            system.name,
            round_,
            result.summary,
            cpu_s=after.cpu_s - before.cpu_s if after else None,
            peak_mb=after.peak_mb if after else None,
            records=result.records,
        )
        path = self.raw / f"{scenario.key}-{system.name}-r{round_}.json"
        path.write_text(json.dumps({**run.to_json(), **result.to_json()}) + "\n")
        s = run.summary
        cpu = f", proxy CPU {1000 * run.cpu_s / max(1, s['requests']):.2f} ms/req" if run.cpu_s is not None else ""
        print(
            f"  {scenario.key:<16} {system.name:<12} r{round_}: {s['ok']}/{s['requests']} ok, "
            f"{s['throughput_rps']:.1f} req/s, p50 total {_p50(s)}{cpu}",
            file=sys.stderr,
        )
        return run

    def _ids(self) -> int:
        self._next_id += IDS_PER_RUN
        return self._next_id


def _p50(summary: dict[str, Any]) -> str:
    total = summary.get("total_ms")
    return f"{total['p50']:.1f} ms" if total else "-"
