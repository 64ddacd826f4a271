"""The Markdown report: machine, method, targets, a headline table, then one table per scenario (ratios to
direct first, absolute figures after)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bench.aggregate import Figures
from bench.scenarios import SCENARIOS, TIMINGS, Scenario
from bench.targets import DIRECT, GUARD, LITELLM, Target, added

Pooled = dict[str, dict[str, Figures]]
Row = tuple[str, Callable[[str, Figures], str]]


def ms(value: float | None, sign: bool = False) -> str:
    if value is None or math.isnan(value):
        return "-"
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:+,.{digits}f}" if sign else f"{value:,.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


def scenario_table(scenario: Scenario, figures: dict[str, Figures]) -> str:
    systems = list(figures)
    base = figures.get(DIRECT)

    def over(metric: str) -> Callable[[str, Figures], str]:
        return lambda name, f: (
            "-" if base is None or name == DIRECT else ms(getattr(f, metric) - getattr(base, metric), True)
        )

    def ratio(name: str, f: Figures) -> str:
        return f"{f.throughput / base.throughput:.3f}" if base and base.throughput else "-"

    rows: list[Row] = [("throughput, ratio to direct", ratio)]
    latency = ["ttft_p50", "ttft_p99", "total_p50", "total_p99"] if scenario.stream else ["total_p50", "total_p99"]
    names = {"ttft_p50": "TTFT p50", "ttft_p99": "TTFT p99", "total_p50": "total p50", "total_p99": "total p99"}
    rows += [(f"added {names[m]}, ms", over(m)) for m in latency]
    if scenario.turns > 1:
        rows.append(("added p50, turns 16-20, ms", over("late_total_p50")))
    rows += [(f"{names[m]}, ms", _metric(m)) for m in latency]
    rows += [
        ("throughput, req/s", lambda n, f: f"{f.throughput:,.1f}"),
        ("output tokens/s", lambda n, f: f"{f.tokens_per_s:,.0f}"),
        ("requests (errors)", lambda n, f: f"{f.requests:,} ({f.errors})"),
        ("proxy CPU per request, ms", lambda n, f: ms(f.cpu_ms)),
        ("proxy peak RSS, MB", lambda n, f: "-" if f.peak_mb is None else f"{f.peak_mb:,.0f}"),
    ]
    body = [[label, *(render(name, figures[name]) for name in systems)] for label, render in rows]
    return table(["", *systems], body)


def _metric(metric: str) -> Callable[[str, Figures], str]:
    return lambda name, f: ms(getattr(f, metric))


def headline(pooled: Pooled, idle_mb: dict[str, float]) -> str:
    systems = [s for s in ("nginx", GUARD, LITELLM) if any(s in v for v in pooled.values())]

    def tput(scenario: str) -> Callable[[str], str]:
        def cell(name: str) -> str:
            got = pooled.get(scenario, {})
            if name not in got or DIRECT not in got:
                return "-"
            return f"{got[name].throughput / got[DIRECT].throughput:.2f}"

        return cell

    def add(scenario: str, metric: str = "total_p50") -> Callable[[str], str]:
        return lambda name: ms(added(pooled, scenario, name, metric), True)

    def cpu(name: str) -> str:
        f = pooled.get("c32", {}).get(name)
        return ms(f.cpu_ms) if f else "-"

    rows: list[tuple[str, Callable[[str], str]]] = [
        ("added p50 latency, non-stream, concurrency 1 (ms)", add("c1")),
        ("added p99 latency, non-stream, concurrency 1 (ms)", add("c1", "total_p99")),
        ("throughput vs direct, non-stream, concurrency 32", tput("c32")),
        ("throughput vs direct, streaming 256 tokens, concurrency 64", tput("stream-c64")),
        ("added TTFT p50, streaming, concurrency 64 (ms)", add("stream-c64", "ttft_p50")),
        ("added p50 latency, 8,000-token prompt, concurrency 8 (ms)", add("p8000")),
        ("added p50 latency, 32,000-token prompt, concurrency 8 (ms)", add("p32000")),
        ("added p50 latency, turns 16-20 of a conversation (ms)", add("turns", "late_total_p50")),
        ("proxy CPU per request, non-stream, concurrency 32 (ms)", cpu),
        ("idle RSS (MB)", lambda name: f"{idle_mb[name]:,.0f}" if name in idle_mb else "-"),
    ]
    return table(["", *systems], [[label, *(cell(s) for s in systems)] for label, cell in rows])


def targets_table(targets: list[Target]) -> str:
    def measured(t: Target) -> str:
        return "-" if math.isnan(t.measured) else t.shown or f"{t.measured:.{t.digits}f}{t.unit}"

    return table(["target", "measured", "pass / miss"], [[t.goal, measured(t), t.verdict] for t in targets])


def machine_text(machine: dict[str, Any]) -> str:
    packages = ", ".join(f"{name} {v}" for name, v in machine["packages"].items())
    load = " / ".join(f"{x:.1f}" for x in machine["load_average"])
    return (
        f"- {machine['cores']} cores ({machine['cpu']}), {machine['memory_gb']} GB, Linux {machine['kernel']}, "
        f"Python {machine['python']}; load average at the start {load}.\n"
        f"- token-guard at {machine['token_guard_commit']}; {packages}."
    )


def method_text(settings: dict[str, Any]) -> str:
    timings = ", ".join(f"{k}: TTFT {t * 1000:g} ms, ITL {i * 1000:g} ms" for k, (t, i) in TIMINGS.items())
    sentences = [
        "Every system is a process of its own on loopback in front of the same simulator process (`python -m proxy "
        f"simulate`, vLLM 0.32 profile, max_model_len {settings['max_model_len']:,}; {timings}).",
        f"The load generator (httpx, one process) shares the {settings['cores']} cores with them.",
        "nginx: the Debian package with a generated config (one worker, keepalive upstream, HTTP/1.1, request and "
        "response buffering off, access log off). LiteLLM: `litellm[proxy]` at a pinned version in its own virtual "
        "environment, one worker, the model as `openai/<name>` on the simulator, a master key, the local cost map, "
        "logging at ERROR. token-guard: `python -m proxy serve` with the default policy, log level warning.",
        "Rounds are interleaved: each round runs every system once per scenario, the order rotated each round; "
        f"{settings['rounds']} rounds of {settings['duration_s']:g} s (conversations: one per worker), each run after "
        "a warm-up of one short request per connection.",
        "Each figure is the median of the rounds' figures (percentiles taken within each run); throughput counts a "
        "request still running at the end of a run by the share of it inside the run.",
        "Every request carries a prompt no system saw before, built to the exact token count with the model's "
        "tokenizer and chat template, so no cache answers from memory except within a conversation.",
        "Proxy CPU and RSS come from `/proc` of the proxy's process tree: `utime + stime` over the measured run, "
        "`VmHWM` reset before it.",
    ]
    return " ".join(sentences)


def report(
    pooled: Pooled,
    machine: dict[str, Any],
    settings: dict[str, Any],
    targets: list[Target],
    idle_mb: dict[str, float],
    counting_md: str | None,
    plots: list[str],
    closing: str | None = None,
) -> str:
    parts = [
        f"# token-guard performance report ({settings['date']})",
        "## Machine\n\n" + machine_text(machine) + "\n- " + settings["note"],
        "## Method\n\n" + method_text(settings),
        "## Targets\n\n" + targets_table(targets),
        "## Headline (added over direct; ratios to direct)\n\n" + headline(pooled, idle_mb),
        *(f"![{p}]({p})" for p in plots),
    ]
    for scenario in SCENARIOS:
        if scenario.key in pooled:
            parts.append(f"## {scenario.title}\n\n" + scenario_table(scenario, pooled[scenario.key]))
    if counting_md:
        parts.append("## Counting alone (`python -m bench counting`)\n\n" + counting_md.strip())
    if closing:
        parts.append("## Closing note\n\n" + closing.strip())
    return "\n\n".join(parts) + "\n"
