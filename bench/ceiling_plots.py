"""PNG plots of a ceiling result (matplotlib, as bench/plots.py for the load report): CPU per request, and requests
per second, of each system in each scenario, as grouped bars. `python -m bench plot-ceiling <json>` draws them for a
result already written; `python -m bench ceiling` draws them with its report.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from bench.plots import COLORS

# (file name suffix, the figure's key in ceiling_render's figures, axis label, title)
METRICS = (
    ("cpu-per-request", "cpu_ms_per_request", "proxy CPU per request or stream (ms)", "CPU per request"),
    ("requests-per-s", "per_s", "requests or streams per second", "Requests per second"),
)
# The load report's colours for the systems both measure, and fixed ones for the ceiling's own; the rest by turn.
SYSTEM_COLORS = {**COLORS, "relay": "#f4a261", "token-guard-relayed": "#8ab17d", "token-guard-2w": "#9c6644",
                 "envoy": "#6d597a"}  # fmt: skip
OTHER_COLORS = ("#e9c46a", "#264653", "#b56576", "#43aa8b", "#577590", "#bc6c25", "#606c38", "#9d4edd")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("result", type=Path, help="a ceiling result (ceiling*.json)")
    parser.add_argument("--out", type=Path, help="folder for the PNGs (default: the result's own)")


def main(args: argparse.Namespace) -> int:
    results = json.loads(args.result.read_text())
    names = draw(results, args.out or args.result.parent, args.result.stem)
    for name in names:
        print(f"bench: wrote {(args.out or args.result.parent) / name}", file=sys.stderr)
    return 0 if names else 2


def file_names(stem: str) -> list[str]:
    """The PNGs draw() writes for a result named `stem` (ceiling-quick.json: ceiling-quick-cpu-per-request.png...)."""
    return [f"{stem}-{suffix}.png" for suffix, *_ in METRICS]


def draw(results: dict[str, Any], out: Path, stem: str) -> list[str]:
    """Write one PNG per metric into `out`; returns their file names (none when matplotlib is missing)."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]  # optional: the bench extra

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        print("bench: matplotlib is not installed; no plots (pip install matplotlib)", file=sys.stderr)
        return []
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (_, key, label, title) in zip(file_names(stem), METRICS, strict=True):
        fig, ax = plt.subplots(figsize=(11, 4.6), constrained_layout=True)
        if _bars(ax, results, key):
            ax.set(ylabel=label, title=f"{title}, each system in each scenario ({results['settings']['date']})")
            fig.savefig(out / name, dpi=110)
            written.append(name)
        plt.close(fig)
    return written


def _bars(ax: Any, results: dict[str, Any], key: str) -> bool:
    """Grouped bars: a group per scenario, a bar per system that has the figure (direct has no proxy CPU)."""
    pooled: dict[str, dict[str, dict[str, Any]]] = results["figures"]
    scenarios = [s for s in results["scenarios"] if s["key"] in pooled]
    every = _systems(pooled)  # a system keeps its colour in both plots, also where it has no bar (direct's CPU)
    systems = [n for n in every if any(pooled[s["key"]].get(n, {}).get(key) is not None for s in scenarios)]
    if not systems:
        return False
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        points = [(x, pooled[s["key"]][system][key]) for x, s in enumerate(scenarios)
                  if pooled[s["key"]].get(system, {}).get(key) is not None]  # fmt: skip
        xs = [x - 0.4 + width * (i + 0.5) for x, _ in points]
        bars = ax.bar(xs, [v for _, v in points], width, label=system, color=_color(system, every.index(system)))
        ax.bar_label(bars, fmt=_label_format(key), fontsize=6, rotation=90, padding=2)
    ticks = [f"{s['key']}\n" + textwrap.fill(s["title"], 26) for s in scenarios]
    ax.set_xticks(range(len(scenarios)), ticks, fontsize=8)
    ax.margins(y=0.15)  # room for the labels over the tallest bars
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return True


def _systems(pooled: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Every system, in the order the runs first measured it."""
    seen: dict[str, None] = {}
    for systems in pooled.values():
        seen.update(dict.fromkeys(systems))
    return list(seen)


def _color(system: str, index: int) -> str:
    return SYSTEM_COLORS.get(system) or OTHER_COLORS[index % len(OTHER_COLORS)]


def _label_format(key: str) -> str:
    return "%.3f" if key == "cpu_ms_per_request" else "%.0f"
