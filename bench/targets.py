"""The issue's targets, checked against a run's figures: each one measured, passed or missed, and by how much."""

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
    measured: str
    passed: bool | None  # None: not measured in this run

    @property
    def verdict(self) -> str:
        return {True: "pass", False: "miss", None: "not measured"}[self.passed]


def check(pooled: Pooled, idle_mb: dict[str, float], counting: dict[str, Any] | None) -> list[Target]:
    return [*_latency(pooled), _streaming(pooled), *_counting(counting), _memory(idle_mb)]


def added(pooled: Pooled, scenario: str, system: str, metric: str = "total_p50") -> float:
    systems = pooled.get(scenario, {})
    if system not in systems or DIRECT not in systems:
        return math.nan
    value: float = getattr(systems[system], metric) - getattr(systems[DIRECT], metric)
    return value


def _latency(pooled: Pooled) -> list[Target]:
    guard, litellm = added(pooled, "c1", GUARD), added(pooled, "c1", LITELLM)
    first = Target(
        "added p50, non-stream, max_tokens 16, concurrency 1: at most 1 ms",
        f"{guard:+.2f} ms",
        None if math.isnan(guard) else guard <= 1.0,
    )
    half = litellm / 2
    second = Target(
        "... and under half of LiteLLM's",
        f"{guard:+.2f} ms vs half of {litellm:+.2f} ms",
        None if math.isnan(guard) or math.isnan(litellm) else guard < half,
    )
    return [first, second]


def _streaming(pooled: Pooled) -> Target:
    systems = pooled.get("stream-c64", {})
    if GUARD not in systems or DIRECT not in systems or not systems[DIRECT].throughput:
        return Target("streaming, concurrency 64: throughput at least 0.95 of direct", "-", None)
    ratio = systems[GUARD].throughput / systems[DIRECT].throughput
    return Target("streaming, concurrency 64: throughput at least 0.95 of direct", f"{ratio:.3f}", ratio >= 0.95)


def _counting(counting: dict[str, Any] | None) -> list[Target]:
    one_shot_goal = "counting, one-shot prompts: at most 1.2 x the raw `tokenizers` floor"
    turn_goal = "counting, multi-turn: at most 0.2 x the floor per turn once earlier turns are counted"
    if not counting:
        return [Target(one_shot_goal, "-", None), Target(turn_goal, "-", None)]
    one_shot = counting.get("one_shot_ratios") or {}
    worst = max(one_shot.values(), default=math.nan)
    per_turn = counting.get("per_turn_ratio", math.nan)
    shown = ", ".join(f"{size}: {ratio:.2f}x" for size, ratio in one_shot.items())
    return [
        Target(one_shot_goal, shown or "-", None if math.isnan(worst) else worst <= 1.2),
        Target(turn_goal, f"{per_turn:.2f}x", None if math.isnan(per_turn) else per_turn <= 0.2),
    ]


def _memory(idle_mb: dict[str, float]) -> Target:
    goal = "idle RSS with one model's tokenizer loaded: under 300 MB"
    if GUARD not in idle_mb:
        return Target(goal, "-", None)
    return Target(goal, f"{idle_mb[GUARD]:.0f} MB", idle_mb[GUARD] < 300)
