"""`python -m bench report` (`make bench`): start the simulator and every system as processes of their own,
measure every scenario in interleaved rounds, run the counting micro-benchmark, and write
bench/results/<date>/ (report.md, results.json, PNG plots; per-request records under raw/)."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import plots, render, targets
from bench.aggregate import Figures, pool
from bench.load import demo_tokenizer, prompt_source
from bench.machine import describe
from bench.procstats import usage
from bench.prompts import PromptCounter
from bench.scenarios import SCENARIOS, TIMINGS, Measurement, Scenario
from bench.systems import LITELLM_VERSION, SYSTEMS, Running, SetupError, Upstream, nginx_version, start, start_simulator

MAX_MODEL_LEN = 40960
SHARED_NOTE = (
    "The machine was shared: other engineers ran tests on it during the run, so absolute figures carry noise; "
    "the interleaved rounds spread it over every system alike."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="output folder (default: bench/results/<today>)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per measured run")
    parser.add_argument("--no-warmup", action="store_true", help="no warm-up request per connection before each run")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of " + ",".join(SYSTEMS))
    parser.add_argument("--scenarios", default=",".join(s.key for s in SCENARIOS), help="comma-separated keys")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer directory (default: the DeepSeek demo tokenizer)")
    parser.add_argument("--no-counting", action="store_true", help="skip the counting micro-benchmark")
    parser.add_argument("--note", default=SHARED_NOTE, help="a sentence about the machine's state during the run")
    parser.add_argument("--notes", type=Path, help="a Markdown file to end the report with (the closing note)")
    parser.add_argument("--rerender", type=Path, metavar="DIR", help="rewrite DIR's report and plots, no measuring")


def main(args: argparse.Namespace) -> int:
    if args.rerender:
        write(args.rerender, json.loads((args.rerender / "results.json").read_text()), args.notes)
        print(f"bench: rewrote {args.rerender / 'report.md'} from its results.json", file=sys.stderr)
        return 0
    date = datetime.date.today().isoformat()
    out = args.out or Path("bench/results") / date
    raw = out / "raw"
    (raw / "logs").mkdir(parents=True, exist_ok=True)
    tokenizer = args.tokenizer or demo_tokenizer()
    names = [n for n in args.systems.split(",") if n]
    chosen = [s for s in SCENARIOS if s.key in args.scenarios.split(",")]
    counter = PromptCounter(tokenizer)
    sources = functools.cache(lambda tokens, turns: prompt_source(counter, tokens, turns))
    measurement = Measurement(args.duration, not args.no_warmup, raw, sources)
    settings = {
        "date": date,
        "rounds": args.rounds,
        "duration_s": args.duration,
        "warmup": not args.no_warmup,
        "max_model_len": MAX_MODEL_LEN,
        "cores": os.cpu_count(),
        "note": args.note,
    }
    extra = {"nginx": nginx_version() if "nginx" in names else "-", "litellm": LITELLM_VERSION}
    machine = describe(extra)
    began = time.monotonic()
    idle_mb: dict[str, float] = {}
    try:
        for timing in TIMINGS:
            phase = [s for s in chosen if s.timing == timing]
            if phase:
                _phase(timing, phase, names, tokenizer, raw / "logs", measurement, args.rounds, idle_mb, sources)
    except SetupError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    counting = None if args.no_counting else run_counting(raw)
    results = {
        "settings": settings,
        "machine": machine,
        "idle_rss_mb": idle_mb,
        "counting": counting,
        "figures": {s: {n: f.to_json() for n, f in fs.items()} for s, fs in pool(measurement.runs).items()},
    }
    write(out, results, args.notes)
    print(f"bench: wrote {out / 'report.md'} in {time.monotonic() - began:.0f} s", file=sys.stderr)
    return 0


def write(out: Path, results: dict[str, Any], notes: Path | None) -> None:
    """report.md, the plots and results.json (the figures, small enough to commit) from a run's results."""
    pooled = {s: {n: Figures(**f) for n, f in fs.items()} for s, fs in results["figures"].items()}
    counting, idle_mb = results["counting"], results["idle_rss_mb"]
    checked = targets.check(pooled, idle_mb, counting)
    drawn = plots.draw(pooled, out)
    closing = notes.read_text() if notes else None
    text = render.report(
        pooled,
        results["machine"],
        results["settings"],
        checked,
        idle_mb,
        (counting or {}).get("markdown"),
        drawn,
        closing,
    )
    (out / "report.md").write_text(text)
    results = {**results, "targets": [t.to_json() for t in checked]}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")


def _phase(
    timing: str,
    scenarios: list[Scenario],
    names: list[str],
    tokenizer: Path,
    logs: Path,
    measurement: Measurement,
    rounds: int,
    idle_mb: dict[str, float],
    sources: Any,
) -> None:
    for scenario in scenarios:  # build every prompt before any server runs
        sources(scenario.prompt_tokens, scenario.turns)
    ttft, itl = TIMINGS[timing]
    print(f"bench: upstream timing {timing!r} (TTFT {ttft * 1000:g} ms, ITL {itl * 1000:g} ms)", file=sys.stderr)
    with _started(tokenizer, ttft, itl, names, logs) as systems:
        for system in systems:
            if system.pid is not None and system.name not in idle_mb:
                idle_mb[system.name] = usage(system.pid).rss_mb
        for scenario in scenarios:
            measurement.interleaved(scenario, systems, rounds)


@contextlib.contextmanager
def _started(tokenizer: Path, ttft: float, itl: float, names: list[str], logs: Path) -> Iterator[list[Running]]:
    simulator = start_simulator(tokenizer, MAX_MODEL_LEN, ttft, itl, logs)
    running: list[Running] = []
    try:
        upstream = Upstream(simulator.url, tokenizer, MAX_MODEL_LEN)
        for name in names:
            running.append(start(name, upstream, logs))
            print(f"bench: {name} on {running[-1].url} (pid {running[-1].pid or '-'})", file=sys.stderr)
        time.sleep(2.0)  # let start-up work settle before idle RSS and the first run
        yield running
    finally:
        for system in running:
            system.stop()
        simulator.stop()


def run_counting(raw: Path) -> dict[str, Any] | None:
    """The counting micro-benchmark (`python -m bench counting`), when the package has it."""
    from bench.__main__ import COMMANDS

    if "counting" not in COMMANDS:
        print(
            "bench: no `counting` subcommand here; the report goes without the counting micro-benchmark",
            file=sys.stderr,
        )
        return None
    path = raw / "counting.json"
    print("bench: counting micro-benchmark", file=sys.stderr)
    done = subprocess.run([sys.executable, "-m", "bench", "counting", "--out", str(path)])
    if done.returncode != 0 or not path.exists():
        print("bench: the counting micro-benchmark failed; the report goes without it", file=sys.stderr)
        return None
    data: dict[str, Any] = json.loads(path.read_text())  # markdown, one_shot_ratios, per_turn_ratio, ...
    return data
