"""A smoke test of `python -m bench calls`: the guard runs under cProfile in front of the instant upstream, twice per
scenario, and the calls of the measured requests are written per request with the commit measured. No figure is
asserted but what any guard must show: a stream of 16 events costs more calls than a small answer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


def test_calls_per_request_of_small_answers_and_streams(tmp_path: Path) -> None:
    out = tmp_path / "calls.json"
    argv = ["calls", "--systems", "token-guard", "--requests", "40", "--warm", "5", "--out", str(out)]
    assert main(argv) == 0

    result = json.loads(out.read_text())
    per_request = result["calls_per_request"]["token-guard"]
    assert 100 < per_request["c32"] < per_request["stream-c32"]  # every event of a stream is read and relayed
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    assert result["commits"] == {"token-guard": head.stdout.strip()}


def test_an_unknown_scenario_is_refused(tmp_path: Path) -> None:
    assert main(["calls", "--scenarios", "c9000", "--out", str(tmp_path / "calls.json")]) == 2
    assert not (tmp_path / "calls.json").exists()
