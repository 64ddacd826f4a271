"""`token-guard doctor` against a real vLLM: every built-in sample agrees with vLLM's own `POST /tokenize`, and a chat
template that differs from the model's is reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.drift.samples import BUILTIN_SAMPLES
from tests.e2e.stack import Stack

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] if m['content'] is string else '' }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def check(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKEN_GUARD_")}
    command = [sys.executable, "-m", "proxy", "doctor", "--upstream", stack.vllm_url, "--json", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_check_passes_against_vllm(stack: Stack) -> None:
    done = check(stack)  # zero-config: the tokenizer comes from the `root` vLLM reports
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["upstream"]["version"] == stack.version
    assert {r["sample"]: r["verdict"] for r in report["samples"]} == {s.name: "OK" for s in BUILTIN_SAMPLES}
    (window,) = report["max_model_len"]
    assert window["verdict"] == "OK" and window["guard"] == window["upstream"]


def test_check_reports_a_different_template(stack: Stack, tmp_path: Path) -> None:
    model_dir = stack.http.get(stack.vllm_url + "/v1/models").json()["data"][0]["root"]
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    done = check(stack, "--model", "tiny", "--tokenizer", str(model_dir), "--chat-template", str(template))
    assert done.returncode == 1, done.stdout + done.stderr
    verdicts = {r["sample"]: r["verdict"] for r in json.loads(done.stdout)["samples"]}
    assert {name for name, v in verdicts.items() if v == "MISMATCH"} == {
        s.name for s in BUILTIN_SAMPLES if s.kind == "chat"
    }
