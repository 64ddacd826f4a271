"""A smoke test of `python -m bench ceiling --quick` against direct and the relay: the instant upstream, the relay and
the load generator start as processes of their own on loopback, every scenario runs once, and the report is written
with its plots. No timing is asserted: this only proves the harness works end to end. And `python -m bench
plot-ceiling` draws the plots of a result already written."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from bench.__main__ import main
from bench.ceiling import result_stem
from bench.ceiling_plots import METRICS

STREAM_EVENTS = {"c1": 0, "c32": 0, "stream-c1": 16, "stream-c32": 16, "long-c128": 64}  # --quick: 64-chunk streams


def test_quick_ceiling_against_direct_and_the_relay(tmp_path: Path) -> None:
    assert main(["ceiling", "--quick", "--systems", "direct,relay", "--out", str(tmp_path)]) == 0

    results = json.loads((tmp_path / "ceiling-quick.json").read_text())
    assert results["skipped"] == {}
    assert list(results["figures"]) == list(STREAM_EVENTS)
    for scenario, systems in results["figures"].items():
        assert list(systems) == ["direct", "relay"]
        for name, f in systems.items():
            assert f["errors"] == 0 and f["cut"] == 0, (scenario, name, f["error_kinds"])
            assert f["requests"] > 0 and f["per_s"] > 0
            assert 0 < f["total_p50"] <= f["total_p99"]
            assert (f["cpu_ms_per_request"] is None) == (name == "direct")
            if STREAM_EVENTS[scenario]:
                assert f["events_per_stream"] == STREAM_EVENTS[scenario]
                assert 0 < f["first_p50"] <= f["total_p50"]
                assert f["chunks_per_s"] > 0
        assert systems["relay"]["cpu_ms_per_request"] > 0 and systems["relay"]["proxy_cores"] > 0

    report = (tmp_path / "ceiling-quick.md").read_text()
    for title in ("## non-stream, one at a time", "## stream of 16 chunks, 32 concurrent", "## long streams of 64"):
        assert title in report
    assert report.count("What bounds direct here:") == len(STREAM_EVENTS)
    for suffix, *_ in METRICS:
        assert f"![ceiling-quick-{suffix}](ceiling-quick-{suffix}.png)" in report
        assert is_png(tmp_path / f"ceiling-quick-{suffix}.png")


def test_quick_ceiling_splits_token_guards_cost_into_relaying_and_guarding(tmp_path: Path) -> None:
    systems = "relay,token-guard-relayed,token-guard"
    assert main(["ceiling", "--quick", "--systems", systems, "--scenarios", "c32", "--out", str(tmp_path)]) == 0

    results = json.loads((tmp_path / "ceiling-quick.json").read_text())
    figures = results["figures"]["c32"]
    assert list(figures) == systems.split(",")
    assert all(f["errors"] == 0 and f["cpu_ms_per_request"] > 0 for f in figures.values())
    logs = tmp_path / "raw" / "ceiling-logs"
    relayed = [line for line in (logs / "token-guard-relayed.log").read_text().splitlines() if "status=200" in line]
    guarded = [line for line in (logs / "token-guard.log").read_text().splitlines() if "status=200" in line]
    assert relayed and all("endpoint=/unguarded/v1/chat/completions" in line for line in relayed)
    assert not any("prompt_tokens=" in line or "guarded=True" in line for line in relayed)  # relayed, not counted
    assert guarded and all("guarded=True" in line and "prompt_tokens=" in line for line in guarded)
    report = (tmp_path / "ceiling-quick.md").read_text()
    assert "## Where token-guard's CPU goes, this run" in report
    (row,) = [line for line in report.splitlines() if line.startswith("| c32 |")]
    assert len(row.split("|")) == 8  # scenario, relay, relayed, relaying, guarding, token-guard


def test_quick_ceiling_runs_token_guard_from_another_checkout(tmp_path: Path) -> None:
    """token-guard@DIR runs that checkout's code, for an A/B of two versions in one run (here: this checkout)."""
    checkout = Path(__file__).resolve().parents[1]
    systems = f"token-guard@{checkout},token-guard@{tmp_path}"  # the second is not a checkout: skipped, and why
    assert main(["ceiling", "--quick", "--systems", systems, "--scenarios", "c32", "--out", str(tmp_path)]) == 0

    results = json.loads((tmp_path / "ceiling-quick.json").read_text())
    assert list(results["skipped"]) == [f"token-guard@{tmp_path}"]
    assert "not a token-guard checkout" in results["skipped"][f"token-guard@{tmp_path}"]
    (figures,) = results["figures"]["c32"].values()
    assert figures["errors"] == 0 and figures["cpu_ms_per_request"] > 0
    (log,) = (tmp_path / "raw" / "ceiling-logs").glob("token-guard@*.log")
    assert "prompt_tokens=" in log.read_text()


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


def small_result() -> dict[str, object]:
    """A ceiling result as `bench ceiling` writes it, cut to what the plots read: two scenarios, three systems."""

    def figures(per_s: float, cpu: float | None) -> dict[str, float | None]:
        return {"per_s": per_s, "cpu_ms_per_request": cpu}

    return {
        "settings": {"date": "2026-12-04"},
        "scenarios": [{"key": "c32", "title": "non-stream, 32 concurrent"},
                      {"key": "stream-c32", "title": "stream of 16 chunks, 32 concurrent"}],
        "figures": {
            "c32": {"direct": figures(9000, None), "relay": figures(4400, 0.2), "token-guard": figures(1700, 0.6)},
            "stream-c32": {"direct": figures(5000, None), "relay": figures(2100, 0.36),
                           "token-guard": figures(1300, 0.78)},
        },
    }  # fmt: skip


def test_plot_ceiling_draws_one_png_per_metric(tmp_path: Path) -> None:
    result = tmp_path / "ceiling-small.json"
    result.write_text(json.dumps(small_result()))
    assert main(["plot-ceiling", str(result), "--out", str(tmp_path / "plots")]) == 0

    drawn = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert drawn == sorted(f"ceiling-small-{suffix}.png" for suffix, *_ in METRICS) and len(drawn) == 2
    assert all(is_png(tmp_path / "plots" / name) for name in drawn)


def test_a_ceiling_result_is_named_by_the_commit_it_measured() -> None:
    assert result_stem("5fbfd3f") == "ceiling-5fbfd3f"
    assert result_stem("b3a8362 + uncommitted changes") == "ceiling-b3a8362-dirty"


def test_quick_ceiling_runs_envoy_with_another_checkouts_processor_and_the_one_message_floor(tmp_path: Path) -> None:
    """envoy-extproc@DIR is Envoy with DIR's processor, for an A/B of two versions in one run (here: this checkout);
    envoy-trivial-processor-body sends the processor the request's body alone. Both appear in the Envoy table."""
    checkout = Path(__file__).resolve().parents[1]
    systems = f"envoy,envoy-trivial-processor-body,envoy-extproc@{checkout},envoy-trivial-processor@{checkout}"
    assert main(["ceiling", "--quick", "--systems", systems, "--scenarios", "c1,c32", "--out", str(tmp_path)]) == 0

    results = json.loads((tmp_path / "ceiling-quick.json").read_text())
    assert list(results["skipped"]) == [f"envoy-trivial-processor@{checkout}"]  # a checkout runs token-guard only
    for figures in results["figures"].values():
        assert list(figures) == systems.split(",")[:3]
        assert all(f["errors"] == 0 for f in figures.values())
        assert all(f["helper_cpu_ms_per_request"] > 0 for name, f in figures.items() if name != "envoy")
    logs = tmp_path / "raw" / "ceiling-logs"
    floor = yaml.safe_load((logs / "envoy-trivial-processor-body.yaml").read_text())
    (listener,) = floor["static_resources"]["listeners"]
    (manager,) = listener["filter_chains"][0]["filters"]
    mode = manager["typed_config"]["http_filters"][0]["typed_config"]["processing_mode"]
    assert (mode["request_header_mode"], mode["request_body_mode"], mode["response_header_mode"]) == (
        "SKIP", "BUFFERED", "SKIP")  # fmt: skip
    (processor_log,) = logs.glob("envoy-extproc@*-processor.log")
    assert "Envoy's external processor" in processor_log.read_text()
    report = (tmp_path / "ceiling-quick.md").read_text()
    rows = [line.split(" | ")[0] for line in report.split("## Inside Envoy")[1].splitlines() if line.startswith("| ")]
    assert rows[1:5] == ["| envoy", f"| envoy-extproc@{checkout}", "| envoy-trivial-processor-body", "| token-guard"]
    assert f"envoy-extproc@{checkout}: processor CPU per request" in report
