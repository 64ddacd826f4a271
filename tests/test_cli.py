"""The `token-guard` command without the simulator: a production install (the image) carries neither the simulator
package nor its libraries (starlette, python-multipart: the simulator extra), so the guard's own commands never load
them, and `simulate` and `demo` say what to install instead of failing with a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a production install lacks: None in sys.modules makes an import of it fail as a missing module would.
WITHOUT_SIMULATOR = "import sys\nfor name in ('simulator', 'starlette', 'multipart', 'python_multipart'):\n" \
    "    sys.modules[name] = None\n"  # fmt: skip


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def guard_modules() -> list[str]:
    """Every module of proxy/ but the demo, which is the simulator's tour."""
    paths = sorted((ROOT / "proxy").rglob("*.py"))
    names = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in paths]
    return [name for name in names if name not in ("proxy.demo", "proxy.__main__")]


def test_every_module_of_the_guard_loads_without_the_simulator() -> None:
    done = python(WITHOUT_SIMULATOR + f"import importlib\nfor name in {guard_modules()!r}:\n"
                  "    importlib.import_module(name)\nprint('loaded')")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loaded"


def test_the_guards_commands_parse_without_the_simulator() -> None:
    done = python(WITHOUT_SIMULATOR + "from proxy.cli import main\nsys.exit(main(['serve', '--help']))")
    assert done.returncode == 0, done.stderr
    assert "--upstream" in done.stdout


@pytest.mark.parametrize("command", [["simulate"], ["simulate", "--port", "0"], ["demo", "--once"]])
def test_simulate_and_demo_say_what_to_install(command: list[str]) -> None:
    done = python(WITHOUT_SIMULATOR + f"from proxy.cli import main\nsys.exit(main({command!r}))")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"token-guard: error: {command[0]} needs the simulator" in done.stderr
    assert "pip install '.[simulator]'" in done.stderr


def test_simulate_reads_its_own_flags() -> None:
    done = subprocess.run([sys.executable, "-m", "proxy", "simulate", "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: token-guard simulate")
    assert "--kv-capacity" in done.stdout and "--responses-store" in done.stdout


def test_flags_simulate_does_not_take_are_refused() -> None:
    done = subprocess.run([sys.executable, "-m", "proxy", "simulate", "--no-such-flag"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in done.stderr and "Traceback" not in done.stderr
    other = subprocess.run([sys.executable, "-m", "proxy", "doctor", "--no-such-flag"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert other.returncode == 2 and "unrecognized arguments: --no-such-flag" in other.stderr


def test_token_guard_render_says_what_it_needs_to_run_without_an_upstream() -> None:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("TOKEN_GUARD_")}
    done = subprocess.run([sys.executable, "-m", "proxy", "render", "--port", "8123"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=clean)  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "token-guard: error: render.only: the render service asks no upstream, so [[models]] must name what it " \
        "renders" in done.stderr  # fmt: skip
    unsized = subprocess.run([sys.executable, "-m", "proxy", "render", "--model", "tiny", "--tokenizer", "/models"],
                             cwd=ROOT, capture_output=True, text=True, timeout=120, env=clean)  # fmt: skip
    assert unsized.returncode == 2
    assert "models[0].max_model_len: required with render.only (no upstream tells it)" in unsized.stderr
