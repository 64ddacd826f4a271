"""Start-up: zero-config discovery, waiting for a late upstream, the command line, and the demo."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from proxy.cli import main
from proxy.server.running import ServerThread, bind_socket
from simulator import SimulatorSettings
from simulator import create_app as create_simulator
from tests.support.polling import eventually
from tests.support.servers import MODEL, guard, guard_unchecked, simulator, simulator_in_memory


def test_zero_config_sidecar_learns_model_window_and_tokenizer_from_the_upstream(deepseek_dir: Path) -> None:
    with simulator_in_memory(deepseek_dir, profile="0.31", max_model_len=1000, root=str(deepseek_dir)) as sim:
        with guard(sim) as proxy:  # no model configured at all
            client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", max_retries=0)
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=5000
            )
            usage = raw.parse().usage
            assert usage is not None and usage.prompt_tokens + usage.completion_tokens == 1000
            assert httpx.get(f"{proxy.url}/health").json()["models"] == [MODEL]


def test_model_whose_root_is_not_readable_is_not_guarded_but_named(deepseek_dir: Path, tmp_path: Path) -> None:
    with simulator_in_memory(deepseek_dir, profile="0.31", root=str(tmp_path / "elsewhere")) as sim:
        with guard(sim) as proxy:
            response = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "messages": [
                {"role": "user", "content": "x"}]})  # fmt: skip
            assert response.status_code == 404 and "does not exist" in response.json()["error"]["message"]


def test_guard_waits_for_an_upstream_that_starts_late(deepseek_dir: Path) -> None:
    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there yet
    with guard_unchecked(f"http://127.0.0.1:{port}", deepseek_dir, **{"server.ready_wait_s": 0.5}) as proxy:
        health = httpx.get(f"{proxy.url}/health")
        assert health.status_code == 503 and health.json()["status"] == "starting"
        early = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "messages": [
            {"role": "user", "content": "x"}]})  # fmt: skip
        assert early.status_code == 503 and early.json()["error"]["type"] == "ServiceUnavailableError"
        assert early.headers["retry-after"] == "2"  # after waiting server.ready_wait_s for the guard to learn
        app = create_simulator(SimulatorSettings(tokenizer=deepseek_dir, model=MODEL, max_model_len=777))
        with ServerThread(app, port=port):
            assert eventually(lambda: httpx.get(f"{proxy.url}/health").status_code == 200, timeout_s=30)
            ok = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "max_tokens": 9000,
                            "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
            assert ok.status_code == 200 and ok.json()["usage"]["total_tokens"] == 777


def test_configured_window_wins_over_the_discovered_one_with_a_warning(
    deepseek_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="token_guard")
    with simulator_in_memory(deepseek_dir, profile="0.32", max_model_len=2048) as sim:
        with guard(sim, deepseek_dir, **{"model.max_model_len": 1024}) as proxy:
            assert eventually(lambda: "differs from the upstream's 2048" in caplog.text)
            response = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": MODEL, "max_tokens": 4000,
                                  "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
            assert response.json()["usage"]["total_tokens"] == 1024


@pytest.fixture
def restored_logging() -> Iterator[None]:
    """`serve` sets up the root logger for its process; in a test, put back what was there (pytest's capture)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_bad_settings_stop_the_program_with_a_message_naming_the_key(
    capsys: pytest.CaptureFixture[str], restored_logging: None
) -> None:
    assert main(["serve", "--port", "eighty"]) == 2
    assert "server.port: expected an integer from 1 to 65535, got 'eighty' (from --port)" in capsys.readouterr().err
    assert main(["serve", "--model", "m", "--tokenizer", "/no/such/dir"]) == 2
    assert "models[0] (m): tokenizer '/no/such/dir': no such file or directory" in capsys.readouterr().err


def test_serve_command_works_without_any_file(deepseek_dir: Path, tmp_path: Path) -> None:
    with simulator(deepseek_dir, profile="0.31", max_model_len=2048) as (sim, _, _):
        sock = bind_socket()
        port = sock.getsockname()[1]
        sock.close()
        command = [sys.executable, "-m", "proxy", "serve", "--upstream", sim.url, "--model", MODEL, "--tokenizer",
                   str(deepseek_dir), "--max-model-len", "2048", "--port", str(port)]  # fmt: skip
        log = tmp_path / "serve.log"
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            url = f"http://127.0.0.1:{port}"
            assert eventually(lambda: _health(url) == 200, timeout_s=30)
            reply = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=99999
            )
            assert reply.usage is not None and reply.usage.total_tokens == 2048
            # the request's log line arrives while the guard serves (its lines are written in batches)
            assert eventually(lambda: "action=clamp" in log.read_text(), timeout_s=5)
        finally:
            process.terminate()
            process.wait(timeout=30)
        assert "listening on" in log.read_text()


def _health(url: str) -> int:
    try:
        return httpx.get(f"{url}/health").status_code
    except httpx.HTTPError:
        return 0


def test_demo_tour_shows_pass_clamp_and_reject() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "demo", "--once", "--port", "0"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "action pass" in out and "action clamp" in out and "action reject" in out
    assert "maximum context length" in out and "= 2048 of 2048" in out
    assert "OpenAI(base_url=" in out and "curl" in out


def test_livez_answers_while_the_upstream_is_down(deepseek_dir: Path) -> None:
    sock = bind_socket()
    port = sock.getsockname()[1]
    sock.close()
    with guard_unchecked(f"http://127.0.0.1:{port}", deepseek_dir) as proxy:
        assert httpx.get(f"{proxy.url}/health").status_code == 503
        assert httpx.get(f"{proxy.url}/livez").status_code == 200
