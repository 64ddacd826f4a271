"""PNG plots of a report (matplotlib): added latency versus prompt size, throughput versus concurrency."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from bench.aggregate import Figures
from bench.targets import DIRECT

PROMPT_SIZES = {"c8": 100, "p2000": 2000, "p8000": 8000, "p32000": 32000}  # all at concurrency 8, non-stream
CONCURRENCY = {"c1": 1, "c8": 8, "c32": 32}  # non-stream, 100-token prompts
COLORS = {"direct": "#555555", "nginx": "#2a9d8f", "token-guard": "#e76f51", "litellm": "#457b9d"}


def draw(pooled: dict[str, dict[str, Figures]], out: Path) -> list[str]:
    """Write the plots into `out`; returns their file names (none when matplotlib is missing)."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]  # optional: the bench extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("bench: matplotlib is not installed; no plots (pip install matplotlib)", file=sys.stderr)
        return []
    names = []
    for name, painter in (("added-latency-vs-prompt.png", _latency), ("throughput-vs-concurrency.png", _throughput)):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
        if painter(pooled, axes):
            fig.savefig(out / name, dpi=110)
            names.append(name)
        plt.close(fig)
    return names


def _systems(pooled: dict[str, dict[str, Figures]], keys: dict[str, int]) -> list[str]:
    return [s for s in COLORS if any(s in pooled.get(k, {}) for k in keys)]


def _latency(pooled: dict[str, dict[str, Figures]], axes: Any) -> bool:
    drawn = False
    for ax, metric, label in zip(axes, ("total_p50", "total_p99"), ("p50", "p99"), strict=True):
        for system in _systems(pooled, PROMPT_SIZES):
            if system == DIRECT:
                continue
            points = [
                (size, getattr(pooled[k][system], metric) - getattr(pooled[k][DIRECT], metric))
                for k, size in PROMPT_SIZES.items()
                if system in pooled.get(k, {}) and DIRECT in pooled[k]
            ]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=system, color=COLORS[system])
                drawn = True
        ax.set_yscale("symlog", linthresh=1.0)  # from under a millisecond to seconds
        ax.set(
            xscale="log",
            xlabel="prompt tokens (concurrency 8, max_tokens 16)",
            ylabel=f"added {label} latency over direct (ms)",
            title=f"Added {label} latency vs prompt size",
        )
        ax.set_xticks(list(PROMPT_SIZES.values()), [f"{n:,}" for n in PROMPT_SIZES.values()])
        ax.axhline(0, color="#999999", linewidth=0.8)
        ax.grid(alpha=0.3)
        ax.legend()
    return drawn


def _throughput(pooled: dict[str, dict[str, Figures]], axes: Any) -> bool:
    drawn = False
    for ax, relative in zip(axes, (False, True), strict=True):
        for system in _systems(pooled, CONCURRENCY):
            points = [
                (c, pooled[k][system].throughput / (pooled[k][DIRECT].throughput if relative else 1.0))
                for k, c in CONCURRENCY.items()
                if system in pooled.get(k, {}) and DIRECT in pooled[k]
            ]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=system, color=COLORS[system])
                drawn = True
        ax.set(
            xscale="log",
            xlabel="concurrency (non-stream, 100-token prompts, max_tokens 16)",
            ylabel="ratio to direct" if relative else "requests per second",
            title="Throughput vs concurrency" + (", relative to direct" if relative else ""),
        )
        ax.set_xticks(list(CONCURRENCY.values()), [str(c) for c in CONCURRENCY.values()])
        ax.grid(alpha=0.3)
        ax.legend()
    return drawn
