"""`python -m bench ceiling`: the proxies themselves as the bottleneck. An upstream that answers at once
(bench.instant), and in front of it direct, nginx, the smallest Python relay, token-guard (1 and 2 workers) and LiteLLM,
measured by one aiohttp load generator in a process of its own, interleaved round by round; CPU of each proxy's
process tree from /proc.
Writes bench/results/<date>/ceiling-<commit>.md, its .json and its plots (ceiling-<commit>-*.png; `--quick`:
ceiling-quick.*, a smoke test of the harness).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.aioload import Generator, Job
from bench.ceiling_plots import draw
from bench.ceiling_render import markdown, pool
from bench.ceiling_systems import CEILING_SYSTEMS, machine_busy_s, start_instant, start_system
from bench.instant import MAX_MODEL_LEN
from bench.machine import describe, version
from bench.procstats import usage
from bench.systems import LITELLM_KEY, LITELLM_VERSION, Running, SetupError, Upstream, nginx_version

BUSY_NOTE = "Taken on a shared machine (other work on the same two cores), so absolute figures are noisy."


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    concurrency: int
    stream: bool
    chunks: int = 16  # max_tokens: the events per stream the instant upstream sends


def scenarios(long_chunks: int) -> list[Scenario]:
    return [
        Scenario("c1", "non-stream, one at a time", 1, False),
        Scenario("c32", "non-stream, 32 concurrent", 32, False),
        Scenario("stream-c1", "stream of 16 chunks, one at a time", 1, True),
        Scenario("stream-c32", "stream of 16 chunks, 32 concurrent", 32, True),
        Scenario("long-c128", f"long streams of {long_chunks} chunks, 128 concurrent", 128, True, long_chunks),
    ]


@dataclass
class Run:
    scenario: str
    system: str
    round: int
    load: dict[str, Any]  # the generator's figures (bench.aioload._figures)
    proxy_cpu_s: float | None  # the system's whole process tree during the CPU window; None for direct
    upstream_cpu_s: float
    machine_cpu_s: float  # every process on the machine, the load generator included
    proxy_rss_mb: float | None
    helper_cpu_s: float | None = None  # the process beside the system's own (Envoy's external processor)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, help="output folder (default: bench/results/<today>)")
    parser.add_argument("--duration", type=float, help="seconds per measured run (default 5; --quick 0.3)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds; figures are their medians (default 2)")
    parser.add_argument("--warmup", type=float, help="seconds of warm-up load before each run (default 1)")
    parser.add_argument("--drain", type=float, help="seconds requests in flight may take after a run before cut")
    parser.add_argument("--systems", default=",".join(CEILING_SYSTEMS), help="comma-separated; token-guard-<N>w too")
    parser.add_argument("--scenarios", default=",".join(s.key for s in scenarios(256)), help="comma-separated keys")
    parser.add_argument("--long-chunks", type=int, help="chunks per long stream (default 256; --quick 64)")
    parser.add_argument("--upstream-workers", type=int, default=1, help="processes of the instant upstream")
    parser.add_argument("--note", default=BUSY_NOTE, help="a sentence about the machine's state during the run")
    parser.add_argument("--quick", action="store_true", help="a smoke test: short runs, one round")


def main(args: argparse.Namespace) -> int:
    quick = args.quick
    settings = {
        "date": datetime.date.today().isoformat(),
        "duration_s": args.duration or (0.3 if quick else 5.0),
        "rounds": args.rounds or (1 if quick else 2),
        "warmup_s": args.warmup if args.warmup is not None else (0.1 if quick else 1.0),
        "drain_s": args.drain or (2.0 if quick else 10.0),
        "long_chunks": args.long_chunks or (64 if quick else 256),
        "upstream_workers": args.upstream_workers,
        "quick": quick,
        "note": args.note,
    }
    out = args.out or Path("bench/results") / settings["date"]
    logs = out / "raw" / "ceiling-logs"
    logs.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.systems.split(",") if n]
    keys = [k for k in args.scenarios.split(",") if k]
    chosen = [s for s in scenarios(settings["long_chunks"]) if s.key in keys]
    if len(chosen) != len(keys):
        print(f"bench: unknown scenario in {keys}; choose from {[s.key for s in scenarios(0)]}", file=sys.stderr)
        return 2
    extra = {
        "nginx": nginx_version() if "nginx" in names else "-",
        "litellm": LITELLM_VERSION,
        "aiohttp": version("aiohttp"),
    }
    machine = describe(extra)
    began = time.monotonic()
    skipped: dict[str, str] = {}
    runs: list[Run] = []
    with _started(names, settings["upstream_workers"], logs, skipped) as (upstream, systems):
        generator = Generator(logs / "load-generator.log")
        try:
            for round_ in range(1, settings["rounds"] + 1):
                for scenario in chosen:
                    shift = (round_ - 1) % max(1, len(systems))
                    for system in systems[shift:] + systems[:shift]:
                        runs.append(_measure(generator, scenario, system, upstream, round_, settings, len(runs)))
        finally:
            generator.close()
    results = {
        "settings": settings,
        "machine": machine,
        "systems": names,
        "skipped": skipped,
        "scenarios": [asdict(s) for s in chosen],
        "figures": pool(runs),
        "runs": [asdict(r) for r in runs],
    }
    stem = "ceiling-quick" if quick else result_stem(machine["token_guard_commit"])
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / f"{stem}.md").write_text(markdown(results, draw(results, out, stem)))
    print(f"bench: wrote {out / stem}.md in {time.monotonic() - began:.0f} s", file=sys.stderr)
    return 0 if runs else 2


@contextlib.contextmanager
def _started(
    names: list[str], upstream_workers: int, logs: Path, skipped: dict[str, str]
) -> Iterator[tuple[Running, list[Running]]]:
    """The instant upstream and every system that starts; the others go to `skipped` with the reason."""
    instant = start_instant(logs, upstream_workers)
    systems: list[Running] = []
    try:
        upstream = Upstream(instant.url, _tokenizer(names), MAX_MODEL_LEN)
        for name in names:
            try:
                running = start_system(name, upstream, logs)
            except SetupError as exc:
                skipped[name] = str(exc)
                print(f"bench: {name} skipped: {exc}", file=sys.stderr)
                continue
            running.name = name
            systems.append(running)
            print(f"bench: {name} on {running.url} (pid {running.pid or '-'})", file=sys.stderr)
        _settle([s.pid for s in [instant, *systems] if s.pid is not None])  # start-up work done first
        yield instant, systems
    finally:
        for system in systems:
            system.stop()
        instant.stop()


def _tokenizer(names: list[str]) -> Path:
    if not any(n.startswith("token-guard") or n.startswith("envoy-extproc") for n in names):
        return Path("-")  # nothing will read it
    from bench.load import demo_tokenizer

    return demo_tokenizer()


def _measure(
    generator: Generator,
    scenario: Scenario,
    system: Running,
    upstream: Running,
    round_: int,
    settings: dict[str, Any],
    seed: int,
) -> Run:
    job = Job(
        url=system.url,
        concurrency=scenario.concurrency,
        duration_s=settings["duration_s"],
        stream=scenario.stream,
        chunks=scenario.chunks,
        warmup_s=settings["warmup_s"],
        drain_s=settings["drain_s"],
        api_key=LITELLM_KEY,  # LiteLLM needs its master key; the others ignore it
        seed=2 * seed,  # every run its own prompts (the generator uses seed and seed + 1)
    )
    helper = system.helper.pid if system.helper is not None else None
    pids = [p for p in (system.pid, upstream.pid, helper) if p is not None]
    marks: list[Sample] = []

    def settled_mark() -> None:  # the window opens on idle processes, whatever the warm-up left behind
        _settle(pids)
        marks.append(_sample(system, upstream))

    load = generator.run(job, settled_mark, lambda: marks.append(_sample(system, upstream)))
    before, after = marks
    guarded = system.pid is not None
    run = Run(
        scenario.key,
        system.name,
        round_,
        load,
        proxy_cpu_s=after.proxy_cpu_s - before.proxy_cpu_s if guarded else None,
        helper_cpu_s=after.helper_cpu_s - before.helper_cpu_s if helper is not None else None,
        upstream_cpu_s=after.upstream_cpu_s - before.upstream_cpu_s,
        machine_cpu_s=after.machine_cpu_s - before.machine_cpu_s,
        proxy_rss_mb=after.proxy_rss_mb if guarded else None,
    )
    _print(run, scenario)
    _settle(pids)  # a proxy still working on streams the generator cut would take cores from the next system
    return run


@dataclass(frozen=True)
class Sample:
    proxy_cpu_s: float  # the system's whole: its own process tree and its helper's
    upstream_cpu_s: float
    machine_cpu_s: float
    proxy_rss_mb: float
    helper_cpu_s: float


def _sample(system: Running, upstream: Running) -> Sample:
    proxy = usage(system.pid) if system.pid is not None else None
    helper = usage(system.helper.pid).cpu_s if system.helper is not None else 0.0
    upstream_cpu_s = usage(upstream.pid).cpu_s if upstream.pid is not None else 0.0
    return Sample((proxy.cpu_s if proxy else 0.0) + helper, upstream_cpu_s, machine_busy_s(),
                  proxy.rss_mb if proxy else 0.0, helper)  # fmt: skip


def _settle(pids: list[int], limit_s: float = 60.0) -> None:
    """Wait until the processes are idle: at most one clock tick of CPU each in 0.1 s."""
    deadline, last = time.monotonic() + limit_s, [usage(p).cpu_s for p in pids]
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = [usage(p).cpu_s for p in pids]
        if all(b - a <= 0.01 for a, b in zip(last, now, strict=True)):
            return
        last = now
    print(f"bench: still busy {limit_s:.0f} s after a run; going on", file=sys.stderr)


def _print(run: Run, scenario: Scenario) -> None:
    load = run.load
    unit = "streams/s" if scenario.stream else "req/s"
    p50 = (load["total_ms"] or {}).get("p50", float("nan"))
    cpu = ""
    if run.proxy_cpu_s is not None:
        cpu = f", proxy CPU {1000 * run.proxy_cpu_s / max(1e-9, load['requests_in_cpu_window']):.3f} ms/req"
    errors = sum(load["errors"].values())
    print(
        f"  r{run.round} {scenario.key:<11} {run.system:<15} {load['per_s']:8.1f} {unit}, p50 {p50:.2f} ms{cpu}, "
        f"{errors} errors, {load['cut']} cut",
        file=sys.stderr,
    )


def result_stem(commit: str) -> str:
    """A result is named by the commit it measured (its folder is the date): `ceiling-<commit>`, `-dirty` when the
    checkout had uncommitted changes to proxy/."""
    short, _, changes = commit.partition(" + ")
    return f"ceiling-{short}" + ("-dirty" if changes else "")
