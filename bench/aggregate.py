"""Pool the rounds of each scenario and system into the figures the report shows."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from statistics import median
from typing import Any

from bench.scenarios import Run
from bench.stats import distribution_ms
from bench.wire import Record

LATE_TURNS = 16  # conversations: turns from here on have most of their prompt counted before


@dataclass(frozen=True)
class Figures:
    requests: int
    errors: int
    ttft_p50: float
    ttft_p99: float
    total_p50: float
    total_p99: float
    throughput: float  # requests per second, median of the rounds
    tokens_per_s: float  # output tokens per second, median of the rounds
    cpu_ms: float | None  # proxy CPU milliseconds per request
    peak_mb: float | None  # proxy peak RSS over the rounds
    late_total_p50: float | None  # conversations: p50 total of the late turns

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def figures(runs: list[Run]) -> Figures:
    """Each figure is the median of the rounds' figures, so one round disturbed by a neighbour moves nothing."""
    per_round = [_round(run) for run in runs]
    cpu = [run.cpu_s for run in runs if run.cpu_s is not None]
    peaks = [run.peak_mb for run in runs if run.peak_mb is not None]
    requests = sum(run.summary["requests"] for run in runs)

    def mid(key: str) -> float:
        values = [v for r in per_round if (v := r[key]) is not None and not math.isnan(v)]
        return median(values) if values else math.nan

    return Figures(
        requests=requests,
        errors=requests - sum(run.summary["ok"] for run in runs),
        ttft_p50=mid("ttft_p50"),
        ttft_p99=mid("ttft_p99"),
        total_p50=mid("total_p50"),
        total_p99=mid("total_p99"),
        throughput=median(run.summary["throughput_rps"] for run in runs),
        tokens_per_s=median(run.summary["output_tokens_per_s"] for run in runs),
        cpu_ms=1000 * sum(cpu) / max(1, requests) if cpu else None,
        peak_mb=max(peaks) if peaks else None,
        late_total_p50=None if math.isnan(mid("late_total_p50")) else mid("late_total_p50"),
    )


def _round(run: Run) -> dict[str, float | None]:
    summary = run.summary
    ttft, total = summary["ttft_ms"] or {}, summary["total_ms"] or {}
    late = distribution_ms([r.total for r in run.records if _ok(r) and (r.turn or 0) >= LATE_TURNS and r.total])
    return {
        "ttft_p50": ttft.get("p50"),
        "ttft_p99": ttft.get("p99"),
        "total_p50": total.get("p50"),
        "total_p99": total.get("p99"),
        "late_total_p50": late["p50"] if late else None,
    }


def _ok(record: Record) -> bool:
    return record.error is None and record.status == 200


def pool(runs: list[Run]) -> dict[str, dict[str, Figures]]:
    """scenario -> system -> figures, in the order the runs were made."""
    grouped: dict[str, dict[str, list[Run]]] = {}
    for run in runs:
        grouped.setdefault(run.scenario, {}).setdefault(run.system, []).append(run)
    return {s: {name: figures(rs) for name, rs in systems.items()} for s, systems in grouped.items()}
