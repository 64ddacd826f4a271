"""The ceiling's targets, checked against a run's figures: each one measured, passed or missed, and by how much."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.aggregate import Figures

GUARD, DIRECT, LITELLM = "token-guard", "direct", "litellm"
Pooled = dict[str, dict[str, Figures]]


@dataclass(frozen=True)
class Target:
    goal: str
    measured: float  # nan: not measured in this run
    limit: float
    unit: str
    higher_is_better: bool = False
    shown: str = ""  # how the measurement reads, when more than the number

    @property
    def passed(self) -> bool | None:
        if math.isnan(self.measured) or math.isnan(self.limit):
            return None
        return self.measured >= self.limit if self.higher_is_better else self.measured <= self.limit

    @property
    def verdict(self) -> str:
        if self.passed is None:
            return "not measured"
        margin = abs(self.measured - self.limit)
        return f"{'pass' if self.passed else 'miss'} by {margin:.{self.digits}f}{self.unit}"

    @property
    def digits(self) -> int:
        return 0 if self.unit == " MB" else 2

    def to_json(self) -> dict[str, Any]:
        return {"goal": self.goal, "measured": self.measured, "limit": self.limit, "verdict": self.verdict}


def check(pooled: Pooled, idle_mb: dict[str, float], counting: dict[str, Any] | None) -> list[Target]:
    guard, litellm = added(pooled, "c1", GUARD), added(pooled, "c1", LITELLM)
    one_shot = (counting or {}).get("one_shot_ratios") or {}
    return [
        Target("added p50, non-stream, max_tokens 16, concurrency 1: at most 1 ms", guard, 1.0, " ms"),
        Target(
            "... and under half of LiteLLM's added p50",
            guard,
            litellm / 2,
            " ms",
            shown=f"{guard:+.2f} ms vs half of {litellm:+.2f} ms",
        ),
        Target(
            "streaming 256 tokens, concurrency 64: throughput at least 0.95 of direct",
            throughput_ratio(pooled, "stream-c64", GUARD),
            0.95,
            "",
            higher_is_better=True,
        ),
        Target(
            "counting, one-shot prompts: at most 1.2x the raw `tokenizers` floor (worst size)",
            max(one_shot.values(), default=math.nan),
            1.2,
            "x",
            shown=", ".join(f"{size}: {ratio:.2f}x" for size, ratio in one_shot.items()),
        ),
        Target(
            "counting, multi-turn: at most 0.2x the floor per turn once earlier turns are counted",
            (counting or {}).get("per_turn_ratio", math.nan),
            0.2,
            "x",
        ),
        Target("idle RSS with one model's tokenizer loaded: under 300 MB", idle_mb.get(GUARD, math.nan), 300, " MB"),
    ]


def added(pooled: Pooled, scenario: str, system: str, metric: str = "total_p50") -> float:
    systems = pooled.get(scenario, {})
    if system not in systems or DIRECT not in systems:
        return math.nan
    value: float = getattr(systems[system], metric) - getattr(systems[DIRECT], metric)
    return value


def throughput_ratio(pooled: Pooled, scenario: str, system: str) -> float:
    systems = pooled.get(scenario, {})
    if system not in systems or DIRECT not in systems or not systems[DIRECT].throughput:
        return math.nan
    return systems[system].throughput / systems[DIRECT].throughput
