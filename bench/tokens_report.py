"""The Markdown of a `python -m bench tokens` result: CPU per render side by side with its ratios, the token ids'
agreement, resident memory, the machine and its load."""

from __future__ import annotations

from typing import Any

from bench.render import table

GUARD, VLLM, RAW = "guard", "vllm", "raw"  # the systems, as --systems names them


def per_request_ms(tally: dict[str, Any] | None, key: str = "cpu_s") -> float | None:
    if not tally or not tally["requests"]:
        return None
    return float(tally[key]) / float(tally["requests"]) * 1000


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}" if value < 100 else f"{value:,.0f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def titles(settings: dict[str, Any]) -> dict[str, str]:
    return {
        "first": f"the first long prompt after start (~{settings['fresh_tokens']:,} tokens: caches empty)",
        "fresh": f"fresh prompt (one user message, ~{settings['fresh_tokens']:,} tokens), one at a time",
        "turn": f"turn {settings['turns']} of an agent conversation (+{settings['turn_tokens']:,} tokens a turn)",
        "small": f"{settings['concurrency']} concurrent small chats (~{settings['small_tokens']} tokens)",
    }


def cpu_table(result: dict[str, Any]) -> str:
    rows = []
    for key, title in titles(result["settings"]).items():
        got = result["scenarios"].get(key, {})
        guard, vllm, vllm_api, raw = (
            per_request_ms(got.get(GUARD)),
            per_request_ms(got.get(VLLM)),
            per_request_ms(got.get(VLLM), "own_cpu_s"),
            per_request_ms(got.get(RAW)),
        )
        first: dict[str, Any] = next(iter(got.values()), {"tokens": [0], "requests": 0})
        tokens = sum(first["tokens"]) / max(1, len(first["tokens"]))
        cells = [title, f"{tokens:,.0f}", str(first["requests"]), ms(guard), ms(vllm), ms(vllm_api), ms(raw)]
        rows.append([*cells, ratio(guard, vllm), ratio(guard, vllm_api), ratio(guard, raw)])
    header = ["", "prompt tokens", "requests", "token-guard render", "vLLM, all processes", "vLLM, API server alone",
              "raw encode", "guard / vLLM", "guard / vLLM API server", "guard / raw"]  # fmt: skip
    return table(header, rows)


def tick_table(result: dict[str, Any]) -> str:
    rows = []
    for key, title in titles(result["settings"]).items():
        got = result["scenarios"].get(key, {})
        cells = [f"{ms(per_request_ms(got.get(s), 'tick_cpu_s'))}" for s in (GUARD, VLLM)]
        rows.append([title, *cells])
    return table(["utime + stime (10 ms ticks), ms per request", "token-guard render", "vLLM, all processes"], rows)


def rss_table(rss: dict[str, dict[str, Any]], vllm: str) -> str:
    models = rss.get("guard-models", {}).get("models", [])
    names = {
        GUARD: "token-guard render, the tiny model, after the run",
        VLLM: f"vLLM {vllm} (API server + engine core), the tiny model, after the run",
        "guard-models": f"token-guard render, {len(models)} models ({', '.join(models)}), after a long and a small "
        "chat each",
    }
    rows = [[names[n], f"{got['all processes']:,.0f}", f"{got['top process']:,.0f}"] for n, got in rss.items()]
    return table(["", "RSS, all processes, MB", "RSS, top process alone, MB"], rows)


def markdown(result: dict[str, Any]) -> str:
    machine, settings = result["machine"], result["settings"]
    load = " / ".join(f"{x:.2f}" for x in machine["load_average"])
    after = " / ".join(f"{x:.2f}" for x in result["load_average_after"])
    firsts = (next(iter(got.values()), {"requests": 0}) for got in result["scenarios"].values())
    checked = sum(t["requests"] for t in firsts)
    mismatched = sum(result["mismatches"].values())
    systems = settings["systems"]
    lines = [
        f"# CPU per render: token-guard render, vLLM {settings['vllm']}'s render route, raw encode ({result['date']})",
        "",
        f"- {machine['cores']} cores ({machine['cpu']}), {machine['memory_gb']} GB; load average (1 / 5 / 15 min) "
        f"{load} at the start, {after} at the end. {settings['note']}".rstrip(),
        f"- token-guard at {machine['token_guard_commit']}; systems: {systems}.",
        "- CPU per request: the server's threads' time on a CPU (schedstat) over the measured requests, every process "
        "of its tree (vLLM: API server and engine core; the API server alone beside it); raw: `time.process_time()` "
        "around `Tokenizer.encode(prompt, add_special_tokens=False)` of the already rendered prompt.",
        "",
        "## CPU per request, ms",
        "",
        cpu_table(result),
        "",
        f"Token ids: {checked} requests compared across {systems}: {mismatched} mismatches.",
        "",
        tick_table(result),
    ]
    if result["rss_mb"]:
        lines += ["", "## Resident memory", "", rss_table(result["rss_mb"], settings["vllm"])]
    return "\n".join(lines) + "\n"
