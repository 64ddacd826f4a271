"""Pool the rounds of each scenario and system into the figures the report shows."""

from __future__ import annotations

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
    records = [r for run in runs for r in run.records]
    ok = [r for r in records if r.error is None and r.status == 200]
    ttft = distribution_ms([r.ttft for r in ok if r.ttft is not None]) or {}
    total = distribution_ms([r.total for r in ok if r.total is not None]) or {}
    cpu = [run.cpu_s for run in runs if run.cpu_s is not None]
    peaks = [run.peak_mb for run in runs if run.peak_mb is not None]
    return Figures(
        requests=len(records),
        errors=len(records) - len(ok),
        ttft_p50=ttft.get("p50", float("nan")),
        ttft_p99=ttft.get("p99", float("nan")),
        total_p50=total.get("p50", float("nan")),
        total_p99=total.get("p99", float("nan")),
        throughput=median(run.summary["throughput_rps"] for run in runs),
        tokens_per_s=median(run.summary["output_tokens_per_s"] for run in runs),
        cpu_ms=1000 * sum(cpu) / max(1, len(records)) if cpu else None,
        peak_mb=max(peaks) if peaks else None,
        late_total_p50=_late_p50(ok),
    )


def _late_p50(ok: list[Record]) -> float | None:
    late = distribution_ms([r.total for r in ok if r.turn is not None and r.turn >= LATE_TURNS and r.total])
    return late["p50"] if late else None


def pool(runs: list[Run]) -> dict[str, dict[str, Figures]]:
    """scenario -> system -> figures, in the order the runs were made."""
    grouped: dict[str, dict[str, list[Run]]] = {}
    for run in runs:
        grouped.setdefault(run.scenario, {}).setdefault(run.system, []).append(run)
    return {s: {name: figures(rs) for name, rs in systems.items()} for s, systems in grouped.items()}
