"""The ceiling comparison's figures (medians of the rounds) and its Markdown report: one table per scenario with ratios
to direct and to the relay, what bounds direct, and the ceiling's targets for token-guard against the relay."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from statistics import median
from typing import Any

from bench.ceiling_systems import GUARD_WORKERS, RELAYED
from bench.envoy import ENVOY_SYSTEMS, TRIVIAL_SYSTEMS, envoy_system
from bench.targets import Target

DIRECT, RELAY, GUARD, GUARD2 = "direct", "relay", "token-guard", "token-guard-2w"
Figures = dict[str, Any]  # one system in one scenario
Pooled = dict[str, dict[str, Figures]]  # scenario -> system -> figures


def pool(runs: list[Any]) -> Pooled:
    """scenario -> system -> the medians of its rounds, in the order the runs were made (runs as dataclasses)."""
    grouped: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        data = run if isinstance(run, dict) else vars(run)
        grouped.setdefault(data["scenario"], {}).setdefault(data["system"], []).append(data)
    return {s: {name: _figures(rounds) for name, rounds in systems.items()} for s, systems in grouped.items()}


def _per_round(run: dict[str, Any]) -> dict[str, float | None]:
    load, cpu = run["load"], run["proxy_cpu_s"]
    window = load["cpu_window_s"] or math.nan
    total, first = load["total_ms"] or {}, load["first_byte_ms"] or {}
    requests, chunks = load["requests_in_cpu_window"], load["chunks"]
    return {
        "per_s": load["per_s"],
        "chunks_per_s": load["chunks_per_s"],
        "total_p50": total.get("p50"),
        "total_p99": total.get("p99"),
        "first_p50": first.get("p50"),
        "first_p99": first.get("p99"),
        "cpu_ms_per_request": 1000 * cpu / requests if cpu is not None and requests else None,
        "helper_cpu_ms_per_request": 1000 * helper / requests
        if (helper := run.get("helper_cpu_s")) is not None and requests
        else None,
        "cpu_us_per_chunk": 1e6 * cpu / chunks if cpu is not None and chunks else None,
        "proxy_cores": cpu / window if cpu is not None else None,
        "upstream_cores": run["upstream_cpu_s"] / window,
        "generator_cores": load["generator_cpu_s"] / window,
        "machine_cores": run["machine_cpu_s"] / window,
        "events_per_stream": load["events_per_stream"],
    }


def _figures(rounds: list[dict[str, Any]]) -> Figures:
    per_round = [_per_round(r) for r in rounds]
    figures: Figures = {}
    for key in per_round[0]:
        values = [v for p in per_round if (v := p[key]) is not None and not math.isnan(v)]
        figures[key] = median(values) if values else None
    kinds: Counter[str] = Counter()
    for run in rounds:
        kinds.update(run["load"]["errors"])
    rss = [r["proxy_rss_mb"] for r in rounds if r["proxy_rss_mb"] is not None]
    return figures | {
        "rounds": len(rounds),
        "requests": sum(r["load"]["requests"] for r in rounds),
        "errors": sum(kinds.values()),
        "error_kinds": dict(kinds),
        "cut": sum(r["load"]["cut"] for r in rounds),
        "rss_mb": max(rss) if rss else None,
    }


def markdown(results: dict[str, Any], plots: Sequence[str] = ()) -> str:
    """The report; `plots`: the PNGs beside it (bench/ceiling_plots.py), linked at its end."""
    settings, machine, pooled = results["settings"], results["machine"], results["figures"]
    lines = [f"# Ceiling: the proxies themselves as the bottleneck ({settings['date']})", "", settings["note"], ""]
    lines += _how(settings, machine)
    for name, reason in results["skipped"].items():
        lines.append(f"- **{name} skipped**: {reason}")
    for scenario in results["scenarios"]:
        if scenario["key"] in pooled:
            lines += ["", f"## {scenario['title']}", ""]
            lines += _table(scenario, pooled[scenario["key"]])
            lines += ["", _bounds(scenario, pooled[scenario["key"]], machine["cores"], settings["upstream_workers"])]
    lines += ["", "## The ceiling's targets: token-guard (1 worker) against the relay, this run", ""]
    lines += ["| target | measured | verdict |", "|---|---:|---|"]
    for target in targets(pooled):
        shown = target.shown or ("-" if math.isnan(target.measured) else f"{target.measured:.2f}{target.unit}")
        lines.append(f"| {target.goal} | {shown} | {target.verdict} |")
    lines += _split(pooled)
    lines += _envoy(pooled)
    lines += plot_links(plots)
    return "\n".join(lines) + "\n"


def plot_links(plots: Sequence[str]) -> list[str]:
    """The report's last section: its plots, each linked by file name (they sit beside it)."""
    if not plots:
        return []
    return ["", "## Plots", *(line for name in plots for line in ("", f"![{Path(name).stem}]({name})"))]


def _envoy(pooled: Pooled) -> list[str]:
    """Envoy alone, Envoy with token-guard as its external processor, and token-guard serve, side by side: the p50
    each adds one small request at a time, the processor's own CPU per request (Envoy's apart) against serve's, and
    requests/s at 32 concurrent."""
    present = _envoy_present(pooled)
    if not present:
        return []
    rows = ["", "## Inside Envoy: token-guard as its external processor, this run", "",
            "| system | added p50, c1 | over Envoy alone | processor CPU per request, c32 | requests/s, c32 |",
            "|---|---:|---:|---:|---:|"]  # fmt: skip
    for name in [*present, GUARD]:
        added = _get(pooled, "c1", name, "total_p50") - _get(pooled, "c1", DIRECT, "total_p50")
        over = _get(pooled, "c1", name, "total_p50") - _get(pooled, "c1", "envoy", "total_p50")
        key = "helper_cpu_ms_per_request" if name != GUARD else "cpu_ms_per_request"
        cpu = _get(pooled, "c32", name, key)
        rows.append(f"| {name} | {added:+.2f} ms | {over:+.2f} ms | {cpu:.3f} ms | "
                    f"{_get(pooled, 'c32', name, 'per_s'):,.0f} |")  # fmt: skip
    rows += ["", "| target | measured | verdict |", "|---|---:|---|"]
    for target in envoy_targets(pooled):
        shown = target.shown or ("-" if math.isnan(target.measured) else f"{target.measured:.2f}{target.unit}")
        rows.append(f"| {target.goal} | {shown} | {target.verdict} |")
    return rows


def _envoy_present(pooled: Pooled) -> list[str]:
    """The run's Envoy systems, in ENVOY_SYSTEMS' order, each followed by its other checkouts' (name@DIR)."""
    ran = [*pooled.get("c1", {}), *(n for n in pooled.get("c32", {}) if n not in pooled.get("c1", {}))]
    return [name for base in ENVOY_SYSTEMS for name in ran if envoy_system(name) == base]


def envoy_targets(pooled: Pooled) -> list[Target]:
    """The targets for the external processor, each ext_proc system against Envoy alone and serve."""
    found = []
    for name in _envoy_present(pooled):
        base = envoy_system(name)
        if base is None or ENVOY_SYSTEMS[base] is None or base in TRIVIAL_SYSTEMS:
            continue
        over = _get(pooled, "c1", name, "total_p50") - _get(pooled, "c1", "envoy", "total_p50")
        cpu = _get(pooled, "c32", name, "helper_cpu_ms_per_request") / (
            _get(pooled, "c32", GUARD, "cpu_ms_per_request") or math.nan
        )
        found += [
            Target(f"{name}: added p50 over Envoy alone, one at a time, at most 1.5 ms", over, 1.5, " ms"),
            Target(f"{name}: processor CPU per request, 32 concurrent, at most 1.5x serve's", cpu, 1.5, "x"),
        ]
    return found


def _split(pooled: Pooled) -> list[str]:
    """token-guard's CPU per request in two parts, from the same run: relaying (token-guard-relayed, the same
    requests on a path it does not guard, against the relay) and guarding (token-guard against token-guard-relayed:
    reading the JSON, rendering the template, counting, deciding)."""
    rows = []
    for key in ("c32", "stream-c32"):
        relay, relayed, guard = (_get(pooled, key, name, "cpu_ms_per_request") for name in (RELAY, RELAYED, GUARD))
        if not any(math.isnan(v) for v in (relay, relayed, guard)):
            rows.append(f"| {key} | {1000 * relay:.0f} | {1000 * relayed:.0f} ({relayed / relay:.2f}x) | "
                        f"{1000 * (relayed - relay):+.0f} | {1000 * (guard - relayed):+.0f} | "
                        f"{1000 * guard:.0f} ({guard / relay:.2f}x) |")  # fmt: skip
    if not rows:
        return []
    return [
        "", "## Where token-guard's CPU goes, this run", "",
        "token-guard-relayed is token-guard sent the same requests on a path it does not guard: it relays them as "
        "received, with its request line, metrics and upstream client, and counts nothing.", "",
        "| scenario | relay, us | token-guard-relayed, us | relaying over the relay | guarding | token-guard, us |",
        "|---|---:|---:|---:|---:|---:|", *rows,
    ]  # fmt: skip


def _how(settings: dict[str, Any], machine: dict[str, Any]) -> list[str]:
    packages = machine["packages"]
    versions = ", ".join(f"{k} {packages.get(k, '-')}" for k in ("nginx", "litellm", "uvicorn", "uvloop", "httptools"))
    load = ", ".join(f"{v:.2f}" for v in machine["load_average"])
    return [
        f"Machine: {machine['cores']} cores ({machine['cpu']}), Python {machine['python']}, load average at the start "
        f"{load}; token-guard {machine['token_guard_commit']}; {versions}, aiohttp {packages.get('aiohttp', '-')}.",
        "",
        f"How: an upstream that answers at once (`bench/instant.py`, raw ASGI under uvicorn + uvloop + httptools, "
        f"{settings['upstream_workers']} process): a fixed 579-byte `chat.completion`, or N `chat.completion.chunk` "
        "events then `data: [DONE]`, each event its own write with the loop yielded in between. One aiohttp load "
        "generator (uvloop) in a process of its own, closed loop; every request a new random chat turn of 20-60 words. "
        f"Systems interleaved round by round (order rotated), {settings['rounds']} round(s) of "
        f"{settings['duration_s']:g} s after {settings['warmup_s']:g} s of warm-up; figures are medians of the rounds. "
        "Proxy CPU is user + system time of the system's whole process tree (every worker) from /proc/<pid>/stat, "
        "from just before the first measured request to just after the last one ended, divided by the requests, "
        "streams or SSE chunks completed in that window. Throughput counts a request that ends after the duration by "
        "its share inside it. Added p50 is against direct in the same run.",
        "",
    ]


def _fmt(value: float | None, digits: int = 1, suffix: str = "") -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}{suffix}"


def _ratio(systems: dict[str, Figures], name: str, base: str, key: str) -> str:
    if base not in systems or not systems[base].get(key) or systems[name].get(key) is None:
        return "-"
    return f"{systems[name][key] / systems[base][key]:.2f}"


def _added(systems: dict[str, Figures], name: str, key: str) -> str:
    if name == DIRECT or DIRECT not in systems or None in (systems[name][key], systems[DIRECT][key]):
        return "-"
    return f"{systems[name][key] - systems[DIRECT][key]:+.2f}"


def _table(scenario: dict[str, Any], systems: dict[str, Figures]) -> list[str]:
    stream, long = scenario["stream"], scenario["chunks"] > 16
    key = "chunks_per_s" if long else "per_s"
    head = ["system", "streams/s" if stream else "req/s"]
    head += ["chunks/s", "per worker"] if long else []
    head += ["vs direct", "vs relay"]
    head += ["first byte p50 / p99 ms", "total p50 / p99 ms", "added p50 first / total"] if stream else []
    head += [] if stream else ["p50 / p99 ms", "added p50 ms"]
    head += ["CPU / stream", "CPU / chunk"] if stream else ["CPU / request"]
    head += ["proxy cores", "errors"]
    rows = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for name, f in systems.items():
        cells = [name, _fmt(f["per_s"], 0 if f["per_s"] and f["per_s"] >= 100 else 1)]
        if long:
            workers = int(m.group(1)) if (m := GUARD_WORKERS.fullmatch(name)) else 1
            per_worker = f["chunks_per_s"] / workers if f["chunks_per_s"] is not None and name != DIRECT else None
            cells += [_fmt(f["chunks_per_s"], 0), _fmt(per_worker, 0)]
        cells += [_ratio(systems, name, DIRECT, key), _ratio(systems, name, RELAY, key)]
        if stream:
            added = f"{_added(systems, name, 'first_p50')} / {_added(systems, name, 'total_p50')}"
            cells += [_pair(f["first_p50"], f["first_p99"]), _pair(f["total_p50"], f["total_p99"]), added]
            cells += [_fmt(f["cpu_ms_per_request"], 3, " ms"), _fmt(f["cpu_us_per_chunk"], 1, " µs")]
        else:
            cells += [_pair(f["total_p50"], f["total_p99"]), _added(systems, name, "total_p50")]
            cells += [_fmt(f["cpu_ms_per_request"], 3, " ms")]
        errors = str(f["errors"]) + (f" ({f['cut']} cut)" if f["cut"] else "")
        cells += [_fmt(f["proxy_cores"], 2), errors]
        rows.append("| " + " | ".join(cells) + " |")
    events = {n: f["events_per_stream"] for n, f in systems.items() if f["events_per_stream"] is not None}
    if len(set(events.values())) > 1:
        rows += ["", "SSE data events per stream as received: " + ", ".join(f"{n} {v:g}" for n, v in events.items())]
    return rows


def _pair(p50: float | None, p99: float | None) -> str:
    digits = 2 if (p50 or 0) < 100 else 0
    return f"{_fmt(p50, digits)} / {_fmt(p99, digits)}"


def _bounds(scenario: dict[str, Any], systems: dict[str, Figures], cores: int, upstream_workers: int) -> str:
    """Which resource was full while direct ran: the load generator, the upstream, the machine, or none."""
    if DIRECT not in systems:
        return "Direct was not measured in this run."
    f = systems[DIRECT]
    generator, upstream, machine = f["generator_cores"] or 0.0, f["upstream_cores"] or 0.0, f["machine_cores"] or 0.0
    others = max(0.0, machine - generator - upstream)
    split = (
        f"load generator {generator:.2f} core, instant upstream {upstream:.2f} ({upstream_workers} process), "
        f"everything else on the machine {others:.2f}; {machine:.2f} of {cores} cores busy"
    )
    if scenario["concurrency"] == 1:
        bound = "the round trip of one request at a time (generator, loopback and upstream in series)"
    elif machine >= 0.9 * cores:
        bound = "the machine: its cores were full"
    elif generator >= 0.85:
        bound = "the load generator: one Python process at a full core"
    elif upstream >= 0.85 * upstream_workers:
        bound = "the instant upstream: its process(es) at a full core"
    else:
        bound = "no single process at a full core (latency and scheduling between the processes)"
    return f"What bounds direct here: {bound}. While direct ran: {split}."


def _get(pooled: Pooled, scenario: str, system: str, key: str) -> float:
    value = pooled.get(scenario, {}).get(system, {}).get(key)
    return math.nan if value is None else float(value)


def _vs(guard: float, relay: float) -> str:
    return "-" if math.isnan(guard) else f"{guard:+.2f} ms vs relay {relay:+.2f} ms"


def targets(pooled: Pooled) -> list[Target]:
    def ratio(scenario: str, key: str, system: str = GUARD, base: str = RELAY) -> float:
        return _get(pooled, scenario, system, key) / (_get(pooled, scenario, base, key) or math.nan)

    def added(system: str) -> float:
        return _get(pooled, "c1", system, "total_p50") - _get(pooled, "c1", DIRECT, "total_p50")

    errors = [f["errors"] for systems in pooled.values() for n, f in systems.items() if n == GUARD]
    relay_added = added(RELAY)
    return [
        Target(
            "CPU per small chat request, 32 concurrent: at most 2x the relay's",
            ratio("c32", "cpu_ms_per_request"),
            2.0,
            "x",
        ),
        Target(
            "CPU per 17-event stream, 32 concurrent: at most 2x the relay's",
            ratio("stream-c32", "cpu_ms_per_request"),
            2.0,
            "x",
        ),
        Target("requests/s, 32 concurrent: at least 0.5x the relay's", ratio("c32", "per_s"), 0.5, "x", True),
        Target("streams/s, 32 concurrent: at least 0.5x the relay's", ratio("stream-c32", "per_s"), 0.5, "x", True),
        Target(
            "added p50, one at a time: at most the relay's + 0.4 ms",
            added(GUARD),
            relay_added + 0.4,
            " ms",
            shown=_vs(added(GUARD), relay_added),
        ),
        Target(
            "0 errors, every scenario",
            float(sum(errors)) if errors else math.nan,
            0.0,
            "",
            shown=str(sum(errors)) if errors else "-",
        ),
        Target(
            "chunks/s, long streams: 2 workers at least 1.7x one",
            ratio("long-c128", "chunks_per_s", GUARD2, GUARD),
            1.7,
            "x",
            True,
        ),
    ]
