"""Percentiles and the summary of a load run, from its per-request records."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench.wire import Record

PERCENTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}


def percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks of an ascending sequence."""
    if not ordered:
        raise ValueError("no values")
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution_ms(seconds: list[float]) -> dict[str, float] | None:
    if not seconds:
        return None
    ordered = sorted(s * 1000 for s in seconds)
    stats = {name: percentile(ordered, q) for name, q in PERCENTILES.items()}
    stats["mean"] = sum(ordered) / len(ordered)
    return stats


def _ok(record: Record) -> bool:
    return record.error is None and record.status == 200


def error_key(record: Record) -> str:
    if record.status == 0:
        return (record.error or "no response").split(":", 1)[0]
    if record.status == 200:
        return "stream error"
    return str(record.status)


def summarize(records: list[Record], window_s: float) -> dict[str, Any]:
    """Latency over every request. Throughput over the window in which new requests were being started: a request
    that ends after it counts by the share of its time inside, so long streams do not make the count jump."""
    ok = [r for r in records if _ok(r)]
    done = [(_share(r, window_s), r) for r in ok]
    per_s = 1 / window_s if window_s > 0 else 0.0
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": dict(Counter(error_key(r) for r in records if not _ok(r))),
        "throughput_rps": sum(share for share, _ in done) * per_s,
        "output_tokens_per_s": sum(share * (r.output_tokens or 0) for share, r in done) * per_s,
        "ttft_ms": distribution_ms([r.ttft for r in ok if r.ttft is not None]),
        "total_ms": distribution_ms([r.total for r in ok if r.total is not None]),
        "prompt_tokens": sorted({r.prompt_tokens for r in ok if r.prompt_tokens is not None})[:3],
    }


def _share(record: Record, window_s: float) -> float:
    if record.end <= window_s:
        return 1.0
    return max(0.0, window_s - record.start) / (record.total or 1.0)
