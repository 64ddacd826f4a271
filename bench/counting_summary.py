"""Read the counting micro-benchmark's JSON into what the report needs: ratios to the floor and its table."""

from __future__ import annotations

from typing import Any


def summarize_counting(data: dict[str, Any]) -> dict[str, Any]:
    return {"markdown": data.get("markdown"), "one_shot_ratios": {}, "per_turn_ratio": float("nan")}
